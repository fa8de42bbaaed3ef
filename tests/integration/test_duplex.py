"""The duplex dialect of ``/v1/realtime`` (``?duplex=1``) against vLLM-Omni's
document, over real sockets, on the passthrough engine (50 words, each before
20 ms of audio, paced in real time: word i is produced at 20·i ms of audio).

The revision followed is ``docs/serving/realtime_duplex_api.md`` at
``doc.DUPLEX_DOC_REVISION`` and ``vllm_omni/clients/duplex.py`` at
``doc.DUPLEX_CLIENT_REVISION``. The client events are the document's own
examples (``support.upstream_docs``, each citing its section); the replies are
checked against the document's catalogue and its server examples (``doc.gaps``:
every key an example shows is there), and, end to end, by a client that
behaves as the current ``DuplexClient`` (``support.duplex_client``). Resume,
replay and the journal are the ones every dialect uses
(``tests/integration/test_resume.py``); what is proved here is what the
dialect adds: no throwaway ``session.created`` on ``?autostart=0``, a seq on
every session event and none on the connection events, ``session.closed`` last,
acks that cannot start a storm, the commit fan-out and the answer in the
document's order, playback truth to the millisecond, the epoch fence,
turn-taking events, and upstream's error codes and shapes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import websockets
from support import upstream_docs as doc
from support.duplex_client import DocDuplexClient
from support.gateway import Client, RunningGateway, connect, run_gateway

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

MODEL = "openbmb/MiniCPM-o-4_5"  # the document's model, served here by the passthrough engine
WORDS = "".join(f"w{i} " for i in range(50))  # the passthrough answer's transcript


@contextlib.asynccontextmanager
async def gateway(engine: PassthroughEngine | None = None, **settings: Any) -> AsyncIterator[RunningGateway]:
    async with run_gateway(
        Settings(engine="passthrough", model=MODEL, video_engine="none", **settings),
        engine=engine or PassthroughEngine(),
        vad_factory=None,
    ) as gw:
        yield gw


def duplex_url(gw: RunningGateway, path: str = "/v1/realtime", **query: str) -> str:
    params = {"duplex": "1", "model": MODEL, "autostart": "0", **query}
    return gw.url.removesuffix("/v1/realtime") + path + "?" + "&".join(f"{k}={v}" for k, v in params.items())


class Duplex(Client):
    """A raw client that acks every event with a seq, as upstream's DuplexClient does."""

    acks = 0

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        event = await super().recv(timeout)
        seq = event.get("server_event_seq")
        if isinstance(seq, int) and event["type"] != "session.closed":
            with contextlib.suppress(websockets.ConnectionClosed):  # the last event before a close
                await self.send({"type": "session.event_ack", "server_event_seq": seq})
                self.acks += 1
        return event

    async def open(self, **session: Any) -> dict[str, Any]:
        await self.send({"type": "session.update", "session": {"model": MODEL, "turn_detection": None, **session}})
        created = await self.wait_for("session.created")
        await self.wait_for("session.updated")
        return created

    async def answer(self, ms: int = 300) -> str:
        """Speak ``ms`` of audio, commit, and return the response id once it is created."""
        await self.send(doc.fill(doc.APPEND, audio=doc.pcm16(ms), duration_ms=ms))
        await self.send(doc.COMMIT)
        created = await self.wait_for("response.created")
        return str(created["response_id"])

    def seqs(self) -> list[int]:
        return [e["server_event_seq"] for e in self.events if "server_event_seq" in e]

    def of(self, kind: str, after: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.events[after:] if e["type"] == kind]


@contextlib.asynccontextmanager
async def duplex(gw: RunningGateway, path: str = "/v1/realtime", **query: str) -> AsyncIterator[Duplex]:
    async with websockets.connect(duplex_url(gw, path, **query), max_size=None, close_timeout=1) as ws:
        yield Duplex(ws)


def names(events: list[dict[str, Any]], item_id: str) -> list[dict[str, Any]]:
    """The events that name ``item_id`` (as item_id, or as their item's id)."""
    return [e for e in events if item_id in (e.get("item_id"), (e.get("item") or {}).get("id"))]


# --- opening ------------------------------------------------------------------------------------


async def test_autostart_0_opens_with_the_first_session_update_and_no_throwaway_session() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.send(doc.fill(doc.SESSION_UPDATE))  # "Session lifecycle": the document's open handshake
        created = await c.wait_for("session.created")
        updated = await c.wait_for("session.updated")
        assert c.types()[:2] == ["session.created", "session.updated"]
        assert doc.gaps(doc.SESSION_CREATED, created) == [] and doc.gaps(doc.SESSION_UPDATED, updated) == []
        assert created["attachment_generation"] == 1 and "incarnation" not in created
        assert created["resume_token"].startswith("rt_") and created["server_event_seq"] == 1
        s = created["session"]
        assert s == updated["session"]
        assert s["model"] == MODEL and s["state"] == "open" and s["turn_state"] == "idle" and s["epoch"] == 0
        assert (s["overlap_policy"], s["playback_commit_policy"], s["idle_timeout_s"]) == (
            "listen_only",
            "ack_only",
            300,
        )
        assert s["instructions"] == "You are a concise voice assistant." and s["temperature"] == 0.7
        assert s["audio"]["input"]["sample_rate_hz"] == 16000 and s["audio"]["output"]["format"]["rate"] == 24000
        assert s["capabilities"]["supports_session_resume"] and s["capabilities"]["supports_barge_in"]
        assert s["playback"] == {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}
        await c.send(doc.HEARTBEAT)
        await c.wait_for("session.heartbeat_ack")
        # ref_audio is taken, never refused; and no session.warning, an event not in the catalogue
        assert "error" not in c.types() and "session.warning" not in c.types()


