"""The realtime session (Sans-I/O): the facade the host and the transport drive.

Inputs: decoded client events, input audio, and engine outputs delivered by
the shell. Outputs: server events in ``events`` (GA-shaped dicts, each with
``event_id`` and a monotonic ``server_event_seq``) and effects in ``effects``
for the shell to carry out; ``take()`` hands both over. Nothing here awaits,
sleeps or touches a socket, so every rule is unit-testable.

``RealtimeSession`` is composed of parts, each owning one topic and each
testable alone (tests/unit/test_session_parts.py):

- ``EventLog`` (events.py): seq, epoch, ids, pending events and effects, what
  the next snapshot writes;
- ``History`` (history.py): the conversation within its item and byte limits;
- ``InputAudio`` (input.py): the input buffer, server VAD, transcriptions;
- ``Responses`` (responses.py): the running responses and their outputs;
- a ``TurnTaking`` (turn_taking.py): what the dialect decides about turns
  (``RealtimeTurns`` here; the duplex dialect's in duplex_turns.py);
- on an engine that takes its own turns (``info.takes_turns``), ``EngineTurns``
  (engine_turns.py): while the session's turns are detected by the server
  (``turn_detection`` set; a dialect may say otherwise: ``_engine_hears``), its
  input audio goes to the engine's conversation instead of the speech detector,
  and the engine's turns, answers and transcripts become the session's events.

The facade owns the configuration, the lifecycle, the dispatch of client
events, the conversation item events and snapshots, and wires the parts to
one another (each gets what it needs, explicitly, when built). The hot paths
(``append_audio``, ``on_response``) are the parts' own methods, bound here
once, with no layer between the host and the part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.audio.codecs import AudioFormat
from gateway.protocol import client_events as ce
from gateway.protocol.dialects import BETA, GA, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import (
    ConfigLimits,
    SessionConfig,
    apply_transcription_update,
    apply_update,
    render,
    render_beta_transcription,
)
from gateway.session import snapshot
from gateway.session.conversation import Conversation, Item, item_from_spec
from gateway.session.effects import CloseSocket, Effect
from gateway.session.engine_turns import EngineTurns
from gateway.session.events import STATE_EVENTS, EventLog
from gateway.session.history import History
from gateway.session.input import VAD_RATE, InputAudio, VadStream
from gateway.session.limits import SessionLimits, check_images
from gateway.session.mcp import McpServers
from gateway.session.responses import Responses
from gateway.session.turn_taking import Parts, RealtimeTurns, TurnTaking
from orchestrator.engine import EngineInfo, EngineOutput, TurnOutput

__all__ = ["STATE_EVENTS", "VAD_RATE", "RealtimeSession", "SessionLimits", "VadStream"]


class RealtimeSession:
    """See the module docstring."""

    # The hot paths and the engine's callbacks: the parts' methods, bound in __init__.
    # input_audio_buffer.append (raises ProtocolError); the audio's format when not the session's
    append_audio: Callable[[bytes, str | None, AudioFormat | None], None]
    on_response: Callable[[str, EngineOutput], None]  # (request id, output) of a response
    on_response_failed: Callable[[str, str, str], None]  # (request id, code, message)
    on_transcription: Callable[[str, EngineOutput], None]
    on_transcription_failed: Callable[[str, str, str], None]

    def __init__(
        self,
        *,
        session_id: str,
        config: SessionConfig,
        engine: EngineInfo,
        beta: bool = False,
        limits: SessionLimits | None = None,
        vad_factory: Callable[[], VadStream] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate_limits: Callable[[], dict[str, Any]] | None = None,  # the fields of rate_limits.updated
        created_at: float | None = None,
        turn_taking: TurnTaking | None = None,  # the dialect's; None: the Realtime API's
    ) -> None:
        self.id = session_id
        self.engine = engine
        self.beta = beta
        self.limits = limits = limits or SessionLimits()
        self.created_at = created_at if created_at is not None else time.time()
        self.expires_at = int(self.created_at + limits.lifetime_s)
        self._config = config
        self._config_limits = ConfigLimits(voices=engine.voices, ignored_fields=engine.ignored_fields)
        self._warned: set[str] = set()  # ignored fields already reported (session.warning)
        self._vad_factory = vad_factory
        self.conversation = Conversation()
        self.attachment_generation = 1  # the connections the session has had (a resume adds one)
        self.dirty = True  # state changed since the last snapshot (the host clears it once it wrote one)
        log = self._log = EventLog(lambda item_id: history.changed(item_id), self._state_changed)
        self._emit = log.emit
        # What take() hands over: the log's two lists, held here (read by the host on every flush).
        self.events: list[dict[str, Any]] = log.events
        self.effects: list[Effect] = log.effects
        turns = self._turns = turn_taking or RealtimeTurns()
        # History and responses, input and responses, know each other only through the
        # callbacks given here (those that name a part built later look it up when called).
        history = self._history = History(self.conversation, limits, log.emit, keep=lambda it: responses.writes(it))
        mcp = self._mcp = McpServers(log, history)
        responses = self._responses = Responses(
            log,
            history,
            turns,
            engine=engine,
            limits=limits,
            beta=beta,
            config=config,
            lazy_message=turns.lazy_message,
            make_item=self._item_from_spec,
            answered=lambda played_ms: self._input.arm_idle(played_ms),
            rate_limits=rate_limits,
            mcp=mcp,
        )
        self._input = InputAudio(
            log,
            history,
            turns,
            engine=engine,
            limits=limits,
            beta=beta,
            config=config,
            responding=responses.answering,
            transcribed=responses.transcribed,
            vad_factory=vad_factory,
            clock=clock,
        )
        turns.bind(Parts(log, history, self._input, responses), config)
        log.spell = turns.spelling
        self.append_audio = self._input.append
        self.on_transcription = self._input.on_transcription
        self.on_transcription_failed = self._input.on_transcription_failed
        self.on_response = responses.on_output
        self.on_response_failed = responses.on_failed
        self._engine_turns: EngineTurns | None = None
        if engine.takes_turns and self.passes_engine_turns:
            self._engine_turns = EngineTurns(log, history, self._input, responses, engine=engine,
                                             session_id=session_id, answer=self._answer_led,
                                             barge_in=turns.speech_during_response)  # fmt: skip
        self._route_audio()

    # Whether the dialect passes an engine's own turns through (``EngineTurns``); the duplex
    # dialect's turns are its own protocol's (units, overlap policy), and keep the gateway's.
    passes_engine_turns = True

    def _engine_hears(self) -> bool:
        """Whether the engine's own turns run now: the server detects the turns."""
        cfg = self._config
        return self._engine_turns is not None and cfg.type == "realtime" and cfg.turn_detection is not None

    def _route_audio(self) -> None:
        """Input audio to the engine's conversation, or to the input buffer and speech detector."""
        if self._engine_hears():
            self.append_audio = self._append_heard
            return
        self.append_audio = self._input.append
        if self._engine_turns is not None:
            self._engine_turns.shutdown()  # (turns the client commits: each answer a request of its own)

    def _append_heard(self, audio: bytes, event_id: str | None, fmt: AudioFormat | None = None) -> None:
        """Input audio for an engine that takes its own turns: checked as an append is, then heard."""
        fmt = fmt or self.config.input_format
        if len(audio) % fmt.bytes_per_sample:
            raise ProtocolError(Code.INVALID_AUDIO, f"Audio length {len(audio)} is not a whole number of "
                                f"{fmt.codec} samples.", param="audio")  # fmt: skip
        duration = fmt.duration_ms(len(audio))
        if duration > self.limits.max_append_ms:
            raise ProtocolError(Code.APPEND_TOO_LARGE, f"One append may carry at most {self.limits.max_append_ms} "
                                f"ms of audio; this one has {duration:.0f} ms. Send smaller chunks.",
                                param="audio")  # fmt: skip
        if audio and self._engine_turns is not None:
            self._engine_turns.append(audio, fmt)

    def _answer_led(self) -> str | None:
        """An answer the engine began by itself: one under way gives way to it."""
        if self._responses.current is not None:
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)
        return self._responses.create(ce.ResponseParams(tools=()), None, led=True)

    # --- state the shell reads ------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        return self._config

    @config.setter
    def config(self, new: SessionConfig) -> None:
        self._config = new
        self._input.configure(new)
        self._responses.config = new
        self._turns.config = new
        self._route_audio()

    @property
    def seq(self) -> int:
        """The ``server_event_seq`` of the last event."""
        return self._log.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self._log.seq = value

    @property
    def epoch(self) -> int:
        """Bumped on barge-in and on takeover by another replica."""
        return self._log.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._log.epoch = value

    @property
    def audio_ms(self) -> float:
        """All input audio ever appended: the clock of audio_start/end_ms."""
        return self._input.audio_ms

    @audio_ms.setter
    def audio_ms(self, value: float) -> None:
        self._input.audio_ms = value

    @property
    def audio_out_ms(self) -> float:
        """Output audio made on this replica (the host meters it per tenant)."""
        return self._responses.audio_out_ms

    @property
    def conversation_id(self) -> str:
        return self._history.id

    @property
    def active_response_id(self) -> str | None:
        resp = self._responses.current
        return resp.id if resp else None

    @property
    def responses(self) -> Responses:
        """The responses part (tests and introspection; the shell uses the methods here)."""
        return self._responses

    @property
    def input_audio(self) -> InputAudio:
        """The input audio part (tests and introspection)."""
        return self._input

    @property
    def dialect(self) -> Dialect:
        """The dialect the session speaks: how its events are spelled on the wire and in
        its journal (``Dialect.encode``), and how its sessions are rebuilt (``session/kinds.py``)."""
        return BETA if self.beta else GA

    @property
    def retained(self) -> bool:
        """Whether the session's state outlives its close (``stored``): kept in the store for
        its client to fork it or download its recording, until the store's idle TTL."""
        return False

    @classmethod
    def stored(cls, state: dict[str, Any]) -> bool:
        """Whether the snapshot ``state`` is of a session kept for its client (``retained``)."""
        return False

    @classmethod
    def recording(cls, state: dict[str, Any], journal: list[bytes]) -> tuple[bytes, str]:
        """The recording of a stored session, from its snapshot and journal (the events as
        sent): (content, media type). The Realtime API keeps none."""
        raise ProtocolError(Code.UNSUPPORTED, "This session keeps no recording.")

    @classmethod
    def fork(cls, state: dict[str, Any], *, session_id: str, engine: EngineInfo, **kwargs: Any) -> RealtimeSession:
        """A new session ``session_id`` that carries on the stored session ``state``'s
        conversation and settings. The Realtime API has no forks."""
        raise ProtocolError(Code.UNSUPPORTED, "Sessions of this dialect cannot be forked.")

    @property
    def output_pending(self) -> bool:
        """Output waits to go out after its answer ended (a dialect that paces it: GPT-Live's)."""
        return False

    @property
    def idle_timeout_s(self) -> float | None:
        """How long the session may go without a client event before it expires (the door
        keeps the clock and calls ``expire_idle``); None: no idle timeout."""
        return None

    @property
    def sends_gateway_events(self) -> bool:
        """Whether the gateway's own events (``session.warning``, ``session.replaced``) go
        to this client: the OpenAI SDKs cannot parse them, so only once it opted in
        (``gateway_events``)."""
        return self.config.gateway_events

    def take(self) -> tuple[list[dict[str, Any]], list[Effect]]:
        """Hand the pending events and effects to the shell."""
        # EventLog.take(), inlined: the host takes on every flush (every delta).
        events, effects = self.events, self.effects
        out, eff = events.copy(), effects.copy()
        events.clear()
        effects.clear()
        return out, eff

    def take_item_changes(self) -> tuple[set[str], set[str]]:
        """(changed, dropped) item ids since the last call: the next snapshot's item records."""
        return self._log.take_item_changes()

    def error(self, err: ProtocolError) -> None:
        self._log.error(err)

    def _state_changed(self) -> None:
        self.dirty = True

    # --- lifecycle ----------------------------------------------------------

    def start(
        self,
        resume_token: str | None = None,
        *,
        configured: bool = False,
        warnings: Sequence[tuple[str, str]] = (),
        event_id: str | None = None,
    ) -> None:
        """``resume_token`` (gateway extension) lets the client resume the session later.
        ``configured``/``warnings``/``event_id``: a dialect whose first event opened the session
        with its settings (``configure``), and that event's id; the Realtime API opens none that way."""
        if resume_token is None:
            self._emit("session.created", session=self.render_config())
        else:
            self._emit("session.created", session=self.render_config(), resume_token=resume_token)
        # As the API does (and the SDK documents): the conversation right after the session.
        self._emit("conversation.created", conversation={"id": self._history.id, "object": "realtime.conversation"})
        self._mcp.configure(self.config.tools, "session.tools")  # (a secret minted with MCP servers)

    def render_config(self) -> dict[str, Any]:
        return render(self.config, session_id=self.id, expires_at=self.expires_at, beta=self.beta)

    def configure(self, update: dict[str, Any], *, media: bool = False) -> list[tuple[str, str]]:
        """The settings of a dialect whose first event opens the session with them
        (``Opening.with_config``), applied before the session starts: the warnings to
        report (``media``: as a media transport's request carries them, GPT-Live's ``POST
        /v1/live/sessions``). The Realtime API has no such event."""
        raise ProtocolError(Code.UNSUPPORTED, "This dialect opens no session with its own settings.", param="type")

    @property
    def channel_policy(self) -> Any:
        """The allow-lists of an untrusted frontend's data channel (GPT-Live's
        ``client.data_channel``: ``protocol/live_channel.ChannelPolicy``); None: the dialect
        has none, everything passes."""
        return None

    def append_input(self, audio: bytes, fmt: AudioFormat | None = None) -> None:
        """Input audio a binary frame carried (in the session's input format) or a media
        transport handed in (a call's track, in ``fmt``: the transport's own format, converted
        once to the engine's)."""
        self.append_audio(audio, None, fmt)

    def wake(self, key: str) -> None:
        """A ``Wake`` effect this session asked for is due (the Realtime API asks for none)."""

    def on_turn(self, request_id: str, output: TurnOutput) -> None:
        """An output of the ``StartConversation`` request ``request_id``: what an engine that
        takes its own turns decided (``EngineTurns``)."""
        if self._engine_turns is not None:
            self._engine_turns.on_output(request_id, output)

    def on_turns_failed(self, request_id: str, code: str, message: str) -> None:
        """The ``StartConversation`` request ``request_id`` failed with the engine's ``code``."""
        if self._engine_turns is not None:
            self._engine_turns.on_failed(request_id, code, message)

    def backend_event(self, request_id: str, event: dict[str, Any]) -> None:
        """An event of the ``RunResponses`` request ``request_id`` (the Realtime API runs none)."""

    def backend_ended(self, request_id: str, failure: tuple[str, str] | None) -> None:
        """The ``RunResponses`` request ``request_id`` is over: ``failure`` is (code, message), or None."""

    def expire_idle(self) -> None:
        """No client event for ``idle_timeout_s``: the dialect's way to end the session."""
        self.expire()

    def expire(self) -> None:
        self._log.fail(
            Code.SESSION_EXPIRED,
            f"The session reached its maximum lifetime of {self.limits.lifetime_s:.0f} s; open a new session.",
            None,
        )
        self.shutdown()
        self.effects.append(CloseSocket(CloseCode.SESSION_EXPIRED, "session expired"))

    def shutdown(self) -> None:
        """Cancel every running request (client gone or session over)."""
        self._responses.shutdown()
        self._input.shutdown()
        if self._engine_turns is not None:
            self._engine_turns.shutdown()

    # --- client events ------------------------------------------------------

    def handle(self, event: ce.ClientEvent) -> None:
        try:
            match event:
                case ce.AudioAppend():
                    self.append_audio(event.audio, event.event_id, None)
                case ce.SessionUpdate():
                    self._session_update(event)
                case ce.TranscriptionSessionUpdate():
                    self._transcription_session_update(event)
                case ce.AudioCommit():
                    self._input.commit(event.event_id, manual=True)
                case ce.AudioClear():
                    self._input.clear()
                case ce.ItemCreate():
                    self._item_create(event)
                case ce.ItemRetrieve():
                    self._emit("conversation.item.retrieved", item=self._item(event).render(self.beta))
                case ce.ItemTruncate():
                    self._truncate(event)
                case ce.ItemDelete():
                    self._delete(event)
                case ce.ResponseCreate():
                    self._turns.answer(event.response, event.event_id)
                case ce.ResponseCancel():
                    self._responses.cancel(event.response_id)
                case ce.OutputAudioClear():
                    raise ProtocolError(
                        Code.UNSUPPORTED,
                        "output_audio_buffer.clear is for WebRTC and SIP: over a WebSocket the client holds "
                        "the output audio; stop playing it and send conversation.item.truncate.",
                        param="type",
                    )
        except ProtocolError as err:
            if err.event_id is None:
                err.event_id = event.event_id
            self.error(err)

    def _session_update(self, event: ce.SessionUpdate) -> None:
        new, warnings = apply_update(self.config, event.session, beta=self.beta, limits=self._config_limits)
        if new.voice != self.config.voice and self._holds_assistant_audio():
            # As the API answers: the voice is fixed once the model has spoken.
            raise ProtocolError(
                Code.CANNOT_UPDATE_VOICE,
                "Cannot update a conversation's voice if assistant audio is present.",
                param="session.voice" if self.beta else "session.audio.output.voice",
            )
        self._apply_config(new, warnings)

    def _transcription_session_update(self, event: ce.TranscriptionSessionUpdate) -> None:
        if not self.beta:
            raise ProtocolError(
                Code.UNKNOWN_EVENT,
                "transcription_session.update is the beta protocol's; over the GA protocol send "
                'session.update with session.type "transcription".',
                param="type",
            )
        new, warnings = apply_transcription_update(self.config, event.session, limits=self._config_limits)
        self._apply_config(new, warnings, announce="transcription_session.updated")

    def _holds_assistant_audio(self) -> bool:
        return any(
            item.role == "assistant" and any(p.type == "output_audio" and p.audio_ms > 0 for p in item.content)
            for item in self.conversation
        )

    def _apply_config(
        self, new: SessionConfig, warnings: list[tuple[str, str]], *, announce: str = "session.updated"
    ) -> None:
        """Check what needs the engine, then apply ``new`` and announce it (``announce``:
        session.updated, or the beta's transcription_session.updated)."""
        self._check_config(new)
        self.config = new
        if announce == "transcription_session.updated":
            self._emit("transcription_session.updated", session=render_beta_transcription(new))
        else:
            self._emit("session.updated", session=self.render_config())
            self._mcp.configure(new.tools, "session.tools")  # new MCP servers: their tools are listed
        if not self.sends_gateway_events:
            return  # the SDKs have no type for session.warning: only for clients that opted in
        for param, message in warnings:
            if param in self._warned:
                continue  # each ignored field is reported once per session
            self._warned.add(param)
            # Not an error: the update applied; the client learns what has no effect here.
            self._emit("session.warning", code="unsupported_field", message=message, param=param)

    def _check_config(self, new: SessionConfig) -> None:
        """What a configuration needs of the engine and of the session (a speech detector, or
        an engine that takes its own turns; no running response to become a transcription session)."""
        old_td = self.config.turn_detection
        detects = self._vad_factory is not None or self._engine_turns is not None
        if new.turn_detection is not None and new.turn_detection != old_td and not detects:
            raise ProtocolError(
                Code.INVALID_VALUE,
                "Server VAD is not available on this gateway (no speech detector); "
                "set turn_detection to null and commit turns yourself.",
                param="session.audio.input.turn_detection",
            )
        if new.type == "transcription" and self._responses.current is not None:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                "A session becomes a transcription session only with no response running; "
                "cancel it or wait for response.done.",
                param="session.type",
            )

    # --- conversation items -------------------------------------------------

    def _item(self, event: ce.ItemRetrieve | ce.ItemTruncate | ce.ItemDelete) -> Item:
        item = self.conversation.get(event.item_id)
        if item is None:
            raise ProtocolError(Code.ITEM_NOT_FOUND, f"Item with item_id {event.item_id!r} not found.", param="item_id")
        return item

    def _item_create(self, event: ce.ItemCreate) -> None:
        spec = event.item
        if spec.id is not None and self.conversation.get(spec.id) is not None:
            raise ProtocolError(Code.ITEM_EXISTS, f"An item with id {spec.id!r} already exists.", param="item.id")
        prev_id = event.previous_item_id
        if prev_id is not None and prev_id != "root" and self.conversation.get(prev_id) is None:
            raise ProtocolError(
                Code.ITEM_NOT_FOUND, f"previous_item_id {prev_id!r} not found.", param="previous_item_id"
            )
        if spec.type == "mcp_approval_response":
            self._check_approval(spec)
        item = self._item_from_spec(spec, "item")
        prev = self._history.insert(item, prev_id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self.beta))
        if item.type == "mcp_approval_response":
            self._responses.approval(item)

    def _check_approval(self, spec: ce.ItemSpec) -> None:
        asked = self.conversation.get(spec.approval_request_id or "")
        if asked is None or asked.type != "mcp_approval_request":
            raise ProtocolError(
                Code.ITEM_NOT_FOUND,
                f"approval_request_id {spec.approval_request_id!r} names no mcp_approval_request in the conversation.",
                param="item.approval_request_id",
            )
        if any(it.type == "mcp_approval_response" and it.approval_request_id == asked.id for it in self.conversation):
            raise ProtocolError(
                Code.INVALID_VALUE,
                f"The approval request {asked.id!r} was answered already.",
                param="item.approval_request_id",
            )

    # --- MCP servers (the host lists and calls them: gateway/hosting/mcp.py) ---------------

    def mcp_listed(self, item_id: str, tools: list[dict[str, Any]] | None, failure: str | None) -> None:
        """The tools of the server whose listing is ``item_id`` (None: ``failure`` says why)."""
        if self._mcp.listed(item_id, tools, failure):
            self._responses.listings_done()

    def mcp_called(self, item_id: str, output: str | None, error: dict[str, Any] | None) -> None:
        """The answer to the call ``item_id``: its output, or the SDK's error object."""
        self._responses.called(item_id, output, error)

    def _item_from_spec(self, spec: ce.ItemSpec, param: str) -> Item:
        """Build an item; validates every part before asking for any work (its audio's transcription)."""
        for i, part in enumerate(spec.content):
            if part.type == "input_image" and (self.beta or not self.engine.accepts_images):
                raise ProtocolError(
                    Code.UNSUPPORTED,
                    "The beta protocol has no input_image parts; use the GA protocol."
                    if self.beta
                    else f"Model {self.config.model!r} (engine {self.engine.name}) takes no images: describe the "
                    "image in text, or use a model that takes images (their /v1/models entry says accepts_images).",
                    param=f"{param}.content[{i}]",
                )
        item, audio = item_from_spec(spec, param, self._log.new_id, self.config.input_format)
        check_images(item.images(), self.limits, f"{param}.content")
        if audio is not None:
            self._input.transcribe_item(item, audio)
        return item

    def _truncate(self, event: ce.ItemTruncate) -> None:
        item = self._item(event)
        if item.role != "assistant":
            raise ProtocolError(Code.INVALID_TRUNCATE, "Only assistant audio items can be truncated.", param="item_id")
        if event.content_index >= len(item.content) or item.content[event.content_index].type != "output_audio":
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"content_index {event.content_index} is not an audio part of item {item.id!r}.",
                param="content_index",
            )
        part = item.content[event.content_index]
        if event.audio_end_ms > part.audio_ms + 1:
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"audio_end_ms {event.audio_end_ms} is beyond the item's audio ({part.audio_ms:.0f} ms).",
                param="audio_end_ms",
            )
        resp = self._responses.current
        if resp is not None and resp.message is item:
            # The client stopped playing this answer: stop generating it too.
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        self._cut(item, event.content_index, event.audio_end_ms)

    def dtmf(self, digit: str, received_at: int) -> None:
        """A key the caller pressed on a phone call (a carrier's ``dtmf``, a SIP call's RFC 4733
        event): OpenAI's SIP event ``input_audio_buffer.dtmf_event_received`` (``received_at``:
        Unix seconds)."""
        self._emit("input_audio_buffer.dtmf_event_received", event=digit, received_at=received_at)

    def dtmf_sent(self, digit: str, event_id: str | None, refused: str | None) -> None:
        """What became of a ``SendDtmf`` this session asked for (``refused``: why it was not sent).
        The Realtime dialect asks none."""

    def transport_progress(self, kind: str, fields: dict[str, Any]) -> None:
        """An outbound call's progress (``ringing``, ``answered``, ``failed``), for a dialect that
        reports it (GPT-Live's ``transport.*``). The Realtime dialect's REST call waits instead."""

    # --- playback (a connection that plays the audio: WebRTC) ---------------------------

    def playback(self, kind: str, response_id: str | None, item_id: str | None, audio_end_ms: int) -> None:
        """What the connection played of an answer's audio: ``started`` (its first audio
        went out), ``stopped`` (its last, after it ended), ``cleared`` (cut at
        ``audio_end_ms`` of ``item_id``: the answer stops if it still runs, the item keeps
        what was heard: ``conversation.item.truncated``). OpenAI's WebRTC-only events."""
        if response_id is None:
            return  # nothing played and nothing runs: nothing to clear
        if kind == "started":
            self._emit("output_audio_buffer.started", response_id=response_id)
            return
        if kind == "stopped":
            self._emit("output_audio_buffer.stopped", response_id=response_id)
            return
        resp = self._responses.find(response_id)
        if resp is not None:
            self._responses.end(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        item = self.conversation.get(item_id) if item_id is not None else None
        if item is not None and item.content and item.content[0].type == "output_audio":
            self._cut(item, 0, min(audio_end_ms, int(item.content[0].audio_ms)))
        self._emit("output_audio_buffer.cleared", response_id=response_id)

    def _cut(self, item: Item, content_index: int, audio_end_ms: int) -> None:
        """The item's audio part keeps ``audio_end_ms`` of audio and the text spoken by then."""
        part = item.content[content_index]
        kept = part.marks.kept_before(audio_end_ms)
        part.transcript = (part.transcript or "")[:kept]
        part.marks = part.marks.upto(kept)
        part.audio_ms = float(audio_end_ms)
        self._emit("conversation.item.truncated", item_id=item.id, content_index=content_index,
                   audio_end_ms=audio_end_ms)  # fmt: skip

    def _delete(self, event: ce.ItemDelete) -> None:
        item = self._item(event)
        if self._responses.writes(item):
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        self._history.remove(item.id)
        self._emit("conversation.item.deleted", item_id=item.id)

    # --- snapshots (resume) --------------------------------------------------

    def snapshot_state(self, *, with_items: bool = True) -> dict[str, Any]:
        """Everything another replica needs to carry the session on. ``with_items``
        False: the conversation's items are left out (stored one record each, see
        ``take_item_changes``); ``item_ids`` keeps their order either way."""
        log, responses = self._log, self._responses
        return {
            "id": self.id,
            "dialect": self.dialect.name,
            "beta": self.beta,
            "config": self.config,  # written by snapshot.dumps, read back by config_from_dict
            "created_at": self.created_at,
            "seq": log.seq,
            "epoch": log.epoch,
            "conversation_id": self._history.id,
            "id_base": log.id_base,
            "id_counter": log.id_counter,
            "audio_ms": self.audio_ms,
            "item_ids": [it.id for it in self.conversation],
            **({"items": [snapshot.item_to_dict(it) for it in self.conversation]} if with_items else {}),
            "response": None if responses.current is None else snapshot.response_to_dict(responses.current),
            "oob": [snapshot.response_to_dict(resp) for resp in responses.out_of_band],
        }

    @classmethod
    def restore(cls, state: dict[str, Any], *, engine: EngineInfo, conversation: bool = True,
                **kwargs: Any) -> RealtimeSession:  # fmt: skip
        """Rebuild a session from ``snapshot_state`` output (on any replica). ``conversation``
        False: all but the conversation and what refers to its items (the running responses,
        MCP listings), for ``load_conversation`` to add later: a resume is answered before
        the conversation is read, so that its cost does not grow with the conversation."""
        session = cls(
            session_id=state["id"],
            config=snapshot.config_from_dict(state["config"]),
            engine=engine,
            beta=state["beta"],
            created_at=state["created_at"],
            **kwargs,
        )
        log = session._log
        log.seq = state["seq"]
        log.epoch = state["epoch"]
        log.id_base = state["id_base"]
        log.id_counter = state["id_counter"]
        session.audio_ms = state["audio_ms"]
        session._history.id = state["conversation_id"]
        if conversation:
            session.load_conversation(state)
        session.dirty = False
        return session

    def load_conversation(self, state: dict[str, Any]) -> None:
        """The conversation of ``state`` (a snapshot with its items: ``snapshot.assemble``),
        its running responses and MCP listings, into a session ``restore`` left without them.
        ``state`` may be later than the one restored from (what the old owner wrote last):
        its ids and seq are taken where they are further on."""
        log = self._log
        log.seq, log.epoch = max(log.seq, state["seq"]), max(log.epoch, state["epoch"])
        if state["id_base"] == log.id_base:
            log.id_counter = max(log.id_counter, state["id_counter"])
        self._history.restore((snapshot.item_from_dict(entry) for entry in state["items"]), state["conversation_id"])
        self._mcp.restore(self.config.tools, self.conversation)
        rate = self.engine.output_sample_rate
        current = state["response"]
        self._responses.restore(
            None if current is None else snapshot.response_from_dict(current, self.conversation, rate),
            [snapshot.response_from_dict(r, self.conversation, rate) for r in state.get("oob", ())],
        )

    def recover(self, reason: str) -> None:
        """After a takeover: end what died with the old replica, explicitly.

        A running response (the conversation's and each out-of-band one) ends
        with status ``incomplete`` and ``reason`` and, unless
        ``reissue_interrupted_responses`` is off, is created again from the
        conversation. A transcription that was running is reported failed.
        """
        self._log.epoch += 1
        self._mcp.configure(self.config.tools, "session.tools")  # a listing that died with it: again
        for item in self.conversation:
            if item.pending_transcription:
                item.pending_transcription = False
                item.content[0].transcript = ""
                self._input.report_failure(item.id, "replica_lost", "The replica transcribing this audio was lost.")
        for resp in self._responses.running():
            # The SDK's status_details.reason has no value for this: the gateway's own
            # reason goes in the extension field gateway_reason.
            self._responses.end(resp, "incomplete", {"type": "incomplete", "gateway_reason": reason})
            if self.config.reissue_interrupted_responses:
                self._turns.answer(
                    ce.ResponseParams(
                        output_modalities=resp.modalities,
                        instructions=resp.instructions,
                        voice=resp.voice,
                        max_output_tokens=resp.max_output_tokens,
                        conversation="auto" if resp.in_conversation else "none",
                        metadata=resp.metadata,
                        tools=resp.overrides.get("tools"),
                        tool_choice=resp.overrides.get("tool_choice"),
                        parallel_tool_calls=resp.overrides.get("parallel_tool_calls"),
                        say=resp.overrides.get("say"),
                    ),
                    None,
                )
