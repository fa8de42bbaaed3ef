"""A session's input audio reflected to its sidebands (GPT-Live's ``session.input_audio.append``
server event): what the call's microphone track carried (only a WebRTC session has
sidebands), as it reached the session before muting, converted to what the dialect
reflects (mono PCM16 at 24 kHz) and sent to each sideband outside the session's stream
(no ``server_event_seq``, never journaled: a resumed sideband is not sent it again)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import Converter
from gateway.hosting.delivery import Delivery

REFLECTED_RATE = 24_000
_REFLECTED = AudioFormat("pcm16", REFLECTED_RATE)


class Reflector:
    """One session's reflection (the converter keeps its state from chunk to chunk)."""

    def __init__(self, encode: Callable[[bytes], bytes]) -> None:
        self.encode = encode
        self._converter: Converter | None = None

    def reflect(self, audio: bytes, fmt: AudioFormat, to: Iterable[Delivery]) -> None:
        """``audio`` (in ``fmt``: the call's, as it reached the session) to every delivery of ``to``."""
        converter = self._converter
        if converter is None or converter.src != fmt:
            converter = self._converter = Converter(fmt, _REFLECTED)
        pcm = converter.process(audio)
        if not pcm:
            return
        data = self.encode(pcm)
        for delivery in to:
            delivery.send_now(data)