async def test_session_warnings_go_only_to_a_client_that_opted_in() -> None:
    async with gateway() as gw, duplex(gw) as c:
        update = doc.fill(doc.SESSION_UPDATE)
        await c.send({**update, "session": {**update["session"], "gateway_events": True, "volume": 11}})
        created = await c.wait_for("session.created")
        assert created["session"]["gateway_events"] is True
        await c.send(doc.HEARTBEAT)
        await c.wait_for("session.heartbeat_ack")  # (the warnings came before it)
        assert {"session.ref_audio", "session.volume"} <= {w["param"] for w in c.of("session.warning")}
        await c.send(doc.fill(doc.APPEND_WITH_FRAMES))
        assert (await c.wait_for("session.warning"))["param"] == "video_frames"


async def test_a_session_opens_at_connect_with_a_model_and_without_autostart_0() -> None:
    async with gateway() as gw:
        async with websockets.connect(gw.url + f"?duplex=1&model={MODEL}", close_timeout=1) as ws:
            first = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
            assert first["type"] == "session.created" and first["server_event_seq"] == 1


async def test_v1_duplex_is_an_alias_of_the_duplex_route() -> None:
    """ "Quick Start": ws://<host>/v1/duplex is an alias of the same route (it always selects it)."""
    async with gateway() as gw, duplex(gw, "/v1/duplex", duplex="0") as c:
        created = await c.open()
        assert doc.gaps(doc.SESSION_CREATED, created) == []
        await c.send(doc.HEARTBEAT)
        assert (await c.wait_for("session.heartbeat_ack"))["session_id"] == created["session"]["id"]


async def test_a_resume_only_socket_refuses_other_events_until_a_session_exists() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.send(doc.HEARTBEAT)
        ack = await c.recv()  # no session: a connection event, without a seq
        assert ack["type"] == "session.heartbeat_ack" and "server_event_seq" not in ack
        await c.send(doc.fill(doc.APPEND))
        refused = await c.recv()
        assert refused["type"] == "error" and refused["error"]["code"] == "session_not_open"
        assert "server_event_seq" not in refused
        await c.send({"type": "session.update", "session": {"model": MODEL, "overlap_policy": "sometimes"}})
        bad = await c.recv()
        assert bad["error"]["code"] == "invalid_value" and bad["error"]["param"] == "session.overlap_policy"
        await c.open()  # the socket goes on: a good update opens the session


async def test_the_pre_realtime_append_aliases_are_refused_and_the_documents_formats_taken() -> None:
    """ "Event catalogue": push_chunk and input.audio.append are not accepted on this route;
    the input formats are pcm16, pcm_s16le, s16le (pcm_f32le is not spoken here), G.711."""
    async with gateway() as gw, duplex(gw) as c:
        await c.open(input_audio_format="s16le")
        for kind in doc.DUPLEX_NOT_ACCEPTED:
            await c.send({**doc.fill(doc.APPEND), "type": kind, "event_id": "old"})
            err = await c.wait_for("error")
            assert (err["error"]["code"], err["error"]["event_id"]) == ("unknown_event", "old")
        await c.send({"type": "session.update", "session": {"input_audio_format": "pcm_f32le"}})
        err = await c.wait_for("error")
        assert err["error"]["code"] == "unsupported_audio_format" and "pcm_f32le" in err["error"]["message"]
        await c.send({**doc.fill(doc.APPEND, audio=doc.pcm16(200)), "input_audio_format": "s16le"})
        await c.send(doc.COMMIT)
        await c.wait_for("input_audio_buffer.committed")


# --- every example, every seq --------------------------------------------------------------------


