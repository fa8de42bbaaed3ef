"""``/v1/realtime/video`` under pressure: a client that stops reading.

The gateway promises (gateway/transport/video.py): at most
``video_queue_chunks`` chunks wait for a slow client; when one more arrives
the oldest waiting chunk is dropped whole and the next chunk delivered
reports it (``dropped_chunks``, ``dropped_generation_chunk_indexes``); the
first fMP4 chunk delivered carries the init segment, whichever chunk that
is; a client that lets more than ``video_max_consecutive_drops`` chunks drop
in a row is closed with 4010.

The client here is a plain socket driven by websockets' Sans-I/O protocol, so
the test decides when bytes are read from the kernel: while it does not read,
nothing is. The kernel buffers on loopback absorb megabytes (send buffers
autotune up to ``tcp_wmem``), which would take minutes to fill with CPU-rendered
video; so the client's receive buffer and the server's send buffer (set on the
listening socket, inherited by accepted ones) are shrunk to a few KiB. The
gateway's code is unchanged by that: its writer blocks exactly as it would
behind a slow mobile link, only sooner.
"""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.gateway import RunningGateway, run_gateway
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from gateway.protocol.errors import Code
from gateway.settings import Settings
from gateway.transport.video import VideoSocket
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.engines.video.engine import CpuVideoEngine

pytestmark = pytest.mark.timeout(90)

QUEUE = 2  # video_queue_chunks
BUFFER = 4096  # bytes asked for SO_RCVBUF (client) and SO_SNDBUF (server); Linux doubles them
FILL_MESSAGES = 60  # ~4 KiB errors: about 240 KiB, well over what the shrunk buffers hold (~80 KiB)
# Short chunks generated as fast as the CPU renders them: lead_chunks lets the engine
# run far ahead of real time, so it outruns a client that reads nothing.
STREAM = {"prompt": "A paper boat on a stormy sea", "width": 320, "height": 240, "fps": 12, "frames_per_chunk": 2}


class Closed(Exception):
    def __init__(self, code: int | None) -> None:
        super().__init__(f"closed with {code}")
        self.code = code


class RawVideoClient:
    """A WebSocket client whose reads the test controls (see the module docstring)."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol
        self._pending: list[str | bytes] = []
        self.close_code: int | None = None

    @classmethod
    async def open(cls, url: str, rcvbuf: int = BUFFER) -> RawVideoClient:
        loop = asyncio.get_running_loop()
        uri = parse_uri(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: sets the window
        sock.setblocking(False)
        await loop.sock_connect(sock, (uri.host, uri.port))
        protocol = ClientProtocol(uri, max_size=None)
        protocol.send_request(protocol.connect())
        client = cls(sock, protocol)
        await client._flush()
        async with asyncio.timeout(10):
            while True:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    raise ConnectionError("the server closed during the handshake")
                protocol.receive_data(data)
                events = protocol.events_received()
                if events:
                    assert isinstance(events[0], Response) and events[0].status_code == 101, events[0]
                    client._take(events[1:])
                    return client

    async def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def _take(self, events: list[Any]) -> None:
        for frame in events:
            if frame.opcode == Opcode.TEXT:
                self._pending.append(frame.data.decode())
            elif frame.opcode == Opcode.BINARY:
                self._pending.append(bytes(frame.data))
            elif frame.opcode == Opcode.CLOSE:
                self.close_code = self.protocol.close_code
            else:
                assert frame.opcode in (Opcode.PING, Opcode.PONG), frame  # the server never fragments

    async def send(self, event: dict[str, Any]) -> None:
        self.protocol.send_text(orjson.dumps(event))
        await self._flush()

    async def recv(self, timeout: float = 30.0) -> str | bytes:
        """The next message; reads the socket only when none is buffered. Closed at the end."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while not self._pending:
                if self.close_code is not None:
                    raise Closed(self.close_code)
                data = await loop.sock_recv(self.sock, 65536)
                if not data:
                    self.protocol.receive_eof()
                    self.close_code = self.protocol.close_code
                    raise Closed(self.close_code)
                self.protocol.receive_data(data)
                self._take(self.protocol.events_received())
                await self._flush()  # pongs, and the echo of a close
        return self._pending.pop(0)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Stream:
    """What a client read, checked as it goes: each metadata is followed by its frame."""

    client: RawVideoClient
    events: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[tuple[dict[str, Any], bytes]] = field(default_factory=list)

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        message = await self.client.recv(timeout)
        assert isinstance(message, str), f"a binary frame ({len(message)} B) without its metadata"
        event: dict[str, Any] = orjson.loads(message)
        self.events.append(event)
        if event["type"] == "video.chunk_metadata":
            payload = await self.client.recv(timeout)
            assert isinstance(payload, bytes), "metadata followed by a text frame"
            assert len(payload) == event["byte_length"]
            self.chunks.append((event, payload))
        return event

    async def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next(timeout)
                if match(event):
                    return event

    async def drain(self, timeout: float = 30.0) -> int | None:
        """Read to the end; the close code."""
        with suppress(Closed):
            async with asyncio.timeout(timeout):
                while True:
                    await self.next(timeout)
        return self.client.close_code


