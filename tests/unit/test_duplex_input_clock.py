"""Input-clocked duplex sessions (``extra_body.clock: "input"``), Sans-I/O: the
acknowledgement contract of the duplex document's newest sibling revision
(``doc.INPUT_CLOCK_REVISION``, "Input-clocked sessions"), on ``DuplexSession`` driven
directly as ``test_duplex_session.py`` drives it. A unit here is a turn (docs/duplex.md,
*Input-clocked sessions*): it completes when its transcript and its answer are out."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from support import upstream_docs as doc
from test_duplex_session import INFO, Driver, loud

from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import DuplexConfig, apply_duplex_update, default_session_config
from gateway.protocol.errors import ProtocolError
from gateway.protocol.session_config import ConfigLimits
from gateway.session.duplex import DuplexSession
from gateway.session.effects import StartResponse
from orchestrator.engine import Finished

ACK = "input_audio_buffer.processed"


def clocked(**duplex: Any) -> Driver:
    return Driver(extra_body={**doc.INPUT_CLOCK, **duplex.pop("extra_body", {})}, **duplex)


def acks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == ACK]


def transcribe(d: Driver, item_id: str, text: str = "hello") -> list[dict[str, Any]]:
    d.session.on_transcription(f"input_{item_id}", Finished(text=text))
    return d.take()


def committed_item(events: list[dict[str, Any]]) -> str:
    return str(next(e for e in events if e["type"] == "input_audio_buffer.committed")["item_id"])


def test_a_session_without_the_clock_is_never_acknowledged() -> None:
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    d.answer(3, finish=True)
    assert ACK not in d.types(d.events) and "input_index" not in d.events[0]["session"]


def test_an_append_is_acknowledged_at_once_in_the_documents_shape() -> None:
    d = clocked()
    assert d.events[0]["session"]["input_index"] == 0 and d.session.duplex.input_clocked
    events = d.append(loud(200))
    assert d.types(events) == ["input_audio_buffer.speech_started", ACK]  # (a manual turn's speech onset)
    ack = events[1]
    assert doc.gaps(doc.INPUT_PROCESSED, ack) == [] and "server_event_seq" in ack
    assert {k: ack[k] for k in ("audio_end_ms", "unit_end_ms", "input_index", "trigger", "units")} == {
        "audio_end_ms": 200, "unit_end_ms": 0, "input_index": 1, "trigger": "input_audio_buffer.append", "units": [],
    }  # fmt: skip
    assert "decision" not in ack and "first_input_index" not in ack
    assert acks(d.append(loud(100)))[0]["audio_end_ms"] == 300


def test_a_commit_is_acknowledged_after_its_transcript_and_its_whole_answer() -> None:
    d = clocked()
    d.append(loud(200))
    events = d.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    item = committed_item(events)
    assert ACK not in d.types(events) and "response.created" in d.types(events)
    assert ACK not in d.types(transcribe(d, item))  # the answer still runs
    d.answer(5)
    assert ACK not in d.types(d.events[-12:])
    rid = d.answer(0, finish=True)
    after_done = d.events[[e["type"] for e in d.events].index("response.done") :]
    assert d.types(after_done) == ["response.done", ACK]  # after every output of the input
    ack = after_done[-1]
    assert (ack["input_index"], ack["trigger"], ack["audio_end_ms"], ack["unit_end_ms"]) == (
        2, "input_audio_buffer.commit", 200, 200,
    )  # fmt: skip
    assert ack["units"] == [{"end_ms": 200, "decision": "speak"}]
    assert rid == d.events[-2]["response"]["id"]


def test_the_answer_may_end_before_the_transcript_the_ack_waits_for_both() -> None:
    d = clocked()
    d.append(loud(200))
    item = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    d.answer(2, finish=True)
    assert len(acks(d.events)) == 1  # the append's
    events = transcribe(d, item)
    assert d.types(events)[-3:] == ["conversation.item.input_audio_transcription.completed",
                                    "conversation.item.done", ACK]  # fmt: skip


def test_every_output_of_an_input_lies_between_the_acks_before_and_after_it() -> None:
    """A lockstep client: each input only after the previous one's acknowledgement. The
    outputs an input caused come after the acknowledgement before it and before its own."""
    d = clocked()
    for turn in range(3):
        d.append(loud(200))
        item = committed_item(d.send({"type": "input_audio_buffer.commit"}))
        transcribe(d, item, f"turn {turn}")
        d.answer(3, finish=True)
    index = [e.get("input_index") for e in d.events if e["type"] == ACK]
    assert index == [1, 2, 3, 4, 5, 6]
    cuts = [i for i, e in enumerate(d.events) if e["type"] == ACK]
    for before, after in zip(cuts[0::2], cuts[1::2], strict=True):  # an append's ack ... its commit's
        between = d.types(d.events[before + 1 : after])
        assert between.count("response.created") == between.count("response.done") == 1


def test_a_commit_during_an_answer_waits_for_its_deferred_answer_and_two_are_one_unit() -> None:
    d = clocked()
    d.append(loud(200))
    first = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    transcribe(d, first)
    d.answer(2)
    d.append(loud(200))  # (index 3: acknowledged in order, after the first commit's)
    second = committed_item(d.send({"type": "input_audio_buffer.commit"}))  # deferred
    d.append(loud(100))
    third = committed_item(d.send({"type": "input_audio_buffer.commit"}))  # deferred too: merged
    transcribe(d, second)
    transcribe(d, third)
    assert [a["input_index"] for a in acks(d.events)] == [1]  # the rest wait for the first answer
    d.answer(0, finish=True)  # the first answer ends; the deferred one starts
    assert [a["input_index"] for a in acks(d.events)] == [1, 2, 3]
    assert acks(d.events)[1]["units"] == [{"end_ms": 200, "decision": "speak"}]
    assert d.session.active_response_id is not None
    done = d.types(d.events).index("response.done")
    assert d.types(d.events)[done + 1 : done + 4] == [ACK, ACK, "response.created"]  # the acks first
    d.answer(2, finish=True)
    last = acks(d.events)[3:]
    assert [a["input_index"] for a in last] == [4, 5, 6]
    assert last[0]["units"] == [{"end_ms": 500, "decision": "speak"}]  # 200 + 100 ms, one unit
    assert [a["units"] for a in last[1:]] == [[], []] and last[-1]["unit_end_ms"] == 500


def test_a_barge_in_settles_the_answer_and_the_deferred_turn_as_cancelled() -> None:
    d = clocked()
    d.append(loud(200))
    first = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    transcribe(d, first)
    d.answer(2)
    d.append(loud(200))
    second = committed_item(d.send({"type": "input_audio_buffer.commit"}))  # deferred behind the answer
    transcribe(d, second)
    events = d.send({"type": "barge_in"})  # not an input the clock acknowledges
    got = acks(events)
    assert [a["input_index"] for a in got] == [2, 3, 4] and d.types(events)[-1] == ACK
    assert got[0]["units"] == [{"end_ms": 200, "decision": "cancelled", "reason": "barge_in"}]
    assert got[2]["units"] == [{"end_ms": 400, "decision": "cancelled", "reason": "barge_in"}]
    assert "response.created" not in d.types(events)


def test_a_refused_append_is_rejected_and_its_audio_not_counted() -> None:
    d = clocked()
    d.append(loud(200))
    events = d.append(loud(100), sample_rate_hz=24000)  # not the session's rate
    assert d.types(events) == ["error", ACK]
    ack = events[1]
    assert (ack["decision"], ack["reason"], ack["audio_end_ms"]) == ("rejected", "unsupported_audio_format", 200)


def test_an_input_that_fails_while_handled_gets_a_plain_ack() -> None:
    d = clocked()
    events = d.send({"type": "input_audio_buffer.commit", "event_id": "empty"})
    assert d.types(events) == ["error", ACK] and "decision" not in events[1]
    assert events[0]["error"]["event_id"] == "empty"


def test_response_create_is_acknowledged_after_its_response_and_a_refused_one_at_once() -> None:
    d = clocked()
    d.send({"type": "response.create", "event_id": "r1", "response": {"modalities": ["text"]}})
    refused = d.send({"type": "response.create", "event_id": "r2"})
    assert d.types(refused) == ["error"]  # the second input waits for the first's acknowledgement
    d.answer(2, finish=True)
    got = acks(d.events)
    assert [(a["input_index"], a["trigger"]) for a in got] == [(1, "response.create"), (2, "response.create")]
    assert got[0]["units"] == [{"end_ms": 0, "decision": "speak"}] and got[1]["units"] == []


def test_a_commit_with_nothing_to_answer_is_a_listen_unit() -> None:
    d = clocked(extra_body={"auto_response": False})
    d.append(loud(200))
    item = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    assert not any(isinstance(e, StartResponse) for e in d.effects)
    got = acks(transcribe(d, item))
    assert got[0]["units"] == [{"end_ms": 200, "decision": "listen"}]
    silence = d.send({"type": "input_audio_buffer.commit", "is_speech": False})  # a silence declaration
    assert d.types(silence) == ["response.listen", ACK] and silence[1]["units"] == []  # no unit: at once
    assert [a["input_index"] for a in acks(d.events)] == [1, 2, 3]


def test_a_teardown_acknowledges_every_owed_input_at_once_before_session_closed() -> None:
    d = clocked()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    d.answer(2)
    d.append(loud(100))
    events = d.send({"type": "session.close"})
    assert d.types(events)[-2:] == [ACK, "session.closed"]
    ack = events[-2]
    assert (ack["first_input_index"], ack["input_index"], ack["audio_end_ms"]) == (2, 3, 300)
    assert ack["units"] == [{"end_ms": 200, "decision": "aborted", "reason": "client_close"}]
    assert "decision" not in ack


def test_the_clock_is_fixed_when_the_session_is_created() -> None:
    d = clocked()
    for extra in ({"clock": None}, {"clock": "wall"}, {"clock": "input", "input_clock_unit_max_s": 120}):
        err = next(e for e in d.send({"type": "session.update", "session": {"extra_body": extra}}))
        assert err["type"] == "error" and err["error"]["code"] == "input_clock_update_unsupported"
    events = d.send({"type": "session.update", "session": {"extra_body": {"auto_response": False}}})
    assert d.types(events) == ["session.updated"]  # extra_body without the clock keeps it
    assert events[0]["session"]["extra_body"]["clock"] == "input" and d.session.duplex.input_clocked
    same = d.send(
        {"type": "session.update", "session": {"extra_body": {"clock": "input", "input_clock_unit_timeout_s": 15}}}
    )
    assert d.types(same) == ["session.updated"]  # the same values (15: the default)
    plain = Driver()  # a session created without it
    err = plain.send({"type": "session.update", "session": {"extra_body": doc.INPUT_CLOCK}})[0]
    assert err["error"]["code"] == "input_clock_update_unsupported" and not plain.session.duplex.input_clocked
    assert err["error"]["code"] in doc.INPUT_CLOCK_ERRORS


@pytest.mark.parametrize("value", [0, -1, "30", True, float("inf")])
@pytest.mark.parametrize("key", ["input_clock_unit_timeout_s", "input_clock_unit_max_s"])
def test_a_bad_clock_timeout_is_refused_when_the_session_is_created(key: str, value: Any) -> None:
    config = default_session_config("m")
    with pytest.raises(ProtocolError) as refused:
        apply_duplex_update(config, DuplexConfig(), {"extra_body": {"clock": "input", key: value}},
                            limits=ConfigLimits())  # fmt: skip
    assert (refused.value.code, refused.value.param) == ("invalid_duplex_runtime_config", f"session.extra_body.{key}")
    apply_duplex_update(config, DuplexConfig(), {"extra_body": {key: value}}, limits=ConfigLimits())  # inert
    apply_duplex_update(config, DuplexConfig(), {"extra_body": {"clock": "input", key: None}}, limits=ConfigLimits())


def test_the_opening_update_makes_the_clock() -> None:
    session = DuplexSession(session_id="s", config=default_session_config("m"), engine=INFO, vad_factory=None)
    session.configure({"extra_body": {"clock": "input", "input_clock_unit_timeout_s": 3}})
    session.start(configured=True)
    created = session.take()[0][0]
    assert (
        created["session"]["input_index"] == 0 and created["session"]["extra_body"]["input_clock_unit_timeout_s"] == 3
    )


def test_the_clock_survives_a_snapshot_mid_turn_and_a_takeover_reissues_into_the_same_unit() -> None:
    d = clocked()
    d.append(loud(200))
    item = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    transcribe(d, item)
    d.answer(3)
    d.session.dirty = False
    assert ACK not in d.types(d.append(loud(100)))  # owed behind the turn: no event, but state
    assert d.session.dirty
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None, wall_clock=lambda: d.now)
    assert again.render_config()["input_index"] == 3
    r = Driver.around(again)
    again.recover("replica_lost")  # the answer died with its replica: ended, and made again
    events = r.take()
    assert ACK not in r.types(events) and "response.created" in r.types(events)
    r.answer(2, finish=True)
    got = acks(r.events)
    assert [a["input_index"] for a in got] == [2, 3] and got[0]["units"] == [{"end_ms": 200, "decision": "speak"}]
    assert got[1]["audio_end_ms"] == 300 and [a["input_index"] for a in acks(r.append(loud(20)))] == [4]


def test_without_reissue_a_turn_lost_with_its_replica_is_aborted() -> None:
    d = clocked()
    d.send({"type": "session.update", "session": {"reissue_interrupted_responses": False}})
    d.append(loud(200))
    item = committed_item(d.send({"type": "input_audio_buffer.commit"}))
    d.answer(3)
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None, wall_clock=lambda: d.now)
    again.recover("replica_lost")  # the transcript failed with it too
    events = Driver.around(again).take()
    assert f"input_{item}" not in {getattr(e, "request_id", None) for e in events}
    got = acks(events)
    assert got[0]["input_index"] == 2
    assert got[0]["units"] == [{"end_ms": 200, "decision": "aborted", "reason": "replica_lost"}]


def test_a_server_vad_turn_is_acknowledged_with_the_append_that_ended_it() -> None:
    d = clocked(vad=True)
    assert acks(d.append(loud(400)))[0]["units"] == []
    events = d.append(bytes(32 * 400))  # silence: the turn ends, committed by the server, answered
    item = committed_item(events)
    assert ACK not in d.types(events)
    transcribe(d, item)
    d.answer(2, finish=True)
    got = acks(d.events)[-1]
    assert got["input_index"] == 2 and got["units"][0]["decision"] == "speak"
    assert 0 < got["unit_end_ms"] <= got["audio_end_ms"] == 800


def test_an_alias_is_acknowledged_as_its_canonical_event() -> None:
    d = clocked(extra_body={"auto_response": False})
    d.append(loud(200))
    item = committed_item(d.send({"type": "input.commit"}))
    assert isinstance(de.decode(orjson.dumps({"type": "input.commit"})), de.Commit)
    assert acks(transcribe(d, item))[0]["trigger"] == "input_audio_buffer.commit"
