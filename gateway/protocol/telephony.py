"""Carriers' media streams, decoded and encoded (pure): one codec object per carrier.

A carrier (Twilio's ``<Connect><Stream>``) opens a WebSocket to the gateway and
speaks its own JSON: a ``connected`` greeting, a ``start`` that names the stream,
the call and the audio format, then 20 ms ``media`` messages of the caller's
audio, ``dtmf`` key presses, ``mark`` echoes of the labels the gateway sent
after its audio (sent back once the audio before them has played, or dropped by
a ``clear``) and a last ``stop``. The gateway answers with ``media`` (the
answer's audio), a ``mark`` after each chunk of it and ``clear`` (barge-in:
drop what is buffered).

A codec turns a carrier's message into the events below and the gateway's
output into the carrier's messages; it keeps no state and touches no socket
(``gateway/transport/telephony/`` is the I/O). Each carrier is ONE object
(``TWILIO``): the transport asks it, never a carrier's name. A message a codec
writes is text (``bytes`` of JSON) or ``Binary`` (a carrier that takes raw audio
frames: Vonage); a message it reads is the socket's text (``str``) or binary
(``bytes``) frame.

Twilio's documents: "Media Streams - WebSocket Messages" (the messages) and
"Webhooks security" (``X-Twilio-Signature``: base64 of HMAC-SHA1, keyed with the
account's Auth Token, over the full URL Twilio requested followed by each POST
parameter's name and value, sorted by name; a WebSocket upgrade is a GET: the
URL alone).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import jwt
import orjson

from gateway.audio.codecs import AudioFormat

DTMF_KEYS = frozenset("0123456789*#ABCD")
PCMU_8K = AudioFormat("pcmu", 8000)  # G.711 μ-law at 8 kHz: every carrier's default
PCMA_8K = AudioFormat("pcma", 8000)
L16_8K = AudioFormat("pcm16", 8000)  # linear PCM16 mono, little-endian (Vonage, Exotel)
L16_16K = AudioFormat("pcm16", 16000)
MAX_PARAMETERS = 99  # Twilio's <Parameter> limit per stream: more in a start is refused
MAX_PARAMETER_CHARS = 4096  # one custom parameter's name or value
VONAGE_JWT_MAX_AGE_S = 300  # a Vonage-signed upgrade's JWT issued longer ago than this: refused (403)
VONAGE_JWT_LEEWAY_S = 60  # ... or issued this far in the future (clock skew)


class CarrierMessageError(ValueError):
    """A carrier's message that does not decode: the call logs it and goes on."""


@dataclass(frozen=True, slots=True)
class Connected:
    """The stream's first message (``connected``)."""


@dataclass(frozen=True, slots=True)
class StreamStart:
    """``start``: which stream and call, what the caller's audio is, what the TwiML passed."""

    stream_id: str
    call_id: str
    account_id: str
    audio: AudioFormat
    channels: int
    parameters: dict[str, str] = field(default_factory=dict)  # ``customParameters``


@dataclass(frozen=True, slots=True)
class MediaIn:
    """``media``: the caller's audio, in the start's format (``chunk``: the carrier's order)."""

    audio: bytes
    chunk: int | None  # the carrier's order of the caller's audio (a carrier that may reorder: its sequence)


@dataclass(frozen=True, slots=True)
class DtmfIn:
    digit: str


@dataclass(frozen=True, slots=True)
class MarkIn:
    """A label the gateway sent, echoed: the audio before it has played (or was cleared)."""

    name: str


@dataclass(frozen=True, slots=True)
class StreamStop:
    """``stop``: the call ended or the stream was stopped; nothing follows."""


CarrierEvent = Connected | StreamStart | MediaIn | DtmfIn | MarkIn | StreamStop


@dataclass(frozen=True, slots=True)
class Binary:
    """A binary WebSocket message to the carrier (raw audio); a codec's ``bytes`` are a text message."""

    data: bytes


Outgoing = bytes | Binary


