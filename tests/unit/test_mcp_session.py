"""MCP tools on the Sans-I/O session: a server's tools are listed when it joins the
session, offered to the engine as functions, a call of one runs inside the
response (the GA event sequence), an approval request waits for the client's
answer, and the engine is asked again, in the same response, with the result.
The host's side (listing and calling a real MCP server) is fed by hand here;
tests/integration/test_mcp.py runs it for real. Every event is checked against
the SDK's models by the Driver."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.session_driver import Driver

from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code
from gateway.session import snapshot
from gateway.session.effects import CallMcpTool, Cancel, ListMcpTools, StartResponse
from gateway.session.responses import MCP_ROUNDS
from gateway.session.session import RealtimeSession
from orchestrator.engine import Finished, Message, TextDelta, ToolCall, ToolCallDelta, ToolChoice
from orchestrator.engines.passthrough import PassthroughEngine

SERVER = {"type": "mcp", "server_label": "weather", "server_url": "https://mcp.example.com/mcp",
          "require_approval": "never", "authorization": "tok-secret", "headers": {"X-Key": "hdr-secret"}}  # fmt: skip
TOOLS = [
    {"name": "forecast", "description": "The forecast", "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}},
    {"name": "delete_city", "input_schema": {"type": "object", "properties": {}},
     "annotations": {"readOnlyHint": False}},
]  # fmt: skip


def of(kind: type, effects: list[Any]) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def listed(d: Driver, server: dict[str, Any] = SERVER, tools: list[dict[str, Any]] = TOOLS) -> str:
    """session.update with ``server``, and the host's listing of ``tools``: the list item's id."""
    events, effects = d.send({"type": "session.update", "session": {"type": "realtime", "tools": [server]}})
    assert d.types(events) == ["session.updated", "conversation.item.added", "mcp_list_tools.in_progress"]
    echoed = events[0]["session"]["tools"][0]
    assert "authorization" not in echoed and "headers" not in echoed  # credentials are never echoed
    assert "tok-secret" not in json.dumps(events) and "hdr-secret" not in json.dumps(events)
    (lister,) = of(ListMcpTools, effects)
    assert lister.server["authorization"] == "tok-secret"  # (the host needs them)
    d.session.mcp_listed(lister.item_id, tools, None)
    events, _ = d.take()
    assert d.types(events) == ["mcp_list_tools.completed", "conversation.item.done"]
    assert events[1]["item"] == {"id": lister.item_id, "type": "mcp_list_tools", "server_label": "weather",
                                 "tools": tools}  # fmt: skip
    return lister.item_id


def test_a_listed_servers_tools_are_offered_as_functions() -> None:
    d = Driver(output_modalities=("text",))
    listed(d, {**SERVER, "allowed_tools": ["forecast"]})
    _, effects = d.send(
        {
            "type": "response.create",
            "response": {"tool_choice": {"type": "mcp", "server_label": "weather", "name": "forecast"}},
        }
    )
    (start,) = of(StartResponse, effects)
    assert [t.name for t in start.request.tools] == ["forecast"]  # allowed_tools narrowed it
    assert start.request.tools[0].parameters["required"] == ["city"]
    assert start.request.tool_choice == ToolChoice("function", "forecast")


def test_a_call_runs_inside_the_response_and_the_engine_hears_the_result() -> None:
    d = Driver(output_modalities=("text",))
    list_id = listed(d)
    d.user_text("Weather in Oslo?")
    rid = d.respond()
    events = d.output(rid, ToolCallDelta(0, '{"city":', call_id="c0", name="forecast"), ToolCallDelta(0, ' "Oslo"}'),
                      Finished())  # fmt: skip
    assert d.types(events) == [
        "response.output_item.added", "conversation.item.added",
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done", "response.mcp_call.in_progress",
    ]  # fmt: skip
    call_id = events[0]["item"]["id"]
    assert events[0]["item"] == {
        "id": call_id, "type": "mcp_call", "server_label": "weather", "name": "forecast", "arguments": "",
        "approval_request_id": None, "output": None, "error": None,
    }  # fmt: skip
    (call,) = of(CallMcpTool, d.effects)
    assert (call.response_id, call.item_id, call.name, call.arguments) == (rid, call_id, "forecast", '{"city": "Oslo"}')
    d.session.mcp_called(call_id, "sunny", None)
    events, effects = d.take()
    assert d.types(events) == ["response.mcp_call.completed", "response.output_item.done", "conversation.item.done"]
    assert events[1]["item"]["output"] == "sunny"
    (again,) = of(StartResponse, effects)  # the same response, asked again with the result
    assert again.request.request_id == rid
    assert again.request.tool_choice == ToolChoice("auto")
    assert again.request.messages[-3:] == (
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", tool_calls=(ToolCall(call_id, "forecast", '{"city": "Oslo"}'),)),
        Message("tool", "sunny", tool_call_id=call_id),
    )
    events = d.output(rid, TextDelta("Sunny in Oslo."), Finished())
    done = events[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"
    assert [o["type"] for o in done["response"]["output"]] == ["mcp_call", "message"]
    assert list_id in [it.id for it in d.session.conversation]


def test_what_the_engine_says_after_a_call_waits_for_its_result() -> None:
    """Each item is finished before the next begins, even when the engine goes on talking."""
    d = Driver(output_modalities=("text",))
    listed(d)
    rid = d.respond()
    d.output(rid, ToolCallDelta(0, '{"city": "Oslo"}', call_id="c0", name="forecast"), TextDelta("Checking."),
             Finished())  # fmt: skip
    assert "response.output_text.delta" not in d.types()
    call_id = of(CallMcpTool, d.effects)[0].item_id
    d.session.mcp_called(call_id, None, {"type": "tool_execution_error", "message": "no such city"})
    events, effects = d.take()
    kinds = d.types(events)
    assert kinds.index("response.mcp_call.failed") < kinds.index("response.output_item.done")
    assert kinds.index("response.output_item.done") < kinds.index("response.output_text.delta")
    failed = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert failed["error"] == {"type": "tool_execution_error", "message": "no such city"} and failed["output"] is None
    (again,) = of(StartResponse, effects)
    assert Message("tool", "The tool call failed: no such city", tool_call_id=call_id) in again.request.messages
    assert again.request.messages[-1] == Message("assistant", "Checking.")


def test_an_approval_request_waits_for_the_clients_answer() -> None:
    d = Driver(output_modalities=("text",))
    listed(d, {**SERVER, "require_approval": {"never": {"tool_names": ["forecast"]}}})
    rid = d.respond()
    events = d.output(rid, ToolCallDelta(0, "{}", call_id="c0", name="delete_city"), Finished())
    assert d.types(events) == ["response.output_item.added", "conversation.item.added", "response.output_item.done",
                               "conversation.item.done"]  # fmt: skip
    asked = events[0]["item"]
    assert asked == {"id": asked["id"], "type": "mcp_approval_request", "server_label": "weather",
                     "name": "delete_city", "arguments": "{}"}  # fmt: skip
    assert d.session.active_response_id == rid  # the response waits
    unknown = {"type": "mcp_approval_response", "approval_request_id": "nope", "approve": True}
    err = d.error({"type": "conversation.item.create", "event_id": "e1", "item": unknown})
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_NOT_FOUND, "item.approval_request_id", "e1")
    events, effects = d.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": asked["id"], "approve": True}})  # fmt: skip
    kinds = d.types(events)
    assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]
    assert events[0]["item"]["type"] == "mcp_approval_response" and events[0]["item"]["approve"] is True
    assert kinds[2:] == ["response.output_item.added", "conversation.item.added", "response.mcp_call_arguments.delta",
                         "response.mcp_call_arguments.done", "response.mcp_call.in_progress"]  # fmt: skip
    assert events[2]["item"]["approval_request_id"] == asked["id"]
    (call,) = of(CallMcpTool, effects)
    assert call.name == "delete_city"
    again = d.error({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": asked["id"], "approve": False}})  # fmt: skip
    assert again["code"] == Code.INVALID_VALUE


def test_a_declined_call_is_not_run_and_the_model_hears_why() -> None:
    d = Driver(output_modalities=("text",))
    listed(d, {**SERVER, "require_approval": "always"})
    rid = d.respond()
    events = d.output(rid, ToolCallDelta(0, '{"city": "Oslo"}', call_id="c0", name="forecast"), Finished())
    asked = events[0]["item"]["id"]
    answer = {"type": "mcp_approval_response", "approval_request_id": asked, "approve": False, "reason": "not now"}
    _, effects = d.send({"type": "conversation.item.create", "item": answer})
    assert not of(CallMcpTool, effects)
    (again,) = of(StartResponse, effects)
    assert again.request.messages[-1] == Message("tool", "The user declined to run this tool: not now",
                                                 tool_call_id=asked)  # fmt: skip


def test_a_response_waits_for_a_listing_under_way() -> None:
    d = Driver(output_modalities=("text",))
    _, effects = d.send({"type": "session.update", "session": {"type": "realtime", "tools": [SERVER]}})
    (lister,) = of(ListMcpTools, effects)
    events, effects = d.send({"type": "response.create"})
    assert events == [] and not of(StartResponse, effects)
    err = d.error({"type": "response.create"})  # the first counts as the conversation's
    assert err["code"] == Code.RESPONSE_ACTIVE
    d.session.mcp_listed(lister.item_id, TOOLS, None)
    events, effects = d.take()
    assert "response.created" in d.types(events)
    assert [t.name for t in of(StartResponse, effects)[0].request.tools] == ["forecast", "delete_city"]


def test_a_failed_listing_says_why_and_offers_nothing() -> None:
    d = Driver(output_modalities=("text",))
    _, effects = d.send({"type": "session.update", "session": {"type": "realtime", "tools": [SERVER]}})
    (lister,) = of(ListMcpTools, effects)
    d.session.mcp_listed(lister.item_id, None, "its server_url is not in this gateway's mcp_allowed_urls")
    events, _ = d.take()
    assert d.types(events) == ["mcp_list_tools.failed", "error", "conversation.item.done"]
    error = events[1]["error"]
    assert (error["code"], error["param"]) == (Code.MCP_LIST_TOOLS_FAILED, "session.tools[0]")
    assert "mcp_allowed_urls" in error["message"] and "'weather'" in error["message"]
    _, effects = d.send({"type": "response.create"})
    assert of(StartResponse, effects)[0].request.tools == ()


def test_the_same_server_is_listed_once_and_again_when_reached_anew() -> None:
    d = Driver(output_modalities=("text",))
    listed(d)
    _, effects = d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "tools": [{**SERVER, "allowed_tools": ["forecast"]}]},
        }
    )
    assert not of(ListMcpTools, effects)
    _, effects = d.send(
        {"type": "session.update", "session": {"type": "realtime", "tools": [{**SERVER, "authorization": "tok-2"}]}}
    )
    assert len(of(ListMcpTools, effects)) == 1


def test_a_cancel_fails_a_running_call_and_cancels_it_with_the_response() -> None:
    d = Driver(output_modalities=("text",))
    listed(d)
    rid = d.respond()
    d.output(rid, ToolCallDelta(0, "{}", call_id="c0", name="forecast"), Finished())
    events, effects = d.send({"type": "response.cancel"})
    assert Cancel(rid) in effects
    assert d.types(events)[:2] == ["response.mcp_call.failed", "response.output_item.done"]
    assert events[-1]["response"]["status"] == "cancelled"
    d.session.mcp_called(of(CallMcpTool, d.effects)[0].item_id, "late", None)  # a late answer: nothing
    assert d.take() == ([], [])


def test_a_model_that_keeps_calling_still_ends_its_response() -> None:
    d = Driver(output_modalities=("text",))
    listed(d)
    rid = d.respond()
    for _ in range(MCP_ROUNDS - 1):
        d.output(rid, ToolCallDelta(0, "{}", call_id="c", name="forecast"), Finished())
        d.session.mcp_called(of(CallMcpTool, d.effects)[-1].item_id, "again", None)
        d.take()
    last = of(StartResponse, d.effects)[-1].request
    assert last.tools == () and last.tool_choice == ToolChoice("none")
    events = d.output(rid, TextDelta("Done."), Finished())
    assert events[-1]["response"]["status"] == "completed"


def test_mcp_items_survive_a_snapshot() -> None:
    d = Driver(output_modalities=("text",))
    listed(d)
    rid = d.respond()
    d.output(rid, ToolCallDelta(0, '{"city": "Oslo"}', call_id="c0", name="forecast"), Finished())
    d.session.mcp_called(of(CallMcpTool, d.effects)[0].item_id, "sunny", None)
    d.output(rid, TextDelta("Sunny."), Finished())
    state = snapshot.loads(snapshot.dumps(d.session.snapshot_state()))
    restored = RealtimeSession.restore(state, engine=PassthroughEngine().info)
    before = [it.render(False) for it in d.session.conversation]
    assert [it.render(False) for it in restored.conversation] == before
    restored.handle(ce.decode(b'{"type": "response.create"}'))  # (nothing is listed again)
    _, effects = restored.take()
    assert not of(ListMcpTools, effects)
    assert [t.name for t in of(StartResponse, effects)[0].request.tools] == ["forecast", "delete_city"]


@pytest.mark.parametrize(
    ("tool", "param", "code"),
    [
        ({"type": "mcp", "server_label": "x"}, "session.tools[0].server_url", Code.MISSING_FIELD),
        ({"type": "mcp", "server_label": "x", "server_url": "ftp://a"}, "session.tools[0].server_url",
         Code.INVALID_VALUE),
        ({"type": "mcp", "server_label": "x", "connector_id": "connector_gmail"}, "session.tools[0].connector_id",
         Code.UNSUPPORTED),
        ({"type": "mcp", "server_label": "a b", "server_url": "https://a"}, "session.tools[0].server_label",
         Code.INVALID_VALUE),
        ({"type": "mcp", "server_label": "x", "server_url": "https://a", "require_approval": "sometimes"},
         "session.tools[0].require_approval", Code.INVALID_VALUE),
        ({"type": "mcp", "server_label": "x", "server_url": "https://a", "bogus": 1}, "session.tools[0].bogus",
         Code.UNKNOWN_PARAMETER),
    ],
)  # fmt: skip
def test_a_bad_mcp_tool_is_refused_naming_the_field(tool: dict[str, Any], param: str, code: str) -> None:
    d = Driver(output_modalities=("text",))
    err = d.error({"type": "session.update", "event_id": "u1", "session": {"type": "realtime", "tools": [tool]}})
    assert (err["code"], err["param"], err["event_id"]) == (code, param, "u1")


def test_the_beta_dialect_refuses_mcp_tools_it_has_no_events_for() -> None:
    d = Driver(beta=True, output_modalities=("text",))
    err = d.error({"type": "session.update", "session": {"tools": [SERVER]}})
    assert (err["code"], err["param"]) == (Code.UNSUPPORTED, "session.tools[0].type")
    err = d.error({"type": "response.create", "response": {"tools": [SERVER]}})
    assert (err["code"], err["param"]) == (Code.UNSUPPORTED, "response.tools[0].type")