async def test_every_client_example_of_the_document_is_answered_as_documented() -> None:
    """Each C→S example of "Message examples", in a live session; only the documented
    replies come back, each with the keys of the document's example, and no error (the tool
    result needs tools: not here, see docs/duplex.md)."""
    async with gateway() as gw, duplex(gw) as c:
        await c.send(doc.fill(doc.SESSION_UPDATE))
        await c.wait_for("session.created")
        mark = len(c.events)
        await c.send(doc.HEARTBEAT)
        ack = await c.wait_for("session.heartbeat_ack")
        assert doc.gaps(doc.HEARTBEAT_ACK, ack) == [] and "server_event_seq" in ack
        await c.send(doc.EVENT_ACK)  # seq 48, beyond what was sent: clamped, never answered
        await c.send(doc.fill(doc.APPEND_WITH_FRAMES))
        await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(200)))
        await c.send(doc.COMMIT)
        turn = len(c.events)
        await c.wait_for("response.done")
        committed = c.of("input_audio_buffer.committed", turn)[0]
        user = committed["item_id"]
        assert [e["type"] for e in names(c.events[turn:], user) if e["type"] in doc.COMMIT_FAN_OUT] == list(
            doc.COMMIT_FAN_OUT
        )
        rid = c.of("response.created", turn)[0]["response_id"]
        item_id = c.of("response.output_item.added", turn)[0]["item"]["id"]
        await c.send(doc.fill(doc.PLAYBACK_ACK, response_id=rid, item_id=item_id))
        ack = await c.wait_for("playback.acknowledged")
        assert doc.gaps(doc.PLAYBACK_ACKNOWLEDGED, ack) == []
        assert ack["event"]["played_ms"] == 1000 and ack["event"]["item_id"] == item_id
        await c.send(doc.fill(doc.ITEM_RETRIEVE, item_id=item_id))
        retrieved = await c.wait_for("conversation.item.retrieved")
        assert doc.gaps(doc.ITEM_RETRIEVED, retrieved) == [] and retrieved["item"]["id"] == item_id
        await c.send(doc.fill(doc.ITEM_TRUNCATE, item_id=item_id, audio_end_ms=900))
        truncated = await c.wait_for("conversation.item.truncated")
        assert (
            doc.gaps(doc.ITEM_TRUNCATED, truncated) == []
            and truncated["event"]["type"] == "conversation.item.truncated"
        )
        await c.send(doc.ITEM_CREATE)
        await c.wait_for(lambda e: e["type"] == "conversation.item.done" and e["item"]["role"] == "user")
        user_item = c.events[-1]["item"]["id"]
        await c.send(doc.fill(doc.ITEM_DELETE, item_id=user_item))
        deleted = await c.wait_for("conversation.item.deleted")
        assert deleted["event"] == {"type": "conversation.item.deleted", "item_id": user_item}
        await c.send(doc.SILENCE_COMMIT)
        listen = await c.wait_for("response.listen")
        assert doc.gaps(doc.RESPONSE_LISTEN, listen) == [] and listen["response"]["status"] == "listening"
        await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(200)))
        await c.send(doc.CLEAR)
        assert set(await c.wait_for("input_audio_buffer.cleared")) - {"event_id", "server_event_seq"} == set(
            doc.CLEARED
        )
        await c.send(doc.INPUT_CANCEL)
        await c.wait_for("input_audio_buffer.cleared")  # (wait_for reads on: this is the second)
        await c.send(doc.TEXT_APPEND)
        await c.send(doc.COMMIT_ALIAS)  # input.commit: the text becomes a user item, then an answer
        await c.wait_for(
            lambda e: e["type"] == "conversation.item.added" and e["item"]["content"][0].get("text") == "and tomorrow?"
        )
        rid2 = (await c.wait_for("response.created"))["response_id"]
        await c.wait_for("response.speak")
        await c.send(doc.fill(doc.RESPONSE_CANCEL, response_id=rid2))
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "cancelled" and done["response_id"] == rid2
        await c.send(doc.RESPONSE_CREATE)
        created = await c.wait_for("response.created")
        meta = created["response"]["metadata"]
        assert meta["trace"] == "turn-3" and meta["duplex_event"]["response_id"] == created["response_id"]
        await c.wait_for("response.speak")
        await c.send(doc.OUTPUT_AUDIO_CLEAR)
        cleared = await c.wait_for("output_audio_buffer.cleared")
        assert cleared["response_id"] == created["response_id"]
        done = await c.wait_for("response.done")
        assert done["response"]["status_details"]["reason"] == "output_audio_buffer_clear"
        await c.send(doc.BARGE_IN)
        assert (await c.wait_for("turn.event"))["event"] == "barge_in"
        await c.send(doc.TURN_SIGNAL)
        turn_event = await c.wait_for("turn.event")
        assert turn_event["event"] == "barge_in" and "turn_state" in turn_event and "epoch" in turn_event
        await c.send(doc.CLOSE)
        closed = await c.wait_for("session.closed")
        assert doc.gaps(doc.SESSION_CLOSED, closed) == []
        assert (closed["reason"], closed["event"]) == (
            "client_close",
            {"type": "session.closed", "reason": "client_close"},
        )
        assert closed["epoch"] == turn_event["epoch"]
        with pytest.raises(websockets.ConnectionClosedOK):
            await c.ws.recv()
        assert [e for e in c.events[mark:] if e["type"] == "error"] == []
        # Every type sent is one of the document's 42; every event of the session has a seq, in order,
        # and the last is session.closed.
        assert {e["type"] for e in c.events} <= set(doc.DUPLEX_SERVER_TYPES)
        assert all("server_event_seq" in e for e in c.events)
        assert c.seqs() == list(range(1, len(c.events) + 1)) and c.events[-1] is closed


async def test_an_ack_is_never_answered_with_an_event_that_has_a_seq() -> None:
    """The storm of the issue: a client that acks every event with a seq, and whose acks
    are malformed, must not get an endless stream of errors, in either dialect."""
    async with gateway() as gw:
        async with duplex(gw) as c:
            await c.open()
            for _ in range(20):
                await c.send({"type": "session.event_ack"})  # no seq at all
            errors = [await c.recv() for _ in range(20)]
            assert {e["error"]["code"] for e in errors} == {"missing_required_parameter"}
            assert all("server_event_seq" not in e for e in errors)
            await c.send(doc.HEARTBEAT)
            assert (await c.recv())["type"] == "session.heartbeat_ack"  # nothing else was queued
        async with connect(gw.url) as ga:  # the GA dialect: the same DuplexClient-style acks are valid
            created = await ga.wait_for("session.created")
            await ga.wait_for("conversation.created")
            await ga.send({"type": "session.event_ack", "server_event_seq": created["server_event_seq"]})
            await ga.send({"type": "session.event_ack", "server_event_seq": "x"})
            bad = await ga.recv()
            assert bad["type"] == "error" and bad["server_event_seq"] == 0  # connection-level: never acked back
            await ga.send({"type": "session.event_ack", "server_event_seq": 0})
            await ga.send({"type": "input_audio_buffer.clear"})
            assert (await ga.recv())["type"] == "input_audio_buffer.cleared"


