"""The duplex dialect's spelling (Sans-I/O): every event a session's parts emit, as
vLLM-Omni's duplex document (revision 2e9bf1cb, "Message examples") sends it.

``DuplexSpelling.spell`` is the ``EventLog``'s spelling step of a duplex session
(``events.Spelling``). It writes the event, a changed one, more events around
it, or holds it until its turn, so that the orders are the document's:

- the commit fan-out: ``conversation.item.added`` and ``.created`` (both
  spellings, each with its seq), ``input_audio_buffer.committed`` (held until
  its item is added; the native ``input.committed`` under ``event``),
  ``...input_audio_transcription.completed``, then ``conversation.item.done``
  (held until the transcript is known, and carrying it; a failed transcript is
  an ``error``); the transcription's deltas are not sent;
- an answer: ``response.created`` (``metadata.duplex_event``), its item added
  and created, then ``response.output_item.added`` (held until the item is
  added), ``response.speak`` before its first audio delta (none for a text
  answer), each ``response.output_audio.delta`` (with ``format``,
  ``sample_rate_hz`` and ``metadata``) followed by exactly one
  ``response.output_audio_transcript.delta`` (the text held since the last
  one), text after the last audio with an empty audio delta, and
  ``response.done`` whose metadata is the duplex event (``committed``, the
  ledger);
- ``event`` echoes on ``conversation.item.deleted`` / ``.truncated``.

What the turn-taking must know of these moments it is told (``TurnMoments``:
a turn committed, an answer opened, an answer speaking, speech started); the
playback ledgers it reads and moves per audio delta (``Ledger.sent``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gateway.protocol.duplex_config import DuplexConfig
from gateway.protocol.session_config import beta_format
from gateway.session.playback import EMPTY_VIEW, Playback
from gateway.session.response import Response
from gateway.session.turn_taking import Parts


class TurnMoments(Protocol):
    """What the spelling tells and reads of the turn-taking (``DuplexTurns``)."""

    duplex: DuplexConfig
    playback: Playback
    turn_id: int
    clock: Callable[[], float]  # the wall clock of the ledgers' playout schedule

    @property
    def ending(self) -> tuple[str, str] | None:
        """(response id, status) of the conversation's answer ending now, if one is."""

    def committed(self, item_id: str | None, resp: Response | None) -> dict[str, Any]:
        """A turn is committed (its item added): the native ``input.committed`` event."""

    def answer_opened(self, resp: Response) -> None:
        """The conversation's answer was created."""

    def speaking(self) -> None:
        """The conversation's answer sends its first audio."""

    def speech_started(self) -> None:
        """``input_audio_buffer.speech_started`` went out."""

    def response_created(self, response_id: str) -> None:
        """A response (the conversation's or an out-of-band one) was created."""

    def response_done(self, response_id: str, status: str, details: dict[str, Any] | None) -> None:
        """A response's ``response.done`` went out."""

    def transcript_final(self, item_id: str) -> None:
        """A committed item's transcript went out (``.completed``), or its failure."""


