"""One stream's audio from one format to another, in one stage (Sans-I/O).

Every place where the gateway changes audio's format goes through ``Converter``: the
source codec decoded (G.711 is a table lookup), the rate changed once (``StreamResampler``,
libsoxr), the destination codec encoded. Audio therefore never passes through an
intermediate format on its way: a phone's 8 kHz µ-law reaches the engine at its rate in
one step, and the engine's audio reaches a phone, a SIP trunk or a WebRTC track in one
step (docs/architecture.md, *The audio path*).

A transport hands the door its audio in its own format (``Door.receive_audio(audio,
fmt)``); the session's input converts it to what the engine takes, and a media
transport converts the engine's audio to what it plays. The session's client-visible
formats (``input_audio_format``, ``output_audio_format``) apply to the events a client
sends and reads, never to a media transport's path.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16
from gateway.audio.resample import StreamResampler


class Converter:
    """Converts a mono stream from ``src`` to ``dst``, chunk by chunk (the resampler's state
    lives in the stream, so nothing is lost or repeated at chunk boundaries).

    ``src == dst``: the input is returned as is. Not thread-safe: one stream per producer.
    After ``flush()`` the stream is finished.
    """

    __slots__ = ("_identity", "_odd", "_resampler", "dst", "src")

    def __init__(self, src: AudioFormat, dst: AudioFormat) -> None:
        self.src = src
        self.dst = dst
        self._identity = src == dst
        self._resampler = StreamResampler(src.rate, dst.rate) if src.rate != dst.rate else None
        self._odd = b""  # (PCM16 in, no resampler) an odd trailing byte waiting for its partner

    @property
    def identity(self) -> bool:
        return self._identity

    def process(self, data: bytes) -> bytes:
        """Audio in ``src``; returns what is ready in ``dst`` (the resampler holds some back)."""
        if self._identity:
            return data
        src = self.src
        if src.codec == "pcm16":
            if self._resampler is None:
                if self._odd:
                    data, self._odd = self._odd + data, b""
                if len(data) % 2:
                    data, self._odd = data[:-1], data[-1:]
            pcm = data
        else:
            pcm = decode_to_pcm16(src, data)
        if self._resampler is not None:
            pcm = self._resampler.process(pcm)
        if not pcm:
            return b""
        return pcm if self.dst.codec == "pcm16" else encode_from_pcm16(self.dst, pcm)

    def flush(self) -> bytes:
        """End the stream: what the resampler still held, in ``dst``."""
        if self._resampler is None:
            return b""
        pcm = self._resampler.flush()
        if not pcm:
            return b""
        return pcm if self.dst.codec == "pcm16" else encode_from_pcm16(self.dst, pcm)


class OutputConverters:
    """What a media transport plays (``dst``), from the answers' audio: the delta itself when it
    is in ``dst`` already (the session's conversion of the engine's audio was the one step: a
    phone session's µ-law), else one ``Converter`` per response, from the engine's own audio
    when the event carries it (``AudioEvent.source``, ``session/events.py``), else from the
    delta in the client's format (a replayed event)."""

    def __init__(self, dst: AudioFormat, *, keep: int = 16) -> None:
        self.dst = dst
        self.keep = keep  # responses whose converter is kept (a response.create may run beside the answer)
        self._by_response: OrderedDict[str, Converter] = OrderedDict()

    def convert(self, response_id: str, delta: bytes, fmt: AudioFormat, event: object = None) -> bytes:
        """One audio event of ``response_id`` (``delta`` in ``fmt``; ``event``: the event, which
        may carry the engine's audio) -> audio in ``dst``."""
        if fmt == self.dst:
            return delta
        source: tuple[bytes, AudioFormat] | None = getattr(event, "source", None)
        audio, src = source if source is not None else (delta, fmt)
        converter = self._by_response.get(response_id)
        if converter is None or converter.src != src:
            converter = self._by_response[response_id] = Converter(src, self.dst)
            while len(self._by_response) > self.keep:
                self._by_response.popitem(last=False)
        return converter.process(audio)

    def end(self, response_id: str) -> bytes:
        """``response_id`` has no more audio: what its converter still held, in ``dst``."""
        converter = self._by_response.pop(response_id, None)
        return converter.flush() if converter is not None else b""

    def clear(self) -> None:
        """The call is over: every converter goes (their filters' memory with them)."""
        self._by_response.clear()


def engine_format(rate: int) -> AudioFormat:
    """What engines take and give: PCM16 mono at ``rate``."""
    return AudioFormat("pcm16", rate)
