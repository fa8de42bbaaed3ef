"""The turns of an engine that takes its own (Sans-I/O): ``EngineTurns``.

An engine whose ``info.takes_turns`` (a full-duplex model behind an upstream that
detects speech itself: the remote engine's ``turns: "upstream"``) decides when the
caller's turn ends and when it answers. A session on it runs no speech detector of
its own for turns: it holds one conversation with the engine (``StartConversation``)
from its first input audio to its end, streams it every chunk of the caller's audio as
it comes (``Feed``, converted once to the engine's rate), and turns what the engine
decides into the events the session's parts emit, which its dialect spells:

- ``SpeechStarted``: ``input_audio_buffer.speech_started`` (a Live client's input
  transcript is placed from there; the Live dialect's barge-in cuts what plays), and
  the answer under way ends ``cancelled`` (``turn_detected``): the engine stopped it;
- ``SpeechStopped``: ``input_audio_buffer.speech_stopped``, and the turn committed as a
  server VAD turn is (``InputAudio.commit_heard``: ``input_audio_buffer.committed``, its
  ``input_audio`` user item, its transcript to come);
- ``Heard``: the transcript of the oldest committed turn still without one (an engine
  transcribes its turns in order, and may answer before it has), as a transcription's
  (``InputAudio.heard``: ``...input_audio_transcription.delta``, then ``.completed``, the
  item's transcript); with none committed, of the turn under way: its pieces wait for its
  commit, and its final transcript commits it (an engine that says no speech end);
- context the dialect appends meanwhile (``context``: instructions, silent thinking)
  goes to the conversation as ``TextChunk``s (the engine adds each as a system message);
- a conversation that ends (the session's end, its turn detection off, a failure) with
  turns committed and not transcribed completes them with what was heard of them, so
  that no answer waits for their transcripts;
- ``AnswerStarted``: a response the engine leads (``Responses.create(..., led=True)``:
  no engine request of its own), given the text and audio that follow, ended by their
  ``Finished``. Deltas of an answer the session ended already (a barge-in) are dropped.

A conversation that fails (its upstream lost) ends the answer under way ``failed`` and
says the engine's code in an ``error``; the next input audio starts another. So does a
session restored on another replica: the conversation is this replica's, never in the
snapshot (what the engine heard before is in the context it is started with).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import Converter, engine_format
from gateway.protocol.session_config import engine_voice
from gateway.session.context import fit_context
from gateway.session.conversation import to_messages
from gateway.session.effects import Cancel, Feed, StartConversation
from gateway.session.events import EventLog
from gateway.session.history import History
from gateway.session.input import InputAudio
from gateway.session.responses import Responses
from orchestrator.engine import (
    AnswerStarted,
    AudioChunk,
    AudioDelta,
    ConversationRequest,
    EngineInfo,
    Finished,
    Heard,
    SpeechStarted,
    SpeechStopped,
    TextChunk,
    TextDelta,
    ToolCallDelta,
    TurnOutput,
)


class EngineTurns:
    """See the module docstring. ``answer()`` starts a response the engine leads (the
    dialect's way: an answer under way gives way to it) and returns its id;
    ``barge_in()`` ends the answer under way, as the engine's speech start did."""

    def __init__(self, log: EventLog, history: History, input_audio: InputAudio, responses: Responses, *,
                 engine: EngineInfo, session_id: str, answer: Callable[[], str | None],
                 barge_in: Callable[[], None]) -> None:  # fmt: skip
        self._log = log
        self._history = history
        self._input = input_audio
        self._responses = responses
        self._engine = engine
        self._session_id = session_id
        self._answer = answer
        self._barge_in = barge_in
        self.request_id: str | None = None  # the conversation under way (None: the next audio starts one)
        self._started = 0  # conversations started here (each one's request id is new)
        self._origin_ms = 0.0  # the session's input clock when it started (the engine's clock is its own)
        self._converter: Converter | None = None
        self._answering: str | None = None  # the response the engine's deltas go to
        self._turn_item: str | None = None  # the caller's turn under way, not committed yet: its item
        self._held: list[str] = []  # ... and what was heard of it
        self._awaiting: deque[tuple[str, list[str]]] = deque()  # committed turns, oldest first, and
        #   what was heard of each before its final transcript
        self.speaking = False  # the engine hears the caller speak
        self.turn_heard: Callable[[], None] = lambda: None  # a turn's transcript is whole (the dialect's)

    def append(self, audio: bytes, fmt: AudioFormat) -> None:
        """Input audio (already checked; silence while muted): on the timeline, and to the engine."""
        if self.request_id is None:
            self._start()
        converter = self._converter
        if converter is None or converter.src != fmt:
            converter = self._converter = Converter(fmt, engine_format(self._engine.input_sample_rate))
        self._input.audio_ms += fmt.duration_ms(len(audio))
        pcm = converter.process(audio)
        if pcm and self.request_id is not None:
            self._log.effects.append(Feed(self.request_id, AudioChunk(pcm)))

    def context(self, text: str) -> None:
        """Context appended to the conversation (a system message): to the conversation under
        way as it comes (one started later has it in its history)."""
        if self.request_id is not None:
            self._log.effects.append(Feed(self.request_id, TextChunk(text)))

    def _start(self) -> None:
        self._started += 1
        rid = self.request_id = f"turns_{self._session_id}_{self._started}"
        self._origin_ms = self._input.audio_ms
        cfg = self._responses.config
        items = fit_context(list(self._history.conversation), cfg.instructions, cfg.truncation,
                            self._engine.max_context_tokens, None)  # fmt: skip
        request = ConversationRequest(
            request_id=rid,
            messages=tuple(to_messages(items)),
            instructions=cfg.instructions,
            modalities=cfg.output_modalities,
            voice=engine_voice(cfg.voice, self._engine.voices, self._engine.default_voice),
            temperature=cfg.temperature,
            speed=cfg.speed,
        )
        self._log.effects.append(StartConversation(request))

    def shutdown(self) -> None:
        """The session is over, or its turns are no longer the engine's: the conversation ends
        (no final marker: it is cancelled)."""
        if self.request_id is not None:
            self._log.effects.append(Cancel(self.request_id))
            self.request_id = None
        self._ended()

    def _ended(self) -> None:
        """No more will be heard: committed turns keep what was heard of them."""
        self.speaking, self._turn_item, self._held, self._answering = False, None, [], None
        while self._awaiting:
            item_id, heard = self._awaiting.popleft()
            self._input.heard(item_id, "".join(heard), final=True)

    # --- what the engine decides --------------------------------------------------------

    def on_output(self, request_id: str, output: TurnOutput) -> None:
        if request_id != self.request_id:
            return  # (a conversation ended here already)
        match output:
            case AudioDelta() | TextDelta() | ToolCallDelta():
                if self._answering is None:  # (an engine that says no AnswerStarted: its first delta does)
                    self._answering = self._answer()
                if self._answering is not None:
                    self._responses.on_output(self._answering, output)
            case Finished():
                if self._answering is not None:
                    self._responses.on_output(self._answering, output)
                self._answering = None
            case AnswerStarted():
                self._answering = self._answer()
            case SpeechStarted():
                self.speaking = True
                self._turn_item, self._held = self._log.new_id("item"), []
                self._log.emit("input_audio_buffer.speech_started", audio_start_ms=self._at(output.audio_ms),
                               item_id=self._turn_item)  # fmt: skip
                if self._responses.current is not None:
                    self._barge_in()
            case SpeechStopped():
                self.speaking = False
                item_id = self._turn_item or self._log.new_id("item")
                self._log.emit("input_audio_buffer.speech_stopped", audio_end_ms=self._at(output.audio_ms),
                               item_id=item_id)  # fmt: skip
                self._commit(item_id)
            case Heard():
                if not self._awaiting:
                    if not output.final:
                        self._held.append(output.text)
                        return
                    self._commit(self._turn_item or self._log.new_id("item"))
                item_id, heard = self._awaiting[0]
                if output.final:
                    self._awaiting.popleft()
                else:
                    heard.append(output.text)
                self._input.heard(item_id, output.text, final=output.final)
                if output.final:
                    self.turn_heard()

    def _commit(self, item_id: str) -> None:
        """The caller's turn into the conversation, with what was heard of it so far."""
        held, self._turn_item, self._held = self._held, None, []
        self._input.commit_heard(item_id)
        self._awaiting.append((item_id, held))
        if held:
            self._input.heard(item_id, "".join(held), final=False)

    def _at(self, audio_ms: float | None) -> int:
        """The engine's place in its input audio, on the session's input clock."""
        return round(self._input.audio_ms if audio_ms is None else self._origin_ms + audio_ms)

    def on_failed(self, request_id: str, code: str, message: str) -> None:
        """The conversation failed (the engine's code): the answer under way fails with it, or
        an ``error`` says it; the next input audio starts another conversation."""
        if request_id != self.request_id:
            return
        self.request_id = None
        answering = self._answering
        self._ended()
        if answering is not None and self._responses.find(answering) is not None:
            self._responses.on_failed(answering, code, message)
        else:
            self._log.fail(code, message, None)
