"""GPT-Live delegation on the Sans-I/O session, both kinds: the built-in ``delegate``
function offered to an engine that calls functions, a call of it becoming
``session.delegation.created`` (and nothing of the call reaching the client), the
automatic acknowledgement, appends naming the delegation, and the Responses backend's
conversation: the requests the session asks the host to run (``RunResponses``), their
events as ``response.event``, the result said, function calls answered by the client,
failures as coded errors, a snapshot taken and restored.

The engine here is scripted: the test feeds the outputs a model that calls functions
would make (the vLLM tests make them for real); the speech detector is an energy one
(``EnergyVad``). Every event is checked as a Live client receives it against the SDK's
models (``check_live_event``)."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
import pytest
from support.sdk_shapes import check_live_event
from support.session_driver import EnergyVad

from gateway.protocol import live_events as le
from gateway.protocol.session_config import SessionConfig
from gateway.session.effects import Cancel, RunResponses, StartResponse, StartTranscription, Wake
from gateway.session.live import LiveSession
from gateway.session.live_delegation import (
    ACK_SAY,
    DELEGATE,
    MAX_QUEUED,
    slim,
)
from orchestrator.engine import AudioDelta, EngineInfo, Finished, TextDelta, ToolCallDelta

CALLS = EngineInfo(name="scripted", description="scripted outputs of a model that calls functions",
                   input_sample_rate=24000, output_sample_rate=24000, voices=("v",), default_voice="v")  # fmt: skip
NO_CALLS = replace(CALLS, ignored_fields=("tools", "tool_choice", "parallel_tool_calls"))
RATE = 24000
RESPONSES = {
    "type": "responses",
    "responses": {
        "model": "tiny",
        "instructions": "Be exact.",
        "max_output_tokens": 40,
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}],
    },
}


def tone(ms: int, amplitude: float = 8000.0) -> bytes:
    t = np.arange(RATE * ms // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()


class Live:
    """A Live session driven as the host drives it; every event checked as the client reads it."""

    def __init__(self, delegation: dict[str, Any] | None = None, engine: EngineInfo = CALLS, backend: bool = True):
        self.session = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=engine,
                                   vad_factory=EnergyVad, responses_backend=backend)  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.effects: list[Any] = []
        start: dict[str, Any] = {"model": "gpt-live-1"}
        if delegation is not None:
            start["delegation"] = delegation
        self.session.configure(start)
        self.session.start(event_id="start")
        self.take()

    def take(self) -> tuple[list[dict[str, Any]], list[Any]]:
        events, effects = self.session.take()
        for event in events:
            check_live_event(orjson.loads(le.encode(event)))
        self.events += events
        self.effects += effects
        return events, effects

    def send(self, event: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        self.session.handle(le.decode(orjson.dumps(event)))
        return self.take()

    def error(self, event: dict[str, Any]) -> dict[str, Any]:
        events, _ = self.send(event)
        assert [e["type"] for e in events] == ["error"], events
        return events[0]["error"]

    def turn(self, heard: str = "what is the weather in Paris") -> StartResponse:
        """The user speaks and stops: the model's answer starts (its request, as the engine gets it)."""
        effects: list[Any] = []
        for pcm in (tone(400), bytes(RATE * 2)):  # 400 ms of speech, then 1 s of silence
            for at in range(0, len(pcm), 960):
                effects += self.send({"type": "session.input_audio.append",
                                      "audio": base64.b64encode(pcm[at : at + 960]).decode()})[1]  # fmt: skip
        transcription = next(e for e in effects if isinstance(e, StartTranscription)).request.request_id
        self.session.on_transcription(transcription, Finished(text=heard))
        self.take()
        return next(e for e in effects if isinstance(e, StartResponse))

    def answer(self, rid: str, *outputs: Any) -> tuple[list[dict[str, Any]], list[Any]]:
        for out in outputs:
            self.session.on_response(rid, out)
        return self.take()

    def delegates(self, task: str = "Find the weather in Paris", *, said: str = "") -> tuple[list[Any], list[Any]]:
        """A turn whose answer calls ``delegate`` (after saying ``said``, if anything)."""
        rid = self.turn().request.request_id
        outputs: list[Any] = [TextDelta(said), AudioDelta(tone(100, 100))] if said else []
        args = orjson.dumps({"task": task}).decode()
        return self.answer(rid, *outputs, ToolCallDelta(0, args, call_id="call_1", name=DELEGATE), Finished())

    def backend(self, request_id: str, *events: dict[str, Any], failure: tuple[str, str] | None = None,
                end: bool = True) -> tuple[list[dict[str, Any]], list[Any]]:  # fmt: skip
        for event in events:
            self.session.backend_event(request_id, event)
        if end:
            self.session.backend_ended(request_id, failure)
        return self.take()


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def runs(effects: list[Any]) -> list[RunResponses]:
    return [e for e in effects if isinstance(e, RunResponses)]


