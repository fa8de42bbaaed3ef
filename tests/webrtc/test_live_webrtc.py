"""GPT-Live over WebRTC (``POST /v1/live/sessions``, docs/live.md *WebRTC*): an aiortc
"browser" against the gateway on loopback, its data channel's allow-lists, and the
server's sideband (``/v1/live/sessions/{id}/attach``), here and from a second replica
(a real redis-server on a loopback port, the sideband relayed over the bus).

All traffic stays on 127.0.0.0/8: ICE gathers on 127.0.0.1 only (aioice's host addresses,
which leave loopback out, are the loopback address here, for the gateway and the browser
alike), the gateway advertises 127.0.0.1 in ``replace`` mode and checks only 127.0.0.0/8.
Every event read off the data channel and the sideband is checked against the official
SDK's Live models (``check_live_event``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import websockets
from aiortc import RTCSessionDescription
from rtc_support import Browser, make_browser, tone, wait_for, write_wav
from support.docs import code_blocks
from support.gateway import RunningGateway, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer
from support.sdk_shapes import check_live_event
from support.speech import silence, speak

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(180)

KEY = "sk-live-webrtc"
OTHER = "sk-live-webrtc-other"
AUTH = {"Authorization": f"Bearer {KEY}"}
LOOPBACK = {
    "webrtc_advertised_addresses": ("127.0.0.1",),
    "webrtc_advertise_mode": "replace",
    "webrtc_peer_networks": ("127.0.0.0/8",),
}


@pytest.fixture(autouse=True)
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ICE host candidates on 127.0.0.1 only (aioice gathers every address but loopback)."""
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    yield


def settings(**over: Any) -> Settings:
    return Settings(video_engine="none", api_keys=(KEY, OTHER), detach_grace_s=5.0, **{**LOOPBACK, **over})


@contextlib.asynccontextmanager
async def passthrough(**over: Any) -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(engine="passthrough", **over), engine=PassthroughEngine(paced=False),
                           vad_factory=False) as gw:  # fmt: skip
        yield gw


@dataclass
class Page:
    """A browser holding a Live WebRTC session: its aiortc side, its session id, and what its
    data channel received (each checked against the SDK's Live models)."""

    browser: Browser
    session_id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def send(self, event: dict[str, Any]) -> None:
        assert self.browser.channel is not None
        self.browser.channel.send(orjson.dumps(event).decode())

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(self, kind: str, **fields: Any) -> dict[str, Any]:
        return await first(self.events, kind, **fields)


async def first(events: list[dict[str, Any]], kind: str, **fields: Any) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in fields.items())), None)

    await wait_for(lambda: found() is not None, kind)
    event = found()
    assert event is not None
    return event


async def create(gw: RunningGateway, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{gw.http}/v1/live/sessions", json=body, headers=headers or AUTH)


@contextlib.asynccontextmanager
async def live_call(
    gw: RunningGateway, session: dict[str, Any], *, wav: Path | None = None,
    before_answer: Callable[[str], Awaitable[None]] | None = None,
) -> AsyncIterator[Page]:  # fmt: skip
    """A page's Live session over WebRTC, as the SDK's ``client.live.create`` starts it
    (``before_answer(session id)``: what the backend does before the page applies the answer,
    so before any media flows)."""
    from openai.types.live import LiveCreateResponse

    browser, offer = await make_browser(wav=wav)
    try:
        r = await create(gw, {"session": session, "transport": {"type": "webrtc", "sdp": offer}})
        assert r.status_code == 201, r.text
        answer = LiveCreateResponse.model_validate(r.json(), strict=True)  # the SDK's response type
        assert answer.session.id.startswith("live_") and answer.transport.type == "webrtc"
        page = Page(browser, answer.session.id)
        assert browser.channel is not None

        def received(message: str) -> None:
            event = orjson.loads(message)
            check_live_event(event, extensions=True)  # (session.started carries the resume extension)
            page.events.append(event)

        browser.channel.on("message", received)
        if before_answer is not None:
            await before_answer(page.session_id)
        await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.transport.sdp, type="answer"))
        yield page
    finally:
        await browser.close()


