"""Each part of the realtime session alone (gateway/session/): the event log, the
history, the input audio, the responses, the playback ledgers and the two
turn-takings, each built with only what it is given (stand-ins for the rest), as
``RealtimeSession`` builds them. The whole session is driven in test_session.py
and test_duplex_session.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.session_driver import TONE, EnergyVad

from gateway.protocol import client_events as ce
from gateway.protocol.duplex_config import DuplexConfig
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import SessionConfig, Transcription, TurnDetection
from gateway.session.conversation import MARK_BYTES, Conversation, Item, Marks, Part
from gateway.session.duplex_turns import DuplexTurns
from gateway.session.effects import Cancel, EndInput, Feed, StartResponse, StartTranscription
from gateway.session.events import EventLog
from gateway.session.history import History
from gateway.session.input import InputAudio
from gateway.session.limits import SessionLimits
from gateway.session.playback import MAX_LEDGERS, Playback
from gateway.session.response import Response
from gateway.session.responses import Responses
from gateway.session.turn_taking import Parts, RealtimeTurns
from orchestrator.engine import AudioChunk, AudioDelta, Finished, TextChunk, TextDelta
from orchestrator.engines.passthrough import PassthroughEngine

INFO = PassthroughEngine().info  # 24 kHz in and out
CONFIG = SessionConfig(model="m", turn_detection=None)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def loud(ms: int) -> bytes:
    """``ms`` of a 200 Hz square wave at 24 kHz (speech to ``EnergyVad``)."""
    t = np.arange(24 * ms)
    return (np.sign(np.sin(2 * np.pi * 200 * t / 24000)) * 3000).astype("<i2").tobytes()


def quiet(ms: int) -> bytes:
    return bytes(48 * ms)


def user_item(item_id: str, text: str = "hi") -> Item:
    return Item(item_id, "user", [Part("input_text", text=text)])


# --- the event log -------------------------------------------------------------------------


def test_the_log_numbers_every_event_and_names_it_from_its_id_base() -> None:
    log = EventLog(lambda item_id: None, lambda: None, id_base="abc")
    log.emit("session.created", session={})
    log.emit("response.output_audio.delta", delta=b"")
    assert [(e["server_event_seq"], e["event_id"]) for e in log.events] == [(1, "event_abc1"), (2, "event_abc2")]
    assert log.seq == 2 and log.new_id("item") == "item_abc0001" and log.new_id("resp") == "resp_abc0002"


def test_the_log_reports_state_changes_and_the_items_they_name_but_not_deltas_or_errors() -> None:
    forgotten: list[str] = []
    changes: list[None] = []
    log = EventLog(forgotten.append, lambda: changes.append(None))
    log.emit("response.output_audio.delta", item_id="a", delta=b"")
    log.error(ProtocolError(Code.INVALID_VALUE, "no", param="x"))
    assert changes == [] and log.take_item_changes() == (set(), set())
    log.emit("conversation.item.retrieved", item={"id": "a"})  # names an item, changes none
    assert log.take_item_changes() == (set(), set())
    log.emit("conversation.item.added", item={"id": "a"})
    log.emit("conversation.item.added", item={"id": "b"})
    log.emit("conversation.item.deleted", item_id="b")
    log.emit("response.done", response={"output": [{"id": "c"}]})
    assert len(changes) == 5 and log.take_item_changes() == ({"a", "c"}, {"b"})
    assert log.take_item_changes() == (set(), set())
    assert forgotten == ["a", "b", "c"]  # each change drops what the conversation cached of the item


def test_the_log_touch_marks_an_item_changed_with_no_event() -> None:
    changes: list[None] = []
    log = EventLog(lambda item_id: None, lambda: changes.append(None))
    item = user_item("a")
    message = item.as_message()
    log.touch(item)
    assert changes == [None] and log.events == [] and log.take_item_changes() == ({"a"}, set())
    assert item.as_message() is not message  # made again: the item changed


def test_the_logs_error_event_has_the_sdk_shape() -> None:
    log = EventLog(lambda item_id: None, lambda: None)
    log.fail(Code.ITEM_NOT_FOUND, "gone", "evt_1", param="item_id")
    (event,) = log.events
    assert event["error"] == {
        "type": "invalid_request_error",
        "code": Code.ITEM_NOT_FOUND,
        "message": "gone",
        "param": "item_id",
        "event_id": "evt_1",
    }


def test_take_hands_over_what_is_pending_and_keeps_the_same_lists() -> None:
    log = EventLog(lambda item_id: None, lambda: None)
    events, effects = log.events, log.effects
    log.emit("session.created", session={})
    log.effects.append(Cancel("r"))
    out, eff = log.take()
    assert types(out) == ["session.created"] and eff == [Cancel("r")]
    assert log.events is events and log.effects is effects and events == [] and effects == []


def test_a_spelling_sees_every_emitted_event_and_writes_what_is_sent() -> None:
    log = EventLog(lambda item_id: None, lambda: None)
    seen: list[str] = []

    def spell(type_: str, fields: dict[str, Any]) -> None:
        seen.append(type_)
        if type_ != "held":
            log.write(type_, {**fields, "spelled": True})

    log.spell = spell
    log.emit("held")
    log.emit("response.output_text.delta", delta="x")
    assert seen == ["held", "response.output_text.delta"]
    assert [(e["type"], e["server_event_seq"], e["spelled"]) for e in log.events] == [
        ("response.output_text.delta", 1, True)
    ]


# --- the history ---------------------------------------------------------------------------


def history(limits: SessionLimits, keep: Any = lambda item: False) -> tuple[History, EventLog]:
    conversation = Conversation()
    log = EventLog(conversation.forget, lambda: None)
    return History(conversation, limits, log.emit, keep), log


def test_history_insert_returns_the_previous_item_and_evicts_the_oldest_past_max_items() -> None:
    h, log = history(SessionLimits(max_items=2))
    assert h.insert(user_item("a"), None) is None
    assert h.insert(user_item("b"), None) == "a"
    assert h.insert(user_item("c"), "a") == "a"  # after a
    assert [it.id for it in h.conversation] == ["c", "b"]
    assert [(e["type"], e["item_id"]) for e in log.events] == [("conversation.item.deleted", "a")]
    assert h.insert(user_item("first"), "root") is None  # the oldest itself: never evicted on insert
    assert [it.id for it in h.conversation] == ["first", "c", "b"] and len(log.events) == 1


def test_history_counts_an_item_again_when_it_changes_and_deletes_at_the_next_insert() -> None:
    h, log = history(SessionLimits(max_conversation_bytes=10))
    first = user_item("a", "12345")
    h.insert(first, None)
    first.content[0].text = "1234567890"  # grown (as an answer's transcript grows): not yet announced
    h.insert(user_item("b", "12345"), None)
    assert log.events == [] and len(h) == 2  # counted as added: 5 + 5
    h.changed("a")  # an event said it changed: 10 + 5, over; nothing deleted mid-event
    assert log.events == [] and len(h) == 2
    h.insert(user_item("c", "1"), None)  # the next insert deletes the oldest
    assert [e["item_id"] for e in log.events] == ["a"] and [it.id for it in h.conversation] == ["b", "c"]
    h.remove("b")
    h.insert(user_item("d", "123456789"), None)  # b's bytes were given back
    assert [e["item_id"] for e in log.events] == ["a"]
    h.changed("gone")  # (an item no longer in the conversation: nothing to count)


def test_an_answers_marks_count_in_the_conversations_bytes() -> None:
    part = answer_part(200)  # 10 marks, "w0 w1 ... w9 "
    item = Item("i", "assistant", [part])
    assert item.counted_bytes() == len(part.transcript or "") + 10 * MARK_BYTES


def test_marks_keep_the_text_heard_before_a_cut_and_pack_one_per_offset() -> None:
    marks = Marks()
    marks.add(0.0, 3)
    marks.add(0.0, 5)  # more text at the same offset: replaces the mark
    marks.add(20.0, 8)
    marks.add(40.0, 12)
    assert list(marks) == [(0.0, 5), (20.0, 8), (40.0, 12)] and len(marks) == 3
    assert [marks.kept_before(ms) for ms in (0, 1, 20, 21, 40, 41, 1e9)] == [0, 5, 5, 8, 8, 12, 12]
    assert list(marks.upto(8)) == [(0.0, 5), (20.0, 8)]
    assert Marks(iter(marks.to_list())) == marks and marks.copy() == marks and marks.copy() is not marks
    assert marks != Marks([(0.0, 5)])
    # The same cut as the (offset, length) tuples it replaces, 12 bytes a mark:
    big = Marks((float(i * 20), i * 4 + 4) for i in range(1_000))
    assert big.kept_before(10_001) == 2004 and len(big.upto(2004)) == 501  # offsets 0..10 000
    assert sum(a.itemsize for a in (big._ms, big._chars)) == MARK_BYTES


def test_history_never_evicts_the_item_being_added_nor_one_it_must_keep() -> None:
    kept = user_item("kept")
    h, log = history(SessionLimits(max_items=1), keep=lambda item: item is kept)
    h.insert(kept, None)
    h.insert(user_item("b"), None)
    assert log.events == [] and len(h) == 2
    h2, log2 = history(SessionLimits(max_conversation_bytes=1))
    h2.insert(user_item("big", "far more than one byte"), None)
    assert log2.events == [] and len(h2) == 1


def test_history_restores_items_without_limits_or_events() -> None:
    h, log = history(SessionLimits(max_items=1))
    h.restore([user_item("a"), user_item("b")], "conv_x")
    assert h.id == "conv_x" and [it.id for it in h.conversation] == ["a", "b"] and log.events == []


# --- the input audio -----------------------------------------------------------------------


class Turns:
    """A turn-taking that records what input audio asks of it and commits as the GA one does."""

    reports_transcripts = False

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.input: InputAudio | None = None

    def speech_during_response(self) -> None:
        self.calls.append("speech_during_response")

    def commit_turn(self, event_id: str | None) -> bool:
        assert self.input is not None
        done = self.input.commit(event_id, manual=False)
        self.calls.append(("commit_turn", done))
        return done

    def answer(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None) -> None:
        self.calls.append(("answer", turn_started_at))


def audio_input(
    config: SessionConfig = CONFIG, *, responding: bool = False, vad: bool = False
) -> tuple[InputAudio, EventLog, Turns, list[tuple[str, str]]]:
    conversation = Conversation()
    log = EventLog(conversation.forget, lambda: None)
    turns, transcribed = Turns(), []
    part = InputAudio(
        log,
        History(conversation, SessionLimits(), log.emit, lambda item: False),
        turns,
        engine=INFO,
        limits=SessionLimits(),
        beta=False,
        config=config,
        responding=lambda: responding,
        transcribed=lambda item_id, text: transcribed.append((item_id, text)),
        vad_factory=EnergyVad if vad else None,
        clock=lambda: 7.0,
    )
    turns.input = part
    return part, log, turns, transcribed


def test_input_streams_appends_into_one_transcription_and_a_commit_makes_the_user_item() -> None:
    part, log, _, _ = audio_input()
    part.append(TONE, None)
    part.append(TONE, None)
    assert part.is_open and not part.can_commit and part.audio_ms == 40
    assert [type(e) for e in log.effects] == [StartTranscription, Feed, Feed]
    rid = log.effects[0].request.request_id  # type: ignore[union-attr]
    with pytest.raises(ProtocolError) as refused:
        part.commit("evt_1", manual=True)
    assert refused.value.code == Code.BUFFER_TOO_SMALL
    for _ in range(3):
        part.append(TONE, None)
    log.take()
    assert part.commit("evt_2", manual=True)
    events, effects = log.take()
    assert types(events) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert effects[-1] == EndInput(rid) and not part.is_open


def test_input_a_vad_commit_of_too_little_audio_is_dropped_silently() -> None:
    part, log, _, _ = audio_input()
    part.append(TONE, None)
    rid = log.effects[0].request.request_id  # type: ignore[union-attr]
    assert part.commit(None, manual=False) is False
    assert log.events == [] and log.effects[-1] == Cancel(rid) and not part.is_open


def test_input_server_vad_leaves_commit_and_answer_to_the_turn_taking() -> None:
    part, log, turns, _ = audio_input(replace_td(TurnDetection(silence_duration_ms=200)), vad=True)
    part.append(quiet(100), None)
    part.append(loud(400), None)
    assert "input_audio_buffer.speech_started" in types(log.events) and turns.calls == []
    part.append(quiet(400), None)
    assert turns.calls == [("commit_turn", True), ("answer", 7.0)]
    assert types(log.events)[-4:] == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]


def test_input_speech_over_a_running_answer_is_the_turn_takings_to_decide() -> None:
    td = replace_td(TurnDetection(silence_duration_ms=200))
    idle, _, idle_turns, _ = audio_input(td, vad=True)
    busy, _, busy_turns, _ = audio_input(td, vad=True, responding=True)
    for part in (idle, busy):
        part.append(loud(300), None)
    assert idle_turns.calls == [] and busy_turns.calls == ["speech_during_response"]


def test_input_holds_transcript_deltas_until_the_item_is_announced_and_reports_the_final_text() -> None:
    part, log, _, transcribed = audio_input(
        SessionConfig(model="m", turn_detection=None, transcription=Transcription())
    )
    for _ in range(5):
        part.append(TONE, None)
    rid = log.effects[0].request.request_id  # type: ignore[union-attr]
    part.on_transcription(rid, TextDelta("hel"))
    assert log.events == []  # manual turns: no item id to name yet
    part.commit(None, manual=True)
    item_id = log.events[0]["item_id"]
    assert log.events[-1]["type"] == "conversation.item.input_audio_transcription.delta"
    part.on_transcription(rid, Finished(text="hello"))
    assert log.events[-1]["type"] == "conversation.item.input_audio_transcription.completed"
    assert transcribed == [(item_id, "hello")]


def test_input_idle_timeout_counts_from_when_the_answer_has_played() -> None:
    part, log, turns, _ = audio_input(replace_td(TurnDetection(idle_timeout_ms=1000)), vad=True)
    part.append(quiet(500), None)
    part.arm_idle(played_ms=300)  # the answer's audio plays until 800 ms
    part.append(quiet(1000), None)
    assert "input_audio_buffer.timeout_triggered" not in types(log.events)
    part.append(quiet(400), None)
    assert types(log.events)[0] == "input_audio_buffer.timeout_triggered" and turns.calls == [("answer", 7.0)]


def test_input_transcribes_a_created_items_audio_and_shutdown_cancels_every_request() -> None:
    part, log, _, _ = audio_input()
    item = Item("it", "user", [Part("input_audio")])
    part.transcribe_item(item, TONE)
    assert item.pending_transcription
    assert [type(e) for e in log.effects] == [StartTranscription, Feed, EndInput]
    assert isinstance(log.effects[1], Feed) and log.effects[1].chunk == AudioChunk(TONE)  # 24 kHz in and out
    part.append(TONE, None)
    start = log.effects[3]
    assert isinstance(start, StartTranscription)
    log.take()
    part.shutdown()
    assert log.effects == [Cancel(start.request.request_id), Cancel("input_it")] and not part.is_open


def replace_td(td: TurnDetection) -> SessionConfig:
    return SessionConfig(model="m", turn_detection=td)


# --- the responses ---------------------------------------------------------------------------


class Ends:
    """A turn-taking that records the conversation's answer's ends, with the events before each."""

    message_named_by_response = False

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.calls: list[tuple[str, str, list[str]]] = []

    def answer_ending(self, resp: Response, status: str) -> None:
        self.calls.append(("ending", status, types(self.log.events)))

    def answer_ended(self, resp: Response, status: str) -> None:
        self.calls.append(("ended", status, types(self.log.events)))


def responses(*items: Item) -> tuple[Responses, EventLog, Ends, list[float]]:
    conversation = Conversation()
    log = EventLog(conversation.forget, lambda: None)
    hist = History(conversation, SessionLimits(), log.emit, lambda item: False)
    for item in items:
        hist.insert(item, None)
    ends, answered = Ends(log), []
    part = Responses(
        log,
        hist,
        ends,
        engine=INFO,
        limits=SessionLimits(),
        beta=False,
        config=CONFIG,
        lazy_message=True,
        make_item=lambda spec, param: user_item("made"),
        answered=answered.append,
    )
    return part, log, ends, answered


def test_a_response_is_created_with_its_message_and_its_engine_request() -> None:
    part, log, _, _ = responses(user_item("a"))
    part.create(ce.ResponseParams(), "evt_1", turn_started_at=3.0)
    assert types(log.events) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    start, end = log.effects
    assert isinstance(start, StartResponse) and start.turn_started_at == 3.0
    assert [m.text for m in start.request.messages] == ["hi"] and end == EndInput(start.request.request_id)
    assert part.answering() and part.current is not None and part.writes(part.current.outputs[0])


def test_one_audio_delta_out_is_one_event() -> None:
    part, log, _, _ = responses()
    part.create(ce.ResponseParams(), None)
    assert part.current is not None
    rid, item_id = part.current.id, part.current.outputs[0].id
    log.take()
    part.on_output(rid, AudioDelta(TONE))
    (event,) = log.events
    assert {k: v for k, v in event.items() if k not in ("event_id", "server_event_seq", "delta")} == {
        "type": "response.output_audio.delta",
        "response_id": rid,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
    }
    assert event["delta"] == TONE and part.audio_out_ms == 20


def test_the_conversations_answer_ends_between_the_turn_takings_two_hooks() -> None:
    part, log, ends, answered = responses()
    part.create(ce.ResponseParams(), None)
    assert part.current is not None
    rid = part.current.id
    log.take()
    part.on_output(rid, TextDelta("w0 "))
    part.on_output(rid, AudioDelta(TONE))
    part.on_output(rid, Finished())
    assert [(c[0], c[1]) for c in ends.calls] == [("ending", "completed"), ("ended", "completed")]
    assert "response.output_audio.done" not in ends.calls[0][2] and ends.calls[1][2][-1] == "response.done"
    assert answered == [20.0] and part.current is None  # 20 ms left for the client to play


def test_an_out_of_band_response_runs_beside_the_conversations_unannounced_to_the_turn_taking() -> None:
    part, log, ends, answered = responses()
    part.create(ce.ResponseParams(conversation="none"), None)
    (oob,) = part.out_of_band
    assert part.current is None and log.events[0]["response"]["conversation_id"] is None
    part.on_output(oob.id, Finished())
    assert ends.calls == [] and answered == [] and part.out_of_band == []


def test_cancel_ends_the_named_response_or_refuses() -> None:
    part, log, _, _ = responses()
    with pytest.raises(ProtocolError) as refused:
        part.cancel(None)
    assert refused.value.code == Code.RESPONSE_NOT_ACTIVE
    part.create(ce.ResponseParams(), None)
    assert part.current is not None
    rid = part.current.id
    part.cancel(rid)
    assert Cancel(rid) in log.effects and log.events[-1]["response"]["status"] == "cancelled"


def test_a_response_waiting_for_a_transcript_is_fed_it_when_it_is_final() -> None:
    pending = Item("u", "user", [Part("input_audio")], pending_transcription=True)
    part, log, _, _ = responses(pending)
    part.create(ce.ResponseParams(), None)
    assert part.current is not None
    rid = part.current.id
    assert EndInput(rid) not in log.effects  # its input is not complete yet
    part.transcribed("u", "hello")
    assert log.effects[-2:] == [Feed(rid, TextChunk("hello")), EndInput(rid)]


def test_shutdown_cancels_every_running_response() -> None:
    part, log, _, _ = responses()
    part.create(ce.ResponseParams(), None)
    part.create(ce.ResponseParams(conversation="none"), None)
    ids = [r.id for r in part.running()]
    log.take()
    part.shutdown()
    assert log.effects == [Cancel(i) for i in ids] and part.running() == []


# --- the playback ledgers ----------------------------------------------------------------------


def test_playback_keeps_the_last_ledgers_and_finds_the_one_an_ack_names() -> None:
    p = Playback()
    with pytest.raises(ProtocolError) as none:
        p.find(None, None)
    assert none.value.code == Code.ITEM_NOT_FOUND
    for i in range(MAX_LEDGERS + 1):
        p.open(f"r{i}", f"i{i}")
    assert len(p.ledgers) == MAX_LEDGERS and "r0" not in p.ledgers
    assert p.find("r3", None).item_id == "i3" and p.find(None, "i5").response_id == "r5"
    assert p.find(None, None).response_id == f"r{MAX_LEDGERS}"


def answer_part(ms: float) -> Part:
    part = Part("output_audio", transcript="")
    for i in range(int(ms // 20)):
        part.transcript = (part.transcript or "") + f"w{i} "
        part.marks.add(part.audio_ms, len(part.transcript))
        part.audio_ms += 20
    return part


def test_playback_cuts_a_cancelled_answer_back_to_what_was_heard_once_acknowledged() -> None:
    p = Playback()
    unheard, heard = answer_part(100), answer_part(100)
    p.open("r0", "i0")
    p.answer_ending("r0", unheard, "cancelled", "commit_all_on_done")
    assert unheard.audio_ms == 100  # never acknowledged: kept whole
    ledger = p.open("r1", "i1")
    ledger.capture(heard)
    ledger.ack(45, None, truncate=False)
    p.answer_ending("r1", heard, "cancelled", "commit_all_on_done")
    p.answer_ended("r1", heard, "cancelled", "commit_all_on_done")
    assert heard.audio_ms == 45 and heard.transcript == "w0 w1 w2 " and ledger.done


def test_playback_ack_only_keeps_only_what_is_acknowledged_of_a_completed_answer() -> None:
    p = Playback()
    part = answer_part(100)
    p.open("r", "i")
    p.answer_ending("r", part, "completed", "ack_only")
    p.answer_ended("r", part, "completed", "ack_only")
    assert part.audio_ms == 0 and part.transcript == ""
    assert p.view() == {"generated_ms": 100, "sent_ms": 100, "played_ms": 0, "committed_ms": 0}


# --- the turn-takings -------------------------------------------------------------------------------


def session_parts(turns: Any, config: SessionConfig) -> Parts:
    """The parts as ``RealtimeSession`` wires them, steered by ``turns``."""
    conversation = Conversation()
    log = EventLog(conversation.forget, lambda: None)
    hist = History(conversation, SessionLimits(), log.emit, lambda item: False)
    common = {"engine": INFO, "limits": SessionLimits(), "beta": False, "config": config}
    resp = Responses(
        log,
        hist,
        turns,
        lazy_message=turns.lazy_message,
        make_item=lambda spec, param: user_item("x"),
        answered=lambda ms: None,
        **common,
    )
    inp = InputAudio(
        log, hist, turns, responding=resp.answering, transcribed=resp.transcribed, vad_factory=EnergyVad, **common
    )
    parts = Parts(log, hist, inp, resp)
    turns.bind(parts, config)
    log.spell = turns.spelling
    return parts


@pytest.mark.parametrize("interrupt", [True, False])
def test_realtime_turns_barge_in_on_speech_only_with_interrupt_response(interrupt: bool) -> None:
    config = SessionConfig(model="m", turn_detection=TurnDetection(interrupt_response=interrupt))
    parts = session_parts(RealtimeTurns(), config)
    parts.responses.create(ce.ResponseParams(), None)
    parts.input.append(loud(300), None)
    assert parts.responses.answering() is not interrupt
    assert parts.log.epoch == (1 if interrupt else 0)


def test_duplex_turns_spell_a_commit_as_upstream_fans_it_out() -> None:
    parts = session_parts(DuplexTurns("s", DuplexConfig()), SessionConfig(model="m", turn_detection=None))
    for _ in range(5):
        parts.input.append(TONE, None)
    parts.input.commit(None, manual=True)
    # (conversation.item.done follows the transcript: test_duplex_session.py)
    assert types(parts.log.events) == [
        "conversation.item.added",
        "conversation.item.created",
        "input_audio_buffer.committed",
    ]
    committed = parts.log.events[2]
    assert committed["event"]["type"] == "input.committed" and committed["event"]["turn_id"] == 1
    assert [e["server_event_seq"] for e in parts.log.events] == [1, 2, 3]


def test_duplex_turns_announce_an_answer_once_before_its_first_audio_and_pair_its_transcript() -> None:
    turns = DuplexTurns("s", DuplexConfig())
    parts = session_parts(turns, SessionConfig(model="m", turn_detection=None))
    turns.answer(ce.ResponseParams(), None)
    assert turns.turn_state == "assistant_generating" and turns.playback.latest() is not None
    current = parts.responses.current
    assert current is not None
    parts.log.take()
    for _ in range(2):
        parts.responses.on_output(current.id, TextDelta("w "))
        parts.responses.on_output(current.id, AudioDelta(TONE))
    # speak before the first audio delta; then each audio delta and its one transcript delta
    assert (
        types(parts.log.events)
        == ["response.speak"]
        + [
            "response.output_audio.delta",
            "response.output_audio_transcript.delta",
        ]
        * 2
    )
    assert [e["delta"] for e in parts.log.events[2::2]] == ["w ", "w "]
    audio = parts.log.events[-2]
    assert audio["metadata"]["audio_duration_ms"] == 40 and audio["sample_rate_hz"] == 24000
    assert turns.turn_state == "assistant_playing"


def test_duplex_turns_answer_a_turn_committed_during_an_answer_after_it() -> None:
    turns = DuplexTurns("s", DuplexConfig())
    parts = session_parts(turns, SessionConfig(model="m", turn_detection=None))
    turns.answer(ce.ResponseParams(), None)
    first = parts.responses.current
    assert first is not None
    turns.answer(ce.ResponseParams(), None)  # the session's own answer: owed, not refused
    assert parts.responses.current is first
    parts.responses.on_output(first.id, Finished())
    second = parts.responses.current
    assert second is not None and second is not first and turns.response_turn == 0