def said(effects: list[Any]) -> list[str | None]:
    return [e.request.say for e in effects if isinstance(e, StartResponse)]


def text_response(text: str, rid: str = "resp_1") -> list[dict[str, Any]]:
    """The stream of a Responses answer that says ``text`` (OpenAI's documented event shapes)."""
    snapshot = {
        "id": rid,
        "object": "response",
        "status": "in_progress",
        "instructions": "Be exact.",
        "input": [{"role": "user"}],
        "tools": [{"type": "function", "name": "lookup"}],
        "output": [],
    }
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return [
        {"type": "response.created", "sequence_number": 0, "response": snapshot},
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": message},
        {
            "type": "response.completed",
            "sequence_number": 3,
            "response": {**snapshot, "status": "completed", "output": [message]},
        },
    ]


def call_response(call_id: str = "call_9", rid: str = "resp_2") -> list[dict[str, Any]]:
    """The stream of a Responses answer that calls the client's function ``lookup``."""
    call = {"id": "fc_1", "type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}",
            "status": "completed"}  # fmt: skip
    snapshot = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    return [
        {"type": "response.created", "response": snapshot},
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {"type": "response.completed", "response": {**snapshot, "status": "completed", "output": [call]}},
    ]


# --- the delegate function -------------------------------------------------------------------


def test_an_engine_that_calls_functions_is_offered_delegate_and_one_that_cannot_is_not() -> None:
    tools = Live().turn().request.tools
    assert [t.name for t in tools] == [DELEGATE]
    assert tools[0].parameters["required"] == ["task"] and "task" in tools[0].parameters["properties"]
    assert len(tools[0].description) > 100  # it says when to call it
    assert Live(engine=NO_CALLS).turn().request.tools == ()
    assert Live({"type": "responses", "responses": {"model": "m"}}).turn().request.tools[0].name == DELEGATE


def test_a_delegate_call_becomes_delegation_created_and_nothing_of_the_call_reaches_the_client() -> None:
    live = Live()
    events, effects = live.delegates()
    created = of(events, "session.delegation.created")
    assert len(created) == 1, [e["type"] for e in events]
    delegation = created[0]["delegation"]
    assert delegation["type"] == "delegation" and delegation["target"] == "client"
    assert created[0]["offset_ms"] == live.session.spelling.timeline_ms()
    assert live.session.delegations == {delegation["id"]: "client"}
    # The call is no tool call to the Live client: only Live events went out.
    assert all(e["type"].startswith(("session.", "error", "info")) for e in live.events), live.events
    # The model reads that the task is handed off (the call's output in its conversation).
    outputs = [it for it in live.session.conversation if it.type == "function_call_output"]
    assert len(outputs) == 1 and delegation["id"] in outputs[0].output and outputs[0].call_id == "call_1"
    assert Wake(0.0, f"ack:{delegation['id']}") in effects  # acknowledgement_delay_ms: 0 by default
    assert not runs(effects)  # client delegation: the application does the work


def test_the_application_answers_with_appends_naming_the_delegation() -> None:
    live = Live()
    live.delegates()
    (delegation_id,) = live.session.delegations
    events, _ = live.send({"type": "session.thinking.append", "event_id": "t", "content": "Looking it up.",
                           "delegation_id": delegation_id})  # fmt: skip
    assert of(events, "session.thinking.appended")[0]["client_event_id"] == "t"
    _, effects = live.send({"type": "session.commentary.append", "content": "It is sunny in Paris.",
                            "delegation_id": delegation_id})  # fmt: skip
    assert said(effects) == ["It is sunny in Paris."]
    err = live.error({"type": "session.thinking.append", "content": "x", "delegation_id": "deleg_other"})
    assert (err["code"], err["param"]) == ("delegation_not_found", "delegation_id")