@contextlib.asynccontextmanager
async def attach(gw: RunningGateway, session_id: str) -> AsyncIterator[tuple[Any, list[dict[str, Any]]]]:
    """The server's sideband on ``gw`` (relayed when ``gw`` does not serve the session)."""
    url = f"ws://127.0.0.1:{gw.port}/v1/live/sessions/{session_id}/attach"
    async with websockets.connect(url, max_size=None, additional_headers=AUTH) as ws:
        seen: list[dict[str, Any]] = []

        async def read() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    event = orjson.loads(message)
                    check_live_event(event, sideband=True)
                    seen.append(event)

        reader = asyncio.ensure_future(read())
        try:
            yield ws, seen
        finally:
            reader.cancel()


async def send(ws: Any, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


# --- a spoken exchange on the embedded default engine ----------------------------------------


async def test_a_spoken_exchange_over_live_webrtc_on_the_default_engine(tmp_path: Path) -> None:
    """The CPU cascade (silero VAD, pocketsphinx, the echo thinker, eSpeak NG): the caller's
    speech on the track is heard (its transcript on the channel), the answer plays on the
    track, and its transcript and no audio delta come on the channel. The server's sideband,
    attached before any media, sees it all: the microphone reflected, both transcripts, the
    model's speech as audio deltas."""
    pcm = silence(300) + await speak("what is your name") + silence(1500)
    wav = write_wav(tmp_path / "said.wav", pcm, 24_000)
    async with contextlib.AsyncExitStack() as stack:
        gw = await stack.enter_async_context(run_gateway(settings()))
        watched: list[dict[str, Any]] = []  # what the sideband received

        async def attach_first(session_id: str) -> None:
            nonlocal watched
            _, watched = await stack.enter_async_context(attach(gw, session_id))
            await wait_for(lambda: bool(gw.runtime.hosting.hosts[session_id].sidebands), "the sideband")

        page = await stack.enter_async_context(live_call(gw, {"model": "gpt-live-1"}, wav=wav,
                                                         before_answer=attach_first))  # fmt: skip
        started = await page.wait_for("session.started")
        assert started["session"]["id"] == page.session_id and "format" not in started["session"]["audio"]
        info = await page.wait_for("info", code="data_channel_permissions")
        assert "every client event" in info["message"]
        await page.wait_for("session.input_transcript.delta")
        await page.wait_for("session.output_transcript.delta")
        await wait_for(lambda: len(page.browser.received.loud()) > 25, "the answer's audio on the track", 90)
        heard = "".join(e["delta"] for e in page.events if e["type"] == "session.input_transcript.delta")
        assert heard.strip()
        assert "session.output_audio.delta" not in page.types()  # its audio is on the track only
        assert not [e for e in page.events if e["type"] == "error"], page.events
        # The sideband: the same transcripts, the model's speech, the microphone reflected.
        await first(watched, "session.output_audio.delta")
        await first(watched, "session.input_audio.append")

        def text(events: list[dict[str, Any]], kind: str) -> str:
            return "".join(e["delta"] for e in events if e["type"] == kind)

        kinds = ("session.input_transcript.delta", "session.output_transcript.delta")
        await wait_for(lambda: all(text(watched, k) == text(page.events, k) != "" for k in kinds),
                       "the same transcripts on the sideband")  # fmt: skip


# --- the data channel's allow-lists ------------------------------------------------------------


def documented_request() -> dict[str, Any]:
    """docs/live.md's *WebRTC* example body (its offer a placeholder)."""
    (block,) = [b for b in code_blocks("docs/live.md") if b.lang == "json" and '"transport"' in b.text]
    body = orjson.loads(block.text)
    assert body["transport"] == {"type": "webrtc", "sdp": "<the page's SDP offer>"}
    return body


RESTRICTED = documented_request()["session"]


async def test_the_data_channel_sends_and_sees_only_what_its_allow_lists_name() -> None:
    async with passthrough() as gw, live_call(gw, RESTRICTED) as page:
        await page.wait_for("session.started")
        info = await page.wait_for("info", code="data_channel_permissions")
        assert "session.instructions.append" in info["message"]
        async with attach(gw, page.session_id) as (ws, seen):
            await wait_for(lambda: bool(gw.runtime.hosting.hosts[page.session_id].sidebands), "the sideband")
            # A forbidden send: refused with the documented error; the session goes on.
            page.send({"type": "session.commentary.append", "event_id": "c1", "content": "no",
                       "delegation_id": None})  # fmt: skip
            refused = await page.wait_for("error", client_event_id="c1")
            assert refused["error"]["code"] == "client_event_not_allowed" and refused["error"]["param"] == "type"
            # An allowed send whose answer is not allowed on the channel: withheld there, seen by the sideband.
            page.send({"type": "session.input_audio.mute", "event_id": "m1"})
            page.send({"type": "session.instructions.append", "event_id": "i1", "content": "Speak slowly.",
                       "delegation_id": None})  # fmt: skip
            await page.wait_for("session.instructions.appended", client_event_id="i1")
            await first(seen, "session.input_audio.muted", client_event_id="m1")
            await first(seen, "session.instructions.appended", client_event_id="i1")
            assert "session.input_audio.muted" not in page.types()
            assert not any(e["type"] == "session.commentary.appended" for e in seen)  # it never reached the session
            # The sideband is trusted: what the channel may not send, it may.
            await send(ws, {"type": "session.commentary.append", "event_id": "c2", "content": "Done.",
                            "delegation_id": None})  # fmt: skip
            await first(seen, "session.commentary.appended", client_event_id="c2")
            assert "session.commentary.appended" not in page.types()
        # Audio goes on the track: an append on the channel is refused (and would be by the list too).
        audio = base64.b64encode(bytes(960)).decode()
        page.send({"type": "session.input_audio.append", "event_id": "a1", "audio": audio})
        refused = await page.wait_for("error", client_event_id="a1")
        assert refused["error"]["code"] == "unsupported"


async def test_a_live_webrtc_session_is_refused_before_any_media() -> None:
    async with passthrough() as gw:
        browser, offer = await make_browser()
        try:
            webrtc = {"type": "webrtc", "sdp": offer}
            cases = [
                ({"session": {"model": "gpt-live-1"}, "transport": webrtc}, {}, 401, "unauthorized"),
                ({"session": {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}},
                  "transport": webrtc}, AUTH, 400, "unknown_parameter"),
                ({"session": {"model": "gpt-live-1", "temperature": 1}, "transport": webrtc}, AUTH, 400,
                 "unknown_parameter"),
                ({"session": {}, "transport": webrtc}, AUTH, 400, "missing_required_parameter"),
                ({"session": {"model": "gpt-live-1", "idle_timeout_s": 30}, "transport": webrtc}, AUTH, 400,
                 "invalid_value"),  # (it pauses a session with a wake policy: none here)
                ({"session": {"model": "gpt-live-1", "wake_policy": {"type": "speech"}}, "transport": webrtc}, AUTH,
                 400, "unsupported"),  # (this gateway runs no speech detector: nothing would wake it)
                ({"session": {"model": "gpt-live-1"}, "transport": {"type": "websocket", "sdp": offer}}, AUTH, 400,
                 "invalid_value"),
                ({"session": {"model": "gpt-live-1"}}, AUTH, 400, "missing_required_parameter"),
                ({"session": {"model": "gpt-live-1"}, "transport": webrtc, "extra": 1}, AUTH, 400,
                 "unknown_parameter"),
                ({"session": {"model": "gpt-live-1", "client": {"data_channel": {"allowed_server_events": [
                    {"type": "response.event"}]}}}, "transport": webrtc}, AUTH, 400, "invalid_type"),
                ({"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": "v=0\r\n"}}, AUTH, 400,
                 None),
            ]  # fmt: skip
            for body, headers, status, code in cases:
                r = await create(gw, body, {**headers} if headers else {"X-None": "1"})
                assert r.status_code == status, (body, r.text)
                error = r.json()["error"]
                if code is not None:
                    assert error["code"] == code, (body, error)
                assert error["message"]
            assert not gw.runtime.hosting.hosts  # no session was opened by any of them
        finally:
            await browser.close()


