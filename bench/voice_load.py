"""Voice load: the gateway against a bare Starlette echo, on the same machine, in one run.

Each of N sessions streams paced 24 kHz PCM16 audio, 50 chunks/s of 20 ms
(960 bytes), as base64 ``input_audio_buffer.append`` JSON (default) or, with
``--binary``, as ``omni-binary.v1`` binary frames. Both servers are started
here as separate processes, served the same way (uvicorn, uvloop, httptools,
``websockets-sansio``, no deflate), and get the same messages:

- the gateway (``python -m gateway serve --engine passthrough``): sessions set
  manual turns with transcription on, so every chunk streams into a
  transcription request; the passthrough engine answers chunk n of a buffer
  with the transcript delta ``"n "``. The client commits every ``--commit-ms``.
  A manual-turn buffer's item id is not known to the client until its commit,
  so the gateway holds a buffer's deltas until then; the chunk sent just
  before each commit is the one whose delta shows the streaming path, so its
  send -> delta time is the latency sample (one per commit per session);
  every chunk's number is counted in the deltas to find lost replies.
- the bare echo (``bench/bare_echo.py``) sends every message back; every
  append's round trip is a latency sample.

With ``--duplex`` each session is also answered while it streams, as a voice
session that speaks while the user's microphone keeps coming (barge-in needs
it): the client asks for a response at once and again as soon as each one is
done, and the gateway's passthrough route streams 20 ms audio deltas paced at
50/s (a transcript word every 5 of them) for ``--answer-s`` seconds per
response, while the appends and commits go on as above. The client acks the
journal with ``session.event_ack`` every 50 events, as the SDKs do. The
baseline is the echo's ``/duplex`` route, which answers every message it reads
with one 20 ms audio message (a ``response.output_audio.delta`` JSON event, or
an output audio frame): the same messages in and out. Added latency in is
measured as before (append -> its transcript delta, which is also commit ->
``input_audio_buffer.committed``: the gateway releases a manual buffer's held
deltas right behind the commit's ack, in the same write); out, as the jitter
of the gaps between one response's audio deltas against the 20 ms pace (for
the echo: between its replies, which follow the client's 20 ms pace).

With ``--dialect live`` (or ``both``: the Realtime sessions, then the Live ones, beside the same
echo, in one run) the gateway is also measured on its GPT-Live dialect (``/v1/live/sessions``):
each session sends ``session.start`` for the passthrough route, streams the same appends as
``session.input_audio.append`` (JSON: Live has no binary frames), and asks for each answer
the one way a Live client can without speech, ``session.commentary.append`` (the model says
it): at once, and again one chunk (20 ms) after the last audio delta of the answer before (Live
has no event for an answer's end; the passthrough answer finishes one chunk after its last
audio). Live implies ``--duplex``. Its latency sample is commentary sent -> the first audio
delta of the answer (the gateway's whole answer path: decode, the context append, the
response, the engine's first chunk, the spelling); a Live input chunk has no reply of its own,
so it counts as handled when sent. Both dialects print **sessions per server core** (N over
the cores the gateway used) and the latency they add.

Added latency = gateway p50/p99 minus echo p50/p99. ``--find-max`` ramps N
until each server saturates. Only 127.0.0.1 is used; every phase is bounded
in time; the servers and client processes are ended on exit, error or Ctrl-C.
See bench/README.md for what each figure means and the figures measured.

    python bench/voice_load.py                      # N=200, JSON, about 1 min
    python bench/voice_load.py --binary --sessions 400
    python bench/voice_load.py --find-max           # ramp N, up to 12 min
    python bench/voice_load.py --duplex --sessions 400 [--binary]
    python bench/voice_load.py --dialect both --sessions 200    # Realtime and GPT-Live in one run
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import contextlib
import math
import multiprocessing as mp
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
CHUNK_MS = 20
GATEWAYS = ("gateway", "live")  # the targets that are the gateway: its Realtime dialect, its GPT-Live dialect
PERIOD_S = CHUNK_MS / 1000
CHUNK_BYTES = 24_000 * 2 * CHUNK_MS // 1000  # 960: 20 ms of 24 kHz mono PCM16
BINARY_SUBPROTOCOL = "omni-binary.v1"
MIN_COMMIT_MS = 100  # the gateway refuses smaller commits
MIN_COMMIT_CHUNKS = MIN_COMMIT_MS // CHUNK_MS

# Targets the figures are printed against.
TARGET_SESSIONS = 400
TARGET_ADDED_P99_MS = 20.0
TARGET_RATIO = 0.5  # appends only (the first voice issue)
TARGET_RATIO_DUPLEX = 0.8  # --duplex: the echo's own scale, or near it
TARGET_IDLE_KB = 40.0

# Manual turns with transcription: every append streams into the open buffer's transcription request.
_INPUT = {"turn_detection": None, "transcription": {"model": "whisper-1"}}
_SESSION_UPDATE = orjson.dumps(
    {"type": "session.update", "session": {"type": "realtime", "audio": {"input": _INPUT}}}
).decode()
_COMMIT = '{"type":"input_audio_buffer.commit"}'
_CLEAR = '{"type":"input_audio_buffer.clear"}'
_DELTA = "conversation.item.input_audio_transcription.delta"
_COMMITTED = "input_audio_buffer.committed"
_AUDIO_OUT = "response.output_audio.delta"
_RESPONSE_CREATE = '{"type":"response.create"}'
ACK_EVERY = 50  # --duplex: the client acks the journal every this many server events, as the SDKs do
WORDS_EVERY = 5  # --duplex: the passthrough answer's transcript word every 5 audio deltas (10 words/s)
_OUT_FRAME = struct.Struct(">BBHQ")  # an output audio frame's header: kind, header length, content index, seq
# --dialect live: GPT-Live sessions (/v1/live/sessions). The Live model takes its own turns, so the
# client asks for each answer the one way Live has without speech: commentary, which the model says.
LIVE_PATH = "/v1/live/sessions"
LIVE_MODEL = "duplex-bench"  # the passthrough route whose answers last --answer-s
_LIVE_AUDIO_OUT = "session.output_audio.delta"
_LIVE_SAY = orjson.dumps(
    {"type": "session.commentary.append", "content": "the next answer, please", "delegation_id": None}
).decode()


def _audio_messages(kind: str = "input_audio_buffer.append") -> tuple[str, bytes]:
    # Noise rather than silence, so base64 and JSON see realistic bytes; sent unchanged every time.
    pcm = np.random.default_rng(7).integers(-3000, 3000, CHUNK_BYTES // 2, dtype="<i2").tobytes()
    text = orjson.dumps({"type": kind, "audio": base64.b64encode(pcm).decode()}).decode()
    return text, bytes((1, 0, 0, 0)) + pcm


# --- client worker (one process, uvloop) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    target: str  # "gateway" (the Realtime dialect) | "live" (the gateway's GPT-Live dialect) | "echo"
    url: str
    binary: bool
    first: int  # global index of this worker's first session
    count: int
    total: int  # sessions over all workers: phases are spread over all of them
    commit_every: int  # chunks per commit
    idle: bool  # open, then send nothing
    client: str  # "asyncio" | "sansio"
    cpus: tuple[int, ...] | None
    duplex: bool = False
    drain_s: float = 5.0
    answer_chunks: int = 0  # live: the audio deltas of one answer (the route's audio_chunks)


@dataclass(slots=True)
class _Stats:
    w0: float  # the measured window: sends and arrivals in [w0, w1) count
    w1: float
    lat: array.array[float] = field(default_factory=lambda: array.array("d"))  # ms
    lag: array.array[float] = field(default_factory=lambda: array.array("d"))  # ms the pacer sent late
    sent: int = 0
    received: int = 0  # messages of any kind
    answered: int = 0  # chunks answered: echoes, or chunk numbers in transcript deltas
    errors: int = 0
    first_error: str = ""
    # --duplex
    jitter: array.array[float] = field(default_factory=lambda: array.array("d"))  # ms, |audio gap - 20 ms|
    audio_out: int = 0  # 20 ms audio messages received
    responses: int = 0  # responses done

    def error(self, what: object) -> None:
        self.errors += 1
        self.first_error = self.first_error or str(what)[:200]


class _Session:
    """One client connection and what it is owed. ``send`` returns an awaitable or None."""

    __slots__ = ("acked", "acked_seq", "answering", "asked_at", "buf", "chunks", "close", "dead", "expected",
                 "fifo", "heard", "items", "last_audio", "pending", "phase", "recv", "send", "seq",
                 "shift")  # fmt: skip

    def __init__(self, phase: float, shift: int) -> None:
        # Sessions neither send nor commit in lockstep: chunks are spread over the 20 ms period
        # (phase, seconds) and commits over the commit period (shift, chunks).
        self.phase = phase
        self.shift = shift
        self.chunks = 0  # sent
        self.send: Callable[[str | bytes], Awaitable[None] | None]
        self.recv: Callable[[], Awaitable[str | bytes]]  # before streaming only
        self.close: Callable[[], Awaitable[None]]
        self.buf = 0  # chunks in the gateway's open buffer
        self.expected = 0  # replies owed: echoes, or chunk numbers in committed buffers
        self.acked = 0  # replies seen
        self.pending: deque[tuple[bytes, float]] = deque()  # commits sent: (last chunk number, its send time)
        self.items: dict[str, tuple[bytes, float]] = {}  # committed item id -> the same
        self.fifo: deque[float] = deque()  # echo: send times in order (-1: not sampled)
        self.dead = False
        # --duplex
        self.answering = False  # a response was asked for and is not done
        self.last_audio = 0.0  # arrival of the last audio message of the current response (0: none yet)
        self.seq = 0  # the last server_event_seq seen
        self.acked_seq = 0  # the last one acked
        # live
        self.asked_at = 0.0  # when the answer under way was asked for (commentary sent); or the next may be
        self.heard = 0  # its audio deltas received so far


def _on_gateway(s: _Session, st: _Stats, raw: str | bytes, t: float, event: dict[str, Any] | None = None) -> None:
    if st.w0 <= t < st.w1:
        st.received += 1
    event = orjson.loads(raw) if event is None else event
    kind = event["type"]
    if kind == _DELTA:
        tokens = event["delta"].encode().split()
        s.acked += len(tokens)
        if st.w0 <= t < st.w1:
            st.answered += len(tokens)
        mark = s.items.get(event["item_id"])
        if mark is not None and tokens and tokens[-1] == mark[0] and st.w0 <= mark[1] < st.w1:
            st.lat.append((t - mark[1]) * 1000)
    elif kind == _COMMITTED:
        s.items[event["item_id"]] = s.pending.popleft()
    elif kind == "conversation.item.input_audio_transcription.completed":
        s.items.pop(event["item_id"], None)
    elif kind == "error":
        st.error(event["error"]["message"])


def _audio_arrived(s: _Session, st: _Stats, t: float) -> None:
    if st.w0 <= t < st.w1:
        st.audio_out += 1
        if s.last_audio:
            st.jitter.append(abs((t - s.last_audio) * 1000 - CHUNK_MS))
    s.last_audio = t


def _on_gateway_duplex(s: _Session, st: _Stats, raw: str | bytes, t: float) -> None:
    if isinstance(raw, bytes) and raw[:1] != b"{":  # an output audio frame (omni-binary.v1)
        if st.w0 <= t < st.w1:
            st.received += 1
        s.seq = _OUT_FRAME.unpack_from(raw)[3]
        _audio_arrived(s, st, t)
        return
    event = orjson.loads(raw)
    s.seq = event.get("server_event_seq") or s.seq
    kind = event["type"]
    if kind == _AUDIO_OUT:
        if st.w0 <= t < st.w1:
            st.received += 1
        _audio_arrived(s, st, t)
        return
    if kind == "response.done":
        s.answering, s.last_audio = False, 0.0  # the pacer asks for the next one
        if st.w0 <= t < st.w1:
            st.responses += 1
        status = event["response"]["status"]
        if status != "completed":
            st.error(f"response {status}: {event['response'].get('status_details')}")
    _on_gateway(s, st, raw, t, event)


def _on_live(s: _Session, st: _Stats, raw: str | bytes, t: float, answer_chunks: int) -> None:
    """A Live session's events: the answer's audio (its first delta is the latency sample: commentary
    sent -> the first audio of the answer that says it), its transcript, errors."""
    if st.w0 <= t < st.w1:
        st.received += 1
    event = orjson.loads(raw)
    s.seq = event.get("server_event_seq") or s.seq
    kind = event["type"]
    if kind == _LIVE_AUDIO_OUT:
        _audio_arrived(s, st, t)
        s.heard += 1
        if s.heard == 1:
            s.acked += 1  # the answer owed for the commentary came
            if st.w0 <= s.asked_at < st.w1:
                st.lat.append((t - s.asked_at) * 1000)
        if s.heard >= answer_chunks:  # the whole answer: the pacer asks for the next one
            # Live has no event for an answer's end: the paced answer finishes one chunk after its
            # last audio, so the next is asked for no sooner (else it would wait behind that tail).
            s.answering, s.last_audio, s.heard, s.asked_at = False, 0.0, 0, t + PERIOD_S
            if st.w0 <= t < st.w1:
                st.responses += 1
    elif kind == "error":
        st.error(event["error"]["message"])


def _on_echo_duplex(s: _Session, st: _Stats, raw: str | bytes, t: float) -> None:
    paced = bool(s.fifo) and s.fifo[0] >= 0  # the reply to an append (a commit's follows it at once)
    _on_echo(s, st, raw, t)
    if paced:
        _audio_arrived(s, st, t)
    elif st.w0 <= t < st.w1:
        st.audio_out += 1


def _on_echo(s: _Session, st: _Stats, raw: str | bytes, t: float) -> None:
    if st.w0 <= t < st.w1:
        st.received += 1
    sent = s.fifo.popleft()
    s.acked += 1
    if sent >= 0 and st.w0 <= t < st.w1:
        st.answered += 1
    if st.w0 <= sent < st.w1:
        st.lat.append((t - sent) * 1000)


def _guarded(on: Callable[[_Session, _Stats, str | bytes, float], None], s: _Session, st: _Stats,
             raw: str | bytes, t: float) -> None:  # fmt: skip
    """A reply the handler cannot read is counted as an error, not raised into the transport."""
    try:
        on(s, st, raw, t)
    except Exception as exc:
        st.error(f"unexpected reply {bytes(raw[:80]) if isinstance(raw, bytes) else raw[:80]!r}: {exc!r}")


Handler = Callable[[str | bytes, float], None]


class _Wire(asyncio.Protocol):
    """The ``sansio`` client: websockets' Sans-I/O ClientProtocol on a bare asyncio Protocol.

    Same library and framing as the asyncio client, without its per-connection
    reader task and per-message futures: frames are handled as they are parsed.
    """

    def __init__(self, url: str, subprotocols: list[str] | None) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        loop = asyncio.get_running_loop()
        self.ws = ClientProtocol(parse_uri(url), subprotocols=subprotocols, max_size=None)  # type: ignore[arg-type]
        self.opened: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.inbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.handler: Handler | None = None  # set once streaming: frames skip the inbox
        self.on_lost: Callable[[], None] = lambda: None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.ws.send_request(self.ws.connect())
        self._flush()

    def _flush(self) -> None:
        assert self.transport is not None
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                self.transport.write_eof()

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Opcode

        t = time.monotonic()
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            opcode = getattr(event, "opcode", None)
            if opcode is None:  # the handshake response
                if self.ws.handshake_exc is not None:
                    self.opened.set_exception(self.ws.handshake_exc)
                elif not self.opened.done():
                    self.opened.set_result(None)
            elif opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                payload = bytes(event.data)  # type: ignore[union-attr]
                if self.handler is not None:
                    self.handler(payload, t)
                else:
                    self.inbox.put_nowait(payload)
        self._flush()  # pongs and the close handshake

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.lost.done():
            self.lost.set_result(None)
        self.on_lost()

    def send(self, message: str | bytes) -> None:
        if self.lost.done():
            raise ConnectionError("connection lost")
        if isinstance(message, str):
            self.ws.send_text(message.encode())
        else:
            self.ws.send_binary(message)
        self._flush()

    async def close(self) -> None:
        if not self.lost.done():
            with contextlib.suppress(Exception):
                self.ws.send_close(1000)
                self._flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.lost), 2)
        if self.transport is not None:
            self.transport.close()


async def _connect(plan: WorkerPlan, index: int) -> tuple[_Session, Callable[[Handler, Callable[[], None]], None]]:
    """Open one connection; returns the session and how to start streaming its frames to a handler."""
    g = plan.first + index  # round robin over commit slots: neighbours in phase commit at different times
    s = _Session(g / plan.total * PERIOD_S, g % plan.commit_every)
    subprotocols = [BINARY_SUBPROTOCOL] if plan.binary else None
    loop = asyncio.get_running_loop()
    if plan.client == "sansio":
        wire = _Wire(plan.url, subprotocols)
        port = int(plan.url.split(":")[2].split("/")[0])
        await asyncio.wait_for(loop.create_connection(lambda: wire, "127.0.0.1", port), 30)
        await asyncio.wait_for(wire.opened, 30)
        s.send, s.recv, s.close = wire.send, wire.inbox.get, wire.close

        def stream_sansio(handler: Handler, on_end: Callable[[], None]) -> None:
            while not wire.inbox.empty():  # anything that came before streaming began
                handler(wire.inbox.get_nowait(), time.monotonic())
            wire.handler, wire.on_lost = handler, on_end
            if wire.lost.done():
                on_end()

        return s, stream_sansio
    from websockets.asyncio.client import connect

    ws = await connect(
        plan.url, subprotocols=subprotocols, compression=None, max_size=None,  # type: ignore[arg-type]
        open_timeout=30, ping_interval=None, close_timeout=2,
    )  # fmt: skip
    s.send, s.recv, s.close = ws.send, ws.recv, ws.close
    tasks: list[asyncio.Task[None]] = []

    async def read(handler: Handler, on_end: Callable[[], None]) -> None:
        try:
            async for raw in ws:
                handler(raw, time.monotonic())
        finally:
            on_end()

    def stream_asyncio(handler: Handler, on_end: Callable[[], None]) -> None:
        tasks.append(loop.create_task(read(handler, on_end)))

    return s, stream_asyncio


async def _open(plan: WorkerPlan, index: int) -> tuple[_Session, Any]:
    s, stream = await _connect(plan, index)
    if plan.target == "live":  # session.start first (the route's model), then session.started
        await _maybe(s.send(orjson.dumps({"type": "session.start", "session": {"model": LIVE_MODEL}}).decode()))
        started = orjson.loads(await asyncio.wait_for(s.recv(), 30))
        if started["type"] != "session.started":
            raise RuntimeError(f"expected session.started, got {started}")
    elif plan.target == "gateway":
        created = orjson.loads(await asyncio.wait_for(s.recv(), 30))
        if created["type"] != "session.created":
            raise RuntimeError(f"expected session.created, got {created}")
        if not plan.idle:
            await _maybe(s.send(_SESSION_UPDATE))
            while True:
                event = orjson.loads(await asyncio.wait_for(s.recv(), 30))
                if event["type"] == "error":
                    raise RuntimeError(event["error"]["message"])
                if event["type"] == "session.updated":
                    break
    return s, stream


async def _maybe(result: Awaitable[None] | None) -> None:
    if result is not None:
        await result


async def _open_all(plan: WorkerPlan) -> tuple[list[tuple[_Session, Any]], list[str]]:
    gate = asyncio.Semaphore(64)  # a burst of handshakes, not N at once

    async def one(i: int) -> tuple[_Session, Any]:
        async with gate:
            return await _open(plan, i)

    done = await asyncio.gather(*(one(i) for i in range(plan.count)), return_exceptions=True)
    return [d for d in done if isinstance(d, tuple)], [repr(e) for e in done if not isinstance(e, tuple)]


async def _pace(plan: WorkerPlan, sessions: list[_Session], start_at: float, st: _Stats) -> None:
    """Send chunk k of session s at start_at + s.phase + k * 20 ms until the window ends."""
    live = plan.target == "live"
    text, frame = _audio_messages("session.input_audio.append" if live else "input_audio_buffer.append")
    chunk: str | bytes = frame if plan.binary and not live else text
    gateway, every, w0, w1 = plan.target == "gateway", plan.commit_every, st.w0, st.w1
    answers = gateway and plan.duplex
    now = time.monotonic
    order = sorted(sessions, key=lambda s: s.phase)
    tick = 0
    while (base := start_at + tick * PERIOD_S) < w1:
        tick += 1
        for s in order:
            due = base + s.phase
            t = now()
            if due - t > 0.0005:  # sessions due within 0.5 ms go out together
                await asyncio.sleep(due - t)
                t = now()
            if s.dead:
                continue
            inside = w0 <= t < w1
            if inside:
                st.lag.append(max(0.0, t - due) * 1000)
                st.sent += 1
            try:
                if live:  # the microphone never stops; the next answer is asked for as soon as one ends
                    if not s.answering and t >= s.asked_at:
                        s.answering, s.asked_at = True, t
                        s.expected += 1
                        await _maybe(s.send(_LIVE_SAY))
                        st.sent += inside
                    if s.seq - s.acked_seq >= ACK_EVERY:
                        s.acked_seq = s.seq
                        await _maybe(s.send(f'{{"type":"session.event_ack","last_received_server_event_seq":{s.seq}}}'))
                        st.sent += inside
                    await _maybe(s.send(chunk))
                    s.chunks += 1
                    st.answered += inside  # Live replies to no chunk: a chunk sent counts as handled
                    continue
                if answers:
                    if not s.answering:  # answering all the time: the next response as soon as one is done
                        s.answering = True
                        await _maybe(s.send(_RESPONSE_CREATE))
                        st.sent += inside
                    if s.seq - s.acked_seq >= ACK_EVERY:
                        s.acked_seq = s.seq
                        await _maybe(s.send(f'{{"type":"session.event_ack","last_received_server_event_seq":{s.seq}}}'))
                        st.sent += inside
                if not gateway:
                    s.fifo.append(t)
                    s.expected += 1
                await _maybe(s.send(chunk))
                s.buf += 1
                s.chunks += 1
                if (s.chunks + s.shift) % every == 0 and s.buf >= MIN_COMMIT_CHUNKS:
                    if gateway:
                        s.pending.append((str(s.buf).encode(), t))
                        s.expected += s.buf
                    else:
                        s.fifo.append(-1.0)
                        s.expected += 1
                    s.buf = 0
                    await _maybe(s.send(_COMMIT))
                    st.sent += inside
            except Exception as exc:
                st.error(repr(exc))
                s.dead = True


async def _finish(plan: WorkerPlan, sessions: list[_Session]) -> int:
    """Flush the gateway's open buffers, wait for every reply owed; return how many never came."""
    for s in sessions:
        if plan.target != "gateway" or s.dead or not s.buf:
            continue
        with contextlib.suppress(Exception):
            if s.buf >= MIN_COMMIT_CHUNKS:
                s.pending.append((str(s.buf).encode(), -1.0))
                s.expected += s.buf
                await _maybe(s.send(_COMMIT))
            else:
                await _maybe(s.send(_CLEAR))  # too short to commit: these chunks are owed nothing
        s.buf = 0
    deadline = time.monotonic() + plan.drain_s
    while time.monotonic() < deadline and any(not s.dead and s.acked < s.expected for s in sessions):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return sum(max(0, s.expected - s.acked) for s in sessions)