class DuplexSpelling:
    """See the module docstring."""

    def __init__(self, session_id: str, turns: TurnMoments, parts: Parts) -> None:
        self.held_done: list[str] = []  # committed items whose conversation.item.done awaits the transcript
        self._session_id = session_id
        self._turns = turns
        self._log = parts.log
        self._write = parts.log.write
        self._history = parts.history
        self._responses = parts.responses
        self._ledgers = turns.playback.ledgers  # (the hot path reads it per audio delta)
        self._spoken: set[str] = set()  # answers that have said response.speak (until their response.done)
        self._unpaired: dict[str, list[str]] = {}  # transcript text awaiting its audio delta, by answer
        self._held_commit: dict[str, Any] | None = None  # input_audio_buffer.committed, until its item is added
        self._held_output: dict[str, Any] | None = None  # response.output_item.added, until its item is added
        self._fan_out_item: str | None = None  # the item of the commit fanning out now

    def spell(self, type_: str, fields: dict[str, Any]) -> None:
        """Every event the parts emit, as the duplex dialect sends it (module docstring)."""
        write = self._write
        resp = self._responses.current
        if type_ == "response.output_audio.delta":
            self._audio_delta(fields, resp)
            return
        if type_ == "response.output_audio_transcript.delta":
            # Held: exactly one transcript delta follows each audio delta, with the text since.
            self._unpaired.setdefault(fields["response_id"], []).append(fields["delta"])
            return
        if type_ == "response.output_audio.done":
            self._pair_the_rest(fields, resp)
        elif type_ == "input_audio_buffer.committed":
            self._held_commit = fields  # until its item is added
            return
        elif type_ == "response.output_item.added" and resp is not None and fields["response_id"] == resp.id:
            self._held_output = fields  # the answer opens with its item added (and created) first
            return
        elif type_ == "conversation.item.done" and fields["item"]["id"] == self._fan_out_item:
            self._fan_out_item = None
            item = self._history.get(fields["item"]["id"])
            if item is not None and item.pending_transcription:
                self.held_done.append(item.id)  # the fan-out's last event: once the transcript is known
                return
        elif type_ == "conversation.item.input_audio_transcription.delta":
            return  # the fan-out has the transcript whole (.completed), not its deltas
        elif type_ == "conversation.item.input_audio_transcription.failed":
            error = fields["error"]
            message = f"Speech recognition of item {fields['item_id']} failed: {error['message']}"
            write("error", {"error": {"type": "server_error", "code": error["code"], "message": message,
                                      "param": None, "event_id": None}})  # fmt: skip
            self._release_done(fields["item_id"])
            self._turns.transcript_final(fields["item_id"])
            return
        elif type_ in ("conversation.item.deleted", "conversation.item.truncated"):
            fields["event"] = {"type": type_, **fields}
            if type_ == "conversation.item.deleted" and fields["item_id"] in self.held_done:
                self.held_done.remove(fields["item_id"])
        elif type_ in ("response.created", "response.done"):
            fields["response"] = self._response_metadata(type_, fields["response"])
        write(type_, fields)
        if type_ == "conversation.item.added":
            write("conversation.item.created", fields)  # upstream sends both spellings
            held, self._held_commit = self._held_commit, None
            if held is not None:
                self._fan_out_item = held.get("item_id")
                held["event"] = self._turns.committed(self._fan_out_item, resp)
                write("input_audio_buffer.committed", held)
            output, self._held_output = self._held_output, None
            if output is not None:
                write("response.output_item.added", output)
        elif type_ == "input_audio_buffer.speech_started":
            self._turns.speech_started()
        elif type_ == "response.created":
            if resp is not None and fields["response"]["id"] == resp.id:
                self._turns.answer_opened(resp)
            self._turns.response_created(fields["response"]["id"])
        elif type_ == "response.done":
            rid = fields["response"]["id"]
            self._spoken.discard(rid)
            self._unpaired.pop(rid, None)
            self._turns.response_done(rid, fields["response"]["status"], fields["response"]["status_details"])
        elif type_ == "conversation.item.input_audio_transcription.completed":
            self._release_done(fields["item_id"])
            self._turns.transcript_final(fields["item_id"])

    def _release_done(self, item_id: str) -> None:
        """A committed item's transcript is known: its held ``conversation.item.done``, with it."""
        if item_id not in self.held_done:
            return
        self.held_done.remove(item_id)
        item = self._history.get(item_id)
        if item is not None:
            prev = self._history.conversation.previous_id(item_id)
            self._write("conversation.item.done", {"previous_item_id": prev, "item": item.render(False)})

    def _audio_delta(self, fields: dict[str, Any], resp: Response | None) -> None:
        """``response.speak`` before an answer's first audio delta ("at most once per response,
        before the first audio delta"), the delta with upstream's metadata, then its one
        transcript delta (the text produced since the last one, maybe none)."""
        rid = fields["response_id"]
        where = {k: fields[k] for k in ("response_id", "item_id", "output_index", "content_index")}
        current = resp is not None and resp.id == rid
        if rid not in self._spoken:
            self._spoken.add(rid)
            meta = {"session_id": self._session_id, "epoch": self._log.epoch, "model_speak": True}
            self._write("response.speak", {**where, "metadata": meta})
            if current:
                self._turns.speaking()
        target = resp if current else self._responses.find(rid)  # (an out-of-band answer's)
        if target is not None:
            self._audio_metadata(target, fields)
        self._write("response.output_audio.delta", fields)
        text = "".join(self._unpaired.pop(rid, ()))
        self._write("response.output_audio_transcript.delta", {**where, "delta": text})

    def _pair_the_rest(self, fields: dict[str, Any], resp: Response | None) -> None:
        """Before ``response.output_audio.done``: text that came after the last audio delta
        goes out with an empty one (the pairing holds, and the transcript deltas add up to
        ``.done``'s transcript); a cancelled answer's is dropped (never spoken)."""
        rid = fields["response_id"]
        if not self._unpaired.get(rid):
            return
        if self._turns.ending == (rid, "cancelled"):
            self._unpaired.pop(rid, None)
            return
        self._audio_delta({**fields, "delta": b""}, resp)

    def _response_metadata(self, type_: str, response: dict[str, Any]) -> dict[str, Any]:
        """ "Tier 2": the raw duplex event under ``response.metadata`` (``duplex_event`` in
        ``response.created``; ``response.done``'s metadata is the event itself, with the
        ledger and whether the whole answer entered the history). The request's own metadata
        keys stay; ``modalities`` goes beside ``output_modalities``."""
        rid = response["id"]
        own = response.get("metadata") or {}
        if "modalities" not in response and "output_modalities" in response:
            response = {**response, "modalities": response["output_modalities"]}  # both spellings, as upstream
        base = {"type": type_, "session_id": self._session_id, "response_id": rid, "epoch": self._log.epoch}
        if type_ == "response.created":
            return {**response, "metadata": {**own, "duplex_event": {**base, "turn_id": self._turns.turn_id}}}
        ledger = self._ledgers.get(rid)
        policy = self._turns.duplex.playback_commit_policy
        committed = (
            ledger is not None
            and response["status"] == "completed"
            and (policy == "commit_all_on_done" or ledger.committed_ms >= ledger.generated_ms)
        )
        playback = ledger.view() if ledger is not None else dict(EMPTY_VIEW)
        return {**response, "metadata": {**own, **base, "committed": committed, "playback": playback}}

    def _audio_metadata(self, resp: Response, fields: dict[str, Any]) -> None:
        """Upstream's audio delta extensions: format, rate, and the metadata of the answer so far."""
        part = resp.part
        assert part is not None
        ledger = self._ledgers.get(resp.id)
        if ledger is not None:
            ledger.sent(part.audio_ms, self._turns.clock())
        fields["format"] = beta_format(resp.output_format)
        fields["sample_rate_hz"] = resp.output_format.rate
        audio_ms = round(part.audio_ms)
        fields["metadata"] = {
            "session_id": self._session_id,
            "epoch": self._log.epoch,
            "model_speak": True,
            "end_of_turn": False,
            "audio_duration_ms": audio_ms,  # cumulative, as upstream's
            "audio_text_marks": [{"text_chars": len(part.transcript or ""), "audio_end_ms": audio_ms}],
            "playback": ledger.view() if ledger is not None else dict(EMPTY_VIEW),
        }