@pytest.mark.parametrize("arguments", ['{"task": ""}', '{"city": "Paris"}', '{"task": "Find', "[1]"])
def test_a_call_without_a_task_delegates_nothing_and_the_model_is_told_why(arguments: str) -> None:
    live = Live()
    rid = live.turn().request.request_id
    events, effects = live.answer(rid, ToolCallDelta(0, arguments, call_id="c", name=DELEGATE), Finished())
    assert not of(events, "session.delegation.created") and not live.session.delegations
    assert not [e for e in effects if isinstance(e, Wake)]
    (output,) = [it for it in live.session.conversation if it.type == "function_call_output"]
    assert output.output.startswith("Not delegated") and "task" in output.output


# --- the acknowledgement ---------------------------------------------------------------------


def test_the_acknowledgement_is_said_when_due_and_delegates_nothing() -> None:
    live = Live()
    live.delegates()
    (delegation_id,) = live.session.delegations
    live.session.wake(f"ack:{delegation_id}")
    _, effects = live.take()
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    assert start.request.say == ACK_SAY and start.request.tools == ()
    assert "working on" in start.request.instructions
    live.session.wake(f"ack:{delegation_id}")  # (once)
    assert not live.take()[1]


def test_thinking_or_commentary_appended_first_drops_every_acknowledgement_due() -> None:
    live = Live({"type": "client", "acknowledgement_delay_ms": 400})
    _, effects = live.delegates()
    (delegation_id,) = live.session.delegations
    assert Wake(0.4, f"ack:{delegation_id}") in effects
    live.send({"type": "session.thinking.append", "content": "Checking.", "delegation_id": delegation_id})
    live.session.wake(f"ack:{delegation_id}")
    assert not [e for e in live.take()[1] if isinstance(e, StartResponse)]


def test_an_answer_that_spoke_as_it_delegated_is_not_acknowledged_again() -> None:
    live = Live()
    _, effects = live.delegates(said="Let me check that.")
    assert of(live.events, "session.delegation.created")
    assert not [e for e in effects if isinstance(e, Wake) and e.key.startswith("ack:")]


def test_an_acknowledgement_due_while_the_user_speaks_is_dropped() -> None:
    live = Live()
    live.delegates()
    (delegation_id,) = live.session.delegations
    live.send({"type": "session.input_audio.append", "audio": base64.b64encode(tone(400)).decode()})
    live.session.wake(f"ack:{delegation_id}")
    assert not [e for e in live.take()[1] if isinstance(e, StartResponse)]


# --- Responses delegation ----------------------------------------------------------------------


def test_a_task_delegated_to_responses_runs_there_with_the_dialogue_and_the_settings() -> None:
    live = Live(RESPONSES)
    events, effects = live.delegates("Find the weather in Paris")
    (created,) = of(events, "session.delegation.created")
    assert created["delegation"]["target"] == "responses"
    (run,) = runs(effects)
    body = run.body
    assert (body["model"], body["instructions"], body["max_output_tokens"]) == ("tiny", "Be exact.", 40)
    assert body["tools"] == RESPONSES["responses"]["tools"] and body["stream"] is True and body["store"] is False
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        for text in ("what is the weather in Paris", "Find the weather in Paris")
    ]


def test_its_events_go_out_as_response_event_slimmed_and_its_text_is_said() -> None:
    live = Live(RESPONSES)
    _, effects = live.delegates()
    (delegation_id,) = live.session.delegations
    (run,) = runs(effects)
    events, effects = live.backend(run.request_id, *text_response("It is sunny, 21 degrees."))
    forwarded = of(events, "response.event")
    assert [e["event"]["type"] for e in forwarded] == ["response.created", "response.output_text.delta",
                                                       "response.output_item.done", "response.completed"]  # fmt: skip
    assert all(e["delegation_id"] == delegation_id for e in forwarded)
    snapshot = forwarded[0]["event"]["response"]
    assert "input" not in snapshot and snapshot["instructions"] is None and snapshot["tools"] == []
    assert (
        forwarded[3]["event"]["response"]["output"] == [] and forwarded[3]["event"]["response"]["status"] == "completed"
    )
    assert forwarded[1]["event"] == text_response("x")[1] | {"delta": "It is sunny, 21 degrees."}  # as it came
    assert said(effects) == ["It is sunny, 21 degrees."]
    # The backend's answer is in its conversation for the next request.
    assert live.session._delegations.items[-1] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "It is sunny, 21 degrees."}],
    }