async def test_an_attach_to_a_session_that_is_not_ones_own_is_refused() -> None:
    async with passthrough() as gw, live_call(gw, {"model": "gpt-live-1"}) as page:
        await page.wait_for("session.started")
        for session_id, key in ((page.session_id, OTHER), ("live_nope", KEY)):
            url = f"ws://127.0.0.1:{gw.port}/v1/live/sessions/{session_id}/attach"
            async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
                event = orjson.loads(await ws.recv())
                assert event["type"] == "error" and event["error"]["code"] == "session_not_found"
                with pytest.raises(websockets.ConnectionClosed):
                    await ws.recv()
                assert ws.close_code == 4004


# --- the sideband from a second replica ---------------------------------------------------------


@contextlib.asynccontextmanager
async def replicas() -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = settings(engine="passthrough", redis_url=server.url)
        engine = PassthroughEngine(paced=False)
        async with (
            run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=False) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=False) as b,
        ):
            yield a, b


async def test_a_sideband_on_another_replica_sees_the_audio_and_controls_the_session(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "mic.wav", tone(440, 4000, 24_000), 24_000)  # the microphone plays a tone
    async with replicas() as (a, b), live_call(a, RESTRICTED, wav=wav) as page:
        await page.wait_for("session.started")
        async with attach(b, page.session_id) as (ws, seen):
            await wait_for(lambda: bool(b.runtime.hosting.links), "the relay to open")
            # The primary's audio, reflected: session.input_audio.append, PCM16 at 24 kHz, no event_id.
            reflected = await first(seen, "session.input_audio.append")
            assert set(reflected) == {"type", "audio"}
            await wait_for(lambda: sum(len(base64.b64decode(e["audio"])) for e in seen
                                       if e["type"] == "session.input_audio.append") >= 48_000,
                           "a second of reflected audio")  # fmt: skip
            # It controls the session: the call's channel sees what it did (where the lists allow).
            await send(ws, {"type": "session.instructions.append", "event_id": "sb1", "content": "Be brief.",
                            "delegation_id": None})  # fmt: skip
            await first(seen, "session.instructions.appended", client_event_id="sb1")
            await page.wait_for("session.instructions.appended", client_event_id="sb1")
            # What a sideband may not send: audio goes on the primary connection.
            await send(ws, {"type": "session.input_audio.append", "event_id": "sb2",
                            "audio": base64.b64encode(bytes(960)).decode()})  # fmt: skip
            refused = await first(seen, "error", client_event_id="sb2")
            assert refused["error"]["code"] == "unsupported"
            await send(ws, {"type": "session.close", "event_id": "sb3"})
            closed = await first(seen, "session.closed")
            assert closed["reason"] == "close_requested"
        assert "session.closed" not in page.types()  # (not in the channel's allow-list)


