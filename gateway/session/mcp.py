"""MCP servers of a session (Sans-I/O): their listings, and what the model is offered.

A session's tools may name MCP servers (``{type: "mcp", server_label,
server_url, ...}``). The gateway lists each server's tools when the server
first appears in a session's (or a response's) tools, or when where or how it
is reached changes: an ``mcp_list_tools`` item joins the conversation
(``conversation.item.added``), ``mcp_list_tools.in_progress`` follows, and the
host lists the tools (effect ``ListMcpTools``); its answer (``listed``) sends
``mcp_list_tools.completed`` or ``mcp_list_tools.failed`` (with a coded
``error`` saying why) and ``conversation.item.done`` with the tools. A
response created while a server it offers is being listed waits for the
listing (responses.py).

The model is offered each listed server's tools, narrowed by
``allowed_tools``, as functions; a call of one becomes an ``mcp_call`` (or,
where ``require_approval`` says so, an ``mcp_approval_request``) in
responses.py. A name already taken (by a function tool, or by an earlier
server's tool) is not offered twice: the first keeps it.

It knows the event log, the history, and the tool specs; not the responses,
the host or how a server is reached.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol.errors import Code
from gateway.session.conversation import Item
from gateway.session.effects import ListMcpTools
from gateway.session.events import EventLog
from gateway.session.history import History
from orchestrator.engine import FunctionTool

# What changes a server's listing: where and how it is reached (allowed_tools and
# require_approval only narrow what is offered, so changing them lists nothing again).
_REACH = ("server_url", "headers", "authorization")


@dataclass(slots=True)
class McpServer:
    """One MCP server of the session, by its ``server_label``."""

    spec: dict[str, Any]  # the tool as validated (session_fields.mcp_tool), credentials included
    item_id: str  # its mcp_list_tools item
    state: Literal["listing", "listed", "failed"] = "listing"
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the SDK's Tool: name, input_schema, ...
    param: str = "session.tools"  # where the client named it (the error of a failed listing says so)


@dataclass(frozen=True, slots=True)
class McpTool:
    """An MCP tool the model was offered, as a call of it is run."""

    server: McpServer
    name: str
    needs_approval: bool


def _matches(flt: dict[str, Any], tool: dict[str, Any]) -> bool:
    """A tool filter (``tool_names``, ``read_only``): every key given must hold."""
    if "tool_names" in flt and tool["name"] not in flt["tool_names"]:
        return False
    if "read_only" in flt:
        hint = bool((tool.get("annotations") or {}).get("readOnlyHint"))
        if hint != flt["read_only"]:
            return False
    return bool(flt)


def allowed(spec: dict[str, Any], tool: dict[str, Any]) -> bool:
    """Whether ``allowed_tools`` lets the model see ``tool`` (unset: every tool)."""
    rule = spec.get("allowed_tools")
    if rule is None:
        return True
    if isinstance(rule, list):
        return tool["name"] in rule
    return _matches(rule, tool)


def needs_approval(spec: dict[str, Any], tool: dict[str, Any]) -> bool:
    """``require_approval``: ``always`` (the default, as the API's), ``never``, or
    ``{always: filter, never: filter}`` (a tool neither names needs approval)."""
    rule = spec.get("require_approval", "always")
    if isinstance(rule, str):
        return rule == "always"
    if "never" in rule and _matches(rule["never"], tool):
        return False
    return True


class McpServers:
    """See the module docstring."""

    def __init__(self, log: EventLog, history: History) -> None:
        self._log = log
        self._history = history
        self._servers: dict[str, McpServer] = {}

    def configure(self, tools: Iterable[dict[str, Any]], param: str) -> None:
        """The MCP servers among ``tools``: list each that is new or reached anew."""
        for i, spec in enumerate(tools):
            if spec.get("type") != "mcp":
                continue
            label = spec["server_label"]
            known = self._servers.get(label)
            if known is not None and all(known.spec.get(k) == spec.get(k) for k in _REACH):
                known.spec = spec  # (its filters may have changed: they apply from the next response)
                continue
            self._list(spec, f"{param}[{i}]")

    def _list(self, spec: dict[str, Any], param: str) -> None:
        log = self._log
        item = Item(log.new_id("mcpl"), "assistant", [], type="mcp_list_tools", server_label=spec["server_label"])
        self._servers[spec["server_label"]] = McpServer(spec, item.id, param=param)
        prev = self._history.insert(item, None)
        log.emit("conversation.item.added", previous_item_id=prev, item=item.render(False))
        log.emit("mcp_list_tools.in_progress", item_id=item.id)
        log.effects.append(ListMcpTools(item.id, spec))

    def restore(self, tools: Iterable[dict[str, Any]], items: Iterable[Item]) -> None:
        """From a snapshot: the servers whose listing ended (the conversation's listings
        say what they hold). One still being listed is not known: ``configure`` (the
        session's recover) lists it again."""
        listings = {it.server_label: it for it in items if it.type == "mcp_list_tools"}
        for spec in tools:
            item = listings.get(spec["server_label"]) if spec.get("type") == "mcp" else None
            if item is not None and item.status != "in_progress":
                state: Literal["listed", "failed"] = "listed" if item.status == "completed" else "failed"
                self._servers[spec["server_label"]] = McpServer(spec, item.id, state, list(item.tools))

    def listing(self, tools: Iterable[dict[str, Any]]) -> bool:
        """Whether a server among ``tools`` is still being listed."""
        servers = self._servers
        return any(
            t.get("type") == "mcp" and (s := servers.get(t["server_label"])) is not None and s.state == "listing"
            for t in tools
        )

    def listed(self, item_id: str, tools: list[dict[str, Any]] | None, failure: str | None) -> bool:
        """The host's answer to ``ListMcpTools``: the tools, or why there are none. False:
        the listing is no longer wanted (the server was listed again since, or is gone)."""
        server = next((s for s in self._servers.values() if s.item_id == item_id), None)
        item = self._history.get(item_id)
        if server is None or server.state != "listing":
            return False
        log = self._log
        if failure is None and tools is not None:
            server.state, server.tools = "listed", tools
            log.emit("mcp_list_tools.completed", item_id=item_id)
        else:
            server.state = "failed"
            log.emit("mcp_list_tools.failed", item_id=item_id)
            log.fail(
                Code.MCP_LIST_TOOLS_FAILED,
                f"The tools of MCP server {server.spec['server_label']!r} could not be listed: {failure}",
                None,
                param=server.param,
            )
        if item is not None:
            item.tools = server.tools
            item.status = "completed" if server.state == "listed" else "incomplete"
            prev = self._history.conversation.previous_id(item_id)
            log.emit("conversation.item.done", previous_item_id=prev, item=item.render(False))
        return True

    def offered(
        self, tools: Iterable[dict[str, Any]], taken: set[str]
    ) -> tuple[tuple[FunctionTool, ...], dict[str, McpTool]]:
        """The listed servers' tools among ``tools`` as the engine takes them, and by
        engine name what a call of each runs. ``taken``: names already offered."""
        functions: list[FunctionTool] = []
        by_name: dict[str, McpTool] = {}
        seen = set(taken)
        for spec in tools:
            if spec.get("type") != "mcp":
                continue
            server = self._servers.get(spec["server_label"])
            if server is None or server.state != "listed":
                continue
            for tool in server.tools:
                name = tool["name"]
                if name in seen or not allowed(spec, tool):
                    continue
                seen.add(name)
                schema = tool.get("input_schema") or {"type": "object", "properties": {}}
                functions.append(FunctionTool(name, tool.get("description") or "", schema))
                by_name[name] = McpTool(server, name, needs_approval(spec, tool))
        return tuple(functions), by_name
