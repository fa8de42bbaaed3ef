"""A Twilio Media Streams simulator, written from Twilio's public documents (and, below it,
Telnyx's, Plivo's, Vonage's and Exotel's, each from its own, as subclasses that spell their
carrier's messages).

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

import jwt
import numpy as np
import orjson
import websockets

FRAME_S = 0.02  # the earpiece plays 20 ms at a time


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
    last_media_at: float = 0.0  # when the caller's last media message went (monotonic seconds)
    _ws: Any = None
    _seq: int = 0
    _queue: deque[tuple[str, bytearray | str]] = field(default_factory=deque)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None

    bytes_per_ms = 8  # the stream's audio (μ-law 8 kHz), both ways
    send_ms = 20  # the caller's audio per media message

    def upgrade_headers(self) -> dict[str, str]:
        headers = {}
        if self.auth_token is not None or self.signature is not None:
            headers["X-Twilio-Signature"] = self.signature or twilio_signature(self.auth_token or "", self.url)
        return headers

    async def connect(self, *, start: bool = True) -> None:
        self._ws = await websockets.connect(self.url, additional_headers=self.upgrade_headers(), max_size=None,
                                            compression=None, open_timeout=10, close_timeout=1)  # fmt: skip
        self._tasks = [asyncio.get_running_loop().create_task(self._receive()),
                       asyncio.get_running_loop().create_task(self._play())]  # fmt: skip
        connected = self.connected_message()
        if connected is not None:
            await self._send(connected, numbered=False)
        if start:
            message = self.start_message(self.parameters())
            if message is not None:
                await self._send(message)

    def parameters(self) -> dict[str, str]:
        return {"client_secret": self.client_secret} if self.client_secret is not None else {}

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

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any] | None:
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

    async def send_media(self, chunk: int, frame: bytes) -> None:
        payload = base64.b64encode(frame).decode()
        media = {"track": "inbound", "chunk": str(chunk), "timestamp": str(chunk * self.send_ms), "payload": payload}
        await self._send({"event": "media", "media": media})

    async def speak(self, audio: bytes) -> float:
        """Send the caller's audio (the stream's format) as media messages of ``send_ms`` at real
        time; when it began."""
        began = time.monotonic()
        t0 = asyncio.get_running_loop().time()
        base = self.media_sent
        size = self.send_ms * self.bytes_per_ms
        frames = [audio[i : i + size] for i in range(0, len(audio), size)]
        self.media_sent += len(frames)
        for n, (chunk, frame) in enumerate(self.media_order(frames)):
            await self.send_media(base + chunk, frame)
            self.last_media_at = time.monotonic()
            delay = t0 + (n + 1) * self.send_ms / 1000 - asyncio.get_running_loop().time()
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
                message = self.parse(raw)
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

    def parse(self, raw: str | bytes) -> dict[str, Any]:
        """A message from the gateway, as a dict with its ``event``."""
        message: dict[str, Any] = orjson.loads(raw)
        return message

    @property
    def buffered_ms(self) -> float:
        return sum(len(v) for k, v in self._queue if k == "audio") / self.bytes_per_ms

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
            frame_bytes = round(FRAME_S * 1000) * self.bytes_per_ms
            while self._queue and len(frame) < frame_bytes:
                kind, value = self._queue[0]
                if kind == "mark":
                    break
                assert isinstance(value, bytearray)
                take = value[: frame_bytes - len(frame)]
                frame += take
                del value[: len(take)]
                if not value:
                    self._queue.popleft()
            if frame:
                self.heard.append(Heard(time.monotonic(), bytes(frame)))
            self._echo_marks()

    def heard_ms(self) -> float:
        return sum(len(h.audio) for h in self.heard) / self.bytes_per_ms


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
    letters and digits). The ``<Stream>``'s ``contentType`` is ``audio/x-mulaw;rate=8000``
    (here by default) or ``audio/x-l16;rate=8000`` or ``rate=16000`` (``PlivoL16Call``): the
    start's ``mediaFormat`` says it (``encoding``, ``sampleRate``), the ``media`` payloads are
    in it (L16: linear PCM16, little-endian, mono), and a ``playAudio`` names its own
    ``contentType`` and ``sampleRate``, which must be the stream's (this one plays no other)."""

    encoding: str = "audio/x-mulaw"
    rate: int = 8000
    stream_sid: str = "87654321-4321-4321-4321-cba987654321"
    call_sid: str = "12345678-1234-1234-1234-123456789abc"

    def __post_init__(self) -> None:
        self.bytes_per_ms = self.rate // 1000 * (1 if self.encoding == "audio/x-mulaw" else 2)
        if self.client_secret is not None:
            self.url += ("&" if "?" in self.url else "?") + "client_secret=" + self.client_secret
            self.client_secret = None  # (not in the start: the URL carries it)

    def connected_message(self) -> dict[str, Any] | None:
        return None

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any]:
        return {"event": "start", "start": {
            "callId": self.call_sid, "streamId": self.stream_sid, "accountId": "MAXXXXXXXXXXXXXXXXXX",
            "tracks": ["inbound"], "mediaFormat": {"encoding": self.encoding, "sampleRate": self.rate},
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
            media = message["media"]
            assert (media["contentType"], media["sampleRate"]) == (self.encoding, self.rate), media
            return "audio", base64.b64decode(media["payload"])
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


@dataclass
class PlivoL16Call(PlivoCall):
    """Plivo Audio Streams with ``contentType="audio/x-l16;rate=16000"`` (``rate=8000`` by
    passing it): linear PCM16 both ways."""

    encoding: str = "audio/x-l16"
    rate: int = 16000


def vonage_jwt(signature_secret: str, iat: int) -> str:
    """The JWT Vonage signs its webhooks with (and a websocket endpoint's ``authorization`` of type
    ``vonage`` sends): HS256 under the account's signature secret, with ``iat`` and ``jti``."""
    claims = {
        "iat": iat,
        "jti": f"jti-{iat}",
        "iss": "Vonage",
        "application_id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    }
    return jwt.encode(claims, signature_secret, algorithm="HS256")


def pcm16(audio: bytes) -> bytes:
    """The caller's voice as linear PCM16 (Vonage's, Exotel's and Plivo's L16 audio): as it is."""
    return audio


@dataclass
class VonageCall(TwilioCall):
    """Vonage Voice API WebSockets, from Vonage's "WebSockets" guide and NCCO reference (the
    ``connect`` action's ``websocket`` endpoint): the upgrade carries the ``Authorization``
    header the endpoint's ``authorization`` sets (``type`` custom: its ``value``); the first
    message is text, ``websocket:connected`` with the ``content-type`` (``audio/l16;rate=16000``)
    and the endpoint's ``headers`` at its top level (the client secret, the call's ``uuid``);
    then the caller's audio as binary messages of 20 ms of linear PCM16 (640 bytes), and
    ``websocket:dtmf`` text events. The server's binary messages are played from a buffer at
    real time (each must be 20 ms: 640 bytes); a ``notify`` action is answered with
    ``websocket:notify`` (its ``payload``) once the audio before it has played; ``clear``
    empties the buffer and is answered ``websocket:cleared``. The call ends with the
    socket's close (Vonage sends no stop message)."""

    authorization: str | None = None  # the Authorization header the NCCO endpoint sets
    rate: int = 16000
    stream_sid: str = ""
    call_sid: str = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"

    def __post_init__(self) -> None:
        self.bytes_per_ms = self.rate * 2 // 1000
        self.frame_sizes: set[int] = set()  # the sizes of the gateway's binary messages

    def upgrade_headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization is not None else {}

    def connected_message(self) -> dict[str, Any]:
        return {"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}",
                "uuid": self.call_sid, **self.parameters()}  # fmt: skip

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any] | None:
        return None  # (the connected message says it all)

    def numbered(self, message: dict[str, Any], seq: int) -> dict[str, Any]:
        return message  # (Vonage numbers nothing)

    async def send_media(self, chunk: int, frame: bytes) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._ws.send(frame)

    def dtmf_message(self, digit: str) -> dict[str, Any]:
        return {"event": "websocket:dtmf", "digit": digit, "duration": 260}

    async def stop(self) -> None:
        """The caller hangs up: Vonage closes the socket."""
        await self._ws.close(1000)

    def parse(self, raw: str | bytes) -> dict[str, Any]:
        if isinstance(raw, bytes):
            self.frame_sizes.add(len(raw))
            return {"event": "media", "audio": raw}
        message: dict[str, Any] = orjson.loads(raw)
        return {"event": message.get("action"), **message}

    def classify(self, message: dict[str, Any]) -> tuple[str, Any]:
        kind = message.get("event")
        if kind == "media":
            return "audio", message["audio"]
        if kind == "notify":
            return "mark", message["payload"]["name"]
        return str(kind), None

    def mark_echo(self, name: str) -> dict[str, Any]:
        return {"event": "websocket:notify", "payload": {"name": name}}

    async def cleared(self, marks: list[str]) -> None:
        await self._send({"event": "websocket:cleared"})


@dataclass
class ExotelCall(TwilioCall):
    """Exotel's Voicebot applet (bidirectional AgentStream), from Exotel's "WebSocket protocol"
    and "Working with the Stream and Voicebot Applet": the applet URL's query parameters (the
    client secret) come back as the ``start``'s ``custom_parameters``; Basic Auth in the URL
    (``KEY:TOKEN@``) is the upgrade's ``Authorization: Basic``; ``connected``, ``start``
    (``stream_sid``, ``call_sid``, ``media_format`` audio/x-raw 16-bit at 8000 Hz), ``media``
    of about 100 ms of base64 PCM16 (``chunk``, ``timestamp``), ``dtmf``, ``stop``. The
    server's ``media`` must be multiples of 320 bytes; its ``mark`` is echoed once the audio
    before it has played; ``clear`` empties the buffer (Exotel documents no answer to it)."""

    basic_auth: str | None = None  # KEY:TOKEN in the applet's URL
    stream_sid: str = "b3f1e2d4c5a6978812345678abcdef01"
    call_sid: str = "8e7d6c5b4a39281706f5e4d3c2b1a0f9"
    account_sid: str = "exotelaccount1"
    bytes_per_ms = 16  # linear PCM16 at 8 kHz
    send_ms = 100

    def __post_init__(self) -> None:
        self.odd_media = 0  # the gateway's media whose size is not a multiple of 320 bytes
        if self.client_secret is not None:  # a query parameter of the applet's URL (and custom_parameters)
            self.url += ("&" if "?" in self.url else "?") + "client_secret=" + self.client_secret

    def upgrade_headers(self) -> dict[str, str]:
        if self.basic_auth is None:
            return {}
        return {"Authorization": "Basic " + base64.b64encode(self.basic_auth.encode()).decode()}

    def connected_message(self) -> dict[str, Any]:
        return {"event": "connected"}

    def start_message(self, parameters: dict[str, str]) -> dict[str, Any]:
        return {"event": "start", "start": {
            "stream_sid": self.stream_sid, "call_sid": self.call_sid, "account_sid": self.account_sid,
            "from": "+919876543210", "to": "+918047491899", "custom_parameters": parameters,
            "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
        }}  # fmt: skip

    def numbered(self, message: dict[str, Any], seq: int) -> dict[str, Any]:
        return {**message, "sequence_number": str(seq), "stream_sid": self.stream_sid}

    async def send_media(self, chunk: int, frame: bytes) -> None:
        payload = base64.b64encode(frame).decode()
        await self._send({"event": "media", "media": {"chunk": str(chunk), "timestamp": str(chunk * self.send_ms),
                                                      "payload": payload}})  # fmt: skip

    def dtmf_message(self, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "dtmf": {"digit": digit, "duration": "100"}}

    def stop_message(self) -> dict[str, Any]:
        return {"event": "stop", "stop": {"call_sid": self.call_sid, "account_sid": self.account_sid,
                                          "reason": "callended"}}  # fmt: skip

    def classify(self, message: dict[str, Any]) -> tuple[str, Any]:
        kind = message.get("event")
        if kind == "media":
            audio = base64.b64decode(message["media"]["payload"])
            self.odd_media += len(audio) % 320 != 0
            return "audio", audio
        if kind == "mark":
            return "mark", message["mark"]["name"]
        return str(kind), None

    def mark_echo(self, name: str) -> dict[str, Any]:
        return {"event": "mark", "mark": {"name": name}}

    async def cleared(self, marks: list[str]) -> None:
        """Exotel empties its buffer; it documents no answer."""