# --- the official SDK: client.live.create, then client.live.sideband.connect ------------------


async def test_the_sdk_creates_a_webrtc_session_and_its_server_attaches_a_sideband() -> None:
    """docs/live.md's *WebRTC* sketch, as the official SDK runs it: the backend creates the
    session with the page's offer (the page applies the answer), then attaches."""
    from openai import AsyncOpenAI

    async with passthrough() as gw:
        browser, offer = await make_browser()
        try:
            events: list[dict[str, Any]] = []
            assert browser.channel is not None
            browser.channel.on("message", lambda m: events.append(orjson.loads(m)))
            client = AsyncOpenAI(
                api_key=KEY, base_url=f"{gw.http}/v1", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1"
            )
            created = await client.live.create(
                session={"model": "gpt-live-1", "instructions": "Answer briefly."},
                transport={"type": "webrtc", "sdp": offer},
            )
            await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=created.transport.sdp, type="answer"))
            await first(events, "session.started")
            async with client.live.sideband.connect(session_id=created.session.id) as sideband:
                await sideband.session.thinking.append(content="The caller is on the pro plan.", delegation_id=None)
                while True:
                    event = orjson.loads(await sideband.recv_bytes())
                    check_live_event(event, sideband=True)
                    if event["type"] == "session.thinking.appended":
                        break
            await first(events, "session.thinking.appended")  # the page's channel sees it too
        finally:
            await browser.close()


# --- barge-in: speech over an answer already written cuts the track -----------------------------

