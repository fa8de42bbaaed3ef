"""A Twilio Media Streams simulator, written from Twilio's public documents.

What it follows ("Media Streams - WebSocket Messages", "TwiML <Stream>", "Webhooks
security"), and nothing of the gateway:

- it opens the stream's WebSocket as Twilio does for ``<Connect><Stream>``: a GET
  upgrade signed with ``X-Twilio-Signature`` (base64 HMAC-SHA1 of the URL, keyed with
  the account's Auth Token), then ``connected`` and ``start`` (``streamSid``,
  ``callSid``, ``accountSid``, ``tracks``, ``customParameters``, ``mediaFormat``
  audio/x-mulaw 8000 Hz mono), each message with its ``sequenceNumber``;
- the caller's audio goes as ``media`` messages of 20 ms (``track`` inbound, ``chunk``,
  ``timestamp``), paced on the wall clock, as a phone line delivers it; ``dtmf`` a key;
  ``stop`` ends the stream;
- the gateway's ``media`` is played from a buffer at real time, 160 bytes per 20 ms;
  a ``mark`` it sends is echoed once the audio queued before it has played; ``clear``
  empties the buffer and echoes every mark still waiting, at once (as Twilio's documents
  say). What the caller heard is kept (``heard``), and when.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import websockets

FRAME_BYTES = 160  # 20 ms of μ-law at 8 kHz
FRAME_S = 0.02


def mulaw(pcm16: bytes) -> bytes:
    """PCM16 -> G.711 μ-law, from the ITU-T G.711 definition (bias 0x84, 8 segments)."""
    x = np.frombuffer(pcm16, dtype="<i2").astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    mag = np.minimum(np.abs(x), 32635) + 0x84
    exponent = np.floor(np.log2(mag)).astype(np.int32) - 7
    exponent = np.clip(exponent, 0, 7)
    mantissa = (mag >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


def twilio_signature(token: str, url: str) -> str:
    return base64.b64encode(hmac.new(token.encode(), url.encode(), hashlib.sha1).digest()).decode()


@dataclass
class Heard:
    at: float  # monotonic seconds
    audio: bytes


@dataclass
class TwilioCall:
    """One simulated call; ``connect`` opens it."""

    url: str
    client_secret: str | None
    auth_token: str | None = None
    signature: str | None = None  # overrides the computed one (a forged request)
    stream_sid: str = "MZ00000000000000000000000000000001"
    call_sid: str = "CA00000000000000000000000000000001"
    account_sid: str = "AC00000000000000000000000000000001"
    received: list[dict[str, Any]] = field(default_factory=list)  # every message from the gateway
    arrivals: list[float] = field(default_factory=list)  # when each of them arrived (monotonic seconds)
    heard: list[Heard] = field(default_factory=list)  # 20 ms frames of answer audio, as played
    marks_echoed: list[str] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)  # when each clear arrived
    max_buffered_ms: float = 0.0  # the most audio ever waiting in the buffer
    media_sent: int = 0
    _ws: Any = None
    _seq: int = 0
    _queue: deque[tuple[str, bytearray | str]] = field(default_factory=deque)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None

    async def connect(self, *, start: bool = True) -> None:
        headers = {}
        if self.auth_token is not None or self.signature is not None:
            headers["X-Twilio-Signature"] = self.signature or twilio_signature(self.auth_token or "", self.url)
        self._ws = await websockets.connect(self.url, additional_headers=headers, max_size=None, compression=None,
                                            open_timeout=10, close_timeout=1)  # fmt: skip
        self._tasks = [asyncio.get_running_loop().create_task(self._receive()),
                       asyncio.get_running_loop().create_task(self._play())]  # fmt: skip
        connected = self.connected_message()
        if connected is not None:
            await self._send(connected, numbered=False)
        if start:
            parameters = {"client_secret": self.client_secret} if self.client_secret is not None else {}
            await self._send(self.start_message(parameters))

    # --- the carrier's spelling (Twilio's; a subclass spells another carrier's) ---

    def connected_message(self) -> dict[str, Any] | None:
        return {"event": "connected", "protocol": "Call", "version": "1.0.0"}

    def classify(self, message: dict[str, Any]) -> tuple[str, Any]:
        """What a message from the gateway is: ("audio", bytes), ("mark", name), ("clear", None)."""
        kind = message.get("event")
        if kind == "media":
            return "audio", base64.b64decode(message["media"]["payload"])
        if kind == "mark":
            return "mark", message["mark"]["name"]
        return str(kind), None

    def mark_echo(self, name: str) -> dict[str, Any]:
        return {"event": "mark", "mark": {"name": name}}

    media_event = "media"  # (the gateway's audio message, and its clear, as this carrier spells them)
    clear_event = "clear"

    async def cleared(self, marks: list[str]) -> None:
        """Twilio: the buffer is emptied and every mark still waiting is echoed at once."""
        for name in marks:
            await self._echo(name)

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any]:
        return {"event": "start", "start": {
            "streamSid": self.stream_sid, "accountSid": self.account_sid, "callSid": self.call_sid,
            "tracks": ["inbound"], "customParameters": parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }}  # fmt: skip

    def numbered(self, message: dict[str, Any], seq: int) -> dict[str, Any]:
        message = {**message, "sequenceNumber": str(seq)}
        if message["event"] != "start":
            message["streamSid"] = self.stream_sid
        return message

    def dtmf_message(self, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}}

    def stop_message(self) -> dict[str, Any]:
        return {"event": "stop", "stop": {"accountSid": self.account_sid, "callSid": self.call_sid}}

    def media_order(self, frames: list[bytes]) -> list[tuple[int, bytes]]:
        """(chunk number, audio) in the order sent: in order (a subclass may shuffle)."""
        return list(enumerate(frames, 1))

    async def _send(self, message: dict[str, Any], *, numbered: bool = True) -> None:
        if numbered:
            self._seq += 1
            message = self.numbered(message, self._seq)
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._ws.send(orjson.dumps(message).decode())

    async def speak(self, audio: bytes) -> float:
        """Send the caller's μ-law audio as 20 ms media messages at real time; when it began."""
        began = time.monotonic()
        t0 = asyncio.get_running_loop().time()
        base = self.media_sent
        frames = [audio[i : i + FRAME_BYTES] for i in range(0, len(audio), FRAME_BYTES)]
        self.media_sent += len(frames)
        for n, (chunk, frame) in enumerate(self.media_order(frames)):
            payload = base64.b64encode(frame).decode()
            await self._send(
                {
                    "event": "media",
                    "media": {
                        "track": "inbound",
                        "chunk": str(base + chunk),
                        "timestamp": str((base + chunk) * 20),
                        "payload": payload,
                    },
                }
            )
            delay = t0 + (n + 1) * FRAME_S - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.closed.is_set():
                break
        return began

    async def dtmf(self, digit: str) -> None:
        await self._send(self.dtmf_message(digit))

    async def stop(self) -> None:
        await self._send(self.stop_message())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._ws is not None:
            await self._ws.close()

    # --- the gateway's side ---

    async def _receive(self) -> None:
        try:
            async for raw in self._ws:
                message = orjson.loads(raw)
                self.received.append(message)
                self.arrivals.append(time.monotonic())
                kind, value = self.classify(message)
                if kind == "audio":
                    self._queue.append(("audio", bytearray(value)))
                    self.max_buffered_ms = max(self.max_buffered_ms, self.buffered_ms)
                elif kind == "mark":
                    self._queue.append(("mark", value))
                    self._echo_marks()
                elif kind == "clear":
                    self.clears.append(time.monotonic())
                    marks = [str(name) for kind_, name in self._queue if kind_ == "mark"]
                    self._queue.clear()
                    await self.cleared(marks)
        except websockets.ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd is not None else None
        finally:
            if self.close_code is None and self._ws.close_code is not None:
                self.close_code = self._ws.close_code
            self.closed.set()

    @property
    def buffered_ms(self) -> float:
        return sum(len(v) for k, v in self._queue if k == "audio") / 8

    def _echo_marks(self) -> None:
        while self._queue and self._queue[0][0] == "mark":
            name = self._queue.popleft()[1]
            asyncio.get_running_loop().create_task(self._echo(str(name)))

    async def _echo(self, name: str) -> None:
        self.marks_echoed.append(name)
        await self._send(self.mark_echo(name))

    async def _play(self) -> None:
        """The caller's earpiece: 20 ms of the buffer every 20 ms."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += FRAME_S
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if loop.time() - next_at > 0.2:
                next_at = loop.time()  # (a stalled loop: the line resumes, as a jitter buffer would)
            frame = bytearray()
            while self._queue and len(frame) < FRAME_BYTES:
                kind, value = self._queue[0]
                if kind == "mark":
                    break
                assert isinstance(value, bytearray)
                take = value[: FRAME_BYTES - len(frame)]
                frame += take
                del value[: len(take)]
                if not value:
                    self._queue.popleft()
            if frame:
                self.heard.append(Heard(time.monotonic(), bytes(frame)))
            self._echo_marks()

    def heard_ms(self) -> float:
        return sum(len(h.audio) for h in self.heard) / 8


def alaw(pcm16: bytes) -> bytes:
    """PCM16 -> G.711 A-law, from the ITU-T G.711 definition (13-bit magnitude, 8 segments)."""
    v = np.frombuffer(pcm16, dtype="<i2").astype(np.int32) >> 3
    mask = np.where(v >= 0, 0xD5, 0x55)
    mag = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]), mag, side="left")
    shift = np.where(seg < 2, 1, seg)
    aval = (np.minimum(seg, 7) << 4) | ((mag >> shift) & 0x0F)
    aval = np.where(seg >= 8, 0x7F, aval)
    return ((aval ^ mask) & 0xFF).astype(np.uint8).tobytes()


@dataclass
class TelnyxCall(TwilioCall):
    """Telnyx Media Streaming, from Telnyx's "Stream call media over WebSocket" (AsyncAPI):
    snake case (``stream_id``, ``sequence_number``, ``custom_parameters``,
    ``media_format``), PCMU or PCMA, and media frames whose order "is not guaranteed": this
    one sends every pair of 20 ms frames swapped (2, 1, 4, 3, ...)."""

    encoding: str = "PCMA"
    stream_sid: str = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
    call_sid: str = "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"

    def connected_message(self) -> dict[str, Any]:
        return {"event": "connected", "version": "1.0.0"}

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any]:
        return {"event": "start", "stream_id": self.stream_sid, "start": {
            "user_id": "3E6F995F-85F7-4705-9741-53B116D28237", "call_control_id": self.call_sid,
            "from": "+13122010094", "to": "+13122123456", "custom_parameters": parameters,
            "media_format": {"encoding": self.encoding, "sample_rate": 8000, "channels": 1},
        }}  # fmt: skip

    def numbered(self, message: dict[str, Any], seq: int) -> dict[str, Any]:
        return {**message, "sequence_number": str(seq), "stream_id": self.stream_sid}

    def dtmf_message(self, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "occurred_at": "2026-12-07T14:00:00.000Z", "dtmf": {"digit": digit}}

    def stop_message(self) -> dict[str, Any]:
        return {"event": "stop", "stop": {"user_id": "3E6F995F", "call_control_id": self.call_sid}}

    def media_order(self, frames: list[bytes]) -> list[tuple[int, bytes]]:
        numbered = list(enumerate(frames, 1))
        for i in range(0, len(numbered) - 1, 2):
            numbered[i], numbered[i + 1] = numbered[i + 1], numbered[i]
        return numbered


@dataclass
class PlivoCall(TwilioCall):
    """Plivo Audio Streams, from Plivo's "Audio Streaming" reference: ``start`` first (no
    ``connected``; ``callId``, ``streamId``, ``mediaFormat``, ``extra_headers``), ``media``
    with ``streamId``, ``dtmf``; the server's ``playAudio``, ``checkpoint`` (answered with
    ``playedStream`` once the audio before it has played) and ``clearAudio`` (answered with
    ``clearedAudio``). The client secret goes in the URL's query (extraHeaders allow only
    letters and digits)."""

    stream_sid: str = "87654321-4321-4321-4321-cba987654321"
    call_sid: str = "12345678-1234-1234-1234-123456789abc"

    def __post_init__(self) -> None:
        if self.client_secret is not None:
            self.url += ("&" if "?" in self.url else "?") + "client_secret=" + self.client_secret
            self.client_secret = None  # (not in the start: the URL carries it)

    def connected_message(self) -> dict[str, Any] | None:
        return None

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any]:
        return {"event": "start", "start": {
            "callId": self.call_sid, "streamId": self.stream_sid, "accountId": "MAXXXXXXXXXXXXXXXXXX",
            "tracks": ["inbound"], "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
        }, "extra_headers": "userId=12345;sessionId=abc"}  # fmt: skip

    def numbered(self, message: dict[str, Any], seq: int) -> dict[str, Any]:
        message = {**message, "sequenceNumber": seq}
        if message["event"] != "start":
            message["streamId"] = self.stream_sid
        return message

    def dtmf_message(self, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "dtmf": {"track": "inbound", "digit": digit}}

    def stop_message(self) -> dict[str, Any]:
        return {"event": "stop"}

    def classify(self, message: dict[str, Any]) -> tuple[str, Any]:
        kind = message.get("event")
        if kind == "playAudio":
            assert message["media"]["contentType"] == "audio/x-mulaw" and message["media"]["sampleRate"] == 8000
            return "audio", base64.b64decode(message["media"]["payload"])
        if kind == "checkpoint":
            return "mark", message["name"]
        if kind == "clearAudio":
            return "clear", None
        return str(kind), None

    def mark_echo(self, name: str) -> dict[str, Any]:
        return {"event": "playedStream", "name": name}

    media_event = "playAudio"
    clear_event = "clearAudio"

    async def cleared(self, marks: list[str]) -> None:
        """Plivo: the queue is emptied and ``clearedAudio`` says so."""
        await self._send({"event": "clearedAudio"})
