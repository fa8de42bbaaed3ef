"""Input-clocked duplex sessions (Sans-I/O): one ``input_audio_buffer.processed`` per input.

vLLM-Omni's input clock, as the newest sibling revision of its duplex document
defines it ("Input-clocked sessions": ``docs/serving/realtime_duplex_api.md`` of
vllm-project/vllm-omni#8485; docs/duplex.md, *Input-clocked sessions*). A session created
with ``extra_body.clock: "input"`` acknowledges every ``input_audio_buffer.append``,
``input_audio_buffer.commit`` and ``response.create`` that reaches it with exactly
one ``input_audio_buffer.processed``, in input order, sent only once every output
that input caused has been sent. A client may step the session as fast as the
acknowledgements come back, or pause between inputs, and always knows which outputs
belong to which input.

A *unit* here is a turn, as the document has it for a commit-based model (this
gateway answers a committed turn whole): the audio a commit (the client's or server
VAD's) committed, its transcript, and the answer made for it; or the answer of a
``response.create``. A unit completes when its transcript is final (``...transcription
.completed`` or ``.failed`` sent) and its answer has ended (``response.done``, and
``rate_limits.updated`` after it, sent). Its ``decision``: ``speak`` (the answer ended
completed or incomplete), ``listen`` (no answer was asked for: ``auto_response`` off,
``response_create: false``), ``cancelled`` (a cancel or a barge-in ended the answer, or
dropped the answer it waited for; ``reason``), ``failed`` (the answer failed;
``reason``: its error code), ``aborted`` (the session ended, or its replica was lost,
with it open; ``reason``). An answer lost with a replica and made again on the next one
(``reissue_interrupted_responses``) stays its unit's.

Units complete in any order and are reported in order: an acknowledgement waits for
every unit created up to the end of its input's handling (its *watermark*) and for the
acknowledgements before it, and lists the units that completed since the last one
(``units``, each ``{end_ms, decision, reason?}``). An input that creates no unit (an
append, a commit with nothing to answer and no audio, a refused input) is acknowledged
as soon as the acknowledgements before it are out. An input refused before any of it
reached the session's state (an append of the wrong format, over a limit) says
``decision: "rejected"`` and ``reason`` (the error code), and its audio is not counted.
A teardown (``session.close``, an expiry) settles the open units as ``aborted`` and
acknowledges every owed input with one event (``first_input_index`` .. ``input_index``),
before the session's last event; nothing is acknowledged after it.

The document's two timeouts (``input_clock_unit_timeout_s``, ``input_clock_unit_max_s``)
are validated and fixed with the clock (protocol/duplex_config.py), and settle nothing
here: a turn always ends (its answer completes, fails, is cancelled, or ends with its
replica), so an acknowledgement waits for its answer's end however long it runs.

The clock is in the session's snapshot: a resumed session, on any replica, goes on
acknowledging where it stopped (``session.input_index`` is the latest input's index).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# What an input-clocked session acknowledges: the document's list (``ACKNOWLEDGED_INPUTS``).
TRIGGERS = ("input_audio_buffer.append", "input_audio_buffer.commit", "response.create")

AnswerState = Literal["none", "owed", "running", "ended"]


@dataclass(slots=True)
class Unit:
    """One turn, from its commit (or ``response.create``) until its outputs are out."""

    seq: int  # 1-based, in creation order
    input_ms: float  # the input audio it committed
    transcripts: list[str] = field(default_factory=list)  # items whose transcript is still to come
    answer: AnswerState = "none"  # none: no answer asked for; owed: asked, not created yet
    response_id: str | None = None
    decision: str | None = None
    reason: str | None = None

    @property
    def done(self) -> bool:
        return not self.transcripts and self.answer in ("none", "ended")


@dataclass(slots=True)
class Ack:
    """An acknowledgement owed to one input."""

    index: int  # input_index: 1-based among the session's acknowledged inputs
    trigger: str
    audio_end_ms: float = 0.0  # the input audio the session had handled with this input
    watermark: int | None = None  # units created by the end of its handling (None: still handled)
    rejected: str | None = None  # the error code of an input refused before it reached the session


class InputClock:
    """See the module docstring. ``flush`` returns the acknowledgements that are due, as
    event fields; the turn-taking emits them (``duplex_turns.DuplexTurns``)."""

    def __init__(self) -> None:
        self.inputs = 0  # acknowledged inputs so far (the latest one's input_index)
        self.units: list[Unit] = []  # open units, oldest first (a done prefix is reported and dropped)
        self.acks: list[Ack] = []  # owed acknowledgements, in input order
        self.created = 0  # units created (acknowledgements wait for their watermark)
        self.completed = 0  # units reported done, a prefix of those created
        self.unit_end_ms = 0.0  # the input audio of that prefix
        self.pending: list[tuple[int, dict[str, Any], float]] = []  # done, not yet acknowledged
        self.reported_end_ms = 0.0  # unit_end_ms of the last acknowledgement
        self.closed = False
        # The unit whose answer waits behind the running one (a commit during an answer).
        self.deferred: Unit | None = None
        # Within one step (not in the snapshot): the turn committed in it, the unit the
        # response being created answers, the units whose lost answer is made again.
        self.fresh: Unit | None = None
        self.answering: Unit | None = None
        self.reissued: list[Unit] = []

    # --- inputs --------------------------------------------------------------------------

    def begin(self, trigger: str) -> Ack | None:
        """An input that is acknowledged reached the session (None: the clock is closed)."""
        if self.closed:
            return None
        self.inputs += 1
        ack = Ack(self.inputs, trigger)
        self.acks.append(ack)
        return ack

    def end(self, ack: Ack, audio_end_ms: float, rejected: str | None = None) -> None:
        """The input is handled: the units it created exist (its watermark is fixed)."""
        ack.audio_end_ms = audio_end_ms
        ack.rejected = rejected
        ack.watermark = self.created

    def step_over(self) -> None:
        """A client event was handled: a turn it committed without asking for an answer
        is not the one a later ``response.create`` answers."""
        self.fresh = None

    # --- units ---------------------------------------------------------------------------

    def _new(self, input_ms: float) -> Unit:
        self.created += 1
        unit = Unit(self.created, input_ms)
        self.units.append(unit)
        return unit

    def turn(self, input_ms: float, transcript_of: str | None) -> None:
        """A turn was committed with ``input_ms`` of audio (``transcript_of``: its item, whose
        transcript is still to come). Its answer, if one is asked for, follows in the step."""
        if self.closed:
            return
        unit = self.fresh = self._new(input_ms)
        if transcript_of is not None:
            unit.transcripts.append(transcript_of)

    def for_answer(self) -> Unit | None:
        """The unit an answer asked for now answers: the turn committed in this step, the unit
        whose answer was lost with a replica, or a new one (``response.create``)."""
        if self.closed:
            return None
        unit = self.fresh if self.fresh is not None and self.fresh.answer == "none" else None
        self.fresh = None
        if unit is None and self.reissued:
            unit = self.reissued.pop(0)
        if unit is None:
            unit = self._new(0.0)
        unit.answer = "owed"
        return unit

    def defer(self, unit: Unit) -> None:
        """``unit``'s answer waits for the running one to end. A second turn deferred before
        the first was answered is merged into it: one answer covers both, as one unit."""
        held = self.deferred
        if held is None or held is unit:
            self.deferred = unit
            return
        if self.units and self.units[-1] is unit:  # (made in this step: no watermark counts it yet)
            self.units.pop()
            self.created -= 1
            held.input_ms += unit.input_ms
            held.transcripts += unit.transcripts
        else:
            unit.answer = "none"  # (a lost answer made again behind another: the held one answers)

    def take_deferred(self) -> Unit | None:
        unit, self.deferred = self.deferred, None
        return unit

    def drop_deferred(self, reason: str) -> None:
        """A barge-in dropped the answer the deferred unit waited for."""
        unit, self.deferred = self.deferred, None
        if unit is not None:
            self._ended(unit, "cancelled", reason)

    def not_answered(self, unit: Unit) -> None:
        """The answer asked for was refused (its error is out): a unit made for it alone goes,
        a turn is left with no answer."""
        if unit.input_ms == 0 and not unit.transcripts and self.units and self.units[-1] is unit:
            self.units.pop()
            self.created -= 1
        else:
            unit.answer = "none"

    def response_created(self, response_id: str) -> None:
        unit, self.answering = self.answering, None
        if unit is not None:
            unit.answer, unit.response_id = "running", response_id

    def response_done(self, response_id: str, decision: str, reason: str | None, *, reissue: bool) -> None:
        """The response ended (``reissue``: lost with a replica, and made again next)."""
        unit = next((u for u in self.units if u.response_id == response_id), None)
        if unit is None:
            return
        if reissue:
            unit.answer, unit.response_id = "owed", None
            self.reissued.append(unit)
        else:
            self._ended(unit, decision, reason)

    def transcript_final(self, item_id: str) -> None:
        for unit in self.units:
            if item_id in unit.transcripts:
                unit.transcripts.remove(item_id)
                return

    def lost(self, reason: str) -> None:
        """After a takeover: answers that were owed and will not be made (a deferred answer
        does not survive its replica) leave their units ``aborted``."""
        self.deferred = None
        for unit in self.units:
            if unit.answer == "owed" and unit not in self.reissued:
                self._ended(unit, "aborted", reason)

    def _ended(self, unit: Unit, decision: str, reason: str | None) -> None:
        unit.answer, unit.decision, unit.reason = "ended", decision, reason

    # --- acknowledgements ------------------------------------------------------------------

    def flush(self) -> list[dict[str, Any]]:
        """The acknowledgements now due, in input order (event fields)."""
        if self.closed:
            return []
        self._report_done()
        out = []
        while self.acks:
            ack = self.acks[0]
            if ack.watermark is None or self.completed < ack.watermark:
                break
            self.acks.pop(0)
            out.append(self._fields(ack, None, teardown=False))
        return out

    def close(self, reason: str, audio_end_ms: float) -> dict[str, Any] | None:
        """Teardown: the open units ``aborted``, every owed input acknowledged by one event
        (None: none was owed); the clock says nothing after it."""
        if self.closed:
            return None
        for unit in self.units:
            if not unit.done:
                unit.transcripts.clear()
                self._ended(unit, "aborted", reason)
        self._report_done()
        self.closed = True
        if not self.acks:
            return None
        first, last = self.acks[0], self.acks[-1]
        self.acks = []
        last.audio_end_ms = audio_end_ms
        return self._fields(last, first.index if first is not last else None, teardown=True)

    def _report_done(self) -> None:
        units = self.units
        while units and units[0].done:
            unit = units.pop(0)
            self.completed += 1
            self.unit_end_ms += unit.input_ms
            decision = unit.decision or ("listen" if unit.answer == "none" else "speak")
            entry: dict[str, Any] = {"end_ms": math.floor(self.unit_end_ms), "decision": decision}
            if unit.reason is not None:
                entry["reason"] = unit.reason
            self.pending.append((unit.seq, entry, self.unit_end_ms))

    def _fields(self, ack: Ack, first_index: int | None, *, teardown: bool) -> dict[str, Any]:
        """An acknowledgement: the done units created up to its input, no later ones."""
        units = []
        while self.pending and (teardown or self.pending[0][0] <= (ack.watermark or 0)):
            _, entry, self.reported_end_ms = self.pending.pop(0)
            units.append(entry)
        fields: dict[str, Any] = {
            "audio_end_ms": math.floor(ack.audio_end_ms),
            "unit_end_ms": math.floor(self.reported_end_ms),
            "input_index": ack.index,
        }
        if first_index is not None:
            fields["first_input_index"] = first_index
        fields["trigger"] = ack.trigger
        fields["units"] = units
        if ack.rejected is not None and first_index is None:
            fields["decision"], fields["reason"] = "rejected", ack.rejected
        return fields

    # --- snapshots -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Between steps (the step's own state is empty then)."""
        deferred = self.deferred.seq if self.deferred is not None else None
        return {
            "inputs": self.inputs,
            "units": [asdict(u) for u in self.units],
            "acks": [asdict(a) for a in self.acks],
            "created": self.created,
            "completed": self.completed,
            "unit_end_ms": self.unit_end_ms,
            "pending": [list(p) for p in self.pending],
            "reported_end_ms": self.reported_end_ms,
            "closed": self.closed,
            "deferred": deferred,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputClock:
        clock = cls()
        clock.inputs = data["inputs"]
        clock.units = [Unit(**u) for u in data["units"]]
        clock.acks = [Ack(**a) for a in data["acks"]]
        clock.created, clock.completed = data["created"], data["completed"]
        clock.unit_end_ms, clock.reported_end_ms = data["unit_end_ms"], data["reported_end_ms"]
        clock.pending = [(seq, entry, end) for seq, entry, end in data["pending"]]
        clock.closed = data["closed"]
        clock.deferred = next((u for u in clock.units if u.seq == data["deferred"]), None)
        return clock
