"""A test server that speaks vLLM-Omni's WebSocket protocols as its documents
define them, made from the documents (``support.upstream_docs`` cites the
sections), not from our server:

- ``/v1/realtime?duplex=1`` (``docs/serving/realtime_duplex_api.md``): the
  handshake rules (``autostart``, ``model``), ``session.created`` with
  ``capabilities`` then ``session.updated``, the commit fan-out in its order,
  the answer (``response.speak``, ``response.output_audio.delta`` with ``format``,
  ``sample_rate_hz`` and ``metadata``, one ``response.output_audio_transcript.delta``
  per audio delta), ``response.cancel``, items, heartbeat, acks, close, and a
  ``server_event_seq`` on every event; with ``turn_detection`` ``server_vad``
  ("Overlap and barge-in", "Input"), turns of its own: speech (here: an append
  louder than ``overlap_silence_rms``, the document's RMS) says ``speech_started``,
  ``silence_duration_ms`` of quiet ``speech_stopped`` and the commit fan-out, and,
  with ``auto_response``, the answer; speech over a running answer under
  ``barge_in_on_speech`` is ``overlap.decision`` ``barge_in`` and the answer ends
  ``cancelled`` (``barge_in``), the epoch advanced;
- ``/v1/realtime`` without ``duplex`` (``docs/serving/realtime_api.md``): the
  turn-based API (``session.created`` at connect, ``session.update`` with a
  top-level ``model``, a non-final commit starting one generation over the
  incoming audio, ``transcription.delta`` / ``.done``, ``response.audio.delta``
  carrying ``audio`` and ``sample_rate_hz``);
- ``/v1/realtime/video`` (``docs/serving/streaming_video_output_api.md`` and
  the prompt-interaction design doc): ``session.start`` within the start
  timeout (else an error and the socket closes; a bad start too), ``video.start``,
  metadata then one binary fMP4 frame per chunk, a ``trailer`` chunk, interactions
  (``session.interaction.queued``, ``event_id_conflict``, ``interaction_failed``),
  ping/pong, stop, ``session.done``; errors in the flat shape.

And what a real upstream does when it goes wrong, on cue: ``die_after`` (the
TCP connection is dropped after that many answer deltas or video chunks),
``delay_s`` (a slow upstream: that long between answer deltas or chunks),
``stall_after`` (video: no chunk after that many), ``refuse_interactions``.
``/health`` answers 200 (vLLM's health path; ``/readyz`` is a 404 there).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

OUT_RATE = 24000
TONE = (0.05 * np.sin(2 * np.pi * 330 * np.arange(OUT_RATE // 50) / OUT_RATE) * 32767).astype("<i2").tobytes()  # 20 ms
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


@dataclass
class Behaviour:
    model: str = "openbmb/MiniCPM-o-4_5"
    words: int = 8  # words of an answer (each: 20 ms of audio, then its transcript)
    die_after: int | None = None  # drop the connection after this many answer deltas / video chunks
    delay_s: float = 0.0  # between two answer deltas / video chunks
    stall_after: int | None = None  # video: produce no chunk after this many
    refuse_interactions: bool = False
    frames_per_chunk: int = 9  # the document's example chunk
    duplex_route: bool = True  # False: a turn-mode deployment (?duplex=1 is not mounted)
    start_timeout_s: float = 10.0


@dataclass
class Seen:
    """What clients did, for the tests to read."""

    connections: int = 0
    duplex_sessions: list[dict[str, Any]] = field(default_factory=list)  # the session objects opened with
    appends: list[tuple[float, int]] = field(default_factory=list)  # (loop time, bytes) of each append
    acks: list[int] = field(default_factory=list)
    heartbeats: int = 0
    cancels: int = 0
    closes: int = 0
    barge_ins: int = 0  # answers its own speech detection stopped (server VAD)
    video_starts: list[dict[str, Any]] = field(default_factory=list)
    interactions: list[dict[str, Any]] = field(default_factory=list)
    stops: int = 0
    turn_commits: list[bool] = field(default_factory=list)  # the turn-based API's commit finals


class OmniDouble:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.b = behaviour or Behaviour()
        self.seen = Seen()
        self.server: Server | None = None
        self.port = 0

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await serve(
            self._route, "127.0.0.1", 0, process_request=self._http, max_size=None, compression=None
        )
        self.port = self.server.sockets[0].getsockname()[1]  # type: ignore[index]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return None
        if urlsplit(request.path).path == "/health":
            return connection.respond(HTTPStatus.OK, "ok\n")
        return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")

    async def _route(self, ws: ServerConnection) -> None:
        self.seen.connections += 1
        assert ws.request is not None
        parts = urlsplit(ws.request.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with contextlib.suppress(ConnectionClosed):
            if parts.path == "/v1/realtime" and query.get("duplex", "").lower() in TRUE and self.b.duplex_route:
                await DuplexSocket(self, ws, query).run()
            elif parts.path == "/v1/realtime":
                await TurnSocket(self, ws).run()
            elif parts.path == "/v1/realtime/video":
                await VideoSocket(self, ws).run()


async def _send(ws: ServerConnection, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


# --- /v1/realtime?duplex=1 ---------------------------------------------------------------------


class DuplexSocket:
    def __init__(self, double: OmniDouble, ws: ServerConnection, query: dict[str, str]) -> None:
        self.d, self.ws, self.b = double, ws, double.b
        self.resume_only = query.get("resume", "").lower() in TRUE or query.get("autostart", "").lower() in FALSE
        self.model = query.get("model")
        self.seq = 0
        self.session_id = f"duplex-{uuid.uuid4().hex}"
        self.session: dict[str, Any] | None = None
        self.items: dict[str, dict[str, Any]] = {}
        self.buffer = bytearray()
        self.answer: asyncio.Task[None] | None = None
        self.answer_id: str | None = None
        self.epoch = 0
        self.turn_id = 0
        self.deltas = 0
        self.heard_ms = 0.0  # input audio so far (server VAD's clock)
        self.speech: tuple[str, float] | None = None  # server VAD: (item id, start ms) of speech under way
        self.quiet_ms = 0.0  # ... and the quiet since its last loud append

    async def emit(self, event: dict[str, Any]) -> None:
        self.seq += 1
        await _send(self.ws, {**event, "server_event_seq": self.seq})  # "Every S→C event ... carries" it

    async def run(self) -> None:
        if self.model and not self.resume_only:  # "Endpoint and transport": ?model= autostarts
            await self.open({"model": self.model})
        async for raw in self.ws:
            event = orjson.loads(raw)
            kind = event.get("type")
            if self.session is None:
                if kind == "session.update":
                    await self.open(event.get("session") or {})
                elif kind == "session.resume":  # "Errors": handshake-stage errors use the flat shape
                    await _send(
                        self.ws,
                        {
                            "type": "error",
                            "error": "Unknown or expired duplex session",
                            "code": "session_resume_expired",
                        },
                    )
                else:
                    await _send(
                        self.ws,
                        {"type": "error", "error": "send session.update first", "code": "invalid_session_resume"},
                    )
                continue
            await self.handle(kind, event)

    async def open(self, session: dict[str, Any]) -> None:
        self.session = dict(session)
        self.d.seen.duplex_sessions.append(self.session)
        view = {
            "object": "realtime.session",
            "type": "realtime",
            "id": self.session_id,
            "model": session.get("model") or self.b.model,
            "state": "open",
            "turn_state": "idle",
            "epoch": 0,
            "turn_id": 0,
            "modalities": session.get("modalities") or ["audio", "text"],
            "input_audio_transcription": session.get("input_audio_transcription"),
            "turn_detection": session.get("turn_detection"),
            "extra_body": session.get("extra_body") or {},
            "capabilities": {
                "implementation_level": "model_native_duplex",
                "supports_input_append": True,
                "supports_barge_in": True,
                "supports_session_resume": True,
                "chunk_period_ms": 1000,
            },
        }
        await self.emit(
            {
                "type": "session.created",
                "attachment_generation": 1,
                "resume_token": f"rt_{uuid.uuid4().hex}",
                "session": view,
            }
        )
        await self.emit({"type": "session.updated", "session": view})

    @property
    def auto_response(self) -> bool:
        extra = (self.session or {}).get("extra_body") or {}
        return extra.get("auto_response", True) is not False

    async def handle(self, kind: str | None, event: dict[str, Any]) -> None:
        if kind == "session.update":
            self.session = {**(self.session or {}), **(event.get("session") or {})}
            await self.emit({"type": "session.updated", "session": self.session})
        elif kind == "session.heartbeat":
            self.d.seen.heartbeats += 1
            await self.emit({"type": "session.heartbeat_ack", "session_id": self.session_id})
        elif kind == "session.event_ack":
            self.d.seen.acks.append(int(event.get("server_event_seq") or 0))
        elif kind == "session.close":
            self.d.seen.closes += 1
            await self.emit(
                {
                    "type": "session.closed",
                    "session_id": self.session_id,
                    "epoch": self.epoch,
                    "reason": "client_close",
                    "event": {"type": "session.closed", "reason": "client_close"},
                }
            )
            await self.ws.close()
        elif kind == "input_audio_buffer.append":
            pcm = base64.b64decode(event.get("audio") or "")
            self.buffer += pcm
            self.d.seen.appends.append((asyncio.get_running_loop().time(), len(pcm)))
            if ((self.session or {}).get("turn_detection") or {}).get("type") == "server_vad":
                await self.detect(pcm)
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            await self.emit({"type": "input_audio_buffer.cleared"})
        elif kind == "input_audio_buffer.commit":
            await self.commit(event)
        elif kind == "conversation.item.create":
            item = {**event["item"], "object": "realtime.item", "status": "completed"}
            item.setdefault("id", f"item_{uuid.uuid4().hex[:12]}")
            await self.add_item(item)
        elif kind == "conversation.item.delete":
            item_id = event.get("item_id")
            if self.items.pop(str(item_id), None) is None:
                await self.error("item_not_found", f"no item {item_id}", event)
            else:
                await self.emit(
                    {
                        "type": "conversation.item.deleted",
                        "item_id": item_id,
                        "event": {"type": "conversation.item.deleted", "item_id": item_id},
                    }
                )
        elif kind == "response.create":
            await self.respond(event.get("response") or {})
        elif kind == "response.cancel":
            await self.cancel()
        else:
            await self.error("unknown_event", f"unsupported event {kind}", event)

    async def detect(self, pcm: bytes) -> None:
        """Server VAD ("Overlap and barge-in"; SERVER_VAD_UPDATE's silence_duration_ms, the
        RMS of overlap_silence_rms): turns this server takes by itself."""
        session = self.session or {}
        rate = int(session.get("sample_rate_hz") or 16000)
        ms = len(pcm) / 2 / rate * 1000
        start_ms, self.heard_ms = self.heard_ms, self.heard_ms + ms
        samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], "<i2").astype(np.float64) / 32768
        loud = bool(samples.size) and float(np.sqrt((samples**2).mean())) > float(
            session.get("overlap_silence_rms", 0.003)
        )
        silence_ms = float((session.get("turn_detection") or {}).get("silence_duration_ms", 500))
        if loud and self.speech is None:
            item_id = f"item_{uuid.uuid4().hex[:12]}"
            self.speech, self.quiet_ms = (item_id, start_ms), 0.0
            await self.emit({"type": "input_audio_buffer.speech_started", "audio_start_ms": round(start_ms),
                             "item_id": item_id})  # fmt: skip
            if self.answer is not None and not self.answer.done():
                await self.barge_in()
        elif loud:
            self.quiet_ms = 0.0
        elif self.speech is not None:
            self.quiet_ms += ms
            if self.quiet_ms >= silence_ms:
                (item_id, _), self.speech = self.speech, None
                await self.emit({"type": "input_audio_buffer.speech_stopped",
                                 "audio_end_ms": round(self.heard_ms - self.quiet_ms), "item_id": item_id})  # fmt: skip
                await self.commit({})
        else:
            self.buffer.clear()  # (silence before any speech is no turn)

    async def barge_in(self) -> None:
        """Speech over the running answer under ``barge_in_on_speech``: it stops."""
        task, rid = self.answer, self.answer_id
        if task is None or rid is None or self.session is None:
            return
        if self.session.get("overlap_policy", "barge_in_on_speech") != "barge_in_on_speech":
            return
        self.d.seen.barge_ins += 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.epoch += 1
        await self.emit({"type": "overlap.decision", "session_id": self.session_id, "epoch": self.epoch,
                         "policy": "barge_in_on_speech", "action": "barge_in",
                         "reason": "server_vad_utterance_active"})  # fmt: skip
        await self.finish(rid, "", True, "cancelled", {"type": "cancelled", "reason": "barge_in"})

    async def error(self, code: str, message: str, cause: dict[str, Any]) -> None:
        await self.emit(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": code,
                    "message": message,
                    "event_id": cause.get("event_id"),
                },
            }
        )

    async def add_item(self, item: dict[str, Any]) -> None:
        self.items[item["id"]] = item
        await self.emit({"type": "conversation.item.added", "previous_item_id": None, "item": item})
        await self.emit({"type": "conversation.item.created", "previous_item_id": None, "item": item})
        await self.emit({"type": "conversation.item.done", "previous_item_id": None, "item": item})

    async def commit(self, event: dict[str, Any]) -> None:
        if not self.buffer:
            await self.error(
                "input_audio_buffer_empty", "input_audio_buffer.commit requires a non-empty input audio buffer.", event
            )
            return
        ms = len(self.buffer) // 32  # 16 kHz PCM16, or as the session declared: the count is what is tested
        self.buffer.clear()
        self.turn_id += 1
        item_id = f"item_{uuid.uuid4().hex[:12]}"
        transcript = f"heard {ms} ms"
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }
        self.items[item_id] = item
        # "Input": the commit fan-out, in this order
        await self.emit({"type": "conversation.item.added", "previous_item_id": None, "item": item})
        await self.emit({"type": "conversation.item.created", "previous_item_id": None, "item": item})
        await self.emit(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": None,
                "item_id": item_id,
                "event": {
                    "type": "input.committed",
                    "session_id": self.session_id,
                    "turn_id": self.turn_id,
                    "epoch": self.epoch,
                    "history_len": len(self.items),
                },
            }
        )
        await self.emit(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item_id,
                "content_index": 0,
                "transcript": transcript,
            }
        )
        await self.emit({"type": "conversation.item.done", "previous_item_id": None, "item": item})
        if self.auto_response and event.get("response_create") is not False:
            await self.respond({})

    def _last_text(self) -> str:
        for item in reversed(list(self.items.values())):
            if item.get("role") == "user":
                part = (item.get("content") or [{}])[0]
                return str(part.get("text") or part.get("transcript") or "")
        return ""

    async def respond(self, params: dict[str, Any]) -> None:
        if self.answer is not None and not self.answer.done():
            await self.error("conversation_already_has_active_response", "a response is active", params)
            return
        rid = f"resp_{uuid.uuid4().hex[:12]}"
        self.answer_id = rid
        modalities = (
            params.get("modalities")
            or params.get("output_modalities")
            or (self.session or {}).get("modalities")
            or ["audio", "text"]
        )
        self.answer = asyncio.get_running_loop().create_task(self._answer(rid, "audio" in modalities))

    async def _answer(self, rid: str, audio: bool) -> None:
        item_id = f"item_{rid}"
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        await self.emit(
            {
                "type": "response.created",
                "response_id": rid,
                "response": {
                    "id": rid,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "status_details": None,
                    "output": [],
                    "metadata": {"duplex_event": {"type": "response.created", "response_id": rid, "epoch": self.epoch}},
                },
            }
        )
        await self.emit({"type": "conversation.item.added", "previous_item_id": None, "item": item})
        await self.emit({"type": "conversation.item.created", "previous_item_id": None, "item": item})
        await self.emit({"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item})
        words = [f"You said: {self._last_text()}".split()[i % 3] for i in range(self.b.words)]
        text = ""
        if audio:
            await self.emit(
                {"type": "response.content_part.added", **where, "part": {"type": "audio", "transcript": ""}}
            )
            await self.emit(
                {
                    "type": "response.speak",
                    **where,
                    "metadata": {"session_id": self.session_id, "epoch": self.epoch, "model_speak": True},
                }
            )
        for i, word in enumerate(words):
            await self._pace()
            delta = word + " "
            text += delta
            if audio:
                await self.emit(
                    {
                        "type": "response.output_audio.delta",
                        **where,
                        "delta": base64.b64encode(TONE).decode(),
                        "format": "pcm16",
                        "sample_rate_hz": OUT_RATE,
                        "metadata": {
                            "session_id": self.session_id,
                            "epoch": self.epoch,
                            "model_speak": True,
                            "end_of_turn": False,
                            "audio_duration_ms": 20 * (i + 1),
                        },
                    }
                )
                await self.emit({"type": "response.output_audio_transcript.delta", **where, "delta": delta})
            else:
                await self.emit({"type": "response.output_text.delta", **where, "delta": delta})
        await self.finish(rid, text, audio, "completed", None)

    async def _pace(self) -> None:
        self.deltas += 1
        if self.b.die_after is not None and self.deltas > self.b.die_after:
            assert self.ws.transport is not None
            self.ws.transport.abort()  # the upstream dies mid-answer
            await asyncio.sleep(3600)
        if self.b.delay_s:
            await asyncio.sleep(self.b.delay_s)

    async def finish(self, rid: str, text: str, audio: bool, status: str, details: dict[str, Any] | None) -> None:
        item_id = f"item_{rid}"
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        if audio:
            await self.emit({"type": "response.output_audio.done", **where})
            await self.emit({"type": "response.output_audio_transcript.done", **where, "transcript": text})
            await self.emit(
                {"type": "response.content_part.done", **where, "part": {"type": "audio", "transcript": text}}
            )
            content = [{"type": "output_audio", "transcript": text}]
        else:
            await self.emit({"type": "response.output_text.done", **where, "text": text})
            content = [{"type": "output_text", "text": text}]
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if status == "completed" else status,
            "content": content,
        }
        self.items[item_id] = item
        await self.emit({"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": item})
        await self.emit({"type": "conversation.item.done", "previous_item_id": None, "item": item})
        await self.emit(
            {
                "type": "response.done",
                "response_id": rid,
                "response": {
                    "id": rid,
                    "object": "realtime.response",
                    "status": status,
                    "status_details": details,
                    "output": [item],
                    "metadata": {"type": "response.done", "response_id": rid, "epoch": self.epoch},
                },
            }
        )
        await self.emit({"type": "rate_limits.updated", "rate_limits": []})  # "always an empty list"

    async def cancel(self) -> None:
        task, rid = self.answer, self.answer_id
        if task is None or task.done() or rid is None:
            return
        self.d.seen.cancels += 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.epoch += 1  # "response.cancel ... advances epoch"
        await self.finish(rid, "", True, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})


# --- /v1/realtime (turn-based) ---------------------------------------------------------------------


class TurnSocket:
    """``docs/serving/realtime_api.md``, "Protocol" and "Audio Handling"."""

    def __init__(self, double: OmniDouble, ws: ServerConnection) -> None:
        self.d, self.ws = double, ws
        self.audio = bytearray()
        self.generating = False

    async def run(self) -> None:
        await _send(self.ws, {"type": "session.created", "id": f"sess-{uuid.uuid4().hex[:8]}"})
        async for raw in self.ws:
            event = orjson.loads(raw)
            kind = event.get("type")
            if kind == "session.update":
                if event.get("model") != self.d.b.model:  # "Selects and validates the served model"
                    await _send(self.ws, {"type": "error", "error": f"model {event.get('model')!r} is not served"})
            elif kind == "input_audio_buffer.commit":
                final = bool(event.get("final"))
                self.d.seen.turn_commits.append(final)
                if not final:
                    self.generating = True
                elif self.generating:
                    await self.answer()
            elif kind == "input_audio_buffer.append":
                pcm = base64.b64decode(event.get("audio") or "")
                self.audio += pcm
                self.d.seen.appends.append((asyncio.get_running_loop().time(), len(pcm)))
                if self.generating:  # generation runs over the incoming stream
                    await _send(self.ws, {"type": "transcription.delta", "delta": f"{len(self.audio) // 32}ms "})
            else:
                await _send(self.ws, {"type": "error", "error": f"unknown event {kind}"})

    async def answer(self) -> None:
        text = f"heard {len(self.audio) // 32} ms"
        await _send(self.ws, {"type": "transcription.done", "text": text, "usage": {"total_tokens": 3}})
        for _ in range(self.d.b.words):
            await _send(
                self.ws,
                {"type": "response.audio.delta", "audio": base64.b64encode(TONE).decode(), "sample_rate_hz": OUT_RATE},
            )
        await _send(self.ws, {"type": "response.audio.done"})


# --- /v1/realtime/video ------------------------------------------------------------------------------


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I", 8 + len(body)) + kind + body


INIT = _box(b"ftyp", b"iso5", b"\x00\x00\x02\x00", b"iso6mp41") + _box(b"moov", _box(b"mvhd", bytes(100)))


def fragment(sequence: int, time: int, frames: int) -> bytes:
    tfhd = _box(b"tfhd", b"\x00\x02\x00\x00", struct.pack(">I", 1))
    tfdt = _box(b"tfdt", b"\x01\x00\x00\x00", struct.pack(">Q", time))
    moof = _box(b"moof", _box(b"mfhd", bytes(4), struct.pack(">I", sequence)), _box(b"traf", tfhd, tfdt))
    return moof + _box(b"mdat", bytes(64 * frames))


class VideoSocket:
    def __init__(self, double: OmniDouble, ws: ServerConnection) -> None:
        self.d, self.ws, self.b = double, ws, double.b
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        self.stopped = asyncio.Event()
        self.pending: list[dict[str, Any]] = []  # interactions queued for the next chunk
        self.active: dict[str, int] = {}  # event id -> chunks left in its transition
        self.payloads: dict[str, dict[str, Any]] = {}
        self.sent = 0
        self.lock = asyncio.Lock()

    async def error(self, message: str, **fields: Any) -> None:
        async with self.lock:
            await _send(self.ws, {"type": "error", "message": message, **fields})

    async def run(self) -> None:
        try:
            raw = await asyncio.wait_for(self.ws.recv(), self.b.start_timeout_s)
        except TimeoutError:
            await self.error("Timeout waiting for session.start")
            return  # the handler returns: the socket closes
        start = orjson.loads(raw)
        if start.get("type") != "session.start":
            await self.error(f"Expected session.start, got: {start.get('type')}")
            return
        if start.get("format", "m4s") != "m4s":  # "Only m4s output is currently accepted"
            await self.error("Invalid session.start format: expected 'm4s'.")
            return
        self.d.seen.video_starts.append(start)
        # upstream's handler: request.model_dump(exclude_none=True)
        config = {k: v for k, v in start.items() if k not in ("type", "format") and v is not None}
        async with self.lock:
            await _send(
                self.ws, {"type": "video.start", "request_id": self.request_id, "format": "m4s", "config": config}
            )
        control = asyncio.get_running_loop().create_task(self.control())
        try:
            await self.stream(int(start.get("num_frames") or 27))
        finally:
            control.cancel()

    async def stream(self, num_frames: int) -> None:
        chunks = -(-num_frames // self.b.frames_per_chunk)
        stopped = False
        for index in range(chunks):
            if self.b.stall_after is not None and index >= self.b.stall_after:
                await self.stopped.wait()  # no generation progress any more
            if self.b.die_after is not None and index >= self.b.die_after:
                assert self.ws.transport is not None
                self.ws.transport.abort()
                return
            if self.b.delay_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopped.wait(), self.b.delay_s)
            if self.stopped.is_set():
                stopped = True
                break
            frames = min(self.b.frames_per_chunk, num_frames - index * self.b.frames_per_chunk)
            started = [p["event_id"] for p in self.pending]
            for p in self.pending:
                self.active[p["event_id"]] = max(1, int(p.get("transition_chunks", 2)))
            self.pending = []
            active = list(self.active)
            completed = [e for e, left in self.active.items() if left == 1]
            self.active = {e: left - 1 for e, left in self.active.items() if left > 1}
            payload = fragment(index + 1, index * 1000, frames)
            await self.chunk("media", payload if index else INIT + payload, index, frames, started, active, completed)
        if not stopped:
            await self.chunk("trailer", _box(b"mfra", bytes(16)), None, 0, [], [], [])
        async with self.lock:
            await _send(
                self.ws,
                {"type": "session.done", "request_id": self.request_id, "chunks": self.sent, "stopped": stopped},
            )

    async def chunk(
        self,
        kind: str,
        data: bytes,
        index: int | None,
        frames: int,
        started: list[str],
        active: list[str],
        completed: list[str],
    ) -> None:
        meta = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": kind,
            "transport_chunk_index": self.sent,
            "generation_chunk_index": index,
            "num_frames": frames,
            "byte_length": len(data),
            "started_event_ids": started,
            "active_event_ids": active,
            "completed_event_ids": completed,
        }
        async with self.lock:  # "one ordered pair ... must not be interleaved with another outbound message"
            await _send(self.ws, meta)
            await self.ws.send(data)
        self.sent += 1

    async def control(self) -> None:
        async for raw in self.ws:
            msg = orjson.loads(raw)
            kind = msg.get("type")
            if kind == "session.stop":
                self.d.seen.stops += 1
                self.stopped.set()
                return
            if kind == "session.ping":
                async with self.lock:
                    await _send(self.ws, {"type": "session.pong"})
            elif kind == "session.interaction":
                await self.interaction(msg.get("interaction"))
            else:
                await self.error(f"Unknown message type: {kind}")

    async def interaction(self, interaction: Any) -> None:
        if not isinstance(interaction, dict) or not isinstance(interaction.get("event"), dict):
            await self.error("session.interaction requires an interaction object with an event object")
            return
        event_id = interaction.get("event_id") or uuid.uuid4().hex
        event = interaction["event"]
        if not (isinstance(event.get("prompt"), str) and event["prompt"].strip()) and "multi_modal_data" not in event:
            await self.error("session.interaction requires a non-empty event.prompt", event_id=event_id)
            return
        if event_id in self.payloads:
            if self.payloads[event_id] == interaction:  # "a retry ... must not apply the update twice"
                async with self.lock:
                    await _send(
                        self.ws,
                        {"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id},
                    )
                return
            await self.error(
                "event_id_conflict", code="event_id_conflict", request_id=self.request_id, event_id=event_id
            )
            return
        if self.b.refuse_interactions:
            await self.error(
                "The active model does not support prompt updates",
                code="interaction_failed",
                request_id=self.request_id,
                event_id=event_id,
            )
            return
        self.payloads[event_id] = interaction
        self.d.seen.interactions.append(interaction)
        self.pending.append({"event_id": event_id, **interaction})
        async with self.lock:
            await _send(
                self.ws, {"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id}
            )


@contextlib.asynccontextmanager
async def omni_double(behaviour: Behaviour | None = None) -> AsyncIterator[OmniDouble]:
    double = OmniDouble(behaviour)
    await double.start()
    try:
        yield double
    finally:
        await double.stop()