async def _worker(plan: WorkerPlan, conn: Connection) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    opened, failures = await _open_all(plan)
    sessions = [s for s, _ in opened]
    conn.send(("ready", len(sessions), failures[:1]))
    order = await loop.run_in_executor(None, conn.recv)
    result: dict[str, Any] = {"connected": len(sessions), "failed": len(failures)}
    try:
        if order[0] == "go" and not plan.idle:
            _, start_at, w0, w1 = order
            st = _Stats(w0, w1)
            handlers = {(False, "gateway"): _on_gateway, (False, "echo"): _on_echo,
                        (True, "gateway"): _on_gateway_duplex, (True, "echo"): _on_echo_duplex}  # fmt: skip
            on = partial(_on_live, answer_chunks=plan.answer_chunks) if plan.target == "live" \
                else handlers[plan.duplex, plan.target]  # fmt: skip
            for s, stream in opened:
                stream(partial(_guarded, on, s, st), partial(setattr, s, "dead", True))
            await _pace(plan, sessions, start_at, st)
            unanswered = await _finish(plan, sessions)
            result.update(lat=st.lat, lag=st.lag, sent=st.sent, received=st.received, answered=st.answered,
                          unanswered=unanswered, errors=st.errors, first_error=st.first_error,
                          closed=sum(s.dead for s in sessions), jitter=st.jitter,
                          audio_out=st.audio_out, responses=st.responses)  # fmt: skip
    finally:
        with contextlib.suppress(TimeoutError):  # closing is best effort: the parent ends us anyway
            await asyncio.wait_for(asyncio.gather(*(s.close() for s in sessions), return_exceptions=True), 15)
    return result


