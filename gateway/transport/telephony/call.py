"""One phone call through a carrier's media stream: the ``Peer`` (and ``Media``) of its session.

What the caller says arrives as the carrier's ``media`` messages: handed to the door as
the session's input audio, as it comes, in the carrier's format (``Door.receive_audio``: the
session converts it, once, to what the engine takes, whatever its input format says). A key press
(``dtmf``) becomes the session's ``input_audio_buffer.dtmf_event_received``.

What the session says: its answers' audio (already in the carrier's format: the session
converted the engine's output, once; if a sideband asked for another format, converted once
from the engine's audio the event carries, ``transport/answer_audio.py``) is paced out
by ``Playout`` (``playout.py``: at most ``LEAD_MS`` ahead of the caller's ear, a ``mark``
after each chunk); every other event is
the session's and its sidebands' business, not the carrier's. Because the gateway knows
what was played (the marks' echoes), it does what a WebRTC call does: on the caller's
speech over an answer (server VAD's ``speech_started``, with ``interrupt_response``), on
a cancelled answer and on ``output_audio_buffer.clear`` it sends ``clear``, and the
session cancels the turn and truncates the item at the audio actually played
(``conversation.item.truncated``, ``output_audio_buffer.cleared``).

A GPT-Live session's call (its door's dialect, accepted on ``/v1/live/sessions/{id}/accept``)
plays ``session.output_audio.delta`` (the dialect's ``media_audio``: one stream of speech
per answer, a new one after each answer's end and each cut; the answer's end is a
``response.done`` naming no response, which the door hands the call alone, ``MediaEvent``),
paced and marked the same way, and reports nothing of what it played (``media_playback``:
Live has no items to truncate); on the caller's speech the Live session stops its answer
and cuts the call's audio (``CutAudio``: ``clear_audio``), which sends ``clear``. A key press becomes
``transport.dtmf.received`` on its sidebands.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway.audio.codecs import AudioFormat
from gateway.hosting.door import Door
from gateway.protocol.errors import CloseCode, Code
from gateway.protocol.server_events import AUDIO_DELTA
from gateway.protocol.telephony import Binary, Carrier, DtmfIn, MarkIn, MediaIn, Outgoing, StreamStop
from gateway.transport.answer_audio import AnswerAudio
from gateway.transport.outbox import Outbox, SlowConsumer
from gateway.transport.telephony.playout import Cut, Playout
from gateway.transport.telephony.reorder import Reorder

log = logging.getLogger("omni.telephony")

_SPEECH_STARTED = "input_audio_buffer.speech_started"
_CUT = frozenset({"cancelled", "failed"})  # an answer that ends so has its audio cut at once
_SILENCE = {"pcm16": b"\x00\x00", "pcmu": b"\xff", "pcma": b"\xd5"}  # one sample of silence


class PhoneCall:
    """See the module docstring. The endpoint builds it, opens its door, then ``run``s it."""

    reconnects = False  # a carrier does not reconnect a stream: a drain lets the call finish

    def __init__(self, codec: Carrier, stream_id: str, call_sid: str, outbox: Outbox, fmt: AudioFormat,
                 *, clock: Callable[[], float] | None = None) -> None:  # fmt: skip
        self.codec = codec
        self.stream_id = stream_id
        self.call_sid = call_sid  # the carrier's id of the call (logs)
        self.outbox = outbox
        self.fmt = fmt  # the carrier's audio, both ways (its start said which)
        self.reorder = Reorder() if codec.reorders else None
        self.playout = Playout(self.fmt.rate * self.fmt.bytes_per_sample // 1000)
        # The carrier's frame (codec.frame_ms of its audio), in bytes: 0, any length.
        self._frame = codec.frame_ms * self.fmt.rate * self.fmt.bytes_per_sample // 1000
        self.door: Door | None = None
        self.ended = False
        self.clears = 0  # clear messages sent (barge-in, cancel, output_audio_buffer.clear)
        self._loop = asyncio.get_running_loop()
        self._clock = clock or self._loop.time
        self._wake = asyncio.Event()
        self._pacer: asyncio.Task[None] | None = None
        self._answers = AnswerAudio(fmt, fmt)  # the answers' audio to the carrier's format (if it is not already)
        self._audio_type = AUDIO_DELTA  # the event whose audio plays (the door's dialect's, once started)
        self._audio_json = _quoted(AUDIO_DELTA)
        self._playback = True  # what was played is reported to the session (the door's dialect's)

    def start(self, door: Door) -> None:
        self.door = door
        self._audio_type = door.dialect.media_audio
        self._audio_json = _quoted(self._audio_type)
        self._playback = door.dialect.media_playback
        self._pacer = self._loop.create_task(self._pace(), name=f"phone call {self.call_sid}")

    # --- what the caller sends ---------------------------------------------------------

    def handle(self, event: object) -> Any:
        """One decoded carrier event; returns what the door asks to wait on (or None)."""
        door = self.door
        if door is None:
            return None
        if isinstance(event, MediaIn):
            if self.reorder is None:
                return self._audio_in(door, event.audio)
            pending = [self._audio_in(door, audio) for audio in self.reorder.push(event.chunk, event.audio)]
            waits = [p for p in pending if p is not None]
            return _all(waits) if waits else None
        if isinstance(event, MarkIn):
            echoed = self.playout.echoed(event.name)
            if echoed is not None and echoed[1] and self._playback:
                self._loop.call_soon(door.played, "stopped", echoed[0])
            return None
        if isinstance(event, DtmfIn):
            door.dtmf(event.digit)
            return None
        if isinstance(event, StreamStop):
            self.end("the carrier stopped the stream")
        return None

    def _audio_in(self, door: Door, audio: bytes) -> Any:
        return door.receive_audio(audio, self.fmt)  # the session converts it, once

    # --- the Peer: what the session says ------------------------------------------------

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if event is None:
            if self._audio_json not in data[:64]:
                return  # (a replayed or connection event: nothing the carrier plays)
            event = orjson.loads(data)
            event["delta"] = base64.b64decode(event["delta"])
        kind = event["type"]
        if kind == self._audio_type:
            self._play(event)
        elif kind == "response.created":
            self._answers.created(event["response"])
        elif kind == "response.done":
            self._answer_ended(event["response"])
        elif kind == _SPEECH_STARTED:
            self._speech_started()

    def close(self, code: int, reason: str) -> None:
        self.end(reason or str(code), code=code)

    def clear_audio(self) -> tuple[str, str, int] | None:
        """The door's ``Media``: ``output_audio_buffer.clear`` cuts the audio now."""
        cut = self._clear()
        return None if cut is None else (cut.response_id, cut.item_id, cut.audio_end_ms)

    # --- the answer's audio ---------------------------------------------------------------

    def _play(self, event: dict[str, Any]) -> None:
        host = self.door.host if self.door is not None else None
        response_id, item_id, audio = self._answers.delta(event, host.output_format if host is not None else None)
        self.playout.feed(audio, response_id=response_id, item_id=item_id)
        self._wake.set()

    def _answer_ended(self, response: dict[str, Any]) -> None:
        response_id, item_id, tail = self._answers.ended(response)
        if response.get("status") in _CUT:
            playing = self.playout.playing
            if playing is not None and playing[0] == response_id:
                self._cut_now()
                return
        if tail and item_id is not None:
            self.playout.feed(tail, response_id=response_id, item_id=item_id)  # (what the converter held)
        self.playout.end_response(response_id)
        self._wake.set()

    def _speech_started(self) -> None:
        """The caller talks over the answer: silence the line (``clear``) and cut the item
        at what was played. An answer still being written is cancelled by the session;
        one already written would play on from the queue and the carrier's buffer."""
        if self.door is None or not self.door.interrupted_by_speech or self.playout.playing is None:
            return
        self._cut_now()

    def _cut_now(self) -> None:
        cut = self._clear()
        if cut is not None and self.door is not None and self._playback:
            # Deferred to the next loop turn: the session is in the middle of a flush.
            self._loop.call_soon(self.door.played, "cleared", cut.response_id, cut.item_id, cut.audio_end_ms)

    def _clear(self) -> Cut | None:
        cut = self.playout.clear()
        self._answers.cut()
        if cut is not None:
            self.clears += 1
            self._write(self.codec.clear(self.stream_id))
            log.info("call %s: cleared at %d ms of item %s (%d ms never played)", self.call_sid, cut.audio_end_ms,
                     cut.item_id, cut.dropped_ms)  # fmt: skip
        return cut

    async def _pace(self) -> None:
        """Send what is due, when it is due (``Playout``), until the call ends."""
        door = self.door
        while not self.ended:
            now = self._clock()
            for chunk in self.playout.due(now):
                for message in self._media(chunk.audio):
                    self._write(message)
                self._write(self.codec.mark(self.stream_id, chunk.mark))
                if chunk.first and door is not None:
                    trace = door.trace
                    if trace is not None and trace.awaiting_socket:
                        trace.played()  # a traced turn ends when its first audio goes to the carrier
                    if self._playback:
                        self._loop.call_soon(door.played, "started", chunk.response_id)
            at = self.playout.next_at(self._clock())
            self._wake.clear()
            if at is None:
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, at - self._clock()))

    def _media(self, audio: bytes) -> list[Outgoing]:
        """The carrier's messages for one chunk: its audio padded with silence to a whole number
        of the carrier's frames (the last chunk of an answer; at most one frame of silence), one
        message per frame where the carrier takes them so (``codec.frame_ms``)."""
        frame = self._frame
        if not frame:
            return [self.codec.media(self.stream_id, audio, self.fmt)]
        short = -len(audio) % frame
        if short:
            silence = _SILENCE[self.fmt.codec]
            audio += silence * (short // len(silence))
        if not self.codec.message_per_frame:
            return [self.codec.media(self.stream_id, audio, self.fmt)]
        return [self.codec.media(self.stream_id, audio[i : i + frame], self.fmt) for i in range(0, len(audio), frame)]

    def _write(self, message: Outgoing) -> None:
        if self.ended:
            return
        try:
            if isinstance(message, Binary):
                self.outbox.put_bytes(message.data)
            else:
                self.outbox.put_text(message)
        except SlowConsumer as exc:
            log.warning("call %s: the carrier does not keep up, hanging up: %s", self.call_sid, exc)
            self.outbox.abort(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
            self.end(Code.SLOW_CONSUMER, code=None)

    # --- the end ------------------------------------------------------------------------

    def end(self, reason: str, *, code: int | None = CloseCode.NORMAL) -> None:
        """The call is over here: pacing stops, the door is detached (its session stays
        resumable for ``detach_grace_s``), the socket closes after what was sent."""
        if self.ended:
            return
        self.ended = True
        log.info("call %s ends: %s", self.call_sid, reason)
        self._wake.set()
        if self._pacer is not None and self._pacer is not asyncio.current_task():
            self._pacer.cancel()
        if self.door is not None:
            self.door.detach()
        self._answers.clear()
        if code is not None:
            self.outbox.close(code, reason[:120])


def _quoted(event_type: str) -> bytes:
    """How an event's type reads in its JSON (a replayed delta's, found without decoding the rest)."""
    return b'"' + event_type.encode() + b'"'


async def _all(waits: list[Any]) -> None:
    for wait in waits:
        await wait
