"""A session's input audio reflected to its sidebands (GPT-Live's ``session.input_audio.append``
server event): what the call's microphone track carried (only a WebRTC session has
sidebands), as it reached the session before muting, converted to what the dialect
reflects (mono PCM16 at 24 kHz) and sent to each sideband outside the session's stream
(no ``server_event_seq``, never journaled: a resumed sideband is not sent it again)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.audio.codecs import AudioFormat, decode_to_pcm16
from gateway.audio.resample import StreamResampler
from gateway.hosting.delivery import Delivery

REFLECTED_RATE = 24_000


class Reflector:
    """One session's reflection (the resampler keeps its state from chunk to chunk)."""

    def __init__(self, encode: Callable[[bytes], bytes]) -> None:
        self.encode = encode
        self._resampler: tuple[AudioFormat, StreamResampler | None] | None = None

    def reflect(self, audio: bytes, fmt: AudioFormat, to: Iterable[Delivery]) -> None:
        """``audio`` (in the session's input format ``fmt``) to every delivery of ``to``."""
        pcm = audio if fmt.codec == "pcm16" else decode_to_pcm16(fmt, audio)
        if self._resampler is None or self._resampler[0] != fmt:
            self._resampler = (fmt, StreamResampler(fmt.rate, REFLECTED_RATE) if fmt.rate != REFLECTED_RATE else None)
        resampler = self._resampler[1]
        if resampler is not None:
            pcm = resampler.process(pcm)
        if not pcm:
            return
        data = self.encode(pcm)
        for delivery in to:
            delivery.send_now(data)