def _worker_entry(plan: WorkerPlan, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends us
    if plan.cpus:
        os.sched_setaffinity(0, plan.cpus)
    import uvloop

    try:
        result = uvloop.run(_worker(plan, conn))
    except BaseException as exc:
        result = {"fatal": repr(exc)}
    with contextlib.suppress(Exception):
        conn.send(("result", result))


# --- servers -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process on 127.0.0.1; ended by ``stop`` (always called: see ``serve``)."""

    def __init__(self, target: str, sessions: int, run_s: float, setup: Setup, *, redis: bool = False) -> None:
        cpus = setup.server_cpus
        self.target = target
        self.redis: RedisServer | None = None
        self._tree: list[psutil.Process] = []  # the gateway's workers (--workers), found once it is ready
        self.port = _free_port()
        # The server's output; kept (and named in the error) only if it fails to start.
        self.log = tempfile.NamedTemporaryFile(prefix=f"voice_load_{target}_", suffix=".log", delete=False)
        self.keep_log = False
        env = dict(os.environ)
        if target in GATEWAYS:
            cmd = [sys.executable, "-m", "gateway", "serve", "--engine", "passthrough", "--port", str(self.port),
                   "--host", "127.0.0.1"]  # fmt: skip
            env.update(
                OMNI_GATEWAY_LOG_LEVEL="warning",
                OMNI_GATEWAY_API_KEYS="",
                OMNI_GATEWAY_REDIS_URL="",
                # Headroom over N: closed sessions stay resumable (detach_grace_s) for a while.
                OMNI_GATEWAY_MAX_SESSIONS=str(max(2_000, 2 * sessions + 100)),
                # Each session has one open buffer and, briefly after a commit, the one finishing.
                OMNI_GATEWAY_MAX_TRANSCRIPTIONS=str(max(1_024, 2 * sessions + 100)),
                OMNI_GATEWAY_MAX_BUFFER_MS=str(max(300_000, int(run_s * 1000) + 60_000)),
                OMNI_GATEWAY_DRAIN_WINDOW_S="1",  # the clients are gone when we stop it: no answers to wait for
                OMNI_GATEWAY_MAX_CONVERSATION_ITEMS=str(setup.conversation_items),
            )
            # Always said: with Redis, serve's default would be one worker per core it may use.
            cmd += ["--workers", str(setup.gateway_workers)]
            if redis:  # a redis-server of its own, on the server's CPUs: its CPU is the server's too
                self.redis = RedisServer(cpus)
                env["OMNI_GATEWAY_REDIS_URL"] = self.redis.url
            self.url = f"ws://127.0.0.1:{self.port}/v1/realtime"
            if setup.duplex:  # a route whose answers last --answer-s, one per session at a time
                route = {"name": LIVE_MODEL, "engine": "passthrough", "words_every": WORDS_EVERY,
                         "audio_chunks": setup.answer_chunks}  # fmt: skip
                env.update(OMNI_GATEWAY_MODELS=orjson.dumps({"models": [route]}).decode(),
                           OMNI_GATEWAY_MODEL=LIVE_MODEL,
                           OMNI_GATEWAY_MAX_RESPONSES=str(max(256, sessions + 100)))  # fmt: skip
                self.url += f"?model={LIVE_MODEL}"
            if target == "live":  # (--dialect live implies --duplex: the route above)
                self.url = f"ws://127.0.0.1:{self.port}{LIVE_PATH}"
        else:
            cmd = [sys.executable, str(ROOT / "bench" / "bare_echo.py"), "--port", str(self.port)]
            self.url = f"ws://127.0.0.1:{self.port}/" + ("duplex" if setup.duplex else "echo")
        self.setup_workers = setup.gateway_workers if target in GATEWAYS else 1
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            if cpus:
                os.sched_setaffinity(self.proc.pid, cpus)
            self.ps = psutil.Process(self.proc.pid)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.keep_log = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.target} exited with {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        self.keep_log = False
                        return
            time.sleep(0.1)
        raise RuntimeError(f"{self.target} not ready after {timeout:.0f} s; see {self.log.name}")

    def _procs(self) -> list[psutil.Process]:
        if self.setup_workers > 1 and not self._tree:
            self._tree = self.ps.children(recursive=True)
        return [self.ps, *self._tree]

    def rss(self) -> int:
        total = 0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                total += int(p.memory_info().rss)
        return total

    def cpu_s(self) -> float:
        """The gateway's CPU seconds (every worker's, with --workers), without Redis's."""
        total = 0.0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                total += _cpu_s(p)
        return total

    def redis_cpu_s(self) -> float:
        return _cpu_s(self.redis.ps) if self.redis is not None else 0.0

    def stop(self) -> None:
        if self.proc.poll() is not None:  # it died on its own: keep its words
            self.keep_log = True
            print(f"warning: {self.target} exited early ({self.proc.returncode}); see {self.log.name}")
        else:
            _terminate(self.proc, 10)
        self.log.close()
        if self.redis is not None:
            self.redis.stop()
        if not self.keep_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log.name)


