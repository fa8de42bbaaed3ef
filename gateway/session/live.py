"""The GPT-Live session (Sans-I/O): OpenAI's Live API served by the gateway's engines.

The Live model runs its own turns: there is no commit, no ``response.create``
for speech, no cancel and no truncate, and the context is append-only. So a
``LiveSession`` is the Realtime session (conversation, input audio and server
VAD, responses, seq, epoch, snapshot, journal, resume) with:

- **its turns** (``LiveTurns``): speech the VAD ends is committed and answered
  at once; speech over an answer stops it (barge-in). Without a speech
  detector (``vad`` off) input audio only moves the session timeline: the
  model takes no turn of its own (an appended commentary is still said). On an
  engine that takes its own turns (``info.takes_turns``) the gateway's speech
  detector takes none: the caller's audio streams to the engine for the whole
  session, and its speech starts (barge-in), answers and transcripts are the
  session's (``EngineTurns``, engine_turns.py);
- **its events** (``LiveSpelling``, live_spelling.py): audio, the two
  transcripts with their place on the session timeline, errors and notices;
  nothing of items, responses or buffers;
- **its commands**: ``session.input_audio.mute``/``.unmute`` (the model hears
  silence; the timeline goes on), ``session.instructions.append`` (developer
  context), ``.thinking.append`` (silent context), ``.commentary.append``
  (context the model says: an answer that communicates it, at once or after
  the answer under way), each acknowledged ``*.appended`` with its span, and
  naming a delegation the application was handed (``delegation_id``);
  ``session.output_audio.fixture.play`` (raw PCM16 at 24 kHz, at most 30 s:
  the answer under way stops, the audio is sent as output, input is muted
  until it has played: ``fixture.playing``, then ``fixture.played``);
  ``session.update`` (delegation and triggers only); ``session.close``
  (``session.closed`` with the final resource and usage, the last event);
- **usage**: ``session.usage.updated`` every ``USAGE_EVERY_S`` (cumulative
  whole seconds of the session timeline), and in ``session.closed``;
- **idle pause and wake** (a WebRTC session's ``wake_policy`` and ``idle_timeout_s``):
  the model's inference waits, paused, for the caller's first speech (heard by
  the speech detector at the policy's ``vad_threshold``), which wakes it
  (``session.resumed``) and is its first turn; ``idle_timeout_s`` of the
  session timeline with no speech and no output pauses it again
  (``session.paused``); usage then reports ``active_seconds`` and
  ``paused_seconds``. While paused nothing is said: commentary and results wait
  for the wake;
- **paced output**: on a WebSocket the model's audio (answers and fixtures)
  goes out in real time, at most ``output_lead_ms`` ahead of the client's ear
  (``PacedOutput``, live_output.py), and a barge-in drops what was not sent,
  with its transcript. A WebRTC call's track plays the audio in real time
  itself: its audio goes to the track as made, each answer's end after it (a
  ``MediaEvent``, the call's alone: the call plays what its converter held), and
  a barge-in cuts the track (``CutAudio``).

Delegation, both kinds (the model's built-in ``delegate`` function,
``session.delegation.created``, the spoken acknowledgement, the Responses
backend's conversation, ``response.item.create``/``response.create`` and
``response.event``), is gateway/session/live_delegation.py's (``Delegations``);
the session lends it its voice (``Voice``: what it says, hears and is told).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from gateway.audio.codecs import AudioFormat, encode_from_pcm16
from gateway.audio.convert import Converter, engine_format
from gateway.protocol import client_events as ce
from gateway.protocol import live_config as lc
from gateway.protocol import live_events as le
from gateway.protocol.dialects import LIVE, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.live_channel import PERMISSIONS_INFO, ChannelPolicy
from gateway.session import live_recording
from gateway.session.conversation import Item, Part, PartType
from gateway.session.effects import CloseSocket, CutAudio, SendDtmf, Wake
from gateway.session.live_delegation import (
    ACK_INSTRUCTIONS,
    ACK_SAY,
    DELEGATE,
    DELEGATE_TOOL,
    RESPONSES_BACKEND_UNCONFIGURED,
    Delegations,
    can_delegate,
)
from gateway.session.live_output import PacedOutput
from gateway.session.live_spelling import WAKE_PACE, LiveSpelling
from gateway.session.response import Response
from gateway.session.session import RealtimeSession
from gateway.session.turn_taking import Parts, RealtimeTurns
from orchestrator.engine import EngineInfo, TurnOutput

USAGE_EVERY_S = 15.0  # session.usage.updated this often (as the API was measured to)
FIXTURE_CHUNK_MS = 100  # an audio fixture goes out in deltas of this length
FIXTURE_ACTIVE = "fixture_active"  # a second fixture, or an append the API refuses while one plays
DELEGATION_NOT_FOUND = "delegation_not_found"  # a delegation_id this session never handed out
OUTPUT_LEAD_MS = 300  # paced output: at most this far ahead of the client's ear (live_output_lead_ms)
_WAKE_USAGE, _WAKE_FIXTURE = "usage", "fixture"
_SAY = "Communicate this to the user now, in your own words: "
_THINK = "Background context for this conversation (do not read it out): "


class LiveTurns(RealtimeTurns):
    """The Live model's turns: VAD-ended speech is answered, speech over an answer stops it,
    whatever the client asked (it asks nothing: the Live API has no turn settings)."""

    spelling_step: LiveSpelling | None = None
    answered: Callable[[], None] = staticmethod(lambda: None)  # an answer ended as it meant to (the session's)
    ended: Callable[[Response], None] = staticmethod(lambda resp: None)  # any answer ended (its calls: the session's)

    def bind(self, parts: Parts, config: Any) -> None:
        super().bind(parts, config)
        self.spelling_step = LiveSpelling(parts.log, parts.input, lambda: self.config.output_format)
        self.spelling = self.spelling_step.spell

    def speech_during_response(self) -> None:
        self._log.epoch += 1
        self._responses.end_current("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)

    def answer(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None) -> None:
        """The model takes its turn: an answer still under way (a commentary's) gives way to it."""
        if self._responses.current is not None:
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)
        self._responses.create(params, event_id, turn_started_at)

    def answer_ended(self, resp: Response, status: str) -> None:
        self.ended(resp)
        if status != "cancelled":
            self.answered()