# --- a turn and its answer, in the document's order ----------------------------------------------


async def test_a_manual_turn_fans_out_in_the_documents_order_with_its_transcript() -> None:
    """ "Input": speech_started / speech_stopped around a client-committed turn, then the commit
    fan-out "in this order"; conversation.item.done carries the transcript."""
    async with gateway() as gw, duplex(gw) as c:
        await c.open()
        await c.send(doc.fill(doc.APPEND, audio=bytes(3200), duration_ms=100, is_speech=False))
        await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(200), duration_ms=200))  # is_speech: true
        started = await c.wait_for("input_audio_buffer.speech_started")
        assert doc.gaps(doc.SPEECH_STARTED, started) == [] and started["audio_start_ms"] == 100
        await c.send(doc.COMMIT)
        stopped = await c.wait_for("input_audio_buffer.speech_stopped")
        assert (stopped["item_id"], stopped["audio_end_ms"]) == (started["item_id"], 300)
        done = await c.wait_for(
            lambda e: e["type"] == "conversation.item.done" and e["item"]["id"] == started["item_id"]
        )
        fan_out = [e for e in names(c.events, started["item_id"]) if e["type"] in doc.COMMIT_FAN_OUT]
        assert [e["type"] for e in fan_out] == list(doc.COMMIT_FAN_OUT)
        for example, sent in zip(
            (
                doc.USER_ITEM_ADDED,
                doc.USER_ITEM_CREATED,
                doc.COMMITTED,
                doc.TRANSCRIPTION_COMPLETED,
                doc.USER_ITEM_DONE,
            ),
            fan_out,
            strict=True,
        ):
            assert doc.gaps(example, sent) == [], example["type"]
        committed, completed = fan_out[2], fan_out[3]
        assert committed["event"]["message"] == doc.COMMITTED["event"]["message"]
        assert committed["event"]["turn_id"] == 1 and committed["event"]["realtime_item_id"] == started["item_id"]
        assert completed["transcript"] and done["item"]["content"][0]["transcript"] == completed["transcript"]
        assert c.types().index("input_audio_buffer.speech_stopped") < c.types().index("input_audio_buffer.committed")
        assert not any(k.endswith("input_audio_transcription.delta") for k in c.types())


async def test_an_answer_is_the_documents_from_response_created_to_rate_limits_updated() -> None:
    """ "Response lifecycle": the opening (the item added and created before output_item.added),
    response.speak before the first audio delta, "exactly one" transcript delta per audio
    delta, the closing events, and the duplex event under response.metadata."""
    async with gateway() as gw, duplex(gw) as c:
        await c.open()
        rid = await c.answer()
        mark = len(c.events) - 1
        done = await c.wait_for("rate_limits.updated")
        item_id = c.of("response.output_item.added", mark)[0]["item"]["id"]
        assistant = names(c.events[mark:], item_id)
        answer = [
            e
            for e in c.events[mark:]
            if e.get("response_id") == rid or e["type"] == "rate_limits.updated" or e in assistant
        ]
        kinds = [e["type"] for e in answer]
        assert [k for k in kinds if not k.endswith(".delta")] == [k for k in doc.ANSWER if not k.endswith(".delta")]
        deltas = [e for e in answer if e["type"].endswith(".delta")]
        assert [e["type"] for e in deltas] == [
            "response.output_audio.delta",
            "response.output_audio_transcript.delta",
        ] * 50
        assert [e["delta"] for e in deltas[1::2]] == [f"w{i} " for i in range(50)]
        assert kinds.index("response.speak") == kinds.index("response.output_audio.delta") - 1
        assert kinds.count("response.speak") == 1
        examples = {e["type"]: e for e in (
            doc.RESPONSE_CREATED, doc.ASSISTANT_ITEM_ADDED, doc.OUTPUT_ITEM_ADDED, doc.CONTENT_PART_ADDED,
            doc.RESPONSE_SPEAK, doc.AUDIO_DELTA, doc.TRANSCRIPT_DELTA, doc.AUDIO_DONE, doc.TRANSCRIPT_DONE,
            doc.CONTENT_PART_DONE, doc.OUTPUT_ITEM_DONE, doc.RESPONSE_DONE, doc.RATE_LIMITS_UPDATED,
        )}  # fmt: skip
        for kind, example in examples.items():
            assert doc.gaps(example, next(e for e in answer if e["type"] == kind)) == [], kind
        final = c.of("response.done", mark)[0]
        assert final["response"]["metadata"]["playback"]["generated_ms"] == 1000 and done["rate_limits"] == []
        assert c.of("response.output_audio_transcript.done", mark)[0]["transcript"] == WORDS


