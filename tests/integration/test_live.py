"""GPT-Live (``/v1/live/sessions``) over a real socket: the API's rules, its errors, and
every event checked strictly against ``openai.types.live`` (``support.sdk_shapes``).

The engine is the passthrough one (it numbers what it hears and answers with a tone and
words, or with the words of what it must say), behind the gateway's real speech
detector; speech is eSpeak NG's, made at test time."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

START = {"type": "session.start", "event_id": "start", "session": {"model": "gpt-live-1"}}


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="passthrough"), engine=PassthroughEngine(audio_chunks=10)) as gw:
        yield gw


def url(gw: RunningGateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/live/sessions"


async def started(c: Client, session: dict[str, Any] | None = None) -> dict[str, Any]:
    await c.send({**START, "session": session or START["session"]})
    return await c.wait_for("session.started")


async def say(c: Client, pcm: bytes) -> None:
    for chunk in chunks(pcm):
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})


def errors(c: Client) -> list[dict[str, Any]]:
    return [e["error"] for e in c.events if e["type"] == "error"]


async def test_a_live_session_starts_with_its_resolved_settings(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        event = await started(c, {"model": "gpt-live-1", "instructions": "Be brief.",
                                   "audio": {"output": {"voice": {"id": "voice_123"}},
                                             "format": {"type": "audio/pcm", "rate": 16000}},
                                   "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                   "store": False})  # fmt: skip
        session = event["session"]
        assert event["client_event_id"] == "start"
        assert session["id"].startswith("live_") and session["status"] == "active"
        assert session["model"] == "gpt-live-1" and session["instructions"] == "Be brief."
        assert session["audio"] == {
            "output": {"voice": {"id": "voice_123"}},
            "format": {"type": "audio/pcm", "rate": 16000},
        }
        assert session["delegation"] == {"type": "client"}  # omitted: the application
        assert session["input"][0]["content"][0]["text"] == "hi"
        assert isinstance(event["resume_token"], str)  # the gateway's resume extension


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"model": "gpt-live-1", "temperature": 0.5}, "unknown_parameter", "session.temperature"),
        ({"model": "gpt-live-1", "audio": {"output": {"voice": "marin", "speed": 2}}}, "unknown_parameter",
         "session.audio.output.speed"),
        ({"instructions": "x"}, "missing_required_parameter", "session.model"),
        ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}, "invalid_value",
         "session.audio.format.rate"),
        ({"model": "gpt-live-1", "delegation": {"type": "decisions", "decisions": {"model": "m", "questions": []}}},
         "decisions_unsupported", "session.delegation.type"),
        ({"model": "gpt-live-1", "audio": {"output": {"voice": "nobody"}}}, "invalid_value",
         "session.audio.output.voice"),
    ],
)  # fmt: skip
async def test_a_start_is_strict_and_a_refused_one_may_be_sent_again(
    gw: RunningGateway, session: dict[str, Any], code: str, param: str
) -> None:
    async with connect(url(gw)) as c:
        await c.send({"type": "session.start", "event_id": "bad", "session": session})
        error = await c.wait_for("error")
        assert error["error"]["code"] == code and error["error"]["param"] == param
        assert error["error"]["client_event_id"] == "bad" and error["client_event_id"] == "bad"
        assert error["error"]["message"]
        await started(c)  # nothing was opened: a good start still opens the session


async def test_events_before_the_start_are_refused_and_the_socket_stays_open(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(silence(20)).decode()})
        await c.send({"type": "session.instructions.append", "content": "x", "delegation_id": None, "event_id": "i"})
        await c.send({"type": "session.bogus", "event_id": "b"})
        await c.send({"type": "session.close", "event_id": "c", "extra": 1})
        for _ in range(4):
            await c.wait_for("error")
        codes = [(e["code"], e.get("param")) for e in errors(c)]
        assert codes == [("session_not_open", "type"), ("session_not_open", "type"), ("unknown_event", "type"),
                         ("unknown_parameter", "extra")]  # fmt: skip
        assert "session.start" in errors(c)[0]["message"]
        assert "session.input_audio.append" in errors(c)[2]["message"]  # the API lists its events
        await started(c)
        await c.send(START)  # a second start
        assert (await c.wait_for("error"))["error"]["code"] == "session_already_started"


async def test_the_model_answers_speech_with_audio_and_both_transcripts(gw: RunningGateway) -> None:
    speech = await speak("hello there, how are you today")
    async with connect(url(gw)) as c:
        await started(c)
        await say(c, silence(300) + speech + silence(1000))
        await c.wait_for(lambda e: e["type"] == "session.output_transcript.delta" and e["delta"].startswith("w9"))
        heard = [e for e in c.events if e["type"] == "session.input_transcript.delta"]
        spoken = [e for e in c.events if e["type"] == "session.output_transcript.delta"]
        audio = [e for e in c.events if e["type"] == "session.output_audio.delta"]
        assert heard and spoken and len(audio) == 10
        assert "".join(e["delta"] for e in spoken).split() == [f"w{i}" for i in range(10)]
        # On the session timeline: what was heard within the speech sent, what was said after it, in order.
        sent_ms = 300 + len(speech) // 48 + 1000
        assert all(0 <= e["start_ms"] <= e["end_ms"] <= sent_ms for e in heard)
        starts = [e["start_ms"] for e in spoken]
        assert starts == sorted(starts) and starts[0] >= heard[-1]["start_ms"]
        assert all(e["end_ms"] - e["start_ms"] == 20 for e in spoken)  # each word spans its 20 ms of audio
        assert not errors(c)


async def test_muted_input_is_heard_as_silence(gw: RunningGateway) -> None:
    speech = await speak("are you there")
    async with connect(url(gw)) as c:
        await started(c)
        await c.send({"type": "session.input_audio.mute", "event_id": "m"})
        assert (await c.wait_for("session.input_audio.muted"))["client_event_id"] == "m"
        await say(c, silence(200) + speech + silence(900))
        await c.send({"type": "session.input_audio.unmute", "event_id": "u"})
        unmuted = await c.wait_for("session.input_audio.unmuted")
        assert unmuted["client_event_id"] == "u"
        assert not [e for e in c.events if e["type"].startswith(("session.input_transcript", "session.output"))]
        await say(c, speech + silence(900))  # heard now
        await c.wait_for("session.output_audio.delta")


async def test_appended_context_is_acknowledged_on_the_timeline_and_commentary_is_said(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await started(c)
        await say(c, silence(400))
        for kind in ("instructions", "thinking"):
            await c.send({"type": f"session.{kind}.append", "content": f"some {kind}", "delegation_id": None,
                          "event_id": kind})  # fmt: skip
            ack = await c.wait_for(f"session.{kind}.appended")
            assert ack["client_event_id"] == kind and ack["start_ms"] == ack["end_ms"] == 400
        assert not [e for e in c.events if e["type"].startswith("session.output")]  # context is not said
        await c.send({"type": "session.commentary.append", "content": "Staging is healthy.", "delegation_id": None,
                      "event_id": "c"})  # fmt: skip
        assert (await c.wait_for("session.commentary.appended"))["client_event_id"] == "c"
        await c.wait_for(lambda e: e["type"] == "session.output_transcript.delta" and e["delta"].startswith("w"))
        said = "".join(e["delta"] for e in c.events if e["type"] == "session.output_transcript.delta")
        assert said.split()[:3] == ["Staging", "is", "healthy."]  # the passthrough says it as it is


async def test_an_append_naming_no_delegation_of_this_session_is_refused(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await started(c)
        await c.send({"type": "session.commentary.append", "content": "x", "delegation_id": "item_nope",
                      "event_id": "c"})  # fmt: skip
        error = (await c.wait_for("error"))["error"]
        assert (error["code"], error["param"], error["client_event_id"]) == ("delegation_not_found", "delegation_id",
                                                                             "c")  # fmt: skip
        await c.send({"type": "session.thinking.append", "content": "x", "event_id": "t"})  # delegation_id is required
        error = (await c.wait_for("error"))["error"]
        assert (error["code"], error["param"]) == ("missing_required_parameter", "delegation_id")


async def test_a_key_to_send_is_refused_where_no_sip_call_carries_the_session(gw: RunningGateway) -> None:
    """``transport.dtmf.send`` goes on a SIP call's RTP (tests/sip/test_sip_live.py); a WebSocket
    session has none: ``unsupported``, and the session goes on."""
    async with connect(url(gw)) as c:
        await started(c)
        await c.send({"type": "transport.dtmf.send", "event": "5", "event_id": "k"})
        error = (await c.wait_for("error"))["error"]
        assert (error["code"], error["param"], error["client_event_id"]) == ("unsupported", "type", "k")
        await c.send({"type": "session.input_audio.mute", "event_id": "m"})
        await c.wait_for("session.input_audio.muted")


async def test_responses_events_need_responses_delegation(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await started(c)
        await c.send({"type": "response.item.create", "event_id": "r",
                      "item": {"type": "message", "role": "user", "content": "hi"}})  # fmt: skip
        await c.send({"type": "response.create", "event_id": "r2"})
        await c.send({"type": "decision.create", "event_id": "d"})
        for _ in range(3):
            await c.wait_for("error")
        assert [(e["code"], e["client_event_id"]) for e in errors(c)] == [
            ("responses_delegation_required", "r"), ("responses_delegation_required", "r2"),
            ("decisions_unsupported", "d"),
        ]  # fmt: skip


async def test_an_audio_fixture_plays_whole_with_input_muted_and_only_one_at_a_time(gw: RunningGateway) -> None:
    # Three seconds of PCM16 at 24 kHz: the refusals below arrive while it plays, even on a busy machine.
    fixture = ((await speak("please hold")) + silence(3000))[: 2 * 24000 * 3]
    async with connect(url(gw)) as c:
        await started(c, {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}})
        await c.send({"type": "session.output_audio.fixture.play", "audio": base64.b64encode(fixture).decode(),
                      "event_id": "f"})  # fmt: skip
        await c.send({"type": "session.output_audio.fixture.play", "audio": base64.b64encode(fixture).decode(),
                      "event_id": "f2"})  # fmt: skip
        await c.send({"type": "session.commentary.append", "content": "x", "delegation_id": None, "event_id": "c"})
        playing = await c.wait_for("session.output_audio.fixture.playing")
        assert playing["client_event_id"] == "f"
        played = await c.wait_for("session.output_audio.fixture.played")
        assert played["client_event_id"] == "f"
        audio = b"".join(base64.b64decode(e["delta"]) for e in c.events if e["type"] == "session.output_audio.delta")
        assert len(audio) == len(fixture) // 2 // 3  # all of it, as μ-law at 8 kHz: one byte a sample
        assert [(e["code"], e["client_event_id"]) for e in errors(c)] == [("fixture_active", "f2"),
                                                                          ("fixture_active", "c")]  # fmt: skip


async def test_an_update_changes_delegation_and_triggers_only(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await started(c)
        await c.send(
            {
                "type": "session.update",
                "event_id": "u1",
                "session": {"delegation": {"type": "client", "acknowledgement_delay_ms": 250}, "triggers": []},
            }
        )
        updated = await c.wait_for("session.updated")
        assert updated["client_event_id"] == "u1"
        assert updated["session"]["delegation"] == {"type": "client", "acknowledgement_delay_ms": 250}
        await c.send({"type": "session.update", "event_id": "u2", "session": {"instructions": "new"}})
        await c.send({"type": "session.update", "event_id": "u3",
                      "session": {"delegation": {"type": "responses", "responses": {"model": "m"}}}})  # fmt: skip
        await c.wait_for("error")
        await c.wait_for("error")
        assert [(e["code"], e["param"]) for e in errors(c)] == [
            ("unknown_parameter", "session.instructions"), ("invalid_value", "session.delegation.type")
        ]  # fmt: skip
        assert "cannot change" in errors(c)[0]["message"]


async def test_a_close_ends_the_session_with_its_usage(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        event = await started(c)
        await say(c, silence(2100))
        await c.send({"type": "session.close", "event_id": "bye"})
        closed = await c.wait_for("session.closed")
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
        assert closed["session"]["id"] == event["session"]["id"] and closed["usage"] == {"seconds": 2.0}
        with pytest.raises(websockets.ConnectionClosedOK) as exc:
            await c.recv()
        assert exc.value.rcvd is not None and exc.value.rcvd.code == 1000


async def test_a_live_session_is_held_to_its_credential_and_tenant() -> None:
    """Keys, the tenant's model allow-list and its limits apply to Live sessions as to every
    session (the same door): no key is refused at the upgrade; a model the tenant may not use is
    refused at session.start (close 4003); a session over the tenant's limit at connect (4029)."""
    keys = orjson.dumps({"tenants": [
        {"name": "acme", "key_sha256": hashlib.sha256(b"sk-acme").hexdigest(), "models": ["gpt-live-1"],
         "limits": {"max_sessions": 1}},
    ]}).decode()  # fmt: skip
    settings = Settings(engine="passthrough", video_engine="none", api_keys=("sk-op",), keys_file=keys)
    async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=3), vad_factory=None) as gw:
        with pytest.raises(websockets.InvalidStatus) as exc:
            async with connect(url(gw)):
                pass
        assert exc.value.response.status_code == 401
        acme = {"Authorization": "Bearer sk-acme"}
        async with connect(url(gw), headers=acme) as c:
            await c.send({**START, "session": {"model": "gpt-live-2"}})
            error = await c.wait_for("error")
            assert error["error"]["code"] == "model_not_allowed" and error["client_event_id"] == "start"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await c.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4003
        async with connect(url(gw), headers=acme) as c:
            await started(c)
            async with connect(url(gw), headers=acme) as second:  # over max_sessions 1
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    while True:
                        await second.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4029
            assert errors(second)[0]["code"] == "rate_limit_exceeded"
