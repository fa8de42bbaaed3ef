"""Function calling on the Sans-I/O session: tools and tool_choice reach the
engine, a call streams as the GA event sequence, function_call_output items
are accepted, and the next response sees the call and its output. Engine
outputs are fed by hand here (the vLLM tests produce them for real); every
event is checked against the SDK's models by the Driver."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from support.session_driver import Driver

from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.session.effects import StartResponse
from orchestrator.engine import Finished, Message, TextDelta, ToolCall, ToolCallDelta, ToolChoice

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def started(effects: list[Any]) -> Any:
    return next(e for e in effects if isinstance(e, StartResponse)).request


def test_session_tools_and_tool_choice_reach_the_engine() -> None:
    d = Driver(output_modalities=("text",))
    d.send({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER], "tool_choice": "required"}})
    _, effects = d.send({"type": "response.create"})
    request = started(effects)
    assert [t.name for t in request.tools] == ["get_weather"]
    assert request.tools[0].parameters["required"] == ["city"]
    assert request.tool_choice == ToolChoice("required")
    assert request.calls_tools


def test_response_create_overrides_tools_and_names_the_function() -> None:
    d = Driver(output_modalities=("text",))
    _, effects = d.send(
        {
            "type": "response.create",
            "response": {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
                         "parallel_tool_calls": False},
        }
    )  # fmt: skip
    request = started(effects)
    assert request.tool_choice == ToolChoice("function", "get_weather")
    assert request.parallel_tool_calls is False
    d.send({"type": "response.cancel"})
    err = d.error({"type": "response.create", "event_id": "x",
                   "response": {"tool_choice": {"type": "function", "name": "nope"}}})  # fmt: skip
    assert (err["code"], err["param"], err["event_id"]) == (Code.INVALID_VALUE, "response.tool_choice.name", "x")


def test_tool_choice_none_offers_no_tools() -> None:
    d = Driver(output_modalities=("text",), tools=(WEATHER,), tool_choice="none")
    _, effects = d.send({"type": "response.create"})
    assert not started(effects).calls_tools


def test_a_call_streams_as_the_ga_sequence_and_ends_in_response_done() -> None:
    d = Driver(output_modalities=("text",), tools=(WEATHER,), tool_choice="required")
    rid = d.respond()
    assert d.types()[-1] == "response.created"  # no message item: this response may only call
    events = d.output(
        rid,
        ToolCallDelta(0, '{"city":', call_id="call_1", name="get_weather"),
        ToolCallDelta(0, ' "Paris"}'),
        Finished(),
    )
    assert d.types(events) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    added = events[0]["item"]
    assert (added["type"], added["name"], added["call_id"], added["arguments"]) == (
        "function_call", "get_weather", "call_1", "",
    )  # fmt: skip
    args_done = events[4]
    assert (args_done["arguments"], args_done["name"], args_done["call_id"]) == ('{"city": "Paris"}', "get_weather",
                                                                               "call_1")  # fmt: skip
    output = events[-1]["response"]["output"]
    assert output == [{"id": added["id"], "object": "realtime.item", "type": "function_call", "status": "completed",
                       "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]  # fmt: skip


def test_text_then_two_calls_get_their_own_output_indexes() -> None:
    d = Driver(output_modalities=("text",), tools=(WEATHER,))
    rid = d.respond()
    events = d.output(
        rid,
        TextDelta("Let me look."),
        ToolCallDelta(0, '{"city": "Oslo"}', call_id="c0", name="get_weather"),
        ToolCallDelta(1, '{"city": "Rome"}', call_id="c1", name="get_weather"),
        Finished(),
    )
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"), (1, "function_call"), (2, "function_call"),
    ]  # fmt: skip
    done = events[-1]["response"]
    assert [o["type"] for o in done["output"]] == ["message", "function_call", "function_call"]
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "Let me look."}]


def test_each_output_is_finished_before_the_next_begins() -> None:
    """As the API streams parallel calls: call 0's arguments.done and output_item.done come
    before call 1's output_item.added, and the message is done before the first call."""
    d = Driver(output_modalities=("text",), tools=(WEATHER,))
    d.user_text("Oslo and Rome?")
    rid = d.respond()
    events = d.output(
        rid,
        TextDelta("Let me look."),
        ToolCallDelta(0, '{"city":', call_id="c0", name="get_weather"),
        ToolCallDelta(0, ' "Oslo"}'),
        ToolCallDelta(1, '{"city": "Rome"}', call_id="c1", name="get_weather"),
        ToolCallDelta(0, "late"),  # a finished call's arguments cannot grow any more
        Finished(),
    )
    seq = [(e["type"], e.get("output_index")) for e in events if e["type"].startswith("response.")]
    assert seq == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.done", None),
    ]
    done = events[-1]["response"]
    assert [o.get("arguments") for o in done["output"]] == [None, '{"city": "Oslo"}', '{"city": "Rome"}']
    # every conversation.item.done names the item before it, as its .added did
    added = {e["item"]["id"]: e["previous_item_id"] for e in events if e["type"] == "conversation.item.added"}
    finished = {e["item"]["id"]: e["previous_item_id"] for e in events if e["type"] == "conversation.item.done"}
    assert finished == added and None not in finished.values()


def test_the_output_of_a_call_is_accepted_and_the_next_response_sees_both() -> None:
    d = Driver(output_modalities=("text",), tools=(WEATHER,), tool_choice="required")
    d.user_text("Weather in Paris?")
    rid = d.respond()
    d.output(rid, ToolCallDelta(0, '{"city": "Paris"}', call_id="call_9", name="get_weather"), Finished())
    events, _ = d.send(
        {"type": "conversation.item.create",
         "item": {"type": "function_call_output", "call_id": "call_9", "output": '{"sky": "clear"}'}}
    )  # fmt: skip
    assert d.types(events) == ["conversation.item.added", "conversation.item.done"]
    assert events[0]["item"]["type"] == "function_call_output"
    _, effects = d.send({"type": "response.create", "response": {"tool_choice": "auto"}})
    messages = started(effects).messages
    assert messages == (
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(ToolCall("call_9", "get_weather", '{"city": "Paris"}'),)),
        Message("tool", '{"sky": "clear"}', tool_call_id="call_9"),
    )


def test_a_cancelled_call_ends_incomplete_with_what_was_streamed() -> None:
    d = Driver(output_modalities=("text",), tools=(WEATHER,), tool_choice="required")
    rid = d.respond()
    d.output(rid, ToolCallDelta(0, '{"ci', call_id="c", name="get_weather"))
    events, _ = d.send({"type": "response.cancel"})
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["output"][0]["status"] == "incomplete" and done["output"][0]["arguments"] == '{"ci'


def test_client_created_function_call_items_and_missing_fields() -> None:
    d = Driver()
    events, _ = d.send({"type": "conversation.item.create", "item": {
        "type": "function_call", "name": "get_weather", "arguments": "{}", "call_id": "call_x"}})  # fmt: skip
    assert events[0]["item"]["call_id"] == "call_x"
    with pytest.raises(ProtocolError) as info:  # refused by the decoder, before the session
        ce.decode(orjson.dumps({"type": "conversation.item.create", "event_id": "e",
                                "item": {"type": "function_call_output", "output": "x"}}))  # fmt: skip
    assert (info.value.code, info.value.param, info.value.event_id) == (Code.MISSING_FIELD, "item.call_id", "e")