async def test_a_text_answer_never_says_response_speak() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open(modalities=["text"])
        await c.send(doc.ITEM_CREATE)
        await c.send({"type": "response.create"})
        await c.wait_for("response.done")
        assert "response.speak" not in c.types() and "response.output_text.delta" in c.types()


# --- resume ------------------------------------------------------------------------------------


async def test_resume_on_an_autostart_0_socket_replays_with_no_session_created() -> None:
    async with gateway() as gw:
        async with duplex(gw) as c:
            created = await c.open()
            sid, token = created["session"]["id"], created["resume_token"]
            rid = await c.answer()
            await c.wait_for(
                lambda e: e["type"] == "response.output_audio.delta" and e["metadata"]["audio_duration_ms"] >= 200
            )
            last = max(c.seqs())
        await asyncio.sleep(0.3)  # the answer goes on, journaled, while no socket is attached
        async with duplex(gw) as r:
            await r.send(doc.fill(doc.RESUME, session_id=sid, resume_token=token, last_received_server_event_seq=last))
            resumed = await r.recv()
            # "Session lifecycle": S→C session.resumed; a connection event (no seq: see docs/duplex.md)
            assert doc.gaps(doc.SESSION_RESUMED, resumed) == [] and "server_event_seq" not in resumed
            assert (resumed["session_id"], resumed["attachment_generation"]) == (
                sid,
                2,
            ) and "incarnation" not in resumed
            assert resumed["resume_token"] != token and resumed["session"]["id"] == sid
            done = await r.wait_for("response.done")
            seqs = r.seqs()
            assert seqs == list(range(last + 1, seqs[-1] + 1))  # exactly once, in order
            assert "session.created" not in r.types() and done["response_id"] == rid
            words = "".join(
                e["delta"] for e in c.events + r.events if e["type"] == "response.output_audio_transcript.delta"
            )
            assert words == WORDS


async def test_a_replaced_socket_learns_its_attachment_generation() -> None:
    async with gateway() as gw, duplex(gw) as first:
        created = await first.open()
        async with duplex(gw) as second:
            await second.send(
                doc.fill(
                    doc.RESUME,
                    session_id=created["session"]["id"],
                    resume_token=created["resume_token"],
                    last_received_server_event_seq=2,
                )
            )
            assert (await second.recv())["type"] == "session.resumed"
            replaced = await first.wait_for("session.replaced")  # no gateway_events needed: it is the document's
            assert doc.gaps(doc.SESSION_REPLACED, replaced) == []
            assert replaced["attachment_generation"] == 1 and "server_event_seq" not in replaced
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await first.ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4009


async def test_refused_resumes_use_upstreams_codes_in_the_handshake_shape() -> None:
    """ "Errors": handshake-stage errors use the flat native shape {type, error: "...", code}."""
    async with gateway() as gw, duplex(gw) as c:
        await c.send(doc.fill(doc.RESUME, session_id="duplex-nope", resume_token="rt_nope"))
        refused = await c.recv()
        assert set(refused) - {"event_id"} == set(doc.HANDSHAKE_ERROR) and isinstance(refused["error"], str)
        assert refused["code"] == "session_resume_expired" and refused["code"] in doc.FATAL_RESUME_CODES
        created = await c.open()
        async with duplex(gw) as other:
            await other.send(doc.fill(doc.RESUME, session_id=created["session"]["id"], resume_token="rt_wrong"))
            wrong = await other.recv()
            assert wrong["code"] == "invalid_resume_token" and isinstance(wrong["error"], str)
            assert "server_event_seq" not in wrong


async def test_a_journal_that_no_longer_holds_the_gap_asks_for_a_resync_with_upstreams_reason() -> None:
    async with gateway(journal_max_events=20) as gw:
        async with duplex(gw) as c:
            created = await c.open()
            await c.answer()
            await c.wait_for("response.done")
        async with duplex(gw) as r:
            await r.send(
                doc.fill(
                    doc.RESUME,
                    session_id=created["session"]["id"],
                    resume_token=created["resume_token"],
                    last_received_server_event_seq=2,
                )
            )
            resync = await r.recv()
            assert doc.gaps(doc.SESSION_RESYNC_REQUIRED, resync) == [] and "server_event_seq" not in resync
            assert resync["reason"] == "journal_overflow" and resync["message"]
            assert resync["session"]["id"] == created["session"]["id"] and resync["conversation"]


# --- playback truth, the epoch, overlap ---------------------------------------------------------


