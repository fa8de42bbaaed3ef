"""One WebRTC call: a peer connection behind a door, the media-carrying ``Peer`` of a session.

What the browser sends comes in two ways: JSON events on the ``oai-events`` data channel
(handed to the door as a WebSocket's text messages are, in order) and the microphone as
an Opus track (decoded, and handed to the door 20 ms at a time at Opus's own 48 kHz: the
session converts it to what the engine takes in one step). What the session says goes out
the same two ways: every event but the answers' audio on the data channel, exactly as on a
WebSocket; the answers' audio, converted once from the engine's (``AudioEvent.source``) to
the track's 48 kHz, into the outgoing track, which paces it at 20 ms on the wall clock and
keeps the ledger of what was sent. The session's client-visible audio formats are never on
this path (docs/architecture.md, *The audio path*).

Because the gateway plays the audio, it knows what the caller heard (to the 20 ms
frame): it reports ``output_audio_buffer.started`` / ``.stopped`` (the track's first
frame of an answer, and its last after the answer ended) and, when an answer is cut
(barge-in, ``response.cancel``, ``output_audio_buffer.clear``), cuts the track within a
frame and has the session truncate the item at the audio actually sent and say
``output_audio_buffer.cleared``: no bookkeeping on the client.

A call ends when its peer hangs up or vanishes (the watchdog: no ICE in time, ICE
failed, no packet for ``webrtc_peer_timeout_s``); its session stays resumable for the
grace period (a re-offer carrying the resume token picks it up on any replica).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiortc import MediaStreamTrack, RTCPeerConnection

from gateway.audio.codecs import AudioFormat
from gateway.hosting.door import Door
from gateway.hosting.peer import MediaEvent
from gateway.protocol.dialects import GA, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.transport.answer_audio import AnswerAudio
from gateway.transport.webrtc.audio_in import AudioIn
from gateway.transport.webrtc.audio_out import AudioOutTrack
from gateway.transport.webrtc.datachannel import ChannelOverflow, EventChannel, MessageTooLarge
from gateway.transport.webrtc.peer import PeerFactory, PeerWatchdog

log = logging.getLogger("omni.webrtc")

# The answer's track: Opus's own rate, so that aiortc's encoder changes only the channels
# (mono to stereo) and the one conversion of the engine's audio is the gateway's.
TRACK_RATE = 48_000
_TRACK = AudioFormat("pcm16", TRACK_RATE)
_SPEECH_STARTED = "input_audio_buffer.speech_started"
_CUT = frozenset({"cancelled", "failed"})  # an answer that ends so has its audio cut at once
TOO_LARGE_LOG_S = 10.0  # a call logs at most one WARNING this often for events too large to send


class Call:
    """See the module docstring. Built by the signaling endpoint, which attaches its door."""

    reconnects = True  # a re-offer carrying the resume token picks the session up (the door's Media)

    def __init__(
        self,
        call_id: str,
        factory: PeerFactory,
        *,
        on_ended: Callable[[Call], None],
        max_message_size: int,
        dialect: Dialect = GA,
    ) -> None:
        self.call_id = call_id
        self.dialect = dialect  # what its channel speaks: which event's audio plays on the track, and
        #   whether what was played is reported to the session (the Realtime API's output_audio_buffer.*)
        self._audio_type = dialect.media_audio
        self._audio_json = f'"{dialect.media_audio}"'.encode()
        self.factory = factory
        self.pc: RTCPeerConnection = factory.create()
        self.track = AudioOutTrack(TRACK_RATE, on_started=self._started, on_stopped=self._stopped)
        self.channel = EventChannel(
            self._message, on_binary=self._binary, on_close=self._channel_closed, max_message_size=max_message_size
        )
        self.door: Door | None = None
        self.ended = False
        self.end_reason: str | None = None
        self.slow = False  # judged a slow consumer: hanging up; what the session still says is dropped
        self._too_large: tuple[float, int] = (float("-inf"), 0)  # (last WARNING at, events unsent since)
        self._on_ended = on_ended
        self._inbox: asyncio.Queue[str] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._audio_in: AudioIn | None = None
        self._watchdog = PeerWatchdog.for_config(self.pc, self._dead, factory.config)
        self._answers = AnswerAudio(_TRACK, AudioFormat("pcm16", 24_000))  # to the track's format, once
        self.pc.on("datachannel", self.channel.accept)
        self.pc.on("track", self._track)

    async def answer(self, offer: str) -> str:
        """The SDP answer to ``offer`` (raises sdp.OfferError; the call is then spent)."""
        return await self.factory.answer(self.pc, offer, audio_track=self.track)

    def start(self, door: Door) -> None:
        """Serve ``door`` (its session opened or resumed): read the channel, watch the peer."""
        self.door = door
        self._reader = asyncio.get_running_loop().create_task(self._read(door), name=f"call {self.call_id}")
        self._watchdog.start()

    # --- what the caller sends --------------------------------------------------------

    def _message(self, text: str) -> None:
        self._inbox.put_nowait(text)

    def _binary(self, data: bytes) -> None:
        # The dialect has no binary messages: what a WebSocket's text frame that is not JSON gets.
        self._inbox.put_nowait(data.decode("utf-8", "replace"))

    async def _read(self, door: Door) -> None:
        """The channel's messages, one after another: one that waits on the store holds the
        ones after it, so the order holds (as on a socket)."""
        while True:
            text = await self._inbox.get()
            pending = door.receive(text)
            if pending is not None:
                await pending

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self._audio_in is not None:
            return  # a video track (the offer's, answered inactive) carries nothing for us
        self._audio_in = AudioIn(track, self._chunk)
        self._audio_in.start()

    def _chunk(self, pcm: bytes, fmt: AudioFormat) -> Any:
        door = self.door
        return door.receive_audio(pcm, fmt) if door is not None else None

    # --- the Peer: what the session says ----------------------------------------------

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if event is None and self._audio_json in data[:64]:
            event = orjson.loads(data)  # a replayed delta: its audio plays on the new track
            event["delta"] = base64.b64decode(event["delta"])
        kind = event["type"] if event is not None else None
        if kind == self._audio_type and event is not None:
            self._play(event)
            return  # the audio is on the track, never on the channel (OpenAI's WebRTC does the same)
        if event is not None:
            if kind == "response.created":
                self._answers.created(event["response"])
            elif kind == "response.done":
                self._answer_ended(event["response"])
            elif kind == _SPEECH_STARTED:
                self._speech_started()
            if isinstance(event, MediaEvent):
                return  # (the call's alone: nothing for the channel)
        if self.slow:
            return  # (the hangup is under way: one WARNING said why, the rest goes nowhere)
        try:
            self.channel.send(data)
        except MessageTooLarge as exc:
            self._unsent(exc)
            with contextlib.suppress(MessageTooLarge, ChannelOverflow):
                self.channel.send(self.dialect.error(ProtocolError(Code.MESSAGE_TOO_LARGE,
                                                                   f"An event was not sent: {exc}.")))  # fmt: skip
        except ChannelOverflow as exc:
            self.slow = True
            log.warning("call %s: slow consumer, hanging up: %s", self.call_id, exc)
            self.close(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)

    def _unsent(self, exc: MessageTooLarge) -> None:
        """An event too large for the peer's channel: one WARNING per ``TOO_LARGE_LOG_S`` at most."""
        now = asyncio.get_running_loop().time()
        last, since = self._too_large
        if now - last < TOO_LARGE_LOG_S:
            self._too_large = (last, since + 1)
            return
        more = f" ({since} more since the last such line)" if since else ""
        log.warning("call %s: an event over the data channel's message limit was not sent: %s%s", self.call_id, exc,
                    more)  # fmt: skip
        self._too_large = (now, 0)

    def close(self, code: int, reason: str) -> None:
        """Hang up (after what was sent: the channel's messages are already in SCTP's hands)."""
        if not self.ended:
            asyncio.get_running_loop().create_task(self.end(reason or str(code)))

    # --- the answer's audio --------------------------------------------------------------

    def _play(self, event: dict[str, Any]) -> None:
        # (what was cut stays cut: audio of it still on its way is dropped by the track)
        host = self.door.host if self.door is not None else None
        response_id, item_id, audio = self._answers.delta(event, host.output_format if host is not None else None)
        self.track.feed(audio, response_id=response_id, item_id=item_id)

    def _answer_ended(self, response: dict[str, Any]) -> None:
        response_id, item_id, tail = self._answers.ended(response)
        if response.get("status") in _CUT:
            playing = self.track.playing
            queued = self.track.queued_ms
            if (playing is not None and playing[0] == response_id) or queued:
                cut = self.track.clear()
                if cut is not None and self.door is not None:
                    # Deferred to the next loop turn: the session is in the middle of a flush.
                    asyncio.get_running_loop().call_soon(
                        self.door.played, "cleared", cut.response_id, cut.item_id, cut.audio_end_ms
                    )
                return
        if tail and item_id is not None:
            self.track.feed(tail, response_id=response_id, item_id=item_id)  # (what the converter held)
        self.track.end_response(response_id)  # stopped once its last frame has gone

    def _speech_started(self) -> None:
        """Server VAD heard the caller. An answer still being written is cancelled by the
        session (its response.done cuts the track), but one already written (engines write
        faster than real time) would play on from the track's queue: barge-in cuts it here,
        as OpenAI's WebRTC does (output_audio_buffer.cleared on speech_started)."""
        if self.door is None or not self.door.interrupted_by_speech:
            return
        if self.track.playing is None and not self.track.queued_ms:
            return
        cut = self.track.clear()
        if cut is not None and self.door is not None:
            # Deferred to the next loop turn: the session is in the middle of a flush.
            asyncio.get_running_loop().call_soon(
                self.door.played, "cleared", cut.response_id, cut.item_id, cut.audio_end_ms
            )

    def clear_audio(self) -> tuple[str, str, int] | None:
        """The door's ``Media``: ``output_audio_buffer.clear`` (and GPT-Live's barge-in) cuts the audio now."""
        self._answers.cut()
        cut = self.track.clear()
        return None if cut is None else (cut.response_id, cut.item_id, cut.audio_end_ms)

    def _started(self, response_id: str) -> None:
        if self.door is not None:
            trace = self.door.trace
            if trace is not None and trace.awaiting_socket:
                trace.played()  # a traced turn ends when its first audio leaves, here on the track
            if self.dialect.media_playback:
                asyncio.get_running_loop().call_soon(self.door.played, "started", response_id)

    def _stopped(self, response_id: str) -> None:
        if self.door is not None and self.dialect.media_playback:
            asyncio.get_running_loop().call_soon(self.door.played, "stopped", response_id)

    # --- the end --------------------------------------------------------------------------

    def _channel_closed(self) -> None:
        if not self.ended:
            asyncio.get_running_loop().create_task(self.end("data channel closed"))

    def _dead(self, reason: str) -> None:
        log.info("call %s: the peer is gone (%s)", self.call_id, reason)
        asyncio.get_running_loop().create_task(self.end(reason))  # not in the watchdog's task: it is stopped

    async def end(self, reason: str) -> None:
        """End the call: media stopped, the door detached (its session stays resumable)."""
        if self.ended:
            return
        self.ended = True
        self.end_reason = reason
        log.info("call %s ends: %s", self.call_id, reason)
        if self._reader is not None:
            self._reader.cancel()
        if self.door is not None:
            self.door.detach()
        self.channel.close()
        self.track.stop()
        self._answers.clear()
        with contextlib.suppress(Exception):
            if self._audio_in is not None:
                await self._audio_in.stop()
        await self._watchdog.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self._on_ended(self)