TAIL = " ".join(["I am still talking about this and that, so you can interrupt me."] * 4)


class WrittenAtOnceThinker:
    """Echo and a long tail, all at once: the answer is written within a second or so, its
    audio (some 15 s) plays on from the call's track."""

    description = "long echo, written at once (test)"

    async def think(self, messages: tuple[Any, ...], instructions: str) -> AsyncIterator[str]:
        from orchestrator.engines.cascade.thinker import EchoThinker

        async for word in EchoThinker().think(messages, instructions):
            assert isinstance(word, str)
            yield word
        yield ". " + TAIL


async def test_speech_over_a_written_answer_cuts_the_calls_track(tmp_path: Path) -> None:
    """The Live dialect says nothing of what was played (no items to truncate), so the
    session tells the call to cut (``CutAudio``) when the caller starts to speak; the next
    answer plays."""
    from orchestrator.engines.cascade import CascadeEngine

    utterance = await speak("what is your name")
    wav = write_wav(tmp_path / "caller.wav", silence(500) + utterance + silence(3500) + utterance + silence(6000),
                    24_000)  # fmt: skip
    engine = CascadeEngine(thinker=WrittenAtOnceThinker())
    async with run_gateway(settings(engine="cascade"), engine=engine) as gw:
        async with live_call(gw, {"model": "gpt-live-1"}, wav=wav) as page:
            await page.wait_for("session.started")
            await wait_for(lambda: len(gw.runtime.calls.calls) == 1, "the call")
            [call] = gw.runtime.calls.calls.values()
            await wait_for(lambda: call.track.queued_ms > 5000 and call.track.playing is not None,
                           "an answer written ahead of its audio, playing", 120)  # fmt: skip
            stream, _ = call.track.playing  # (each answer is a stream of its own, a new one after a cut)
            await wait_for(lambda: not call.track.queued_ms, "the barge-in to cut the track", 120)
            cut_at = call.track.response_sent_ms(stream)
            assert cut_at < 10_000, cut_at  # far from the 15 s that answer had written: it was cut
            # The second utterance is answered: its audio plays as a new stream.
            await wait_for(lambda: (playing := call.track.playing) is not None and playing[0] != stream
                           and call.track.response_sent_ms(playing[0]) > 500, "the next answer", 120)  # fmt: skip
            assert call.track.response_sent_ms(stream) == cut_at  # what was cut went no further


async def test_a_wake_policy_session_waits_for_speech_and_pauses_when_idle(tmp_path: Path) -> None:
    """``wake_policy`` and ``idle_timeout_s`` on the embedded default engine: the call's first
    speech wakes inference (``session.resumed``) and is answered; a second of the call's
    silence after the answer pauses it (``session.paused``); the usage reports both."""
    pcm = silence(1500) + await speak("what is your name") + silence(6000)
    wav = write_wav(tmp_path / "said.wav", pcm, 24_000)
    session = {"model": "gpt-live-1", "wake_policy": {"type": "speech", "vad_threshold": 0.5}, "idle_timeout_s": 1}
    async with run_gateway(settings()) as gw, live_call(gw, session, wav=wav) as page:
        await page.wait_for("session.started")
        await page.wait_for("session.resumed")
        await page.wait_for("session.output_transcript.delta")
        await page.wait_for("session.paused")
        types = page.types()
        assert types.count("session.resumed") == 1 and types.count("session.paused") == 1
        assert types.index("session.resumed") < types.index("session.input_transcript.delta")
        assert types.index("session.output_transcript.delta") < types.index("session.paused")
        page.send({"type": "session.close", "event_id": "bye"})
        closed = await page.wait_for("session.closed")
        usage = closed["usage"]
        assert usage["active_seconds"] + usage["paused_seconds"] == usage["seconds"]
        assert usage["paused_seconds"] >= 1 and usage["active_seconds"] >= 1  # (before the wake, after the pause)