async def test_a_client_that_builds_item_ids_from_response_ids_succeeds_across_a_resume() -> None:
    """ "Endpoint and transport": the item id is ``item_<response_id>``. A client that never
    reads the item id, only response.created's ``response_id``, acknowledges playback,
    retrieves and truncates with the id it built, on its socket and on the one it resumes on."""
    async with gateway() as gw:
        async with duplex(gw) as c:
            created = await c.open()
            sid, token = created["session"]["id"], created["resume_token"]
            rid = await c.answer()
            built = f"item_{rid}"
            await c.wait_for(
                lambda e: e["type"] == "response.output_audio.delta" and e["metadata"]["audio_duration_ms"] >= 200
            )
            assert c.of("response.output_audio.delta")[0]["item_id"] == built
            await c.send({"type": "playback.ack", "response_id": rid, "item_id": built, "played_ms": 200})
            assert (await c.wait_for("playback.acknowledged"))["event"]["item_id"] == built
            await c.wait_for("response.done")
            await c.send({"type": "conversation.item.retrieve", "item_id": built})
            assert (await c.wait_for("conversation.item.retrieved"))["item"]["id"] == built
            await c.send({"type": "conversation.item.truncate", "item_id": built, "content_index": 0,
                          "audio_end_ms": 150})  # fmt: skip
            assert (await c.wait_for("conversation.item.truncated"))["item_id"] == built
            last = max(c.seqs())
        async with duplex(gw) as r:
            await r.send(doc.fill(doc.RESUME, session_id=sid, resume_token=token, last_received_server_event_seq=last))
            await r.wait_for("session.resumed")
            await r.send({"type": "conversation.item.retrieve", "item_id": built})
            assert (await r.wait_for("conversation.item.retrieved"))["item"]["id"] == built
            rid2 = await r.answer()
            await r.send({"type": "playback.ack", "response_id": rid2, "item_id": f"item_{rid2}", "played_ms": 40})
            assert (await r.wait_for("playback.acknowledged"))["event"]["item_id"] == f"item_{rid2}"
            await r.send({"type": "conversation.item.truncate", "item_id": built, "content_index": 0,
                          "audio_end_ms": 100})  # fmt: skip
            assert (await r.wait_for("conversation.item.truncated"))["item_id"] == built
            assert "error" not in c.types() + r.types()


# --- input-clocked sessions (the document's newest sibling revision) ------------------------------


async def test_a_lockstep_client_steps_an_input_clocked_session_and_resumes_where_it_stopped() -> None:
    """ "Input-clocked sessions" (``doc.INPUT_CLOCK_REVISION``): a client that sends each input
    only once the previous one is acknowledged. Every input gets one input_audio_buffer.processed,
    in order, after everything it caused (the answer through rate_limits.updated); the clock is
    fixed; a resume on a new socket says where it stopped (session.input_index) and goes on.
    Answers last 5 s here, so that the close surely comes while the last one runs."""
    async with gateway(PassthroughEngine(audio_chunks=250)) as gw:
        async with duplex(gw) as c:
            created = await c.open(extra_body={**doc.INPUT_CLOCK, "auto_response": True})
            assert created["session"]["input_index"] == 0
            sid, token = created["session"]["id"], created["resume_token"]
            await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(300), duration_ms=300))
            first = await c.wait_for("input_audio_buffer.processed")
            assert doc.gaps(doc.INPUT_PROCESSED, first) == []
            assert (first["input_index"], first["audio_end_ms"], first["units"]) == (1, 300, [])
            await c.send(doc.COMMIT)
            second = await c.wait_for("input_audio_buffer.processed")
            turn = c.types()[c.events.index(first) + 1 : c.events.index(second)]
            assert turn[-2:] == ["response.done", "rate_limits.updated"]  # all it caused, then its ack
            assert "conversation.item.input_audio_transcription.completed" in turn
            assert (second["input_index"], second["trigger"], second["unit_end_ms"]) == (
                2, "input_audio_buffer.commit", 300,
            )  # fmt: skip
            assert second["units"] == [{"end_ms": 300, "decision": "speak"}]
            await c.send({"type": "session.update", "event_id": "u", "session": {"extra_body": {"clock": None}}})
            refused = await c.wait_for("error")
            assert (refused["error"]["code"], refused["error"]["event_id"]) == ("input_clock_update_unsupported", "u")
            await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(100), duration_ms=100))
            await c.wait_for(lambda e: e["type"] == "input_audio_buffer.processed" and e["input_index"] == 3)
            last = max(c.seqs())
        async with duplex(gw) as r:
            await r.send(doc.fill(doc.RESUME, session_id=sid, resume_token=token, last_received_server_event_seq=last))
            resumed = await r.wait_for("session.resumed")
            assert resumed["session"]["input_index"] == 3  # what reached the session: resend what comes after
            await r.send(doc.fill(doc.APPEND, audio=doc.pcm16(100), duration_ms=100))
            fourth = await r.wait_for("input_audio_buffer.processed")
            assert (fourth["input_index"], fourth["audio_end_ms"]) == (4, 500)
            await r.send({"type": "response.create", "response": {"modalities": ["text"]}})
            await r.send(doc.CLOSE)  # while the answer runs: one teardown ack, then session.closed
            closed = await r.wait_for("session.closed")
            teardown = r.of("input_audio_buffer.processed")[-1]
            assert r.events.index(teardown) == r.events.index(closed) - 1
            assert (teardown["input_index"], teardown["trigger"]) == (5, "response.create")
            assert teardown["units"] == [{"end_ms": 300, "decision": "aborted", "reason": "client_close"}]
        assert "error" not in r.types() and c.types().count("error") == 1