def is_type(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == kind


# --- the server, with small socket buffers and a sampler of its queue -----------------------


@asynccontextmanager
async def gateway(**kwargs: Any) -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", detach_grace_s=0.2, drain_window_s=0.5, video_queue_chunks=QUEUE,
                        video_lead_chunks=10_000, **kwargs)  # fmt: skip
    async with run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        for server in gw.server.servers:
            for listener in server.sockets:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
        yield gw


class QueueSampler:
    """Samples every video connection's outbound queue on the server's own loop."""

    def __init__(self, gw: RunningGateway) -> None:
        self.gw = gw
        self.samples = 0
        self.max_queued = 0  # the connection's own count of waiting chunks
        self.max_chunk_items = 0  # chunk entries really in its queue
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for conn in list(self.gw.runtime.video_sockets.values()):
                self.samples += 1
                self.max_queued = max(self.max_queued, conn._queued_chunks)
                self.max_chunk_items = max(self.max_chunk_items, sum(1 for i in conn._queue if i[0] == "chunk"))
            await asyncio.sleep(0.002)

    async def __aenter__(self) -> QueueSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with suppress(asyncio.CancelledError):
            await self._task


async def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def only_connection(gw: RunningGateway) -> VideoSocket:
    (conn,) = gw.runtime.video_sockets.values()
    return conn


def engine_idle(gw: RunningGateway) -> bool:
    engine = gw.runtime.video_engine
    assert isinstance(engine, CpuVideoEngine)
    return gw.runtime.orchestrator.pending == 0 and engine.active_request_ids == ()


def check_delivery(chunks: list[tuple[dict[str, Any], bytes]]) -> list[int]:
    """Transport indexes count 0,1,2...; every generated chunk up to the last delivered one is
    either delivered or reported dropped, once. The dropped generation indexes."""
    metas = [m for m, _ in chunks]
    assert [m["transport_chunk_index"] for m in metas] == list(range(len(metas)))
    delivered = [m["generation_chunk_index"] for m in metas]
    dropped: list[int] = []
    for m in metas:
        assert m["dropped_chunks"] == len(m["dropped_generation_chunk_indexes"])
        # reported dropped chunks are older than the one that reports them
        assert all(i < m["generation_chunk_index"] for i in m["dropped_generation_chunk_indexes"])
        dropped += m["dropped_generation_chunk_indexes"]
    assert delivered == sorted(delivered)
    assert sorted(delivered + dropped) == list(range(delivered[-1] + 1))
    return dropped


def decode_mp4(payloads: list[bytes]) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(b"".join(payloads)), mode="r", format="mp4") as container:
        return list(container.decode(video=0))


def check_media(fmt: str, chunks: list[tuple[dict[str, Any], bytes]]) -> None:
    """The delivered stream plays: fMP4 decodes as one stream (init first, once); each JPEG decodes."""
    payloads = [p for _, p in chunks]
    if fmt == "m4s":
        assert payloads[0][4:8] == b"ftyp"
        assert all(p[4:8] == b"moof" for p in payloads[1:])
        frames = decode_mp4(payloads)
        assert len(frames) == sum(m["num_frames"] for m, _ in chunks)
        assert (frames[0].width, frames[0].height) == (STREAM["width"], STREAM["height"])
        return
    for meta, payload in chunks:
        offset = 0
        for n in meta["frame_byte_lengths"]:
            with av.open(io.BytesIO(payload[offset : offset + n]), mode="r", format="mjpeg") as container:
                (frame,) = list(container.decode(video=0))
            assert (frame.width, frame.height) == (STREAM["width"], STREAM["height"])
            offset += n
        assert offset == len(payload)


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jpeg", "m4s"])
async def test_a_reader_that_pauses_is_told_what_was_dropped_and_the_queue_stays_bounded(fmt: str) -> None:
    async with gateway(video_max_consecutive_drops=10_000) as gw, QueueSampler(gw) as sampler:
        client = await RawVideoClient.open(gw.url + "/video")
        stream = Stream(client)
        try:
            await client.send({"type": "session.start", "format": fmt, **STREAM})
            await stream.wait_for(is_type("video.start"))
            await stream.wait_for(is_type("video.chunk_metadata"))  # the stream flows ...
            conn = only_connection(gw)
            # ... then the client stops reading, until the server has dropped chunks for it.
            assert await eventually(lambda: len(conn._dropped) >= 3), "no chunk was ever dropped"
            assert sampler.max_queued == QUEUE  # full, never more

            report = await stream.wait_for(lambda e: e["type"] == "video.chunk_metadata" and e["dropped_chunks"] > 0)
            for _ in range(3):  # reading again: the stream goes on
                await stream.wait_for(is_type("video.chunk_metadata"))
            await client.send({"type": "session.stop"})
            done = await stream.wait_for(is_type("session.done"))
            assert await stream.drain() == 1000
        finally:
            client.close()
        assert await eventually(lambda: engine_idle(gw) and not gw.runtime.video_sockets, 10)

    assert report["dropped_chunks"] >= 3
    assert done["stopped"] is True
    assert done["chunks"] == len(stream.chunks)  # the chunks received, as upstream counts: not the dropped ones
    dropped = check_delivery(stream.chunks)
    assert set(report["dropped_generation_chunk_indexes"]) <= set(dropped)
    assert len(dropped) <= gw.runtime.metrics.video_dropped._value.get()
    check_media(fmt, stream.chunks)
    assert sampler.samples > 10  # the sampler really watched the queue
    assert sampler.max_queued <= QUEUE and sampler.max_chunk_items <= QUEUE  # memory bounded: at most QUEUE chunks


