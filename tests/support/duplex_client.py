"""A client written to vLLM-Omni's duplex document, behaving as its ``DuplexClient``
does, with raw ``websockets``: no code of ours, so that if our reading of the
document were wrong on the server, the same reading is not repeated here.

The revisions it follows: ``docs/serving/realtime_duplex_api.md`` at
``upstream_docs.DUPLEX_DOC_REVISION`` ("Using DuplexClient" and "API
Reference") and ``vllm_omni/clients/duplex.py`` at
``upstream_docs.DUPLEX_CLIENT_REVISION``. What that client does, and this one:

- connects to ``/v1/realtime?duplex=1&model=...&autostart=0``, sends
  ``session.update`` (its ``SessionConfig.to_session_payload``: the formats,
  a top-level ``sample_rate_hz``, ``audio.input/output.sample_rate_hz``,
  ``extra_body.auto_response``) and waits for ``session.created``; an
  ``error`` first fails; the session id is ``session.session_id``, else
  ``session.id``, else the event's ``session_id``;
- every client event but acks and resumes carries an ``event_id``
  (``evt_<hex>``);
- after **every** event that carries a ``server_event_seq`` it sends
  ``session.event_ack`` ``{server_event_seq}`` (not once the session is
  closed); an event whose seq is not above the last one seen is a replayed
  duplicate and is dropped; an event without a seq always passes;
- it reads audio only from ``response.output_audio.delta`` and transcripts
  only from ``response.output_audio_transcript.delta`` (the old
  ``response.audio.*`` names are plain events to it); ``response.speak``
  makes an answer's decision ``speak``, a ``response.listen`` that names a
  response ends it as ``listen``, and ``response.done`` ends it (``speak``
  when nothing decided);
- sends ``session.heartbeat`` every ``heartbeat_interval_s``;
- ``append`` sends ``format``, ``sample_rate_hz``, ``duration_ms`` and the
  cumulative ``audio_end_ms``; ``ack_playback`` sends ``playback.ack``
  (cumulative ``played_ms`` / ``committed_ms``, ``response_id``,
  ``item_id``); ``barge_in`` sends ``barge_in``; ``close`` sends
  ``session.close`` and waits for ``session.closed``, after which it sends
  nothing (no ack);
- on a transport drop it reconnects (jittered backoff, five attempts) and
  sends ``session.resume`` (``session_id``, ``resume_token``,
  ``last_received_server_event_seq``, 0 if none); events before
  ``session.resumed`` wait and are dispatched after it, behind a synthetic
  ``connection.resumed``; ``session.resync_required`` or an error with a
  fatal resume code ends it, any other error is retried on a new socket;
  ``session.resumed`` refreshes the token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import orjson
import websockets
from support.upstream_docs import FATAL_RESUME_CODES

AUDIO_DELTA = "response.output_audio.delta"
TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
TEXT_DELTAS = ("response.text.delta", "response.output_text.delta")


class DuplexError(Exception):
    def __init__(self, event: dict[str, Any]) -> None:
        err = event.get("error")
        self.code = (err if isinstance(err, dict) else event).get("code")
        super().__init__(f"{self.code}: {event}")


@dataclass
class Answer:
    response_id: str
    audio: bytearray = field(default_factory=bytearray)
    transcript: str = ""
    text: str = ""
    decision: str | None = None
    done: dict[str, Any] | None = None

    @property
    def audio_ms(self) -> float:
        return len(self.audio) / 48.0  # 24 kHz PCM16


class DocDuplexClient:
    def __init__(
        self,
        url: str,
        *,
        model: str,
        session: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        heartbeat_interval_s: float = 30.0,
        attempts: int = 5,
        backoff_s: tuple[float, float] = (0.25, 4.0),
        on_event: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.url = url + "?" + urlencode({"duplex": "1", "model": model, "autostart": "0"})
        self.model = model
        self.session_payload = {
            "model": model,
            "modalities": ["audio", "text"],
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "sample_rate_hz": 16000,
            "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
            "turn_detection": None,
            "extra_body": {"auto_response": True},
            **(session or {}),
        }
        self.headers = headers
        self.heartbeat_interval_s = heartbeat_interval_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.on_event = on_event
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.audio_end_ms = 0.0  # the input audio sent (each append's cumulative audio_end_ms)
        self.session_info: dict[str, Any] = {}
        self.last_seq: int | None = None
        self.events: list[dict[str, Any]] = []  # every event delivered, in order (duplicates dropped)
        self.answers: dict[str, Answer] = {}
        self.acks_sent = 0
        self.heartbeats_sent = 0
        self.duplicates = 0
        self.resumes = 0
        self.closed: str | None = None  # why the session ended, once it has
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # --- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> DocDuplexClient:
        self._ws = await self._connect()
        await self._ws.send(orjson.dumps({"type": "session.update", "session": self.session_payload}).decode())
        while True:
            event = orjson.loads(await asyncio.wait_for(self._ws.recv(), 30))
            await self._dispatch(event)
            if event["type"] == "error":
                raise DuplexError(event)
            if event["type"] == "session.created":
                break
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for task in (self._heartbeat, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        with contextlib.suppress(Exception):
            await self._ws.close()

    async def _connect(self) -> Any:
        return await websockets.connect(
            self.url, additional_headers=self.headers, max_size=64 << 20, open_timeout=10, close_timeout=1
        )

    # --- sending -------------------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        await self._ws.send(orjson.dumps({"event_id": f"evt_{random.getrandbits(48):x}", **event}).decode())

    async def append(self, pcm: bytes, *, is_speech: bool | None = None) -> None:
        duration_ms = len(pcm) / 32
        self.audio_end_ms += duration_ms
        event: dict[str, Any] = {
            "type": "input_audio_buffer.append",
            "audio": base64.b64encode(pcm).decode(),
            "format": "pcm16",
            "sample_rate_hz": 16000,
            "duration_ms": round(duration_ms),
            "audio_end_ms": round(self.audio_end_ms),
        }
        if is_speech is not None:
            event["is_speech"] = is_speech
        await self.send(event)

    async def commit(self, *, create_response: bool | None = None) -> None:
        event: dict[str, Any] = {"type": "input_audio_buffer.commit", "final": True}
        if create_response is not None:
            event["response_create"] = create_response
        await self.send(event)

    async def ack_playback(
        self,
        played_ms: float,
        *,
        response_id: str | None = None,
        item_id: str | None = None,
        committed_ms: float | None = None,
    ) -> None:
        event: dict[str, Any] = {
            "type": "playback.ack",
            "played_ms": int(played_ms),
            "committed_ms": int(played_ms if committed_ms is None else committed_ms),
        }
        if response_id is not None:
            event["response_id"] = response_id
        if item_id is not None:
            event["item_id"] = item_id
        await self.send(event)

    async def barge_in(self) -> None:
        await self.send({"type": "barge_in"})

    async def close(self, timeout_s: float = 20.0) -> None:
        await self.send({"type": "session.close"})
        await self.wait(lambda: self.closed is not None, timeout_s)

    # --- receiving --------------------------------------------------------------------------------

    async def wait(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    async def wait_type(self, kind: str, after: int = 0, timeout_s: float = 30.0) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [e for e in self.events[after:] if e["type"] == kind]
            return bool(found)

        await self.wait(seen, timeout_s)
        return found[0]

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "error"]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def _read_loop(self) -> None:
        while self.closed is None:
            try:
                async for raw in self._ws:
                    if isinstance(raw, bytes):
                        continue
                    await self._dispatch(orjson.loads(raw))
                    if self.closed is not None:
                        return
                raise ConnectionError("the socket closed")
            except asyncio.CancelledError:
                raise
            except Exception:
                if self.closed is not None:
                    return
                if not await self._resume():
                    self.closed = "connection lost"
                    self._changed.set()
                    return

    async def _dispatch(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            if self.last_seq is not None and seq <= self.last_seq:
                self.duplicates += 1
                return
            self.last_seq = seq
        kind = event["type"]
        answer = self._answer(event) if kind != "response.created" else None
        if kind in ("session.created", "session.resumed"):
            session = event.get("session")
            session = session if isinstance(session, dict) else {}
            if session:
                self.session_info = session
            self.session_id = (
                session.get("session_id") or session.get("id") or event.get("session_id") or self.session_id
            )
            self.resume_token = event.get("resume_token") or self.resume_token
        elif kind == "response.created":
            rid = event.get("response_id") or event["response"]["id"]
            self.answers.setdefault(rid, Answer(rid))
        elif answer is not None and answer.done is not None:
            pass  # a finished answer takes nothing more
        elif kind == AUDIO_DELTA and answer is not None:
            if event.get("delta"):
                answer.audio += base64.b64decode(event["delta"])
        elif kind == TRANSCRIPT_DELTA and answer is not None:
            answer.transcript += event.get("delta") or ""
        elif kind in TEXT_DELTAS and answer is not None:
            answer.text += event.get("delta") or ""
        elif kind == "response.speak" and answer is not None:
            answer.decision = "speak"
        elif kind == "response.listen" and answer is not None:
            answer.decision = answer.decision or "listen"
            answer.done = event  # a listen that names a response ends it
        elif kind == "response.done" and answer is not None:
            answer.decision = answer.decision or "speak"
            answer.done = event
        elif kind == "session.closed":
            self.closed = "closed"
        elif kind == "session.expired":
            self.closed = f"expired: {event.get('reason')}"
        elif kind == "session.resync_required":
            self.resume_token = None
        self.events.append(event)
        self._changed.set()
        if self.on_event is not None:
            result = self.on_event(event)
            if asyncio.iscoroutine(result):
                await result
        if isinstance(seq, int) and self.closed is None:
            with contextlib.suppress(Exception):
                await self._ws.send(orjson.dumps({"type": "session.event_ack", "server_event_seq": seq}).decode())
                self.acks_sent += 1

    def _answer(self, event: dict[str, Any]) -> Answer | None:
        rid = event.get("response_id")
        if not isinstance(rid, str):
            response = event.get("response")
            rid = response.get("id") if isinstance(response, dict) else None
        return self.answers.get(rid) if isinstance(rid, str) else None

    async def _resume(self) -> bool:
        if not self.resume_token or not self.session_id:
            return False
        low, high = self.backoff_s
        for attempt in range(self.attempts):
            await asyncio.sleep(random.uniform(low, max(low, min(high, low * 2**attempt))))
            try:
                ws = await self._connect()
            except Exception:
                continue
            try:
                await ws.send(
                    orjson.dumps(
                        {
                            "type": "session.resume",
                            "session_id": self.session_id,
                            "resume_token": self.resume_token,
                            "last_received_server_event_seq": self.last_seq or 0,
                        }
                    ).decode()
                )
                pending: list[dict[str, Any]] = []
                while True:
                    event = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                    if event["type"] == "session.resumed":
                        self._ws = ws
                        self.resumes += 1
                        await self._dispatch({"type": "connection.resumed", "attempt": attempt})
                        await self._dispatch(event)
                        for entry in pending:
                            await self._dispatch(entry)
                        return True
                    if event["type"] == "session.resync_required":
                        await ws.close()
                        self.events.append(event)
                        return False
                    if event["type"] == "error":
                        self.events.append(event)
                        await ws.close()
                        if DuplexError(event).code in FATAL_RESUME_CODES:
                            return False
                        break
                    pending.append(event)
            except Exception:
                with contextlib.suppress(Exception):
                    await ws.close()
        return False

    async def _heartbeat_loop(self) -> None:
        while self.closed is None:
            await asyncio.sleep(self.heartbeat_interval_s)
            with contextlib.suppress(Exception):
                await self.send({"type": "session.heartbeat"})
                self.heartbeats_sent += 1