async def test_playback_acks_cut_the_history_to_what_was_heard_to_the_millisecond() -> None:
    """Acked to 430 ms, then a barge-in: the assistant item keeps the words whose audio had
    started by then (w0..w21) and exactly 430 ms of audio (a truncate beyond it is refused)."""
    async with gateway() as gw, duplex(gw) as c:
        await c.open()
        rid = await c.answer()
        await c.wait_for(
            lambda e: e["type"] == "response.output_audio.delta" and e["metadata"]["audio_duration_ms"] >= 500
        )
        await c.send({"type": "playback.ack", "response_id": rid, "played_ms": 430, "committed_ms": 430})
        acked = await c.wait_for("playback.acknowledged")
        assert acked["event"]["committed_ms"] == 430 and not acked["event"]["history_committed"]
        epoch = acked["event"]["epoch"]
        await c.send(doc.BARGE_IN)
        done = await c.wait_for("response.done")
        # "Response lifecycle": S→C response.done (cancelled by barge-in); the barge-in advanced
        # the epoch before the answer's last events.
        assert doc.gaps(doc.RESPONSE_DONE_BARGE_IN, done) == []
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "barge_in"}
        assert done["response"]["metadata"]["epoch"] == epoch + 1
        heard = "".join(f"w{i} " for i in range(22))
        assert done["response"]["output"][0]["content"][0]["transcript"] == heard
        item_id = done["response"]["output"][0]["id"]
        await c.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 432}
        )
        refused = await c.wait_for("error")
        assert refused["error"]["code"] == "invalid_truncate" and "(430 ms)" in refused["error"]["message"]
        # A truncating ack says exactly what was heard; the item follows it, down or up.
        await c.send({**doc.PLAYBACK_ACK_TRUNCATE, "response_id": rid, "played_ms": 101, "committed_ms": 101})
        await c.wait_for(lambda e: e["type"] == "playback.acknowledged" and e["event"]["truncate"])
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await c.wait_for("conversation.item.retrieved"))["item"]
        assert item["content"][0]["transcript"] == "w0 w1 w2 w3 w4 w5 "


async def test_ack_only_keeps_an_answer_in_history_only_as_far_as_acknowledged() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open(playback_commit_policy="ack_only")
        rid = await c.answer()
        done = await c.wait_for("response.done")
        item_id = done["response"]["output"][0]["id"]
        assert done["response"]["status"] == "completed"  # the answer was generated whole
        assert done["response"]["metadata"]["committed"] is False  # but not heard yet
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        assert (await c.wait_for("conversation.item.retrieved"))["item"]["content"][0]["transcript"] == ""
        for played in (250, 1000):
            await c.send({"type": "playback.ack", "response_id": rid, "played_ms": played})
        last = await c.wait_for(lambda e: e["type"] == "playback.acknowledged" and e["event"]["played_ms"] == 1000)
        assert last["event"]["history_committed"] is True
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = await c.wait_for("conversation.item.retrieved")
        assert item["item"]["content"][0]["transcript"] == WORDS


async def test_a_barge_in_stops_an_answer_that_was_all_sent_but_still_plays() -> None:
    """An engine faster than real time: the answer's second of audio is all sent (response.done)
    long before the client has played it. The ledger knows it still plays: a barge-in stops
    it (output_audio_buffer.cleared, the epoch), and the item keeps what the client heard."""
    async with gateway(PassthroughEngine(paced=False)) as gw, duplex(gw) as c:
        await c.open()
        rid = await c.answer()
        done = await c.wait_for("response.done")
        item_id = done["response"]["output"][0]["id"]
        await c.send({"type": "playback.ack", "response_id": rid, "played_ms": 430, "committed_ms": 430})
        await c.wait_for("playback.acknowledged")
        await c.send(doc.BARGE_IN)
        cleared = await c.wait_for("output_audio_buffer.cleared")
        truncated = await c.wait_for("conversation.item.truncated")
        turn = await c.wait_for("turn.event")
        assert doc.gaps(doc.OUTPUT_AUDIO_CLEARED, cleared) == [] and cleared["response_id"] == rid
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 430)
        assert turn["epoch"] == done["response"]["metadata"]["epoch"] + 1 and turn["turn_state"] == "barge_in"
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await c.wait_for("conversation.item.retrieved"))["item"]
        assert item["content"][0]["transcript"] == "".join(f"w{i} " for i in range(22))


async def test_listen_only_defers_the_answer_to_speech_that_overlaps_one() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open(overlap_policy="listen_only")
        first = await c.answer()
        for _ in range(8):  # 800 ms of overlapping speech (hinted): past overlap_short_ack_ms
            await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(100), duration_ms=100))
        decision = await c.wait_for("overlap.decision")
        # "Overlap and barge-in": S→C overlap.decision, its details under metadata
        assert doc.gaps(doc.OVERLAP_LISTEN, decision) == []
        assert (decision["policy"], decision["action"], decision["reason"]) == (
            "listen_only",
            "listen",
            "long_overlap_speech",
        )
        assert decision["metadata"] == {**doc.OVERLAP_LISTEN["metadata"], "overlap_ms": 700}
        await c.send(doc.COMMIT)
        committed = await c.wait_for("input_audio_buffer.committed")
        assert doc.gaps(doc.COMMITTED_DEFERRED, committed) == [] and committed["event"]["response_create_deferred"]
        done = await c.wait_for("response.done")
        assert done["response_id"] == first and done["response"]["status"] == "completed"
        second = await c.wait_for("response.created")
        assert second["response_id"] != first


