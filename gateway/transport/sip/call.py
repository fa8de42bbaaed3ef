"""One answered SIP call: its RTP behind a door, the media-carrying ``Peer`` of a session.

The caller's audio (G.711 or Opus, decoded to PCM16 at the codec's rate: 8 or 48 kHz) is handed
to the door 20 ms at a time with its format (``Door.receive_audio``: the session converts it to
what the engine takes, in one step, never through the session's input format); a key press
(RFC 4733) becomes ``Door.dtmf``. Of what the session says, the answers' audio is played on
the call's paced RTP track (converted once from the engine's own audio, which each audio event
carries, to PCM16 at the codec's rate: ``transport/answer_audio.py``);
the call reports what was played (``output_audio_buffer.started``/``.stopped``) and cuts the
audio on barge-in, a cancel and ``output_audio_buffer.clear``, as a WebRTC call does. The
other events have no wire here: a sideband socket (``/v1/realtime?call_id=``) sees them.
A GPT-Live session's call (its door's dialect) plays ``session.output_audio.delta`` (one
stream of speech per answer, a new one after each answer's end and each cut: the answer's end
is a ``response.done`` naming no response, which the door hands the call alone,
``MediaEvent``) and reports nothing of what it played, as a Live WebRTC call; a key its
sideband sends (``transport.dtmf.send``) goes on the call's RTP (``send_dtmf``).

The call ends on the caller's BYE, on the session's end (a REST hangup, the call length cap:
then the server sends BYE, ``close``), or at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gateway.audio.codecs import AudioFormat
from gateway.hosting.door import Door
from gateway.protocol.server_events import AUDIO_DELTA
from gateway.quotas import Seat
from gateway.transport.answer_audio import AnswerAudio
from gateway.transport.sip.media import RtpMedia

log = logging.getLogger("omni.sip")

CHUNK_MS = 20  # what the door is handed at a time
INBOX_CHUNKS = 50  # 1 s of the caller's audio waiting for the session; more: the oldest is dropped
_CUT = frozenset({"cancelled", "failed"})
_SPEECH_STARTED = "input_audio_buffer.speech_started"


class SipCall:
    reconnects = False  # a trunk does not re-place a call elsewhere: a drain lets it finish (the door's Media)

    def __init__(self, ringing_id: str, media: RtpMedia, *, on_close: Callable[[SipCall, str], None]) -> None:
        self.ringing_id = ringing_id
        self.call_id = ""  # the session's call id (rtc_...), once it is open
        self.door: Door | None = None
        self.seat: Seat | None = None  # its share of its tenant's limits (gateway/quotas.py): released as it ends
        self.ended = False
        # Set when the session lets the call go (``close``): an outbound call still ringing
        # is cancelled then (``uac.invite``), not left to ring on.
        self.let_go = asyncio.Event()
        self._on_close = on_close
        self._buf = bytearray()
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue(INBOX_CHUNKS)
        self._reader: asyncio.Task[None] | None = None
        self.dropped_chunks = 0
        self._audio_type = AUDIO_DELTA  # the event whose audio plays (the door's dialect's, once started)
        self._playback = True  # what was played is reported to the session (the door's dialect's)
        self.take_media(media)

    def take_media(self, media: RtpMedia) -> None:
        """The call's RTP (again: an outbound call's, once the answer named the far end and its
        codec; the media bound before it, never started, is dropped)."""
        self.media = media
        self._chunk = 2 * media.rate * CHUNK_MS // 1000
        self._format = AudioFormat("pcm16", media.rate)  # what the door is handed, and what the track takes
        self._answers = AnswerAudio(self._format, AudioFormat("pcm16", 24_000))  # to the track's, once
        media.on_audio = self._audio
        media.on_dtmf = self._dtmf
        media.track.on_started = self._started
        media.track.on_stopped = self._stopped

    def start(self, door: Door) -> None:
        self.door = door
        self._audio_type = door.dialect.media_audio
        self._playback = door.dialect.media_playback
        self._reader = asyncio.get_running_loop().create_task(self._read(door), name=f"sip call {self.call_id}")

    # --- the caller ---------------------------------------------------------------------

    def _audio(self, pcm: bytes) -> None:
        self._buf += pcm
        while len(self._buf) >= self._chunk:
            chunk = bytes(self._buf[: self._chunk])
            del self._buf[: self._chunk]
            if self._inbox.full():
                self._inbox.get_nowait()  # the session is a second behind: the oldest audio goes
                self.dropped_chunks += 1
            self._inbox.put_nowait(chunk)

    async def _read(self, door: Door) -> None:
        while True:
            chunk = await self._inbox.get()
            pending = door.receive_audio(chunk, self._format)
            if pending is not None:
                await pending

    def _dtmf(self, key: str) -> None:
        log.info("call %s: the caller pressed %s", self.call_id, key)
        if self.door is not None:
            self.door.dtmf(key)

    # --- the Peer: what the session says ----------------------------------------------

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if event is None:
            return  # a replay or a connection event: nothing of it is heard on a phone line
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
        """The session let the call go (a REST hangup, the session closed): hang up (BYE), or
        cancel the call while it rings."""
        self.let_go.set()
        if not self.ended:
            self._on_close(self, reason or str(code))

    # --- the answer's audio --------------------------------------------------------------

    def send_dtmf(self, digit: str, on_sent: Callable[[], None]) -> str | None:
        """The session's ``SendDtmf``: the key on the call's RTP (None; ``on_sent`` once its end
        went), or why not."""
        return self.media.send_dtmf(digit, on_sent)

    def _play(self, event: dict[str, Any]) -> None:
        host = self.door.host if self.door is not None else None
        response_id, item_id, pcm = self._answers.delta(event, host.output_format if host is not None else None)
        self.media.track.feed(pcm, response_id=response_id, item_id=item_id)

    def _answer_ended(self, response: dict[str, Any]) -> None:
        response_id, item_id, tail = self._answers.ended(response)
        if response.get("status") in _CUT:
            self._cut()
            return
        if tail and item_id is not None:
            self.media.track.feed(tail, response_id=response_id, item_id=item_id)  # (what the converter held)
        self.media.track.end_response(response_id)

    def _speech_started(self) -> None:
        if self.door is not None and self.door.interrupted_by_speech:
            self._cut()

    def _cut(self) -> None:
        track = self.media.track
        if track.playing is None and not track.queued_ms:
            return
        self._answers.cut()
        cut = track.clear()
        if cut is not None and self.door is not None and self._playback:
            asyncio.get_running_loop().call_soon(self.door.played, "cleared", cut.response_id, cut.item_id,
                                                 cut.audio_end_ms)  # fmt: skip

    def clear_audio(self) -> tuple[str, str, int] | None:
        """The door's ``Media``: ``output_audio_buffer.clear`` cuts the audio now."""
        self._answers.cut()
        cut = self.media.track.clear()
        return None if cut is None else (cut.response_id, cut.item_id, cut.audio_end_ms)

    def _started(self, response_id: str) -> None:
        if self.door is not None:
            trace = self.door.trace
            if trace is not None and trace.awaiting_socket:
                trace.played()
            if self._playback:
                asyncio.get_running_loop().call_soon(self.door.played, "started", response_id)

    def _stopped(self, response_id: str) -> None:
        if self.door is not None and self._playback:
            asyncio.get_running_loop().call_soon(self.door.played, "stopped", response_id)

    # --- the end --------------------------------------------------------------------------

    async def end(self, reason: str) -> None:
        """Media stopped and the door detached (the caller of ``end`` ends the session)."""
        if self.ended:
            return
        self.ended = True
        log.info("call %s ends: %s", self.call_id or self.ringing_id, reason)
        if self._reader is not None:
            self._reader.cancel()
        if self.door is not None:
            self.door.detach()
        self._answers.clear()
        with contextlib.suppress(Exception):
            await self.media.stop()
        if self.seat is not None:
            await self.seat.close()  # (its tenant's session count: one less)