def test_the_result_waits_for_the_answer_under_way_then_is_said() -> None:
    live = Live(RESPONSES)
    _, effects = live.delegates()
    (delegation_id,) = live.session.delegations
    (run,) = runs(effects)
    live.session.wake(f"ack:{delegation_id}")
    _, effects = live.take()
    ack = next(e for e in effects if isinstance(e, StartResponse)).request
    assert ack.say == ACK_SAY
    _, effects = live.backend(run.request_id, *text_response("Sunny."))
    assert said(effects) == []  # the acknowledgement is being said
    _, effects = live.answer(ack.request_id, TextDelta("One moment."), AudioDelta(tone(100, 100)), Finished())
    assert said(effects) == ["Sunny."]


def test_the_client_runs_a_task_with_item_create_and_response_create() -> None:
    live = Live(RESPONSES)
    events, _ = live.send(
        {
            "type": "response.item.create",
            "event_id": "i",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Summarise my order."}],
            },
        }
    )
    assert events == []  # (the API acknowledges no item)
    _, effects = live.send({"type": "response.create", "event_id": "go"})
    (run,) = runs(effects)
    assert run.body["input"][-1]["content"][0]["text"] == "Summarise my order."
    events, effects = live.backend(run.request_id, *text_response("Two books, shipped."))
    forwarded = of(events, "response.event")
    assert all("delegation_id" not in e and e["client_event_id"] == "go" for e in forwarded)
    assert said(effects) == ["Two books, shipped."]


def test_a_function_call_waits_for_its_output_and_response_create_continues_its_delegation() -> None:
    live = Live(RESPONSES)
    _, effects = live.delegates()
    (delegation_id,) = live.session.delegations
    (run,) = runs(effects)
    events, effects = live.backend(run.request_id, *call_response("call_9"))
    assert of(events, "response.event")[1]["event"]["item"]["call_id"] == "call_9"  # the app learns of the call
    assert said(effects) == []  # nothing to say yet
    # A request before the call is answered leaves the call out (a backend wants its output with it).
    live.send({"type": "response.item.create", "item": {"role": "user", "content": "And tomorrow?"}})
    _, effects = live.send({"type": "response.create"})
    (other,) = runs(effects)
    assert all(it.get("type") != "function_call" for it in other.body["input"])
    events, effects = live.backend(other.request_id, *text_response("Rain."))
    assert "delegation_id" not in of(events, "response.event")[0]
    live.answer(next(e for e in effects if isinstance(e, StartResponse)).request.request_id, Finished())  # said
    # The app answers the call and continues: the request carries the call and its output.
    live.send({"type": "response.item.create",
               "item": {"type": "function_call_output", "call_id": "call_9", "output": '{"temp": 21}'}})  # fmt: skip
    _, effects = live.send({"type": "response.create"})
    (cont,) = runs(effects)
    kinds = [(it.get("type"), it.get("call_id")) for it in cont.body["input"]]
    at = kinds.index(("function_call", "call_9"))
    assert kinds[at + 1] == ("function_call_output", "call_9")  # the output beside its call
    events, effects = live.backend(cont.request_id, *text_response("21 degrees."))
    assert {e["delegation_id"] for e in of(events, "response.event")} == {delegation_id}
    assert said(effects) == ["21 degrees."]


def test_one_request_runs_at_a_time() -> None:
    live = Live(RESPONSES)
    live.send({"type": "response.create"})
    err = live.error({"type": "response.create", "event_id": "again"})
    assert (err["code"], err["client_event_id"]) == ("conversation_already_has_active_response", "again")
    # The model's tasks wait their turn, and run when the one under way ends.
    rid = runs(live.effects)[0].request_id
    _, effects = live.delegates("Book a table")
    assert not runs(effects) and len(live.session._delegations.queue) == 1
    _, effects = live.backend(rid, *text_response("Done."))
    (queued,) = runs(effects)
    assert queued.body["input"][-1]["content"][0]["text"] == "Book a table"


def test_a_request_is_over_at_its_response_completed_before_its_stream_closes() -> None:
    """A client that answers ``response.completed`` with the next ``response.create`` (as the
    error's message tells it to) is not refused because the HTTP stream's end has not been
    read yet; that end, when it comes, changes nothing."""
    live = Live(RESPONSES)
    live.send({"type": "response.create"})
    first = runs(live.effects)[0].request_id
    events, effects = live.backend(first, *text_response("Done."), end=False)
    assert said(effects) == ["Done."]
    events, effects = live.send({"type": "response.create", "event_id": "next"})
    assert not of(events, "error") and len(runs(effects)) == 1
    events, effects = live.backend(first)  # the first stream closes now
    assert not events and not effects and live.session._delegations.running is not None