async def test_client_secrets_and_origins_hold_as_on_the_other_routes() -> None:
    """A page's client secret opens a Live WebRTC session of the model it was minted for, once;
    another model is 403 ``model_not_allowed``; a page on an origin not allowed is 403."""
    async with passthrough(allowed_origins=("http://app.example",)) as gw:
        async with httpx.AsyncClient(timeout=30) as http:
            mint = {"session": {"type": "realtime", "model": "gpt-live-1"}}
            secret = (await http.post(f"{gw.http}/v1/realtime/client_secrets", headers=AUTH, json=mint)).json()
            other = (await http.post(f"{gw.http}/v1/realtime/client_secrets", headers=AUTH, json=mint)).json()
        page_auth = {"Authorization": f"Bearer {secret['value']}", "Origin": "http://app.example"}
        browser, offer = await make_browser()
        try:
            webrtc = {"type": "webrtc", "sdp": offer}
            r = await create(gw, {"session": {"model": "omni-passthrough"}, "transport": webrtc},
                             {"Authorization": f"Bearer {other['value']}"})  # fmt: skip
            assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed", r.text
            r = await create(gw, {"session": {"model": "gpt-live-1"}, "transport": webrtc},
                             {**AUTH, "Origin": "http://evil.example"})  # fmt: skip
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
            r = await create(gw, {"session": {"model": "gpt-live-1"}, "transport": webrtc}, page_auth)
            assert r.status_code == 201, r.text
            assert r.headers["access-control-allow-origin"] == "http://app.example"
            assert r.json()["session"]["id"].startswith("live_")
            again, _ = await make_browser()
            try:
                r = await create(gw, {"session": {"model": "gpt-live-1"}, "transport": webrtc}, page_auth)
                assert r.status_code == 401, r.text  # a client secret is spent on the session it opened
            finally:
                await again.close()
        finally:
            await browser.close()


async def test_a_page_re_offers_its_live_session_to_another_replica_and_carries_on() -> None:
    """The gateway's resume extension on a Live call: the page's call on A goes; its re-offer
    (``X-Omni-Resume``, the token from ``session.started``) to B resumes the same session,
    whose channel says ``session.resumed`` and goes on."""
    async with replicas() as (a, b):
        async with live_call(a, {"model": "gpt-live-1"}) as page:
            started = await page.wait_for("session.started")
            page.send({"type": "session.instructions.append", "event_id": "i1", "content": "One.",
                       "delegation_id": None})  # fmt: skip
            appended = await page.wait_for("session.instructions.appended", client_event_id="i1")
        resume = {"session_id": page.session_id, "resume_token": started["resume_token"],
                  "last_received_server_event_seq": appended["server_event_seq"]}  # fmt: skip
        await wait_for(lambda: not a.runtime.calls.calls, "the first call to end")
        browser, offer = await make_browser()
        try:
            events: list[dict[str, Any]] = []
            assert browser.channel is not None
            browser.channel.on("message", lambda m: events.append(orjson.loads(m)))
            r = await create(b, {"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": offer}},
                             {**AUTH, "X-Omni-Resume": orjson.dumps(resume).decode()})  # fmt: skip
            assert r.status_code == 201, r.text
            assert r.json()["session"]["id"] == page.session_id
            await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.json()["transport"]["sdp"],
                                                                        type="answer"))  # fmt: skip
            resumed = await first(events, "session.resumed")
            assert resumed["session_id"] == page.session_id
            browser.channel.send(orjson.dumps({"type": "session.instructions.append", "event_id": "i2",
                                               "content": "Two.", "delegation_id": None}).decode())  # fmt: skip
            again = await first(events, "session.instructions.appended", client_event_id="i2")
            assert again["server_event_seq"] > appended["server_event_seq"]
            for event in events:
                check_live_event(event, extensions=True)
            assert page.session_id in b.runtime.hosting.hosts  # it runs on B now
        finally:
            await browser.close()
        # A token that is not the session's: refused before any media.
        browser, offer = await make_browser()
        try:
            bad = orjson.dumps({**resume, "resume_token": "nope"}).decode()
            r = await create(a, {"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": offer}},
                             {**AUTH, "X-Omni-Resume": bad})  # fmt: skip
            assert r.status_code == 401 and r.json()["error"]["code"] == "resume_token_invalid", r.text
        finally:
            await browser.close()


# --- a stored session forked onto a WebRTC call (POST /v1/live/sessions/{id}/fork) ------------


