"""The session's output (Sans-I/O): every server event and effect passes here.

``EventLog`` owns the event sequence (``seq``, each event's
``server_event_seq``), the ``epoch`` (bumped on barge-in and on takeover), the
ids the session hands out (events, items, responses and calls share one random
base, kept in the snapshot), the events and effects the shell has not taken
yet, and what the next snapshot must write: the ids of the conversation items
that changed or were deleted since the last one. It reports each change of
state (every event but a delta, an error or a ``response.event``, and ``touch``
and ``changed``) to
``state_changed``: the session keeps the ``dirty`` flag, which the host reads
and clears on every flush.

It knows event names only as far as snapshots need them (which events name an
item, which change no state); it knows nothing of what the events mean, of
the parts that emit them, or of a dialect's spelling beyond the one hook
(``spell``) a dialect installs.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Protocol

from gateway.audio.codecs import AudioFormat
from gateway.protocol.errors import ProtocolError
from gateway.session.conversation import Item
from gateway.session.effects import Effect

# Events that change no state by themselves: an error; GPT-Live's ``response.event`` (one
# per event of a Responses stream: its part says what changed, ``changed``).
QUIET = frozenset({"error", "response.event"})

# Events that announce a change of session state a replica taking the session over
# must know: each marks the session for a snapshot, and the host sends it only once
# the store holds that snapshot (write-ahead; tests/unit/test_state_events.py).
# session.created is one: its resume token must resume the session anywhere.
REALTIME_STATE_EVENTS = frozenset(
    {
        "session.created",
        "session.updated",
        "transcription_session.updated",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.deleted",
        "conversation.item.truncated",
        "response.created",
        "response.done",
    }
)
# GPT-Live's (gateway/session/live.py): what it says changed, once the store holds it.
LIVE_STATE_EVENTS = frozenset(
    {
        "session.started",
        "session.updated",
        "session.input_audio.muted",
        "session.input_audio.unmuted",
        "session.instructions.appended",
        "session.thinking.appended",
        "session.commentary.appended",
        "session.delegation.created",
        "session.output_audio.fixture.playing",
        "session.output_audio.fixture.played",
        "session.closed",
    }
)
STATE_EVENTS = REALTIME_STATE_EVENTS | LIVE_STATE_EVENTS

# Events that name an item without changing it.
READ_ONLY_EVENTS = frozenset({"conversation.item.retrieved"})


class AudioEvent(dict[str, Any]):
    """An event that carries audio (its ``delta``, in the client's format), with ``source``:
    the same audio as the engine gave it (PCM16 and its format). A media transport converts
    ``source`` to what it plays, once, instead of decoding the client's format again
    (``audio/convert.py``). It encodes, is journaled and is replayed as the plain event."""

    __slots__ = ("source",)

    source: tuple[bytes, AudioFormat]


class MediaEvent(dict[str, Any]):
    """An event only for the connections that play the answers' audio themselves (a WebRTC
    call, a phone call: a door's ``media``), where the dialect tells its clients nothing of it:
    GPT-Live's answer's end (``response.done``, naming no response: its audio deltas name none).
    Never encoded, sent on a wire or journaled; it has no seq of its own but the event's
    before it (a resume's replay that carried that event is past it too)."""

    __slots__ = ()


class Spelling(Protocol):
    """A dialect's step between the parts and the log: it receives every event the
    parts emit and writes (``EventLog.write``) what its clients are sent instead:
    the same event, a changed one, more events around it, or none yet."""

    def __call__(self, type_: str, fields: dict[str, Any]) -> None: ...


class EventLog:
    """See the module docstring."""

    def __init__(
        self, item_changed: Callable[[str], None], state_changed: Callable[[], None], id_base: str | None = None
    ) -> None:
        """``item_changed(item_id)``: an event said the item changed (the conversation
        drops what it cached of it); ``state_changed()``: the session's state changed
        (the next snapshot must be written)."""
        self.seq = 0
        self.epoch = 0
        self.id_base = id_base or secrets.token_hex(6)
        self.id_counter = 0
        self.events: list[dict[str, Any]] = []  # not yet taken by the shell (never replaced)
        self.effects: list[Effect] = []  # (never replaced)
        # Conversation items changed or deleted since the last snapshot: the store keeps one
        # record per item, so a snapshot writes these and not the whole conversation.
        self.changed_items: set[str] = set()
        self.dropped_items: set[str] = set()
        self.spell: Spelling | None = None  # the dialect's, if it spells events its own way
        self._item_changed = item_changed
        self._state_changed = state_changed
        self._source: tuple[bytes, AudioFormat] | None = None  # emit_audio's, for the event that carries it
        self._source_of: object = None  # (the delta it goes with: that very object)

    def emit(self, type_: str, **fields: Any) -> None:
        """The event ``type_``, through the dialect's spelling if it has one."""
        spell = self.spell
        if spell is not None:
            spell(type_, fields)
            return
        # write(), inlined: an audio delta costs one call here, not two.
        self.seq += 1
        event = {"type": type_, "event_id": f"event_{self.id_base}{self.seq:x}", **fields}
        event["server_event_seq"] = self.seq
        if self._source is not None:
            event = self._with_source(event)
        self.events.append(event)
        if not type_.endswith(".delta") and type_ not in QUIET:
            self._state_changed()  # every other event reflects a state change worth a snapshot
            self._note_items(type_, fields)

    def emit_audio(self, type_: str, source: tuple[bytes, AudioFormat], **fields: Any) -> None:
        """An audio event (``fields["delta"]``, in the client's format), with the same audio as
        the engine gave it (``source``): the event written now with that very delta (a spelling
        may rename it) is an ``AudioEvent``. A spelling that holds or re-cuts the delta (a Live
        WebSocket's pacing) writes plain events: a media transport converts their delta then."""
        self._source, self._source_of = source, fields.get("delta")
        try:
            self.emit(type_, **fields)
        finally:
            self._source = self._source_of = None

    def _with_source(self, event: dict[str, Any]) -> dict[str, Any]:
        delta = event.get("delta")
        if not delta or delta is not self._source_of:
            return event  # (an event around the audio delta: a transcript's, an earlier delta held)
        out = AudioEvent(event)
        out.source = self._source  # type: ignore[assignment]  # (not None: the caller checked)
        self._source = self._source_of = None
        return out

    def to_media(self, type_: str, fields: dict[str, Any]) -> None:
        """Append a ``MediaEvent`` (what a spelling calls), in order with the events written."""
        self.events.append(MediaEvent({"type": type_, **fields, "server_event_seq": self.seq}))

    def write(self, type_: str, fields: dict[str, Any]) -> None:
        """Append the event as it is sent (what a spelling calls)."""
        self.seq += 1
        event = {"type": type_, "event_id": f"event_{self.id_base}{self.seq:x}", **fields}
        event["server_event_seq"] = self.seq
        if self._source is not None:
            event = self._with_source(event)
        self.events.append(event)
        if not type_.endswith(".delta") and type_ not in QUIET:
            self._state_changed()
            self._note_items(type_, fields)

    def unsent(self, type_: str, fields: dict[str, Any]) -> None:
        """An event a dialect's spelling sends no client (its clients have no such event): the
        state it announces is still the session's, for the next snapshot to write."""
        if not type_.endswith(".delta") and type_ not in QUIET:
            self._state_changed()
            self._note_items(type_, fields)

    def error(self, err: ProtocolError) -> None:
        self.emit(
            "error",
            error={
                "type": err.type,
                "code": err.code,
                "message": err.message,
                "param": err.param,
                "event_id": err.event_id,
            },
        )

    def fail(self, code: str, message: str, event_id: str | None, param: str | None = None) -> None:
        self.error(ProtocolError(code, message, param=param, event_id=event_id))

    def new_id(self, prefix: str) -> str:
        self.id_counter += 1
        return f"{prefix}_{self.id_base}{self.id_counter:04x}"

    def changed(self) -> None:
        """The session's state changed with no event saying so (the next snapshot writes it)."""
        self._state_changed()

    def touch(self, item: Item) -> None:
        """An item changed with no event naming it: its record must be written again."""
        self._changed(item.id)
        item.forget()  # (it may not be in the conversation: an out-of-band answer's)
        self._state_changed()

    def take(self) -> tuple[list[dict[str, Any]], list[Effect]]:
        """Hand the pending events and effects to the shell. The two lists stay the same
        objects (emptied), so that the session may hold them as its own attributes."""
        events, effects = self.events, self.effects
        out, eff = events.copy(), effects.copy()
        events.clear()
        effects.clear()
        return out, eff

    def take_item_changes(self) -> tuple[set[str], set[str]]:
        """(changed, dropped) item ids since the last call: the next snapshot's item records."""
        changed, dropped = self.changed_items, self.dropped_items
        self.changed_items, self.dropped_items = set(), set()
        return changed, dropped

    def _note_items(self, type_: str, fields: dict[str, Any]) -> None:
        """The items an event says changed: every change of an item is announced by an
        event naming it (added, done, truncated, transcribed, deleted, a response's end)."""
        item = fields.get("item")
        item_id = fields.get("item_id") or (item.get("id") if isinstance(item, dict) else None)
        if not isinstance(item_id, str) or type_ in READ_ONLY_EVENTS:
            pass
        elif type_ == "conversation.item.deleted":
            self.changed_items.discard(item_id)
            self.dropped_items.add(item_id)
        else:
            self._changed(item_id)
        response = fields.get("response")
        if type_ == "response.done" and isinstance(response, dict):
            for output in response.get("output") or ():
                if isinstance(output, dict) and isinstance(output.get("id"), str):
                    self._changed(output["id"])

    def _changed(self, item_id: str) -> None:
        self.changed_items.add(item_id)
        self._item_changed(item_id)