async def test_barge_in_on_speech_cancels_the_answer_and_a_short_remark_is_dropped() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open(overlap_policy="barge_in_on_speech", overlap_barge_in_ms=400)
        await c.answer()
        await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(200), duration_ms=200))
        await c.send(doc.fill(doc.APPEND, audio=bytes(3200), duration_ms=100, is_speech=False))
        drop = await c.wait_for("overlap.decision")
        assert (drop["action"], drop["reason"], drop["metadata"]) == (
            "drop",
            "short_overlap_speech",
            {"overlap_ms": 200, "buffer_audio": False},
        )
        for _ in range(4):
            await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(100), duration_ms=100))
        barge = await c.wait_for(lambda e: e["type"] == "overlap.decision" and e["action"] == "barge_in")
        assert "metadata" not in barge  # as the document's barge_in decision
        done = await c.wait_for("response.done")
        assert done["response"]["status_details"]["reason"] == "barge_in"
        assert done["response"]["metadata"]["epoch"] == barge["epoch"] + 1
        await c.send(doc.TURN_SIGNAL)  # a barge-in with nothing to stop: the fence advances all the same
        assert (await c.wait_for("turn.event"))["epoch"] == barge["epoch"] + 2


# --- the end of a session --------------------------------------------------------------------


async def test_idle_sessions_expire_and_heartbeats_keep_them() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open(idle_timeout_s=1)
        for _ in range(3):
            await asyncio.sleep(0.5)
            await c.send(doc.HEARTBEAT)
        assert "session.expired" not in c.types()
        expired = await c.wait_for("session.expired", timeout=5)
        assert doc.gaps(doc.SESSION_EXPIRED, expired) == [] and "server_event_seq" in expired
        assert expired["reason"] == "idle_ttl_expired" and "incarnation" not in expired
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await c.ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4008


async def test_session_closed_is_the_last_event_even_while_an_answer_streams() -> None:
    async with gateway() as gw:
        async with duplex(gw) as c:
            created = await c.open()
            await c.answer()
            await c.wait_for("response.output_audio.delta")
            await c.send({"type": "close"})  # an alias of session.close
            closed = await c.wait_for("session.closed")
            assert closed["reason"] == "client_close" and closed["server_event_seq"] == max(c.seqs())
            with pytest.raises(websockets.ConnectionClosedOK):
                while True:
                    await c.recv()
            assert c.events[-1] is closed
        async with duplex(gw) as r:
            await r.send(
                doc.fill(
                    doc.RESUME,
                    session_id=created["session"]["id"],
                    resume_token=created["resume_token"],
                    last_received_server_event_seq=0,
                )
            )
            assert (await r.recv())["code"] == "session_resume_expired"  # closed for good


async def test_errors_use_upstreams_codes_where_it_has_them() -> None:
    async with gateway() as gw, duplex(gw) as c:
        await c.open()
        await c.send(doc.COMMIT)
        err = await c.wait_for("error")
        # "Errors": S→C error, the Realtime shape
        assert doc.gaps(doc.ERROR_BUFFER_EMPTY, err) == []
        assert err["error"]["code"] == "input_audio_buffer_empty" and err["error"]["event_id"] == "evt_0060"
        await c.send(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(bytes(640)).decode(),
                "sample_rate_hz": 24000,
            }
        )
        err = await c.wait_for("error")
        assert err["error"]["code"] == "unsupported_audio_format" and err["error"]["param"] == "sample_rate_hz"


# --- a client written to the document ------------------------------------------------------------


async def test_a_client_written_to_the_document_holds_a_session_through_a_drop() -> None:
    """The current DuplexClient's behaviour (support.duplex_client): ack after every event,
    heartbeats, playback acks, a barge-in and a resume after its socket drops: no error, all
    the audio and transcript, and session.closed last."""
    async with gateway() as gw:
        async with DocDuplexClient(gw.url, model=MODEL, heartbeat_interval_s=0.2, backoff_s=(0.05, 0.2)) as dc:
            await dc.append(doc.pcm16(300))
            await dc.commit()
            answer = await wait_answer(dc)
            await dc.wait(lambda: answer.audio_ms >= 300)
            await dc.ack_playback(answer.audio_ms, response_id=answer.response_id)
            dc._ws.transport.abort()  # the socket drops mid-answer
            await dc.wait(lambda: dc.resumes == 1)
            await dc.wait(lambda: answer.done is not None)
            assert answer.done is not None and answer.done["response"]["status"] == "completed"
            assert answer.transcript == WORDS and answer.audio_ms == 1000 and answer.decision == "speak"
            assert "connection.resumed" in dc.types()
            await dc.append(doc.pcm16(300))
            await dc.commit()
            second = await wait_answer(dc, after=answer.response_id)
            await dc.wait(lambda: second.audio_ms >= 200)
            await dc.barge_in()
            await dc.wait(lambda: second.done is not None)
            assert second.done is not None and second.done["response"]["status"] == "cancelled"
            await asyncio.sleep(0.3)
            await dc.close()
        assert dc.errors() == [] and dc.heartbeats_sent >= 1 and dc.closed == "closed"
        # Every event with a seq is acked, but the last: session.closed ends the client's session.
        assert dc.events[-1]["type"] == "session.closed" and "server_event_seq" in dc.events[-1]
        assert dc.acks_sent == sum(1 for e in dc.events if "server_event_seq" in e) - 1


async def wait_answer(dc: DocDuplexClient, after: str | None = None) -> Any:
    await dc.wait(lambda: any(rid != after for rid in dc.answers))
    return next(a for rid, a in dc.answers.items() if rid != after)