class Carrier(Protocol):
    """One carrier's media stream protocol (pure): what the transport asks of it."""

    @property
    def name(self) -> str:
        """For logs, metrics and the webhook's ``carrier``: never compared."""

    @property
    def signature_header(self) -> str | None:
        """The header that signs the stream's upgrade (None: the carrier signs none)."""

    @property
    def secret_parameter(self) -> str:
        """The stream's custom parameter that carries the client secret."""

    @property
    def reorders(self) -> bool:
        """The carrier may deliver the caller's audio out of order (``MediaIn.chunk`` orders it)."""

    @property
    def signing_key_setting(self) -> str:
        """The setting that holds the key ``signed`` checks, and what it signs (the refusal's message)."""

    def decode(self, message: str | bytes) -> CarrierEvent | None: ...

    @property
    def frame_ms(self) -> int:
        """The carrier takes audio in whole frames of this many ms (the call pads the end of an
        answer with silence); 0: any length."""

    @property
    def message_per_frame(self) -> bool:
        """Each ``frame_ms`` of audio is a message of its own (else a message carries whole frames)."""

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        """The message that carries ``audio`` to the caller, in ``fmt``: the start's format (a
        carrier whose message names its audio's format says it; the others ignore it)."""

    def mark(self, stream_id: str, name: str) -> bytes: ...

    def clear(self, stream_id: str) -> bytes: ...

    def signed(self, key: str, urls: list[str], header: str | None) -> bool: ...