class RedisServer:
    """``redis-server`` on a free port of 127.0.0.1, nothing kept on disk (--redis)."""

    def __init__(self, cpus: tuple[int, ...] | None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("--redis needs redis-server on PATH (Debian: apt-get install redis-server)")
        port = _free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", tempfile.gettempdir()],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        if cpus:
            os.sched_setaffinity(self.proc.pid, cpus)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 10
        while True:  # wait for it to accept
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            _terminate(self.proc, 5)


def _terminate(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def serve(target: str, sessions: int, run_s: float, setup: Setup, *, redis: bool = False) -> Any:
    server = Server(target, sessions, run_s, setup, redis=redis)
    try:
        server.wait_ready()
        _touch(server)
        yield server
    finally:
        server.stop()


def _touch(server: Server) -> None:
    """One session opened and closed: lazy imports and first-use caches land before the baseline RSS."""
    from websockets.sync.client import connect

    with connect(server.url, compression=None, open_timeout=10) as ws:
        if server.target == "live":
            ws.send(orjson.dumps({"type": "session.start", "session": {"model": LIVE_MODEL}}).decode())
            ws.recv(timeout=10)
        elif server.target == "gateway":
            ws.recv(timeout=10)
        else:
            ws.send("x")
            ws.recv(timeout=10)
    time.sleep(0.3)


# --- client pool (parent side) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setup:
    """How every phase of one invocation runs."""

    binary: bool
    client: str  # "asyncio" | "sansio"
    commit_every: int
    warmup: float
    clients: int  # client processes; 0: one per 300 sessions, at most the client cores
    server_cpus: tuple[int, ...] | None
    client_cpus: tuple[int, ...] | None
    wait_quiet_s: float = 0.0  # before each server starts, wait up to this long for others' load to drop
    profile: Path | None = None  # py-spy the gateway during the measured window, raw stacks here
    retries: int = 0  # measure again while other processes used > 15% of a core in the window
    duplex: bool = False  # every session is answered while it streams (see the module's docstring)
    answer_s: float = 5.0  # --duplex: the length of each answer
    gateway_workers: int = 1  # --workers: gateway processes (`serve --workers N`), on the first N CPUs
    dialects: tuple[str, ...] = ("realtime",)  # --dialect: the gateway's dialects measured, in this order
    # --conversation-items: the gateway's max_conversation_items. A conversation grows, by design,
    # up to its bounds (bench/conversation_memory.py measures what an item costs); held small,
    # it is full within the warm-up, and the window's RSS growth is whatever else grows.
    conversation_items: int = 16

    @property
    def answer_chunks(self) -> int:
        return int(self.answer_s * 1000) // CHUNK_MS

    def workers(self, n: int) -> int:
        cores = len(self.client_cpus or os.sched_getaffinity(0))
        return self.clients or max(1, min(cores, math.ceil(n / 300)))


class Pool:
    """Client worker processes for one phase; always ended by ``close``."""

    def __init__(self, server: Server, n: int, setup: Setup, *, idle: bool) -> None:
        ctx = mp.get_context("spawn")
        workers = max(1, min(setup.workers(n), n))
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        first = 0
        for w in range(workers):
            count = n // workers + (w < n % workers)
            plan = WorkerPlan(server.target, server.url, setup.binary, first, count, n, setup.commit_every, idle,
                              setup.client, setup.client_cpus, setup.duplex,
                              answer_chunks=setup.answer_chunks)  # fmt: skip
            first += count
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_entry, args=(plan, child), daemon=True)
            proc.start()
            self.procs.append(proc)
            self.conns.append(parent)
        self.ps = [psutil.Process(p.pid) for p in self.procs]

    def _recv(self, conn: Connection, timeout: float) -> Any:
        if not conn.poll(timeout):
            raise TimeoutError("a client worker did not answer in time")
        return conn.recv()

    def ready(self, timeout: float) -> tuple[int, list[str]]:
        connected, errors = 0, []
        for conn in self.conns:
            msg = self._recv(conn, timeout)
            if msg[0] == "result":  # died while opening
                raise RuntimeError(f"client worker failed: {msg[1]}")
            connected += msg[1]
            errors += msg[2]
        return connected, errors

    def send(self, order: tuple[Any, ...]) -> None:
        for conn in self.conns:
            conn.send(order)

    def results(self, timeout: float) -> list[dict[str, Any]]:
        out = [self._recv(conn, timeout)[1] for conn in self.conns]
        for r in out:
            if "fatal" in r:
                raise RuntimeError(f"client worker failed: {r['fatal']}")
        return out

    def cpu_s(self) -> list[float]:
        return [_cpu_s(p) for p in self.ps]

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(3)
            if p.is_alive():
                p.kill()
                p.join(1)


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used (``/proc/stat``): the rest of it is others' load."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, *_ = (int(x) for x in f.readline().split()[1:])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float, threshold_pct: float = 20.0, hold_s: int = 3) -> float:
    """Wait (at most ``limit_s``) until other processes used under ``threshold_pct`` of a core for
    ``hold_s`` seconds in a row; returns their load in the last second."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while True:
        before = _machine_busy_s()
        time.sleep(1.0)
        busy = 100 * (_machine_busy_s() - before)
        quiet = quiet + 1 if busy < threshold_pct else 0
        if quiet >= hold_s or time.monotonic() >= deadline:
            return busy


# Where a sample's own time goes, by the file of its innermost frame (first match wins).
_PARTS = (
    ("orchestrator/engines/", "the engine (passthrough: the model's stand-in)"),
    ("asyncio/tasks.py", "asyncio.sleep (the engine's pacing, the journal writer's batch window)"),
    ("orchestrator/", "the orchestrator (engine requests, admission, metrics)"),
    ("gateway/transport/", "the socket: frames, direct reads and writes, the connection"),
    ("gateway/protocol/", "decoding and encoding events"),
    ("gateway/session/", "the session: turns, responses, conversation"),
    ("gateway/hosting/", "hosting: flush, journal hand-off, effects"),
    ("gateway/store/", "the journal writer and the store"),
    ("gateway/", "the rest of the gateway (quotas, metrics)"),
    ("prometheus_client/", "the rest of the gateway (quotas, metrics)"),
    ("asyncio/runners.py", "the event loop in C (uvloop: epoll, recv/send syscalls, timers, task steps)"),
)


def _part_of(frame: str) -> str:
    return next((name for key, name in _PARTS if key in frame), "other Python (asyncio, libraries)")


class Profiler:
    """py-spy over the server for the measured window (raw collapsed stacks), then a summary of hot spots."""

    def __init__(self, pid: int, duration: float, path: Path) -> None:
        self.path = path
        cmd = ["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(duration))), "--rate", "200",
               "--nonblocking", "--format", "raw", "-o", str(path)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def summary(self, top: int = 25) -> str:
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "py-spy did not finish"
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        for line in self.path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f.rsplit(":", 1)[0] + ")" if f.endswith(")") else f for f in stack.split(";")]
            total += int(count)
            own[frames[-1]] = own.get(frames[-1], 0) + int(count)
            for f in set(frames):
                inclusive[f] = inclusive.get(f, 0) + int(count)
        if not total:
            return "py-spy took no samples"
        parts: dict[str, int] = {}
        for f, c in own.items():
            part = _part_of(f)
            parts[part] = parts.get(part, 0) + c
        mine = {f: c for f, c in inclusive.items() if "gateway/" in f or "orchestrator/" in f}
        lines = [f"py-spy: {total} samples of the gateway, raw stacks in {self.path}", "  own time:"]
        lines += [f"    {100 * c / total:5.1f}%  {f}" for f, c in sorted(own.items(), key=lambda x: -x[1])[:top]]
        lines.append("  own time by part:")
        lines += [f"    {100 * c / total:5.1f}%  {p}" for p, c in sorted(parts.items(), key=lambda x: -x[1])]
        lines.append("  inclusive, gateway and orchestrator functions:")
        lines += [f"    {100 * c / total:5.1f}%  {f}" for f, c in sorted(mine.items(), key=lambda x: -x[1])[:top]]
        return "\n".join(lines)


# --- one measured phase ---------------------------------------------------------------


@dataclass(slots=True)
class Figures:
    target: str
    sessions: int
    binary: bool
    client: str
    connected: int = 0
    msgs_in_s: float = 0.0
    msgs_out_s: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    samples: int = 0
    lag_p99_ms: float = math.nan  # how late the client sent, p99: the client keeping up
    chunks_answered_s: float = 0.0  # audio chunks whose reply came in the window, per second
    unanswered: int = 0  # replies still owed after the drain (lost, or later than --drain)
    errors: int = 0
    closed: int = 0
    first_error: str = ""
    server_cpu_pct: float = math.nan  # the gateway's (all its workers), without Redis
    store: str = "memory"  # the gateway's session store: memory, or redis (--redis)
    workers: int = 1
    redis_cpu_pct: float = 0.0  # --redis: the redis-server's CPU (on the server's CPUs)
    server_rss_mb: float = math.nan
    rss_base_mb: float = math.nan
    rss_per_session_kb: float = math.nan  # (peak RSS in the window - RSS before connecting) / sessions
    # RSS growth per session per second: the slope (least squares) of the RSS sampled every
    # second over the window's second half, after the warm-up's caches and buffers have filled
    rss_growth_kb_s: float = math.nan
    rss_per_idle_kb: float = math.nan
    client_cpu_pct: list[float] = field(default_factory=list)
    other_cpu_pct: float = math.nan  # processes not ours, during the window (100 = one core)
    quiet_pct: float = math.nan  # others' load just before the server started
    profile: str = ""
    added_p50_ms: float = math.nan
    added_p99_ms: float = math.nan
    # --duplex
    duplex: bool = False
    audio_out_s: float = 0.0  # 20 ms audio messages received per second
    responses_s: float = 0.0
    jitter_p50_ms: float = math.nan  # |gap between audio messages - 20 ms|
    jitter_p99_ms: float = math.nan


def _ready_timeout(n: int) -> float:
    return 30.0 + n / 20


def measure_idle(server: Server, n: int, setup: Setup) -> float:
    """Server RSS delta per open idle session, KB."""
    base = server.rss()
    pool = Pool(server, n, setup, idle=True)
    try:
        connected, _ = pool.ready(_ready_timeout(n))
        time.sleep(1.0)  # let the server finish the handshakes' work
        idle = server.rss()
        pool.send(("stop",))
        pool.results(30)
    finally:
        pool.close()
    return (idle - base) / 1024 / max(1, connected)


def rss_slope(samples: list[tuple[float, int]]) -> float:
    """Bytes per second: the least-squares slope of (time, RSS) over the second half of the
    samples (nan with fewer than 3 there)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return math.nan
    t, rss = np.array([s[0] for s in half]), np.array([s[1] for s in half], dtype=np.float64)
    return float(np.polyfit(t - t[0], rss, 1)[0])


def measure_load(server: Server, fig: Figures, setup: Setup, duration: float) -> None:
    n = fig.sessions
    base = server.rss()
    fig.rss_base_mb = base / 2**20
    me = psutil.Process()
    pool = Pool(server, n, setup, idle=False)
    try:
        fig.connected, errors = pool.ready(_ready_timeout(n))
        if errors:
            fig.first_error = errors[0]
        start_at = time.monotonic() + 0.5
        w0, w1 = start_at + setup.warmup, start_at + setup.warmup + duration
        pool.send(("go", start_at, w0, w1))
        time.sleep(max(0.0, w0 - time.monotonic()))
        profiler = None
        if setup.profile is not None and server.target in GATEWAYS:
            profiler = Profiler(server.proc.pid, duration, setup.profile)
        cpu0, ccpu0, me0, all0 = server.cpu_s(), pool.cpu_s(), _cpu_s(me), _machine_busy_s()
        rcpu0 = server.redis_cpu_s()
        rss_at = [(time.monotonic(), server.rss())]
        while (left := w1 - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            rss_at.append((time.monotonic(), server.rss()))
        cpu1, ccpu1, me1, all1 = server.cpu_s(), pool.cpu_s(), _cpu_s(me), _machine_busy_s()
        rcpu1 = server.redis_cpu_s()
        results = pool.results(60)
        if profiler is not None:
            fig.profile = profiler.summary()
    finally:
        pool.close()
    fig.server_cpu_pct = 100 * (cpu1 - cpu0) / duration
    fig.redis_cpu_pct = 100 * (rcpu1 - rcpu0) / duration
    fig.client_cpu_pct = [round(100 * (b - a) / duration, 1) for a, b in zip(ccpu0, ccpu1, strict=True)]
    ours = (cpu1 - cpu0) + (rcpu1 - rcpu0) + sum(ccpu1) - sum(ccpu0) + (me1 - me0)
    fig.other_cpu_pct = max(0.0, 100 * ((all1 - all0) - ours) / duration)
    peak = max(rss for _, rss in rss_at)
    fig.server_rss_mb = peak / 2**20
    fig.rss_per_session_kb = (peak - base) / 1024 / max(1, fig.connected)
    fig.rss_growth_kb_s = rss_slope(rss_at) / 1024 / max(1, fig.connected)
    lat = np.concatenate([np.frombuffer(r["lat"], dtype=np.float64) for r in results])
    lag = np.concatenate([np.frombuffer(r["lag"], dtype=np.float64) for r in results])
    fig.samples = int(lat.size)
    if lat.size:
        fig.p50_ms, fig.p99_ms = (float(x) for x in np.percentile(lat, [50, 99]))
    if lag.size:
        fig.lag_p99_ms = float(np.percentile(lag, 99))
    fig.msgs_in_s = sum(r["sent"] for r in results) / duration
    fig.msgs_out_s = sum(r["received"] for r in results) / duration
    fig.chunks_answered_s = sum(r["answered"] for r in results) / duration
    fig.unanswered = sum(r["unanswered"] for r in results)
    fig.errors = sum(r["errors"] for r in results)
    fig.closed = sum(r["closed"] for r in results)
    fig.first_error = fig.first_error or next((r["first_error"] for r in results if r["first_error"]), "")
    if fig.duplex:
        jitter = np.concatenate([np.frombuffer(r["jitter"], dtype=np.float64) for r in results])
        if jitter.size:
            fig.jitter_p50_ms, fig.jitter_p99_ms = (float(x) for x in np.percentile(jitter, [50, 99]))
        fig.audio_out_s = sum(r["audio_out"] for r in results) / duration
        fig.responses_s = sum(r["responses"] for r in results) / duration


NOISY_PCT = 15.0  # others' CPU in a window (100 = one core) above which figures are skewed
KEEPUP_P50_MS = 10.0  # --find-max: a server whose median round trip passes this is saturated (queueing)


def run_target(target: str, setup: Setup, n: int, *, idle: bool, duration: float, redis: bool = False) -> Figures:
    """Measure one server; on a busy machine (--retries), again, keeping the quietest run."""
    best = _run_once(target, setup, n, idle=idle, duration=duration, redis=redis)
    for _ in range(setup.retries):
        if best.other_cpu_pct <= NOISY_PCT:
            break
        print(f"  {target}: other processes used {best.other_cpu_pct:.0f}% of a core; measuring again", flush=True)
        fig = _run_once(target, setup, n, idle=idle, duration=duration, redis=redis)
        best = fig if fig.other_cpu_pct < best.other_cpu_pct else best
    return best


def _run_once(target: str, setup: Setup, n: int, *, idle: bool, duration: float, redis: bool = False) -> Figures:
    fig = Figures(target, n, setup.binary and target != "live", setup.client, duplex=setup.duplex)
    if target in GATEWAYS:
        fig.store, fig.workers = ("redis" if redis else "memory"), setup.gateway_workers
    if setup.wait_quiet_s > 0:
        fig.quiet_pct = wait_quiet(setup.wait_quiet_s)
    if idle:  # a server of its own: the gateway keeps closed sessions resumable for a while
        with serve(target, n, setup.warmup + duration, setup, redis=redis) as server:
            fig.rss_per_idle_kb = measure_idle(server, n, setup)
    with serve(target, n, setup.warmup + duration, setup, redis=redis) as server:
        measure_load(server, fig, setup, duration)
    return fig


# --- report -------------------------------------------------------------------------


def _f(x: float, nd: int = 1) -> str:
    return "-" if math.isnan(x) else f"{x:,.{nd}f}"


def _ok(good: bool) -> str:
    return "met" if good else "MISSED"


def client_bound(fig: Figures, setup: Setup) -> bool:
    """The client, not the server, may limit the run: its cores are busy or it sends late."""
    cores = len(setup.client_cpus) if setup.client_cpus else max(1, len(os.sched_getaffinity(0)) - 1)
    return sum(fig.client_cpu_pct) >= 90 * cores or fig.lag_p99_ms > 10


def healthy(fig: Figures) -> bool:
    """Everything connected, every reply came, no error, and the client sent on time; a Live run
    also answered within the window with its audio at pace (its chunks have no replies to miss)."""
    live_ok = fig.target != "live" or (fig.samples > 0 and fig.jitter_p50_ms <= KEEPUP_P50_MS)
    return (fig.connected == fig.sessions and not (fig.unanswered or fig.errors or fig.closed)
            and fig.lag_p99_ms <= 20 and live_ok)  # fmt: skip


def _warn(fig: Figures, setup: Setup) -> None:
    if not healthy(fig):
        print(f"warning: {fig.target}: unhealthy run ({fig.unanswered} unanswered, {fig.errors} errors, "
              f"{fig.connected}/{fig.sessions} connected, send lag p99 {_f(fig.lag_p99_ms)} ms) "
              f"{fig.first_error}")  # fmt: skip
        if fig.target == "live":
            print(f"warning: live: {fig.samples} answers began in the window, audio gap jitter p50 "
                  f"{_f(fig.jitter_p50_ms, 1)} ms (a Live run keeps up while it answers at pace)")  # fmt: skip
    if client_bound(fig, setup):
        print(f"warning: {fig.target}: the client may be the bottleneck (its CPU or send lag)")
    if fig.other_cpu_pct > NOISY_PCT:
        print(f"warning: {fig.target}: other processes used {fig.other_cpu_pct:.0f}% of a core meanwhile: "
              "figures are skewed (--wait-quiet helps)")  # fmt: skip


def handled_s(fig: Figures) -> float:
    """Chunks handled per second: input chunks answered, and with --duplex the audio chunks sent out too."""
    return fig.chunks_answered_s + fig.audio_out_s


def server_pct(fig: Figures) -> float:
    """The server side's CPU: the gateway's, and with --redis its redis-server's."""
    return fig.server_cpu_pct + fig.redis_cpu_pct


def per_core(fig: Figures) -> float:
    """Chunks handled per second of server CPU (the gateway's and its Redis's); NaN when the
    run was not healthy."""
    ok = healthy(fig) and fig.server_cpu_pct > 0
    return handled_s(fig) / (server_pct(fig) / 100) if ok else math.nan


def sessions_per_core(fig: Figures) -> float:
    """Sessions per core of server CPU (the gateway's and its Redis's): the N it served over the
    cores it used for them; NaN when the run was not healthy."""
    ok = healthy(fig) and fig.server_cpu_pct > 0
    return fig.connected / (server_pct(fig) / 100) if ok else math.nan


def label(fig: Figures) -> str:
    if fig.target not in GATEWAYS:
        return fig.target
    return fig.target + ("+redis" if fig.store == "redis" else "") + (f" x{fig.workers}" if fig.workers > 1 else "")


def report(gws: list[Figures], echo: Figures, setup: Setup) -> float:
    """Print the gateway runs (memory store; with --redis, Redis too) beside the echo; returns
    the first run's throughput ratio."""
    for gw in gws:
        gw.added_p50_ms, gw.added_p99_ms = gw.p50_ms - echo.p50_ms, gw.p99_ms - echo.p99_ms
    figs, gw = [*gws, echo], gws[0]
    goal = TARGET_RATIO_DUPLEX if gw.duplex else TARGET_RATIO

    def row(
        name: str,
        value: Callable[[Figures], str],
        target: Callable[[Figures], str] | None = None,
        *,
        gateway_only: bool = False,
    ) -> tuple[str, list[str], str]:
        cells = ["" if gateway_only and f is echo else value(f) for f in figs]
        return name, cells, "" if target is None else target(gw)

    def added_jitter(f: Figures) -> float:
        return f.jitter_p99_ms - echo.jitter_p99_ms

    duplex = [
        row("audio msgs out/s", lambda f: _f(f.audio_out_s, 0)),
        row("responses done/s", lambda f: _f(f.responses_s, 1), gateway_only=True),
        row("out gap jitter p50 ms", lambda f: _f(f.jitter_p50_ms, 2)),
        row("out gap jitter p99 ms", lambda f: _f(f.jitter_p99_ms, 2)),
        row("added jitter p99 ms", lambda f: _f(added_jitter(f), 2),
            lambda f: f"<= {TARGET_ADDED_P99_MS:.0f}: {_ok(added_jitter(f) <= TARGET_ADDED_P99_MS)}",
            gateway_only=True),
    ] if gw.duplex else []  # fmt: skip
    rows = [
        row("sessions (connected)", lambda f: f"{f.connected}/{f.sessions}"),
        row("msgs/s in", lambda f: _f(f.msgs_in_s, 0)),
        row("msgs/s out", lambda f: _f(f.msgs_out_s, 0)),
        row("chunks answered/s", lambda f: _f(f.chunks_answered_s, 0)),
        *duplex,
        row("RTT p50 ms", lambda f: _f(f.p50_ms, 2)),
        row("RTT p99 ms", lambda f: _f(f.p99_ms, 2)),
        row("latency samples", lambda f: f"{f.samples:,}"),
        row("added p50 ms", lambda f: _f(f.added_p50_ms, 2), gateway_only=True),
        row("added p99 ms", lambda f: _f(f.added_p99_ms, 2),
            lambda f: f"<= {TARGET_ADDED_P99_MS:.0f}: {_ok(f.added_p99_ms <= TARGET_ADDED_P99_MS)}",
            gateway_only=True),
        row("server CPU % (gateway)", lambda f: _f(f.server_cpu_pct)),
        row("redis-server CPU %", lambda f: _f(f.redis_cpu_pct) if f.store == "redis" else "", gateway_only=True),
        row("server RSS MB (base)", lambda f: f"{_f(f.server_rss_mb)} ({_f(f.rss_base_mb)})"),
        row("RSS KB/session", lambda f: _f(f.rss_per_session_kb)),
        row("  growth KB/s/session", lambda f: _f(f.rss_growth_kb_s, 2)),
        row("RSS KB/idle session", lambda f: _f(f.rss_per_idle_kb),
            lambda f: "" if math.isnan(f.rss_per_idle_kb)
            else f"<= {TARGET_IDLE_KB:.0f}: {_ok(f.rss_per_idle_kb <= TARGET_IDLE_KB)}"),
        row("unanswered/errors/closed", lambda f: f"{f.unanswered}/{f.errors}/{f.closed}"),
        row("client send lag p99 ms", lambda f: _f(f.lag_p99_ms, 2)),
        row("client CPU % per proc", lambda f: " ".join(map(str, f.client_cpu_pct))),
        row("others' CPU %", lambda f: _f(f.other_cpu_pct, 0)),
        row("sessions per server core", lambda f: _f(sessions_per_core(f), 0)),
        row("chunks per server CPU s", lambda f: _f(per_core(f), 0)),
        row("  ratio to the echo", lambda f: _f(per_core(f) / per_core(echo), 2),
            lambda f: f">= {goal}: {_ok(per_core(f) / per_core(echo) >= goal)}", gateway_only=True),
    ]  # fmt: skip
    print(f"\n{'':24}" + "".join(f"{label(f):>16}" for f in figs) + "   target")
    for name, cells, t in rows:
        print(f"{name:24}" + "".join(f"{c:>16}" for c in cells) + f"   {t}")
    # Chunks answered per server CPU second: what each would carry on one full core. Only a run
    # the server kept up with says so (an overloaded one answers late, outside the window).
    ratio = per_core(gw) / per_core(echo)
    what = "chunks handled (in answered + audio out)" if gw.duplex else "chunks answered"
    print(f"\n{what} per server CPU second: gateway {_f(per_core(gw), 0)}, echo {_f(per_core(echo), 0)}: "
          f"throughput ratio gateway/echo {_f(ratio, 2)} (target >= {goal}: {_ok(ratio >= goal)}; "
          f"--find-max measures it at saturation)")  # fmt: skip
    for other in gws[1:]:
        if other.target == "live":
            continue
        print(f"{label(other)}: {_f(per_core(other), 0)} chunks per server CPU second (its Redis's CPU "
              f"counted), {_f(per_core(other) / per_core(gw), 2)} of the memory store's")  # fmt: skip
    for f in gws:
        dialect = "GPT-Live" if f.target == "live" else "Realtime"
        what = (
            "commentary -> the first audio of its answer"
            if f.target == "live"
            else "append -> its transcript delta"
            if not f.duplex
            else "append -> its transcript delta, answering"
        )
        print(f"{dialect} ({label(f)}): {_f(sessions_per_core(f), 0)} sessions per server core; latency the gateway "
              f"adds ({what}, minus the echo's round trip) p50 {_f(f.added_p50_ms, 2)} ms, "
              f"p99 {_f(f.added_p99_ms, 2)} ms")  # fmt: skip
    if gw.sessions < TARGET_SESSIONS:
        print(f"note: N={gw.sessions} is below the {TARGET_SESSIONS}-session target; run --sessions "
              f"{TARGET_SESSIONS} or --find-max")  # fmt: skip
    for fig in figs:
        _warn(fig, setup)
    return ratio


def keeps_up(fig: Figures) -> bool:
    """Not saturated: healthy, and neither the median round trip nor (--duplex) the median gap
    jitter of the audio out has grown into a queue."""
    paced = not fig.duplex or fig.jitter_p50_ms <= KEEPUP_P50_MS
    return healthy(fig) and fig.p50_ms <= KEEPUP_P50_MS and paced


def find_max(setup: Setup, steps: list[int], step_s: float, max_minutes: float) -> dict[str, Any]:
    """Ramp N over ``steps`` for both servers, each until it saturates (stops keeping up).

    Reported: the largest N at which the gateway's p99 added latency (its p99 minus the echo's
    at the same N, or at the largest N the echo kept up with) is within target, and each
    server's saturation throughput (chunks answered/s at the largest N it kept up with),
    whose quotient is the throughput ratio.
    """
    out: dict[str, Any] = {"gateway": [], "echo": []}
    sat = {"gateway": (0, 0.0), "echo": (0, 0.0)}  # (N, chunks answered/s) of the last step kept up with
    saturated = {"gateway": False, "echo": False}
    target_n = 0  # the gateway's largest N within the latency target
    missed = False  # it missed the latency target at some N (larger N are not counted)
    echo_p99 = 0.0
    deadline = time.monotonic() + max_minutes * 60
    print(f"{'target':8}{'N':>6}{'in/s':>8}{'out/s':>8}{'p50':>8}{'p99':>9}{'added99':>9}{'jit99':>7}{'cpu%':>6}"
          f"{'lag99':>7}{'unans':>6}{'client%':>9}{'other%':>7}  verdict")  # fmt: skip
    for n in steps:
        for target in ("echo", "gateway"):
            if saturated[target] or time.monotonic() > deadline:
                continue
            fig = run_target(target, setup, n, idle=False, duration=step_s)
            up = keeps_up(fig)
            verdict = "keeps up" if up else "SATURATED"
            if target == "echo":
                echo_p99 = fig.p99_ms if up else echo_p99
            else:
                fig.added_p99_ms = fig.p99_ms - echo_p99
                within = up and fig.added_p99_ms <= TARGET_ADDED_P99_MS
                missed = missed or not within
                target_n = n if within and not missed else target_n
                verdict += ", p99 added within target" if within else ", p99 added over target"
            if up:
                sat[target] = (n, handled_s(fig))
            saturated[target] = not up
            note = (" client-bound?" if client_bound(fig, setup) else "") + (" " + fig.first_error[:50]).rstrip()
            print(f"{target:8}{n:>6}{fig.msgs_in_s:>8.0f}{fig.msgs_out_s:>8.0f}{fig.p50_ms:>8.2f}{fig.p99_ms:>9.2f}"
                  f"{_f(fig.added_p99_ms, 2):>9}{_f(fig.jitter_p99_ms, 1):>7}"
                  f"{fig.server_cpu_pct:>6.0f}{fig.lag_p99_ms:>7.1f}{fig.unanswered:>6}"
                  f"{sum(fig.client_cpu_pct):>9.0f}{fig.other_cpu_pct:>7.0f}  {verdict}{note}", flush=True)  # fmt: skip
            out[target].append(asdict(fig))
    (gw_n, gw_rate), (echo_n, echo_rate) = sat["gateway"], sat["echo"]
    ratio = gw_rate / echo_rate if echo_rate else math.nan
    lower = {t: "" if saturated[t] else " (kept up with every step run: a lower bound)" for t in saturated}
    print(
        f"\ngateway: max N within p99 added <= {TARGET_ADDED_P99_MS:.0f} ms: {target_n} "
        f"(target >= {TARGET_SESSIONS}: {_ok(target_n >= TARGET_SESSIONS)})"
    )
    print(f"gateway: saturation at N = {gw_n}, {gw_rate:,.0f} chunks handled/s{lower['gateway']}")
    print(f"echo: saturation at N = {echo_n}, {echo_rate:,.0f} chunks handled/s{lower['echo']}")
    print(f"throughput ratio gateway/echo: {_f(ratio, 2)} (target >= {TARGET_RATIO}: {_ok(ratio >= TARGET_RATIO)})")
    out.update(gateway_max_sessions_in_target=target_n, gateway_saturation_sessions=gw_n, gateway_chunks_s=gw_rate,
               echo_saturation_sessions=echo_n, echo_chunks_s=echo_rate, ratio=ratio)  # fmt: skip
    return out


# --- main -----------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Setup]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sessions",
        type=int,
        default=200,
        help=f"N concurrent sessions (default 200; the target is {TARGET_SESSIONS})",
    )
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per server (default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first (default 3)")
    p.add_argument("--binary", action="store_true", help="appends as omni-binary.v1 frames, not base64 JSON")
    p.add_argument(
        "--duplex",
        action="store_true",
        help="full duplex: every session is answered with 20 ms audio deltas at 50/s while it streams in",
    )
    p.add_argument(
        "--dialect",
        choices=["realtime", "live", "both"],
        default="realtime",
        help="the gateway's dialect measured: OpenAI Realtime (/v1/realtime), GPT-Live (/v1/live/sessions: "
        "the microphone streams while the model answers commentary back to back; implies --duplex, JSON "
        "appends), or both in one run beside the same echo (default realtime)",
    )
    p.add_argument("--answer-s", type=float, default=5.0, help="--duplex: seconds of audio per response (default 5)")
    p.add_argument(
        "--conversation-items",
        type=int,
        default=16,
        help="the gateway's max_conversation_items: small, the conversation is full within the warm-up "
        "and the RSS growth shown is everything else (default 16; the server's default is 1000; "
        "bench/conversation_memory.py measures an item)",
    )
    p.add_argument(
        "--commit-ms",
        type=int,
        default=1000,
        help="commit the gateway's buffer every this much audio: one latency sample each "
        "(multiple of 20, >= 100; default 1000)",
    )
    p.add_argument(
        "--client",
        choices=["asyncio", "sansio"],
        default="sansio",
        help="websockets' asyncio client, or its Sans-I/O protocol on a bare asyncio "
        "Protocol (default: sansio, about half the client CPU)",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=0,
        help="client processes (default: one per 300 sessions, at most the client cores)",
    )
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="server on the first CPU, clients on the others (default: on with >= 2 CPUs)",
    )
    p.add_argument("--no-idle", action="store_true", help="skip the idle-session memory phase")
    p.add_argument("--idle-only", action="store_true", help="only the idle-session memory phase")
    p.add_argument("--only", choices=["gateway", "echo"], help="measure one server only")
    p.add_argument("--find-max", action="store_true", help="ramp N (--steps) until a step fails")
    p.add_argument(
        "--steps", default="100,150,200,250,300,400,500,600,800,1000", help="N for --find-max, comma separated"
    )
    p.add_argument("--step-duration", type=float, default=10.0, help="measured seconds per step (default 10)")
    p.add_argument("--max-minutes", type=float, default=12.0, help="no step starts after this (default 12)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each server starts, wait up to S seconds for other processes to use < 20%% "
        "of a core (shared machines; default 0: don't wait)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="py-spy the gateway during the measured window (raw stacks to PATH) and print its "
        "hot spots; figures of a profiled run are not to be quoted",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=0,
        help="measure a server again (up to this many times) while other processes used > 15%% of "
        "a core during its window; the quietest run is kept (default 0)",
    )
    p.add_argument(
        "--redis",
        action="store_true",
        help="also measure the gateway on the Redis store (a redis-server this starts, on the server's CPUs)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes (serve --workers N), on the first N CPUs; the clients on the rest, or beside "
        "them where none are left; above 1 the gateway runs on Redis only, as serve requires (default 1)",
    )
    p.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    args = p.parse_args(argv)  # fmt: skip
    dialects = ("realtime", "live") if args.dialect == "both" else (args.dialect,)
    if "live" in dialects and (args.find_max or args.idle_only):
        p.error("--find-max and --idle-only measure the Realtime dialect only (--dialect realtime)")
    if "live" in dialects:
        args.duplex = True  # a Live model answers while the microphone streams: the duplex route and echo
    if args.commit_ms < MIN_COMMIT_MS or args.commit_ms % CHUNK_MS:
        p.error(f"--commit-ms must be a multiple of {CHUNK_MS} and >= {MIN_COMMIT_MS}")
    cpus = sorted(os.sched_getaffinity(0))
    if args.workers < 1:
        p.error("--workers must be >= 1")
    pin = args.pin and len(cpus) >= 2
    server_cpus, client_cpus = tuple(cpus[: args.workers]), tuple(cpus[args.workers :])
    if not client_cpus:  # nothing left: the clients share the server's CPUs (and say so)
        client_cpus = tuple(cpus)
    setup = Setup(
        binary=args.binary, client=args.client, commit_every=args.commit_ms // CHUNK_MS, warmup=args.warmup,
        clients=args.clients, server_cpus=server_cpus if pin else None, client_cpus=client_cpus if pin else None,
        wait_quiet_s=args.wait_quiet, profile=args.profile, retries=args.retries, duplex=args.duplex,
        answer_s=args.answer_s, gateway_workers=args.workers, conversation_items=args.conversation_items,
        dialects=dialects,
    )  # fmt: skip
    return args, setup


def main(argv: list[str] | None = None) -> int:
    args, setup = _parse(argv)
    # Ctrl-C (even where a shell started us with SIGINT ignored) and SIGTERM unwind through the
    # finally blocks, which stop the servers and the client processes.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.suppress(ValueError, OSError):  # one socket per session on each side
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    mode = (
        ("binary frames" if args.binary else "base64 JSON appends")
        + (f", full duplex (answers of {args.answer_s:g} s, 50 audio deltas/s out)" if args.duplex else "")
        + f"; dialects: {', '.join(setup.dialects)}"
        + (" (Live: base64 JSON appends)" if "live" in setup.dialects else "")
    )
    print(f"voice_load: {mode}, 50 x {CHUNK_BYTES} B chunks/s per session, commit every {args.commit_ms} ms, "
          f"{args.client} client; {os.cpu_count()} CPUs, server on {setup.server_cpus or 'any'}, clients on "
          f"{setup.client_cpus or 'any'}", flush=True)  # fmt: skip
    out: dict[str, Any]
    if args.idle_only:
        out = {}
        for target in ("gateway", "echo"):
            if args.only in (None, target):
                with serve(target, args.sessions, 60.0, setup) as server:
                    out[target] = kb = measure_idle(server, args.sessions, setup)
                print(f"{target}: {kb:.1f} KB RSS per idle session (N={args.sessions})", flush=True)
    elif args.find_max:
        out = find_max(setup, [int(x) for x in args.steps.split(",")], args.step_duration, args.max_minutes)
    else:
        n = args.sessions
        print(f"N={n}, {setup.workers(n)} client process(es), {args.warmup:.0f} s warm-up + "
              f"{args.duration:.0f} s measured per server", flush=True)  # fmt: skip
        figs: dict[str, Figures] = {}
        # Workers share their sessions' state through Redis only (serve refuses --workers > 1 without it).
        gateway_runs = [(True,)] if args.workers > 1 else [(False,), *([(True,)] if args.redis else [])]
        runs = [*(("gateway", redis) for (redis,) in gateway_runs if "realtime" in setup.dialects),
                *([("live", args.workers > 1)] if "live" in setup.dialects else []), ("echo", False)]  # fmt: skip
        for target, redis in runs:
            if args.only in (None, "gateway" if target in GATEWAYS else target):
                key = target + ("+redis" if redis else "")
                print(f"measuring {key} ...", flush=True)
                figs[key] = run_target(target, setup, n, idle=not args.no_idle, duration=args.duration, redis=redis)
        ratio = None
        if "echo" in figs and len(figs) >= 2:  # (the report works out the added latencies: then the JSON)
            ratio = report([f for k, f in figs.items() if k != "echo"], figs["echo"], setup)
        out = {k: asdict(v) for k, v in figs.items()}
        if ratio is not None:
            out["ratio"] = ratio
        else:
            for fig in figs.values():
                print(orjson.dumps({k: v for k, v in asdict(fig).items() if k != "profile"},
                                   option=orjson.OPT_INDENT_2).decode())  # fmt: skip
                _warn(fig, setup)
        for fig in figs.values():
            if fig.profile:
                print(fig.profile)
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: servers and clients stopped", file=sys.stderr)
        sys.exit(130)