async def test_the_init_segment_leads_the_first_chunk_delivered_even_when_chunk_0_was_dropped() -> None:
    async with gateway(video_max_consecutive_drops=10_000) as gw, QueueSampler(gw) as sampler:
        client = await RawVideoClient.open(gw.url + "/video")
        stream = Stream(client)
        try:
            # Fill the socket as the video starts (a stream must begin with session.start): each
            # unknown type is echoed in a ~4 KiB error the client does not read, until the
            # server's writer blocks, before the first chunk is rendered.
            await client.send({"type": "session.start", "format": "m4s", **STREAM})
            for _ in range(FILL_MESSAGES):
                await client.send({"type": "x" * 4000})
            assert await eventually(lambda: len(gw.runtime.video_sockets) == 1, 10)
            conn = only_connection(gw)
            assert await eventually(lambda: 0 in conn._dropped and len(conn._dropped) >= 2), "chunk 0 was not dropped"

            await stream.wait_for(is_type("video.start"))
            errors = [await stream.next() for _ in range(FILL_MESSAGES)]
            assert {(e["type"], e["code"]) for e in errors} == {("error", Code.UNKNOWN_EVENT)}
            first = await stream.wait_for(is_type("video.chunk_metadata"))
            for _ in range(3):
                await stream.wait_for(is_type("video.chunk_metadata"))
            await client.send({"type": "session.stop"})
            await stream.wait_for(is_type("session.done"))
            await stream.drain()
        finally:
            client.close()

    assert first["generation_chunk_index"] > 0
    assert 0 in first["dropped_generation_chunk_indexes"]
    check_delivery(stream.chunks)
    check_media("m4s", stream.chunks)  # starts with ftyp although chunk 0 never arrived, and decodes
    assert sampler.max_queued <= QUEUE and sampler.max_chunk_items <= QUEUE


async def closes_4010(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "omni_session_closes":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("code") == "4010":
                    return float(sample.value)
    return 0.0


async def test_a_client_that_never_reads_is_closed_with_4010() -> None:
    max_drops = 4
    async with gateway(video_max_consecutive_drops=max_drops) as gw, QueueSampler(gw) as sampler, \
            httpx.AsyncClient(base_url=gw.http, timeout=10) as http:  # fmt: skip
        client = await RawVideoClient.open(gw.url + "/video")
        stream = Stream(client)
        try:
            await client.send({"type": "session.start", "format": "jpeg", **STREAM})
            assert await eventually(lambda: len(gw.runtime.video_sockets) == 1, 10)
            # Never read: the server drops, then gives up on the client (the metric says so).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 40
            while await closes_4010(http) < 1:
                assert loop.time() < deadline, "no 4010 close was counted"
                await asyncio.sleep(0.1)
            assert gw.runtime.metrics.video_dropped._value.get() == max_drops + 1
            # Its engine request is cancelled at once: no rendering for a client that is gone.
            assert await eventually(lambda: engine_idle(gw), 10)

            # If it reads after all, what is left comes out, then the slow_consumer error and the 4010 close.
            code = await stream.drain()
        finally:
            client.close()
        assert await eventually(lambda: not gw.runtime.video_sockets, 10)

    assert code == 4010
    last = stream.events[-1]
    assert last["type"] == "error" and last["code"] == Code.SLOW_CONSUMER
    assert sampler.max_queued <= QUEUE and sampler.max_chunk_items <= QUEUE
    check_delivery(stream.chunks)


async def test_a_client_that_never_reads_is_released_after_4010() -> None:
    async with gateway(video_max_consecutive_drops=4) as gw:
        sessions = gw.runtime.metrics.sessions
        client = await RawVideoClient.open(gw.url + "/video")
        try:
            await client.send({"type": "session.start", "format": "jpeg", **STREAM})
            assert await eventually(lambda: len(gw.runtime.video_sockets) == 1, 10)
            assert await eventually(lambda: gw.runtime.metrics.closes.labels("4010")._value.get() >= 1, 40)
            # The client still reads nothing. The server has decided to close: within a few
            # seconds the connection must be gone from the server (socket aborted, session
            # unregistered), or a stalled client holds a session slot and its lease for ever.
            released = await eventually(lambda: not gw.runtime.video_sockets, 10)
            assert released, f"still registered: {list(gw.runtime.video_sockets)}"
            assert sessions._value.get() == 0
        finally:
            client.close()