def _obj(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    if not isinstance(value, dict):
        raise CarrierMessageError(f"'{key}' must be an object")
    return value


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str) or not value:
        raise CarrierMessageError(f"'{key}' must be a non-empty string")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise CarrierMessageError(f"'{what}' must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise CarrierMessageError(f"'{what}' must be an integer") from None


def _json_object(message: str | bytes) -> dict[str, Any]:
    try:
        d = orjson.loads(message)
    except orjson.JSONDecodeError:
        raise CarrierMessageError("not JSON") from None
    if not isinstance(d, dict):
        raise CarrierMessageError("not a JSON object")
    return d


def _media_in(media: Mapping[str, Any]) -> MediaIn | None:
    """A ``media`` object as Twilio, Telnyx and Plivo write it (``payload`` base64, ``chunk``);
    None: another track's (a stream of both tracks: the gateway's own audio comes back)."""
    if media.get("track", "inbound") != "inbound":
        return None
    try:
        audio = base64.b64decode(_str(media, "payload"), validate=True)
    except binascii.Error:
        raise CarrierMessageError("media.payload is not base64") from None
    chunk = media.get("chunk")
    return MediaIn(audio, _int(chunk, "media.chunk") if chunk is not None else None)


def _twilio_format(raw: Mapping[str, Any]) -> tuple[AudioFormat, int]:
    encoding = raw.get("encoding")
    rate = _int(raw.get("sampleRate"), "mediaFormat.sampleRate")
    channels = _int(raw.get("channels", 1), "mediaFormat.channels")
    if encoding != "audio/x-mulaw" or rate != 8000 or channels != 1:
        raise CarrierMessageError(
            f"mediaFormat {encoding!r} {rate} Hz x{channels}: only audio/x-mulaw at 8000 Hz mono is taken"
        )
    return PCMU_8K, channels


def _parameters(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CarrierMessageError("'customParameters' must be an object")
    if len(raw) > MAX_PARAMETERS:
        raise CarrierMessageError(f"at most {MAX_PARAMETERS} customParameters")
    out: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(value, str) or len(name) > MAX_PARAMETER_CHARS or len(value) > MAX_PARAMETER_CHARS:
            raise CarrierMessageError(f"customParameters.{name[:64]} must be a string of at most "
                                      f"{MAX_PARAMETER_CHARS} characters")  # fmt: skip
        out[name] = value
    return out


@dataclass(frozen=True, slots=True, eq=False)
class TwilioCodec:
    """Twilio Media Streams (bidirectional, ``<Connect><Stream>``)."""

    name: str = "twilio"  # for logs and metrics: never compared
    audio: AudioFormat = PCMU_8K  # what the gateway sends back (Twilio takes only this)
    signature_header: str | None = "x-twilio-signature"
    signing_key_setting: str = (
        "twilio_auth_token: the URL the carrier requested (wss://, Host, path and query) is what it signs"
    )
    frame_ms: int = 0  # (any length)
    message_per_frame: bool = False
    secret_parameter: str = "client_secret"  # the <Parameter> of the stream that carries the client secret
    reorders: bool = False  # (a WebSocket over TCP: in order)

    def decode(self, message: str | bytes) -> CarrierEvent | None:
        """One message; None: an event the gateway has no use for. Raises CarrierMessageError."""
        d = _json_object(message)
        kind = d.get("event")
        if kind == "media":
            return _media_in(_obj(d, "media"))
        if kind == "mark":
            return MarkIn(_str(_obj(d, "mark"), "name"))
        if kind == "dtmf":
            digit = _str(_obj(d, "dtmf"), "digit")
            if digit not in DTMF_KEYS:
                raise CarrierMessageError(f"dtmf.digit {digit[:8]!r} is not a key (0-9, *, #, A-D)")
            return DtmfIn(digit)
        if kind == "start":
            start = _obj(d, "start")
            fmt, channels = _twilio_format(_obj(start, "mediaFormat"))
            return StreamStart(
                stream_id=_str(start, "streamSid"),
                call_id=_str(start, "callSid"),
                account_id=str(start.get("accountSid") or ""),
                audio=fmt,
                channels=channels,
                parameters=_parameters(start.get("customParameters")),
            )
        if kind == "connected":
            return Connected()
        if kind == "stop":
            return StreamStop()
        return None  # an event of a later protocol version: ignored, as Twilio asks

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        payload = base64.b64encode(audio).decode("ascii")
        return orjson.dumps({"event": "media", "streamSid": stream_id, "media": {"payload": payload}})

    def mark(self, stream_id: str, name: str) -> bytes:
        return orjson.dumps({"event": "mark", "streamSid": stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> bytes:
        return orjson.dumps({"event": "clear", "streamSid": stream_id})

    @staticmethod
    def signature(token: str, url: str, params: Mapping[str, str] | None = None) -> str:
        """``X-Twilio-Signature`` of a request to ``url`` (with its POST ``params``)."""
        given = params or {}
        data = url + "".join(name + given[name] for name in sorted(given))
        digest = hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()
        return base64.b64encode(digest).decode("ascii")

    def signed(self, token: str, urls: list[str], header: str | None) -> bool:
        """Whether ``header`` is the signature of one of ``urls`` (the URL as Twilio may have
        written it: the gateway behind a TLS proxy sees ``ws://`` where Twilio dialed ``wss://``)."""
        if not header:
            return False
        ok = False
        for url in urls:  # every candidate compared: the timing says nothing of which matched
            ok |= hmac.compare_digest(self.signature(token, url).encode(), header.encode())
        return ok


TWILIO = TwilioCodec()


_TELNYX_FORMATS = {"PCMU": PCMU_8K, "PCMA": PCMA_8K}


@dataclass(frozen=True, slots=True, eq=False)
class TelnyxCodec:
    """Telnyx Media Streaming (bidirectional ``rtp`` mode, PCMU or PCMA at 8 kHz): Twilio's
    shape in snake case (``stream_id``, ``sequence_number``, ``custom_parameters``,
    ``media_format``), and "media frame order is not guaranteed": ``media.chunk`` orders
    the caller's audio. Telnyx documents no signature of the stream's upgrade (its
    webhooks are signed with Ed25519, this socket is not): the client secret is the check."""

    name: str = "telnyx"
    signature_header: str | None = None
    signing_key_setting: str = ""
    frame_ms: int = 0
    message_per_frame: bool = False
    secret_parameter: str = "client_secret"  # a <Parameter> (TeXML) or custom_parameters entry
    reorders: bool = True

    def decode(self, message: str | bytes) -> CarrierEvent | None:
        d = _json_object(message)
        kind = d.get("event")
        if kind == "media":
            return _media_in(_obj(d, "media"))
        if kind == "mark":
            return MarkIn(_str(_obj(d, "mark"), "name"))
        if kind == "dtmf":
            digit = _str(_obj(d, "dtmf"), "digit")
            if digit not in DTMF_KEYS:
                raise CarrierMessageError(f"dtmf.digit {digit[:8]!r} is not a key (0-9, *, #, A-D)")
            return DtmfIn(digit)
        if kind == "start":
            start = _obj(d, "start")
            raw = _obj(start, "media_format")
            fmt = _TELNYX_FORMATS.get(str(raw.get("encoding")))
            rate = _int(raw.get("sample_rate"), "media_format.sample_rate")
            channels = _int(raw.get("channels", 1), "media_format.channels")
            if fmt is None or rate != 8000 or channels != 1:
                raise CarrierMessageError(f"media_format {raw.get('encoding')!r} {rate} Hz x{channels}: only PCMU or "
                                          "PCMA at 8000 Hz mono is taken")  # fmt: skip
            return StreamStart(
                stream_id=_str(d, "stream_id"),
                call_id=_str(start, "call_control_id"),
                account_id=str(start.get("user_id") or ""),
                audio=fmt,
                channels=channels,
                parameters=_parameters(start.get("custom_parameters")),
            )
        if kind == "connected":
            return Connected()
        if kind == "stop":
            return StreamStop()
        return None  # (error, and what a later version adds)

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        return orjson.dumps({"event": "media", "media": {"payload": base64.b64encode(audio).decode("ascii")}})

    def mark(self, stream_id: str, name: str) -> bytes:
        return orjson.dumps({"event": "mark", "mark": {"name": name}})

    def clear(self, stream_id: str) -> bytes:
        return orjson.dumps({"event": "clear"})

    def signed(self, key: str, urls: list[str], header: str | None) -> bool:
        return False  # (no signature to check: signature_header is None)


TELNYX = TelnyxCodec()


def _header_pairs(raw: Any) -> dict[str, str]:
    """Plivo's ``extra_headers``: ``key=value`` pairs separated by ``;`` or ``,``."""
    if raw is None:
        return {}
    if not isinstance(raw, str) or len(raw) > MAX_PARAMETER_CHARS:
        raise CarrierMessageError(f"'extra_headers' must be a string of at most {MAX_PARAMETER_CHARS} characters")
    pairs = [p.partition("=") for p in raw.replace(",", ";").split(";") if p.strip()]
    return {k.strip(): v.strip() for k, _, v in pairs[:MAX_PARAMETERS]}


# Plivo's contentType (the start's mediaFormat encoding and sampleRate) -> the stream's audio, both ways
_PLIVO_FORMATS = {("audio/x-mulaw", 8000): PCMU_8K, ("audio/x-l16", 8000): L16_8K, ("audio/x-l16", 16000): L16_16K}
_PLIVO_CONTENT_TYPES = {fmt.codec: encoding for (encoding, _), fmt in _PLIVO_FORMATS.items()}


@dataclass(frozen=True, slots=True, eq=False)
class PlivoCodec:
    """Plivo Audio Streams (``<Stream bidirectional="true" contentType="audio/x-mulaw;rate=8000">``):
    ``start`` first (no ``connected``), with ``callId``, ``streamId`` and the ``extraHeaders``
    as ``extra_headers``; the gateway sends ``playAudio``, ``checkpoint`` (Plivo answers
    ``playedStream`` once the audio before it has played) and ``clearAudio``. The stream's
    ``contentType`` is the start's ``mediaFormat`` (``encoding``, ``sampleRate``): μ-law at
    8 kHz, or L16 (linear PCM16, little-endian, mono) at 8 or 16 kHz; the ``playAudio`` says
    the same format back (its ``contentType`` and ``sampleRate``). Plivo's ``extraHeaders``
    allow only letters and digits, which a client secret is not made of: its secret goes in
    the stream URL's query (``?client_secret=ek_...``), or the call is announced (the call
    webhook). Plivo documents no signature of the stream's upgrade."""

    name: str = "plivo"
    signature_header: str | None = None
    signing_key_setting: str = ""
    frame_ms: int = 0
    message_per_frame: bool = False
    secret_parameter: str = "client_secret"
    reorders: bool = False

    def decode(self, message: str | bytes) -> CarrierEvent | None:
        d = _json_object(message)
        kind = d.get("event")
        if kind == "media":
            return _media_in(_obj(d, "media"))
        if kind in ("playedStream", "played"):
            return MarkIn(_str(d, "name"))
        if kind == "dtmf":
            digit = _str(_obj(d, "dtmf"), "digit")
            if digit not in DTMF_KEYS:
                raise CarrierMessageError(f"dtmf.digit {digit[:8]!r} is not a key (0-9, *, #, A-D)")
            return DtmfIn(digit)
        if kind == "start":
            start = _obj(d, "start")
            raw = _obj(start, "mediaFormat")
            encoding = raw.get("encoding")
            rate = _int(raw.get("sampleRate"), "mediaFormat.sampleRate")
            fmt = _PLIVO_FORMATS.get((encoding, rate)) if isinstance(encoding, str) else None
            if fmt is None:
                raise CarrierMessageError(f"mediaFormat {str(encoding)[:32]!r} {rate} Hz: only audio/x-mulaw at 8000 "
                                          "Hz or audio/x-l16 at 8000 or 16000 Hz is taken")  # fmt: skip
            return StreamStart(
                stream_id=_str(start, "streamId"),
                call_id=_str(start, "callId"),
                account_id=str(start.get("accountId") or ""),
                audio=fmt,
                channels=1,
                parameters=_header_pairs(d.get("extra_headers")),
            )
        if kind == "stop":
            return StreamStop()
        return None  # (clearedAudio, and what a later version adds)

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        payload = base64.b64encode(audio).decode("ascii")
        content_type = _PLIVO_CONTENT_TYPES[fmt.codec]
        return orjson.dumps({"event": "playAudio", "media": {"contentType": content_type, "sampleRate": fmt.rate,
                                                             "payload": payload}})  # fmt: skip

    def mark(self, stream_id: str, name: str) -> bytes:
        return orjson.dumps({"event": "checkpoint", "streamId": stream_id, "name": name})

    def clear(self, stream_id: str) -> bytes:
        return orjson.dumps({"event": "clearAudio", "streamId": stream_id})

    def signed(self, key: str, urls: list[str], header: str | None) -> bool:
        return False  # (no signature to check: signature_header is None)


PLIVO = PlivoCodec()


def _digit(value: Any) -> DtmfIn:
    if not isinstance(value, str) or value not in DTMF_KEYS:
        raise CarrierMessageError(f"dtmf digit {str(value)[:8]!r} is not a key (0-9, *, #, A-D)")
    return DtmfIn(value)


def _authorized(expected: str, header: str | None) -> bool:
    """Whether the upgrade's ``Authorization`` header is ``expected`` (compared in constant time)."""
    return bool(header) and hmac.compare_digest(expected.encode(), (header or "").encode())


_L16_RATES = {8000: L16_8K, 16000: L16_16K}


@dataclass(frozen=True, slots=True, eq=False)
class VonageCodec:
    """Vonage Voice API WebSockets (the NCCO ``connect`` action's ``websocket`` endpoint,
    bidirectional). The first message is text: ``{"event": "websocket:connected",
    "content-type": "audio/l16;rate=16000"}`` (or ``rate=8000``) with the NCCO endpoint's
    ``headers`` beside it, at the top level: they carry the client secret (``client_secret``)
    and whatever else the NCCO passes (``uuid``: the call's, when it passes it). Then the
    caller's audio as binary messages of raw linear PCM16 (signed, little-endian, mono; 20 ms:
    640 bytes at 16 kHz, 320 at 8 kHz); text events: ``websocket:dtmf`` (``digit``),
    ``websocket:notify`` (the echo of a ``notify``, once the audio sent before it has played:
    the mark), ``websocket:cleared``. The gateway sends binary messages of 20 ms of the same
    format, ``{"action": "notify", "payload": {"name": ...}}`` after each chunk and
    ``{"action": "clear"}`` on barge-in. The upgrade carries the ``Authorization`` header the
    NCCO endpoint's ``authorization`` sets: its ``value`` (type ``custom``), or ``Bearer`` and
    the JWT Vonage signs its webhooks with (type ``vonage``: HS256 under the account's
    signature secret). With ``vonage_websocket_authorization`` set (the value, or the
    signature secret), the header must be one of these."""

    name: str = "vonage"
    signature_header: str | None = "authorization"
    signing_key_setting: str = (
        "vonage_websocket_authorization: the NCCO endpoint's authorization, the value of type custom, or a fresh "
        "JWT of type vonage signed with it as the account's signature secret"
    )
    secret_parameter: str = "client_secret"  # a key of the NCCO endpoint's headers
    reorders: bool = False
    frame_ms: int = 20  # Vonage takes 20 ms frames (640 bytes at 16 kHz), one binary message each
    message_per_frame: bool = True

    def decode(self, message: str | bytes) -> CarrierEvent | None:
        if isinstance(message, (bytes, bytearray, memoryview)):  # a binary message: the caller's audio
            audio = bytes(message)
            if len(audio) % 2:
                raise CarrierMessageError(f"a binary message of {len(audio)} bytes is not whole PCM16 samples")
            return MediaIn(audio, None)
        d = _json_object(message)
        kind = d.get("event")
        if kind == "websocket:notify":
            payload = d.get("payload")
            if not isinstance(payload, dict):
                raise CarrierMessageError("'payload' must be an object")
            return MarkIn(_str(payload, "name"))
        if kind == "websocket:dtmf":
            raw = d.get("dtmf")
            return _digit(raw.get("digit") if isinstance(raw, dict) else d.get("digit"))
        if kind == "websocket:connected":
            content_type = str(d.get("content-type", "")).replace(" ", "").lower()
            codec, _, rate = content_type.partition(";rate=")
            fmt = _L16_RATES.get(_int(rate, "content-type rate")) if codec == "audio/l16" and rate else None
            if fmt is None:
                raise CarrierMessageError(f"content-type {content_type[:64]!r}: only audio/l16;rate=16000 or "
                                          "audio/l16;rate=8000 is taken")  # fmt: skip
            headers = {k: v for k, v in d.items() if k not in ("event", "content-type") and isinstance(v, str)}
            parameters = _parameters(headers)
            call = parameters.get("uuid") or parameters.get("call_uuid") or ""
            return StreamStart(stream_id=call, call_id=call, account_id="", audio=fmt, channels=1,
                               parameters=parameters)  # fmt: skip
        return None  # (websocket:cleared, websocket:media:..., and what a later version adds)

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        return Binary(audio)

    def mark(self, stream_id: str, name: str) -> bytes:
        return orjson.dumps({"action": "notify", "payload": {"name": name}})

    def clear(self, stream_id: str) -> bytes:
        return orjson.dumps({"action": "clear"})

    def signed(self, key: str, urls: list[str], header: str | None) -> bool:
        """``header`` is ``key`` (the endpoint's ``authorization`` of type ``custom``: its value), or
        ``Bearer`` and a JWT signed HS256 with ``key`` (type ``vonage``: the JWT of Vonage's signed
        webhooks, under the account's signature secret), issued at most ``VONAGE_JWT_MAX_AGE_S`` ago.
        Either takes knowing the key."""
        if _authorized(key, header):
            return True
        token = (header or "").removeprefix("Bearer ")
        if token == header or token.count(".") != 2:
            return False
        try:
            claims = jwt.decode(token, key, algorithms=["HS256"], options={"require": ["iat"]})
        except jwt.PyJWTError:
            return False
        age = time.time() - float(claims["iat"])
        return -VONAGE_JWT_LEEWAY_S <= age <= VONAGE_JWT_MAX_AGE_S


VONAGE = VonageCodec()


_EXOTEL_LINEAR = frozenset({"audio/x-raw", "raw/slin", "slin", "audio/l16"})  # 16-bit linear PCM, as written


def _exotel_format(raw: Mapping[str, Any]) -> AudioFormat:
    encoding = str(raw.get("encoding", "")).lower()
    rate = _int(raw.get("sample_rate"), "media_format.sample_rate")
    bits = raw.get("bit_rate")
    if encoding in _EXOTEL_LINEAR and rate in (8000, 16000, 24000) and (bits is None or str(bits) == "16"):
        return AudioFormat("pcm16", rate)
    raise CarrierMessageError(f"media_format {encoding[:32]!r} {rate} Hz: only 16-bit linear PCM (audio/x-raw) at "
                              "8000, 16000 or 24000 Hz is taken")  # fmt: skip


@dataclass(frozen=True, slots=True, eq=False)
class ExotelCodec:
    """Exotel's Voicebot applet (bidirectional AgentStream): ``connected``, then ``start``
    (``stream_sid``, ``call_sid``, ``account_sid``, ``custom_parameters``: the query parameters
    of the applet's URL, ``media_format``: ``audio/x-raw``, 16-bit linear PCM at 8000 Hz by
    default, 16000 or 24000 where the applet asks), ``media`` (base64 ``payload``, ``chunk``,
    ``timestamp``; about 100 ms each), ``dtmf``, ``mark`` (the echo of one the gateway sent, once
    the audio before it has played) and ``stop``. The gateway sends ``media`` (a whole number of
    20 ms: Exotel asks for multiples of 320 bytes), ``mark`` and ``clear``. Exotel's upgrade is
    authenticated by IP allow-listing or Basic Auth in the applet's URL
    (``wss://KEY:TOKEN@host/...``: ``Authorization: Basic base64(KEY:TOKEN)``): with
    ``exotel_basic_auth`` (``KEY:TOKEN``) set, the header must be that."""

    name: str = "exotel"
    signature_header: str | None = "authorization"
    signing_key_setting: str = "exotel_basic_auth: the KEY:TOKEN of the applet URL's Basic Auth"
    secret_parameter: str = "client_secret"  # a query parameter of the applet's URL (custom_parameters)
    reorders: bool = False
    frame_ms: int = 20  # (320 bytes at 8 kHz: Exotel's multiple)
    message_per_frame: bool = False

    def decode(self, message: str | bytes) -> CarrierEvent | None:
        d = _json_object(message)
        kind = d.get("event")
        if kind == "media":
            return _media_in(_obj(d, "media"))
        if kind == "mark":
            return MarkIn(_str(_obj(d, "mark"), "name"))
        if kind == "dtmf":
            return _digit(_obj(d, "dtmf").get("digit"))
        if kind == "start":
            start = _obj(d, "start")
            return StreamStart(
                stream_id=str(start.get("stream_sid") or d.get("stream_sid") or ""),
                call_id=_str(start, "call_sid"),
                account_id=str(start.get("account_sid") or ""),
                audio=_exotel_format(_obj(start, "media_format")),
                channels=1,
                parameters=_parameters(start.get("custom_parameters")),
            )
        if kind == "connected":
            return Connected()
        if kind == "stop":
            return StreamStop()
        return None

    def media(self, stream_id: str, audio: bytes, fmt: AudioFormat) -> Outgoing:
        payload = base64.b64encode(audio).decode("ascii")
        return orjson.dumps({"event": "media", "stream_sid": stream_id, "media": {"payload": payload}})

    def mark(self, stream_id: str, name: str) -> bytes:
        return orjson.dumps({"event": "mark", "stream_sid": stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> bytes:
        return orjson.dumps({"event": "clear", "stream_sid": stream_id})

    @staticmethod
    def authorization(key_and_token: str) -> str:
        """The ``Authorization`` header of an applet URL with ``KEY:TOKEN@`` in it."""
        return "Basic " + base64.b64encode(key_and_token.encode()).decode("ascii")

    def signed(self, key: str, urls: list[str], header: str | None) -> bool:
        return _authorized(self.authorization(key), header)


EXOTEL = ExotelCodec()