async def stored_session(gw: RunningGateway) -> tuple[str, list[tuple[str, str]]]:
    """A Live session over a WebSocket with ``store: true``, given context and closed: its id
    and its conversation (role, text) as it closed."""
    url = f"ws://127.0.0.1:{gw.port}/v1/live/sessions"
    async with websockets.connect(url, additional_headers=AUTH) as ws:

        async def until(kind: str) -> dict[str, Any]:
            while True:
                event = orjson.loads(await ws.recv())
                check_live_event(event)
                if event["type"] == kind:
                    return event

        await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1", "store": True,
                                                              "instructions": "Be kind."}})  # fmt: skip
        session_id = (await until("session.started"))["session"]["id"]
        await send(ws, {"type": "session.thinking.append", "content": "the user is called Ada",
                        "delegation_id": None})  # fmt: skip
        await until("session.thinking.appended")
        kept = [(it.role, it.content[0].text or "") for it in gw.runtime.hosts[session_id].session.conversation]
        await send(ws, {"type": "session.close"})
        await until("session.closed")
    return session_id, kept


async def test_a_stored_session_forks_onto_a_webrtc_call_on_another_replica() -> None:
    """``client.live.sessions.fork`` (the official SDK) on replica B, of a session stored on A:
    201 with the SDK's ``SessionForkResponse``, the call's channel says ``session.started``
    with the stored settings and the overrides, the session carries the stored conversation
    on; another credential's fork, an unknown field and a session never stored are refused
    before any media."""
    from openai import AsyncOpenAI
    from openai.types.live import SessionForkResponse

    async with replicas() as (a, b):
        source, kept = await stored_session(a)
        browser, offer = await make_browser()
        try:
            events: list[dict[str, Any]] = []
            assert browser.channel is not None
            browser.channel.on("message", lambda m: events.append(orjson.loads(m)))
            client = AsyncOpenAI(api_key=KEY, base_url=f"{b.http}/v1")
            channel = {"allowed_server_events": [{"type": "session.started"}, {"type": "error"}]}
            forked = await client.live.sessions.fork(
                source, transport={"type": "webrtc", "sdp": offer}, session={"client": {"data_channel": channel}}
            )
            SessionForkResponse.model_validate(forked.model_dump(), strict=True)
            assert forked.session.id.startswith("live_") and forked.session.id != source
            await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=forked.transport.sdp, type="answer"))
            started = (await first(events, "session.started"))["session"]
            assert started["id"] == forked.session.id and started["instructions"] == "Be kind."
            assert started["store"] is True
            session = b.runtime.hosts[forked.session.id].session
            assert [(it.role, it.content[0].text or "") for it in session.conversation] == kept
            # The override holds: the channel sees only what its list names.
            browser.channel.send(orjson.dumps({"type": "session.instructions.append", "event_id": "i1",
                                               "content": "One.", "delegation_id": None}).decode())  # fmt: skip
            await wait_for(lambda: any(it.content[0].text == "One." for it in session.conversation), "the append")
            for event in events:
                check_live_event(event, extensions=True)
            assert {e["type"] for e in events} <= {"session.started", "error", "info"}
        finally:
            await browser.close()

        async def fork(body: dict[str, Any], key: str = KEY, of: str = source) -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as http:
                return await http.post(f"{b.http}/v1/live/sessions/{of}/fork", json=body,
                                       headers={"Authorization": f"Bearer {key}"})  # fmt: skip

        browser, offer = await make_browser()
        try:
            transport = {"type": "webrtc", "sdp": offer}
            r = await fork({"transport": transport}, key=OTHER)  # not this credential's
            assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found"), r.text
            r = await fork({"transport": transport}, of="live_" + "0" * 20)  # never stored
            assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found"), r.text
            r = await fork({"transport": transport, "session": {"model": "gpt-live-2"}})  # a fork takes no model
            assert (r.status_code, r.json()["error"]["code"]) == (400, "unknown_parameter"), r.text
            assert r.json()["error"]["param"] == "session.model"
            assert not b.runtime.calls.calls  # nothing was answered
        finally:
            await browser.close()