def test_a_task_past_the_queue_is_not_delegated() -> None:
    live = Live(RESPONSES)
    live.send({"type": "response.create"})
    for _ in range(MAX_QUEUED):
        live.delegates()
    events, _ = live.delegates()
    (info,) = of(events, "info")
    assert info["code"] == "delegation_queue_full"
    assert len(live.session.delegations) == MAX_QUEUED
    assert live.session.conversation.get(live.session.conversation.last_id() or "").output.startswith("Not delegated")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("failure", "events"),
    [
        (("responses_backend_unreachable", "The Responses backend is unreachable (refused)."), []),
        (("responses_backend_error", "The Responses backend answered HTTP 404: no model 'x'."), []),
        (("responses_backend_timeout", "The Responses backend sent nothing for 60 s."), []),
        (None, [{"type": "response.created", "response": {"id": "r", "output": []}}]),  # cut short
    ],
)
def test_a_failed_request_is_a_coded_error_and_the_model_is_told(
    failure: tuple[str, str] | None, events: list[dict[str, Any]]
) -> None:
    live = Live(RESPONSES)
    _, effects = live.delegates()
    (run,) = runs(effects)
    out, effects = live.backend(run.request_id, *events, failure=failure)
    (error,) = of(out, "error")
    assert error["error"]["code"] == (failure[0] if failure else "responses_backend_unreachable")
    assert error["error"]["message"]
    assert said(effects) == []
    assert "could not be done" in (live.session.conversation.get(live.session.conversation.last_id() or "")
                                   .as_message().text)  # type: ignore[union-attr]  # fmt: skip
    # The session goes on: another request runs.
    _, effects = live.send({"type": "response.create"})
    assert runs(effects)


def test_a_client_request_that_fails_names_its_response_create() -> None:
    live = Live(RESPONSES)
    _, effects = live.send({"type": "response.create", "event_id": "go"})
    events, _ = live.backend(runs(effects)[0].request_id, failure=("responses_backend_timeout", "Nothing for 1 s."))
    assert of(events, "error")[0]["error"]["client_event_id"] == "go"


# --- what is refused -----------------------------------------------------------------------------


def test_responses_events_need_responses_delegation() -> None:
    live = Live()
    for event in ({"type": "response.item.create", "item": {"role": "user", "content": "x"}},
                  {"type": "response.create"}):  # fmt: skip
        err = live.error({**event, "event_id": "e"})
        assert (err["code"], err["param"], err["client_event_id"]) == ("responses_delegation_required", "type", "e")


def test_responses_delegation_needs_a_backend_on_the_gateway() -> None:
    session = LiveSession(session_id="live_x", config=SessionConfig(model="m"), engine=CALLS, responses_backend=False)
    with pytest.raises(Exception) as raised:
        session.configure({"model": "gpt-live-1", "delegation": RESPONSES})
    assert getattr(raised.value, "code", None) == "responses_backend_unconfigured"
    assert getattr(raised.value, "param", None) == "session.delegation.type"


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ({"type": "web_search_call", "id": "x"}, "unsupported", "item.type"),
        ({"content": "no role"}, "invalid_value", "item.type"),
        ({"type": "message", "role": "robot", "content": "x"}, "invalid_value", "item.role"),
        ({"type": "message", "role": "user"}, "invalid_value", "item.content"),
        ({"type": "function_call_output", "output": "x"}, "missing_required_parameter", "item.call_id"),
        ({"type": "function_call_output", "call_id": "c"}, "missing_required_parameter", "item.output"),
        ({"type": "function_call", "call_id": "c", "name": "f"}, "missing_required_parameter", "item.arguments"),
    ],
)
def test_a_bad_item_is_refused_naming_its_field(item: dict[str, Any], code: str, param: str) -> None:
    live = Live(RESPONSES)
    err = live.error({"type": "response.item.create", "event_id": "i", "item": item})
    assert (err["code"], err["param"], err["client_event_id"]) == (code, param, "i")
    assert live.session._delegations.items == []


# --- the session's life ----------------------------------------------------------------------------


def test_closing_the_session_cancels_the_request_under_way() -> None:
    live = Live(RESPONSES)
    _, effects = live.send({"type": "response.create"})
    (run,) = runs(effects)
    _, effects = live.send({"type": "session.close"})
    assert Cancel(run.request_id) in effects
    events, _ = live.backend(run.request_id, *text_response("late"))
    assert events == []  # nothing after it


