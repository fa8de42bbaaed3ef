"""GPT-Live's spelling (Sans-I/O): the events a session's parts emit, as a Live client reads them.

A Live client sees no items, responses or buffers: the model runs its own turns
and the context is append-only. Of what the parts emit (the Realtime API's
events), ``LiveSpelling.spell`` writes:

- ``response.output_audio.delta`` as ``session.output_audio.delta`` (``delta``);
  on a WebSocket, paced to real time (``PacedOutput``, live_output.py: at most
  its lead ahead of the client's ear; a barge-in drops what was not sent);
- ``response.output_audio_transcript.delta`` as ``session.output_transcript.delta``
  with ``start_ms``/``end_ms``, where on the session timeline the words are
  spoken: the text is held until the audio that follows it is sent, then goes
  out after that audio, spanning it (paced: in proportion to that audio, as it
  is sent; what is left when the answer ends goes out then, unless a barge-in
  dropped its audio); a text answer's ``response.output_text.delta`` goes out
  at once, its span empty at the timeline's now;
- ``conversation.item.input_audio_transcription.delta`` as
  ``session.input_transcript.delta``, spanning the speech it transcribes
  (server VAD's ``speech_started`` to ``speech_stopped``; while the speech goes
  on, to the timeline's now);
- ``error`` in the Live shape (``client_event_id``), and ``session.warning``
  as ``info``;
- the Live session's own events (``session.*``, ``error``, ``info``), as they are;
- where the audio is sent as made (a call's session), an answer's end as ``response.done``
  to the connection that plays it alone (``MediaEvent``, events.py: no Live client reads it).

Everything else is not sent (``EventLog.unsent``: its state still reaches the
snapshot). **The session timeline** is what the API measures ``*_ms`` on,
"milliseconds from the beginning of the session": here the input audio clock
(every appended chunk moves it, muted or not), which output audio carries on
past: an answer's audio starts at the later of the input clock and the end of
the previous answer's audio, and each delta moves its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.audio.codecs import AudioFormat
from gateway.protocol import live_events as le
from gateway.protocol.errors import ProtocolError
from gateway.session.effects import Wake
from gateway.session.events import EventLog
from gateway.session.input import InputAudio
from gateway.session.live_output import Out, PacedOutput

# The Live session's own events (and errors) go out as they are.
_OWN = ("session.", "error", "info", "response.event", "transport.")
WAKE_PACE = "pace"  # the session's Wake key: paced output may go on
_MIN_WAKE_S = 0.005  # (a wake sooner than this waits this long)


class LiveSpelling:
    """See the module docstring."""

    def __init__(self, log: EventLog, input_audio: InputAudio, output_format: Callable[[], AudioFormat]) -> None:
        """``output_format()``: the session's (audio deltas are placed on the timeline by it)."""
        self._log = log
        self._write = log.write
        self._input = input_audio
        self._output_format = output_format
        self.output_end_ms = 0.0  # where the last answer's audio ends on the timeline
        self._answer: str | None = None  # the response whose audio is placed now
        self._said_ms: dict[str, float] = {}  # response id -> timeline ms its transcript has reached
        self._held: dict[str, list[str]] = {}  # response id -> transcript text awaiting its audio
        self._speech: tuple[str | None, float] | None = None  # (item id, start ms) of speech under way
        self._spans: dict[str, tuple[int, int]] = {}  # item id -> (start, end) ms of the speech it holds
        self.on_speech: Callable[[], None] = lambda: None  # the caller began to speak (the session cuts media)
        self.on_quiet: Callable[[], None] = lambda: None  # the caller stopped speaking
        self.output: PacedOutput | None = None  # paced output (a WebSocket session's); None: sent as made
        self.clock: Callable[[], float] = time.monotonic  # the pacing's
        self._wake_due = False  # a Wake(WAKE_PACE) is asked for and not yet come

    def timeline_ms(self) -> int:
        """Now, on the session timeline (see the module docstring)."""
        return int(max(self._input.audio_ms, self.output_end_ms))

    def spell(self, type_: str, fields: dict[str, Any]) -> None:
        """Every event the parts emit, as the Live dialect sends it (or not)."""
        if type_ == "response.output_audio.delta":
            self._audio(fields)
        elif type_ == "response.output_audio_transcript.delta":
            if self.output is not None:
                self.output.text(fields["response_id"], fields["delta"])
            else:
                self._held.setdefault(fields["response_id"], []).append(fields["delta"])
        elif type_ == "response.output_text.delta":
            self._said(fields["response_id"], fields["delta"])
        elif type_ == "conversation.item.input_audio_transcription.delta":
            start, end = self._span(fields["item_id"])
            self._write("session.input_transcript.delta", {"delta": fields["delta"], "start_ms": start,
                                                           "end_ms": end})  # fmt: skip
        elif type_ == "error":
            self._error(fields["error"])
        elif type_ == "session.warning":
            self._write("info", {"code": fields["code"], "message": fields["message"]})
        elif type_.startswith(_OWN):
            self._write(type_, fields)
        else:
            self._track(type_, fields)
            self._log.unsent(type_, fields)

    def _track(self, type_: str, fields: dict[str, Any]) -> None:
        """What the unsent events say that the sent ones need (the spans of speech)."""
        if type_ == "input_audio_buffer.speech_started":
            self._speech = (fields.get("item_id"), float(fields["audio_start_ms"]))
            self.on_speech()
        elif type_ == "input_audio_buffer.speech_stopped":
            item_id = fields.get("item_id")
            start = self._speech[1] if self._speech is not None else float(fields["audio_end_ms"])
            if isinstance(item_id, str):
                self._spans[item_id] = (int(start), int(fields["audio_end_ms"]))
            self._speech = None
            self.on_quiet()
        elif type_ == "input_audio_buffer.committed":
            item_id = fields["item_id"]
            if item_id not in self._spans:  # committed without speech bounds: a span ending now
                now = self.timeline_ms()
                self._spans[item_id] = (now, now)
        elif type_ == "conversation.item.input_audio_transcription.completed":
            self._spans.pop(fields["item_id"], None)
        elif type_ in ("response.output_audio_transcript.done", "response.done"):
            rid = fields["response_id"] if type_ != "response.done" else fields["response"]["id"]
            if self.output is not None:
                if self.output.knows(rid):  # (what is left goes out after the answer's audio)
                    self._send(self.output.end(rid))
                elif type_ == "response.done":
                    self._ended(rid)
                return
            self._flush_said(rid)
            if type_ == "response.done":
                self._ended(rid)

    def _span(self, item_id: str) -> tuple[int, int]:
        """Where the speech ``item_id`` holds is on the timeline (so far, if it goes on)."""
        span = self._spans.get(item_id)
        if span is not None:
            return span
        now = self.timeline_ms()
        speech = self._speech
        if speech is not None and speech[0] in (item_id, None):
            return int(speech[1]), now
        return now, now

    def _audio(self, fields: dict[str, Any]) -> None:
        self.audio_out(fields["response_id"], fields["delta"])

    def audio_out(self, rid: str, delta: bytes) -> None:
        """Audio of the answer (or audio fixture) ``rid``: sent now, or paced."""
        if self.output is not None:
            self.output.feed(rid, delta)
            self.pace()
            return
        self._sent_audio(rid, delta)
        self._flush_said(rid)

    def audio_ended(self, rid: str) -> None:
        """An audio fixture ``rid`` has all its audio (an answer ends with its ``response.done``)."""
        if self.output is not None:
            self._send(self.output.end(rid))
        else:
            self._ended(rid)

    def _sent_audio(self, rid: str, delta: bytes) -> None:
        if self._answer != rid:  # an answer's first audio: it starts where the timeline is now
            self._answer = rid
            self.output_end_ms = float(self.timeline_ms())
            self._said_ms[rid] = self.output_end_ms
        self.output_end_ms += self._duration_ms(len(delta))
        self._write("session.output_audio.delta", {"delta": delta})

    def _ended(self, rid: str) -> None:
        self._said_ms.pop(rid, None)
        if self._answer == rid:
            self._answer = None
            if self.output is None:
                # Sent as made (a call's session): a call plays it, and the Live dialect has no
                # event for its end; the call learns it as a Realtime call does, from a
                # ``response.done`` of its own (naming no response: the call ends the speech it
                # plays, its converter's last ms and all, whatever the status: Live cuts only
                # on the caller's speech, ``CutAudio``).
                self._log.to_media("response.done", {"response": {}})

    # --- paced output (a WebSocket session's: live_output.py) ---------------------------

    def pace(self) -> None:
        """Send what is due now, and ask to be woken when more may go."""
        output = self.output
        if output is None:
            return
        now = self.clock()
        self._send(output.due(now))
        wait = output.wait_s(now)
        if wait is not None and not self._wake_due:
            self._wake_due = True
            self._log.effects.append(Wake(max(wait, _MIN_WAKE_S), WAKE_PACE))

    def woken(self) -> None:
        """The ``Wake(WAKE_PACE)`` asked for is due."""
        self._wake_due = False
        self.pace()

    def drop(self) -> None:
        """A barge-in (or the session's end): what was not sent is not, nor its transcript."""
        if self.output is not None:
            for rid in self.output.drop():
                self._ended(rid)

    @property
    def queued(self) -> bool:
        return self.output is not None and self.output.queued

    def _send(self, out: list[Out]) -> None:
        for kind, rid, value in out:
            if kind == "audio":
                assert isinstance(value, bytes)
                self._sent_audio(rid, value)
            elif kind == "text":
                assert isinstance(value, str)
                self._said(rid, value)
            else:
                self._ended(rid)

    def _flush_said(self, rid: str) -> None:
        """The transcript held for ``rid``, spanning the audio sent since the last went out."""
        held = self._held.pop(rid, None)
        if held:
            self._said(rid, "".join(held))

    def _said(self, rid: str, text: str) -> None:
        start = self._said_ms.get(rid, float(self.timeline_ms()))
        end = max(start, self.output_end_ms if self._answer == rid else start)
        self._said_ms[rid] = end
        self._write("session.output_transcript.delta", {"delta": text, "start_ms": int(start), "end_ms": int(end)})

    def _duration_ms(self, nbytes: int) -> float:
        return self._output_format().duration_ms(nbytes)

    def _error(self, error: dict[str, Any]) -> None:
        err = ProtocolError(error["code"], error["message"], param=error.get("param"), event_id=error.get("event_id"),
                            type=error.get("type", "invalid_request_error"))  # fmt: skip
        self._write("error", le.error_fields(err))

    def to_dict(self) -> dict[str, Any]:
        """For the snapshot: the timeline's output end (the input clock is the session's)."""
        return {"output_end_ms": self.output_end_ms}

    def restore(self, d: dict[str, Any]) -> None:
        self.output_end_ms = float(d.get("output_end_ms", 0.0))
