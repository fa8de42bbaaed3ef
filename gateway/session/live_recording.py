"""The recording of a stored GPT-Live session (``GET /v1/live/sessions/{id}/content``), pure.

It is made from what the session journals, the events as its client was sent
them: the model's speech (``session.output_audio.delta``, audio fixtures
included), placed on the session timeline by the transcript that spans it
(``session.output_transcript.delta``'s ``start_ms``), with silence where the
model said nothing. Input audio is not journaled, so the caller's side is not in
it. The file is a WAV: mono PCM16 at ``RATE``.

What it holds is what the journal still holds (its caps: ``journal_max_events``,
``journal_max_bytes``, the idle TTL; events a client acknowledged with
``session.event_ack`` are trimmed): a recording of a long session may begin late.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable

import orjson

from gateway.audio.codecs import AudioFormat, decode_to_pcm16
from gateway.audio.resample import resample_once

RATE = 24_000
MEDIA_TYPE = "audio/wav"
_BYTES_PER_MS = RATE * 2 // 1000


def wav(events: Iterable[bytes], fmt: AudioFormat) -> bytes:
    """The recording of the journaled ``events`` of a session whose audio was ``fmt``."""
    track = bytearray()
    pending: list[bytes] = []  # audio sent since the last transcript (which places it)

    def place(at_ms: int | None) -> None:
        if not pending:
            return
        if at_ms is not None:
            gap = at_ms * _BYTES_PER_MS - len(track)
            if gap > 0:
                track.extend(bytes(gap))
        for pcm in pending:
            track.extend(pcm)
        pending.clear()

    for raw in events:
        event = orjson.loads(raw)
        kind = event.get("type")
        if kind == "session.output_audio.delta":
            pcm = decode_to_pcm16(fmt, base64.b64decode(event["delta"]))
            pending.append(resample_once(pcm, fmt.rate, RATE))
        elif kind == "session.output_transcript.delta" and pending:
            length_ms = sum(len(p) for p in pending) // _BYTES_PER_MS
            place(max(0, int(event["end_ms"]) - length_ms))
        elif kind == "session.output_audio.fixture.played":
            place(None)  # a fixture has no transcript: it follows what was said before it
    place(None)
    return _wav_header(len(track)) + bytes(track)


def _wav_header(nbytes: int) -> bytes:
    return b"RIFF" + struct.pack("<I", 36 + nbytes) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, RATE, RATE * 2, 2, 16
    ) + b"data" + struct.pack("<I", nbytes)  # fmt: skip