def test_a_restored_session_keeps_its_delegations_and_runs_the_request_under_way_again() -> None:
    live = Live(RESPONSES)
    _, effects = live.delegates("Find the weather in Paris")
    (delegation_id,) = live.session.delegations
    (run,) = runs(effects)
    live.backend(run.request_id, *text_response("x")[:3], end=False)  # under way when the replica is lost
    assert live.session.dirty  # (its output changed the Responses conversation: a snapshot is due)
    state = orjson.loads(orjson.dumps(live.session.snapshot_state()))
    again = LiveSession.restore(state, engine=CALLS, vad_factory=None)
    assert again.delegations == {delegation_id: "responses"}
    _, effects = again.take()
    (rerun,) = runs(effects)
    assert rerun.body == run.body and rerun.request_id != run.request_id  # (what it had output is not in it)
    again.backend_event(run.request_id, text_response("stale")[0])  # the lost replica's request is no more
    again.backend_event(rerun.request_id, text_response("x")[0])
    events, _ = again.take()
    assert [e["event"]["type"] for e in of(events, "response.event")] == ["response.created"]
    assert of(events, "response.event")[0]["delegation_id"] == delegation_id


def test_delegation_created_marks_a_snapshot_that_holds_the_delegation() -> None:
    """session.delegation.created is a state event (write-ahead: tests/unit/test_live_session.py
    proves the others): it marks the session for a snapshot, and the snapshot holds it."""
    live = Live()
    rid = live.turn().request.request_id
    live.session.dirty = False
    events, _ = live.answer(rid, ToolCallDelta(0, '{"task": "t"}', call_id="c", name=DELEGATE), Finished())
    assert of(events, "session.delegation.created") and live.session.dirty
    state = orjson.loads(orjson.dumps(live.session.snapshot_state()))
    again = LiveSession.restore(state, engine=CALLS, vad_factory=None)
    assert again.delegations == live.session.delegations != {}
    assert any(it.type == "function_call_output" for it in again.conversation)


def test_a_fork_carries_no_delegation_and_runs_nothing_but_checks_for_a_backend() -> None:
    live = Live(RESPONSES)
    live.delegates()
    state = orjson.loads(orjson.dumps(live.session.snapshot_state()))
    fork = LiveSession.fork(state, session_id="live_fork", engine=CALLS, vad_factory=None, responses_backend=True)
    assert fork.delegations == {} and fork._delegations.running is None and fork._delegations.items == []
    assert not runs(fork.take()[1])
    elsewhere = LiveSession.fork(state, session_id="live_f2", engine=CALLS, vad_factory=None, responses_backend=False)
    with pytest.raises(Exception) as raised:
        elsewhere.configure({})
    assert getattr(raised.value, "code", None) == "responses_backend_unconfigured"


def test_a_snapshot_from_before_the_responses_conversation_restores() -> None:
    live = Live()
    live.delegates()
    state = orjson.loads(orjson.dumps(live.session.snapshot_state()))
    handed = state["live"].pop("delegation")["handed"]
    state["live"]["delegations"] = handed
    again = LiveSession.restore(state, engine=CALLS, vad_factory=None)
    assert again.delegations == handed


def test_the_responses_conversation_asks_for_a_snapshot_as_it_changes_and_a_stream_s_deltas_do_not() -> None:
    live = Live(RESPONSES)
    steps: list[tuple[str, bool]] = []

    def step(name: str, action: Any) -> None:
        live.session.dirty = False
        action()
        live.take()
        steps.append((name, live.session.dirty))

    step("item", lambda: live.send({"type": "response.item.create", "item": {"role": "user", "content": "hi"}}))
    step("create", lambda: live.send({"type": "response.create"}))
    rid = runs(live.effects)[-1].request_id
    stream = text_response("Hello.")
    step("created", lambda: live.session.backend_event(rid, stream[0]))
    step("delta", lambda: live.session.backend_event(rid, stream[1]))
    step("output", lambda: live.session.backend_event(rid, stream[2]))
    step("ended", lambda: live.backend(rid, stream[3]))
    assert steps == [("item", True), ("create", True), ("created", False), ("delta", False), ("output", True),
                     ("ended", True)]  # fmt: skip


def test_slim_clears_lifecycle_snapshots_only() -> None:
    created = text_response("x")[0]
    assert slim(created)["response"] == {"id": "resp_1", "object": "response", "status": "in_progress",
                                         "instructions": None, "tools": [], "output": []}  # fmt: skip
    assert created["response"]["input"]  # (the event itself is not changed)
    delta = text_response("x")[1]
    assert slim(delta) is delta