class LiveSession(RealtimeSession):
    """See the module docstring."""

    def __init__(self, *, session_id: str, live: lc.LiveSettings | None = None,
                 wall_clock: Callable[[], float] = time.time, responses_backend: bool | None = None,
                 output_lead_ms: int = OUTPUT_LEAD_MS, pace_clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:  # fmt: skip
        """``responses_backend``: whether the gateway has a Responses backend (False: a session
        with Responses delegation is refused at its start; None: not known here, as for a
        session restored from its snapshot, whose start was checked where it started).
        ``output_lead_ms``: how far a WebSocket session's output may be ahead of the client's
        ear (``PacedOutput``; 0: not paced); ``pace_clock``: the pacing's clock (seconds)."""
        self._live_turns = LiveTurns()
        super().__init__(session_id=session_id, turn_taking=self._live_turns, **kwargs)
        self.live = live or lc.LiveSettings(model=self.config.model)
        self.muted = False  # session.input_audio.mute: the model hears silence
        self.fixture: str | None = None  # an audio fixture plays: its play event's id ("" for none given)
        self._responses_backend = responses_backend
        self._delegations = Delegations(self._log, self)
        self._delegations.settings = self.live.delegation or lc.Delegation()
        self._policy = ChannelPolicy.of(self.live.data_channel)
        self.closed = False
        self.forked = False  # a fork of a stored session: its opening event carries the fork's overrides
        self._pending_say: list[tuple[str, str | None]] = []  # commentary to speak once the answer ends
        self._wall_clock = wall_clock
        self._silence: tuple[tuple[int, AudioFormat] | None, bytes] = (None, b"")
        spelling = self._live_turns.spelling_step
        assert spelling is not None
        self.spelling = spelling
        self._live_turns.answered = self._say_pending
        spelling.on_speech = self._speech_started
        spelling.clock = pace_clock
        self.output_lead_ms = output_lead_ms
        self._fixtures = 0  # audio fixtures played (each one's audio is an answer of its own to the pacing)
        # Idle pause (a WebRTC session's wake policy): timeline ms of the pause under way (None: active),
        # of the pauses before it, and of the last speech start or end (what idleness counts from).
        self.paused_at_ms: float | None = None
        self.paused_ms = 0.0
        self._active_ms = 0.0
        spelling.on_quiet = self._quiet
        self._live_turns.ended = self._delegated
        if self._engine_turns is not None:  # (what waited for the caller's turn: said once it is heard,
            self._engine_turns.turn_heard = self._say_pending  # or after the engine's answer to it)

    @property
    def dialect(self) -> Dialect:
        return LIVE

    @property
    def delegations(self) -> dict[str, str]:
        """The delegations handed out: id -> target (what appends may name)."""
        return self._delegations.handed

    # --- lifecycle and config --------------------------------------------------------

    def configure(self, update: dict[str, Any], *, media: bool = False) -> list[tuple[str, str]]:
        """``session.start``'s ``session`` (strict), applied before ``session.started``; a fork's
        overrides of the stored session's settings; ``media``: a WebRTC session's, as ``POST
        /v1/live/sessions`` carries it (``MediaSessionConfigParam``: no ``audio.format``, the
        frontend's ``client.data_channel`` allow-lists)."""
        media = media or self.live.media
        if self.forked:
            self._apply_live(lc.parse_fork(self.live, update, media=media))
        else:
            self._apply_live(lc.parse_start(update, media=media))
        self._policy = ChannelPolicy.of(self.live.data_channel)
        return []

    @property
    def channel_policy(self) -> ChannelPolicy:
        return self._policy

    def append_input(self, audio: bytes, fmt: AudioFormat | None = None) -> None:
        self.append_heard(audio, None, fmt)  # (muted, or under a fixture: the model hears silence)

    # --- stored sessions: kept after their close, forked, recorded ------------------------

    @property
    def retained(self) -> bool:
        return self.live.store

    @classmethod
    def stored(cls, state: dict[str, Any]) -> bool:
        return bool(state.get("live", {}).get("settings", {}).get("store"))

    @classmethod
    def recording(cls, state: dict[str, Any], journal: list[bytes]) -> tuple[bytes, str]:
        fmt = lc.from_dict(state["live"]["settings"]).audio_format
        return live_recording.wav(journal, fmt), live_recording.MEDIA_TYPE

    @classmethod
    def fork(cls, state: dict[str, Any], *, session_id: str, engine: EngineInfo, **kwargs: Any) -> LiveSession:
        """The stored conversation and settings, on a new session with a timeline, seq and
        lifetime of its own; nothing of what ran (answers, fixtures, delegations) comes along.
        Its opening event (``session.start``) applies the fork's overrides (``configure``)."""
        fresh = {**state, "id": session_id, "seq": 0, "epoch": 0, "audio_ms": 0.0, "created_at": time.time(),
                 "response": None, "oob": [], "id_base": secrets.token_hex(6), "id_counter": 0}  # fmt: skip
        session = cls.restore(fresh, engine=engine, **kwargs)
        session.muted, session.closed, session.fixture = False, False, None
        session._pending_say = []
        session._delegations = Delegations(session._log, session)
        session._delegations.settings = session.live.delegation or lc.Delegation()
        session.spelling.restore({})
        session.attachment_generation = 1
        session.effects.clear()  # (restore asked for its usage timer: start asks again)
        session.forked = True
        return session

    def _apply_live(self, live: lc.LiveSettings) -> None:
        if live.delegation_type == "responses" and self._responses_backend is False:
            raise ProtocolError(RESPONSES_BACKEND_UNCONFIGURED, "This gateway has no Responses backend to delegate "
                                "to (its operator sets live_responses_url); use delegation type 'client'.",
                                param="session.delegation.type")  # fmt: skip
        if live.wake_policy is not None and self._engine_turns is not None:
            raise ProtocolError(Code.UNSUPPORTED, "'session.wake_policy' is for the gateway's speech detector, and "
                                "this session's engine takes its own turns; leave it out.",
                                param="session.wake_policy")  # fmt: skip
        if live.wake_policy is not None and self._vad_factory is None:
            raise ProtocolError(Code.UNSUPPORTED, "'session.wake_policy' needs a speech detector, and this gateway "
                                "runs none (its operator installs the cpu extra: silero-vad); leave it out.",
                                param="session.wake_policy")  # fmt: skip
        self.live = live
        self._delegations.settings = live.delegation or lc.Delegation()
        engine = self.engine
        config = live.to_session(self.config, engine.voices, engine.default_voice, vad=self._vad_factory is not None)
        # The model may hand tasks off where its engine calls functions (live_delegation.py).
        self.config = replace(config, tools=(DELEGATE_TOOL,) if can_delegate(engine) else ())

    def start(self, resume_token: str | None = None, *, configured: bool = False,
              warnings: Sequence[tuple[str, str]] = (), event_id: str | None = None) -> None:  # fmt: skip
        """The initial history, then ``session.started`` (answering the ``session.start`` that
        opened it, with the gateway's ``resume_token``)."""
        for raw in () if self.forked else self.live.input:  # (a fork's conversation holds it already)
            role, text = lc.initial_text(raw)
            self._add_context(role, text)
        self._pace()
        self.paused_at_ms, self.paused_ms = None, 0.0
        if self.live.wake_policy is not None:  # inference waits for the first wake
            self._pause(announce=False)
        fields: dict[str, Any] = {"session": self.render_config(), **_echo(event_id)}
        if resume_token is not None:
            fields["resume_token"] = resume_token
        self._emit("session.started", **fields)
        for code, message in self._notices():
            self._emit("info", code=code, message=message)
        if self.live.media:  # what the WebRTC frontend's data channel may send and see
            self._emit("info", code=PERMISSIONS_INFO, message=self._policy.describe())
        self.effects.append(Wake(USAGE_EVERY_S, _WAKE_USAGE))

    def _pace(self) -> None:
        """Paced output where the client plays what it is sent (a WebSocket), not on a WebRTC
        call (its track plays the audio in real time itself)."""
        paced = self.output_lead_ms > 0 and not self.live.media
        spelling = self.spelling
        if not paced:
            spelling.output = None
        elif spelling.output is None or spelling.output.lead_ms != self.output_lead_ms:
            spelling.output = PacedOutput(lambda: self.config.output_format, self.output_lead_ms)

    @property
    def output_pending(self) -> bool:
        """Paced audio waits to go out (a drain waits for it)."""
        return self.spelling.queued

    def _notices(self) -> list[tuple[str, str]]:
        """What the engine does not do of what the session asked (``info``: it goes on)."""
        engine, notices = self.engine, []
        if self.live.instructions and "instructions" in engine.ignored_fields:
            notices.append(("unsupported_field", f"'session.instructions' are kept, but this engine's model "
                            f"does not follow them ({engine.name}: see /v1/models)."))  # fmt: skip
        voice = self.live.voice["id"] if isinstance(self.live.voice, dict) else self.live.voice
        if voice != self.config.voice:
            notices.append(("voice_substituted", f"The voice {voice!r} is spoken with this engine's voice "
                            f"{self.config.voice!r}."))  # fmt: skip
        return notices

    def render_config(self) -> dict[str, Any]:
        return lc.render(self.live, session_id=self.id, expires_at=self.expires_at)

    def usage(self) -> dict[str, Any]:
        """Cumulative billable duration: whole seconds of the session timeline; with a wake policy,
        the paused and (the rest) active whole seconds of it."""
        now = self.spelling.timeline_ms()
        seconds = math.floor(now / 1000)
        if self.live.wake_policy is None:
            return {"seconds": float(seconds)}
        paused = self.paused_ms + (now - self.paused_at_ms if self.paused_at_ms is not None else 0.0)
        paused_s = min(seconds, math.floor(paused / 1000))
        return {"seconds": float(seconds), "active_seconds": seconds - paused_s, "paused_seconds": paused_s}

    # --- idle pause and wake (a WebRTC session's wake policy) ------------------------------

    @property
    def paused(self) -> bool:
        return self.paused_at_ms is not None

    def _pause(self, *, announce: bool = True) -> None:
        """Inference pauses: speech at the wake policy's threshold wakes it."""
        policy = self.live.wake_policy or {}
        self.paused_at_ms = float(self.spelling.timeline_ms())
        self._input.set_wake_threshold(float(policy.get("vad_threshold", lc.WAKE_VAD_THRESHOLD)))
        if announce:
            self._emit("session.paused")

    def _wake_up(self) -> None:
        """Speech wakes inference: the speech is the model's next turn."""
        if self.paused_at_ms is None:
            return
        now = float(self.spelling.timeline_ms())
        self.paused_ms += max(0.0, now - self.paused_at_ms)
        self.paused_at_ms = None
        self._active_ms = now
        self._input.set_wake_threshold(None)
        self._emit("session.resumed")

    def _quiet(self) -> None:
        self._active_ms = float(self.spelling.timeline_ms())

    def _check_idle(self) -> None:
        """``idle_timeout_s`` of the timeline with no speech, no answer and no output: pause."""
        timeout = self.live.idle_timeout_s
        if timeout is None or self.paused or self.closed:
            return
        if self._responses.answering() or self._input.is_open or self.fixture is not None or self.spelling.queued:
            return
        since = max(self._active_ms, self.spelling.output_end_ms)
        if self._input.audio_ms - since >= timeout * 1000:
            self._pause()

    def wake(self, key: str) -> None:
        if key == WAKE_PACE:
            self.spelling.woken()
            return
        if self.closed or self._delegations.wake(key):
            return
        if key == _WAKE_USAGE:
            self._emit("session.usage.updated", usage=self.usage())
            self.effects.append(Wake(USAGE_EVERY_S, _WAKE_USAGE))
        elif key == _WAKE_FIXTURE and self.fixture is not None:
            if self.spelling.queued:  # its audio has not all gone out yet (paced, behind its clock)
                self.effects.append(Wake(FIXTURE_CHUNK_MS / 1000, _WAKE_FIXTURE))
                return
            played, self.fixture = self.fixture, None
            self._emit("session.output_audio.fixture.played", **_echo(played or None))
            self._say_pending()

    def expire(self) -> None:
        self._close("expired", None)
        self.effects.append(CloseSocket(CloseCode.SESSION_EXPIRED, "session expired"))

    def shutdown(self) -> None:
        super().shutdown()
        self._delegations.shutdown()

    def _close(self, reason: str, event_id: str | None) -> None:
        """``session.closed``: the session's last event (everything stops first)."""
        if self.closed:
            return
        self.closed = True
        self.shutdown()
        self.spelling.drop()  # (what was not sent of an answer is not)
        self._emit("session.closed", reason=reason, session=self.render_config(), usage=self.usage(),
                   **_echo(event_id))  # fmt: skip

    # --- client events ---------------------------------------------------------------

    def handle(self, event: Any) -> None:
        try:
            self._handle(event)
        except ProtocolError as err:
            if err.event_id is None:
                err.event_id = getattr(event, "event_id", None)
            self.error(err)

    def _handle(self, event: Any) -> None:
        if self.closed:
            raise ProtocolError(Code.UNSUPPORTED, "The session is closed.")
        match event:
            case ce.AudioAppend():
                self.append_heard(event.audio, event.event_id)
            case le.InputMute():
                self.muted = event.muted
                kind = "muted" if event.muted else "unmuted"
                self._emit(f"session.input_audio.{kind}", **_echo(event.event_id))
            case le.ContextAppend():
                self._append(event)
            case le.FixturePlay():
                self._play(event)
            case le.SessionUpdate():
                self._apply_live(lc.parse_update(self.live, event.session))
                self._emit("session.updated", session=self.render_config(), **_echo(event.event_id))
            case le.SessionStart():
                raise ProtocolError(Code.ALREADY_STARTED, "The session has started already: send session.start "
                                    "once, first, on a primary WebSocket.", param="type")  # fmt: skip
            case le.ResponseItemCreate():
                self._delegations.item_create(event)
            case le.ResponseCreate():
                self._delegations.response_create(event)
            case le.Close():
                self._close("close_requested", event.event_id)
            case le.DtmfSend():
                self.effects.append(SendDtmf(event.digit, event.event_id))  # (the call's RTP: the host's)
            case _:
                raise ProtocolError(Code.UNKNOWN_EVENT, "This event is not a Live client event.", param="type")

    def dtmf(self, digit: str, received_at: int) -> None:
        """A key the caller pressed on a SIP call: ``transport.dtmf.received`` (its sidebands see it)."""
        self._emit("transport.dtmf.received", event=digit)

    def dtmf_sent(self, digit: str, event_id: str | None, refused: str | None) -> None:
        """``transport.dtmf.send`` done: ``transport.dtmf.sent``, or the error that says why not."""
        if refused is not None:
            self.error(ProtocolError(Code.UNSUPPORTED, refused, param="type", event_id=event_id))
            return
        self._emit("transport.dtmf.sent", event=digit, **_echo(event_id))

    def transport_progress(self, kind: str, fields: dict[str, Any]) -> None:
        """An outbound SIP call's ``transport.ringing``/``answered``/``failed`` (with the session's id)."""
        self._emit(f"transport.{kind}", session_id=self.id, **fields)

    def append_heard(self, audio: bytes, event_id: str | None, fmt: AudioFormat | None = None) -> None:
        """Input audio from the client (in ``fmt``, a media transport's own; None: the session's
        input format): the model hears it, or silence as long while input is muted or an audio
        fixture plays (its timeline goes on either way). With no speech detector here the
        model takes no turn of its own: the audio moves the timeline only."""
        fmt = fmt or self.config.input_format
        if self._engine_turns is not None:  # the engine hears it all, and takes its turns itself
            if self.muted or self.fixture is not None:
                audio = self._silent(len(audio), fmt)
            self.append_audio(audio, event_id, fmt)
            return
        if self._vad_factory is None:
            if len(audio) % fmt.bytes_per_sample:
                raise ProtocolError(Code.INVALID_AUDIO, f"Audio length {len(audio)} is not a whole number of "
                                    f"{fmt.codec} samples.", param="audio")  # fmt: skip
            self.audio_ms += fmt.duration_ms(len(audio))
            return
        if self.muted or self.fixture is not None:
            audio = self._silent(len(audio), fmt)
        self.append_audio(audio, event_id, fmt)
        self._check_idle()

    def _engine_hears(self) -> bool:
        """The Live model runs its turns: an engine that takes its own hears everything."""
        return self._engine_turns is not None

    def on_turn(self, request_id: str, output: TurnOutput) -> None:
        if not self.closed:
            super().on_turn(request_id, output)

    def on_turns_failed(self, request_id: str, code: str, message: str) -> None:
        if not self.closed:
            super().on_turns_failed(request_id, code, message)

    def _engine_speaking(self) -> bool:
        """The engine that takes its own turns hears the caller speak."""
        return self._engine_turns is not None and self._engine_turns.speaking

    def _silent(self, nbytes: int, fmt: AudioFormat) -> bytes:
        if self._silence[0] != (nbytes, fmt):
            self._silence = ((nbytes, fmt), encode_from_pcm16(fmt, bytes(nbytes // fmt.bytes_per_sample * 2)))
        return self._silence[1]

    def _speech_started(self) -> None:
        """The caller began to speak: the Live model gives way (barge-in). An answer under way
        is cancelled by its turn-taking; what was not sent of one already written is dropped
        (paced output), or, on a WebRTC call, cut from the track that plays it."""
        self.spelling.drop()
        self.effects.append(CutAudio())
        self._active_ms = float(self.spelling.timeline_ms())
        self._wake_up()

    # --- appended context ----------------------------------------------------------------

    def _append(self, event: le.ContextAppend) -> None:
        if len(event.content) > lc.MAX_APPEND_CHARS:
            raise ProtocolError(Code.STRING_TOO_LONG, f"'content' may hold at most {lc.MAX_APPEND_CHARS} "
                                "characters.", param="content")  # fmt: skip
        if event.kind != "thinking" and self.fixture is not None:
            raise ProtocolError(FIXTURE_ACTIVE, f"session.{event.kind}.append is refused while an audio fixture "
                                "plays; wait for session.output_audio.fixture.played.", param="type")  # fmt: skip
        if event.delegation_id is not None:
            if self.live.delegation_type == "responses":
                raise ProtocolError(Code.INVALID_VALUE, "A non-null delegation_id is not accepted with Responses "
                                    "delegation.", param="delegation_id")  # fmt: skip
            if event.delegation_id not in self.delegations:
                raise ProtocolError(DELEGATION_NOT_FOUND, f"No delegation {event.delegation_id!r} was handed to "
                                    "this session's application.", param="delegation_id")  # fmt: skip
        start = self.spelling.timeline_ms()
        if event.kind == "instructions":
            self._add_context("system", event.content)
            self._tell_engine(event.content)
        else:
            self._delegations.appended()  # (the acknowledgements still due are dropped)
            self._add_context("system", (_THINK if event.kind == "thinking" else _SAY) + event.content)
            if event.kind == "thinking":
                self._tell_engine(_THINK + event.content)
        self._emit(f"session.{event.kind}.appended", start_ms=start, end_ms=self.spelling.timeline_ms(),
                   **_echo(event.event_id))  # fmt: skip
        if event.kind == "commentary":
            self._pending_say.append((event.content, event.event_id))
            self._say_pending()

    def _add_context(self, role: str, text: str) -> None:
        """A text message appended to the conversation (what the model is given from now on)."""
        part_type: PartType = "output_text" if role == "assistant" else "input_text"
        item = Item(id=self._log.new_id("item"), type="message", role=role,  # type: ignore[arg-type]
                    content=[Part(type=part_type, text=text)])  # fmt: skip
        prev = self._history.insert(item, None)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(False))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(False))

    def _say_pending(self) -> None:
        """Speak the commentary waiting, unless an answer or a fixture is under way (it is said
        when that ends: ``LiveTurns.answer_ended`` calls back here)."""
        if (not self._pending_say or self.fixture is not None or self._responses.answering() or self._input.is_open
                or self.paused or self._engine_speaking()):  # fmt: skip
            return  # said once the answer, the fixture or the user's speech under way is over (or at the wake)
        texts = [text for text, _ in self._pending_say]
        event_id = self._pending_say[-1][1]
        self._pending_say.clear()
        text = " ".join(texts)
        # (Saying a result delegates nothing: no tools.)
        params = ce.ResponseParams(instructions=(self.config.instructions + "\n\n" + _SAY + text).strip(), say=text,
                                   tools=())  # fmt: skip
        self._turns.answer(params, event_id)

    # --- delegation (live_delegation.py decides; these are what it asks of the voice) ------------

    def _delegated(self, resp: Response) -> None:
        """An answer ended: its ``delegate`` calls hand their tasks off."""
        calls = [it for it in resp.outputs if it.type == "function_call" and it.name == DELEGATE]
        if not calls:
            return
        spoke = any(it.type == "message" and it.as_message().text.strip() for it in resp.outputs)
        for call in calls:
            self._delegations.delegate(call.call_id or call.id, call.arguments, spoke=spoke)

    def backend_event(self, request_id: str, event: dict[str, Any]) -> None:
        self._delegations.backend_event(request_id, event)

    def backend_ended(self, request_id: str, failure: tuple[str, str] | None) -> None:
        self._delegations.backend_ended(request_id, failure)

    def timeline_ms(self) -> int:
        return self.spelling.timeline_ms()

    def dialogue(self) -> Iterable[Item]:
        return self.conversation

    def call_output(self, call_id: str, text: str) -> None:
        item = Item(id=self._log.new_id("item"), type="function_call_output", role="user", content=[],
                    call_id=call_id, output=text)  # fmt: skip
        prev = self._history.insert(item, None)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(False))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(False))

    def speak(self, text: str) -> None:
        self._add_context("system", _SAY + text)
        self._pending_say.append((text, None))
        self._say_pending()

    def tell(self, text: str) -> None:
        self._add_context("system", _THINK + text)
        self._tell_engine(_THINK + text)

    def _tell_engine(self, text: str) -> None:
        """Silent context, to an engine that takes its own turns: its own answers follow it too.
        (Commentary is not: the gateway's answer says it, and the engine would say it again.)"""
        if self._engine_turns is not None:
            self._engine_turns.context(text)

    def acknowledge(self) -> None:
        """A short acknowledgement of a delegation, unless the model, the user or a fixture is
        heard, or a result waits to be said (it would only interrupt, or come late)."""
        if (self.fixture is not None or self._responses.answering() or self._input.is_open or self._pending_say
                or self.paused or self._engine_speaking()):  # fmt: skip
            return
        params = ce.ResponseParams(instructions=(self.config.instructions + "\n\n" + ACK_INSTRUCTIONS).strip(),
                                   say=ACK_SAY, tools=())  # fmt: skip
        self._turns.answer(params, None)

    # --- audio fixtures --------------------------------------------------------------------

    def _play(self, event: le.FixturePlay) -> None:
        if self.fixture is not None:
            raise ProtocolError(FIXTURE_ACTIVE, "An audio fixture is playing already; only one plays at a time.",
                                param="type")  # fmt: skip
        if self._responses.current is not None:
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        self.spelling.drop()  # (what was not sent of the answer stops too)
        self.fixture = event.event_id or ""
        self._fixtures += 1
        rid = f"fixture_{self._fixtures}"
        self._emit("session.output_audio.fixture.playing", **_echo(event.event_id))
        out = self.config.output_format
        converter = Converter(engine_format(le.FIXTURE_RATE), out)
        step = le.FIXTURE_RATE * FIXTURE_CHUNK_MS // 1000 * 2
        audio = event.audio
        for at in range(0, len(audio), step):
            pcm = audio[at : at + step]
            self._fixture_delta(rid, converter.process(pcm))
        self._fixture_delta(rid, converter.flush())
        self.spelling.audio_ended(rid)
        seconds = len(audio) / 2 / le.FIXTURE_RATE
        self.effects.append(Wake(seconds, _WAKE_FIXTURE))

    def _fixture_delta(self, rid: str, data: bytes) -> None:
        if data:
            self.spelling.audio_out(rid, data)

    # --- snapshots -------------------------------------------------------------------------

    def snapshot_state(self, *, with_items: bool = True) -> dict[str, Any]:
        state = super().snapshot_state(with_items=with_items)
        state["live"] = {
            "settings": lc.to_dict(self.live),
            "muted": self.muted,
            "fixture": self.fixture,
            "delegation": self._delegations.to_dict(),
            "closed": self.closed,
            "pending_say": self._pending_say,
            "spelling": self.spelling.to_dict(),
            "output_lead_ms": self.output_lead_ms,
            "paused_at_ms": self.paused_at_ms,
            "paused_ms": self.paused_ms,
            "active_ms": self._active_ms,
        }
        return state

    @classmethod
    def restore(cls, state: dict[str, Any], **kwargs: Any) -> LiveSession:
        session = super().restore(state, **kwargs)
        assert isinstance(session, LiveSession)
        live = state["live"]
        session.live = lc.from_dict(live["settings"])
        session._policy = ChannelPolicy.of(session.live.data_channel)
        session.muted = live["muted"]
        session._delegations.settings = session.live.delegation or lc.Delegation()
        session._delegations.restore(live.get("delegation") or {"handed": live.get("delegations", {})})
        session.closed = live["closed"]
        session._pending_say = [(text, event_id) for text, event_id in live["pending_say"]]
        session.spelling.restore(live["spelling"])
        session.output_lead_ms = int(live.get("output_lead_ms", OUTPUT_LEAD_MS))
        session._pace()  # (what was queued on the replica lost is not: see docs/live.md, *Paced output*)
        session.paused_ms = float(live.get("paused_ms", 0.0))
        session._active_ms = float(live.get("active_ms", 0.0))
        session.paused_at_ms = live.get("paused_at_ms")
        if session.paused_at_ms is not None:
            policy = session.live.wake_policy or {}
            session._input.set_wake_threshold(float(policy.get("vad_threshold", lc.WAKE_VAD_THRESHOLD)))
        if live["fixture"] is not None:
            # Its audio went out on the replica that was lost; what it still had to play is not
            # replayed (the fixture's own rule for interrupted playback): it ends here, unsaid.
            session.fixture = None
        session.effects.append(Wake(USAGE_EVERY_S, _WAKE_USAGE))
        session.dirty = False
        return session


def _echo(event_id: str | None) -> dict[str, Any]:
    """The client command an event answers (``client_event_id``), when it named itself."""
    return {} if event_id is None else {"client_event_id": event_id}
