"""One response (pure data): what a running response holds and how it renders.

``Response`` is the state ``Responses`` (responses.py) keeps for each running
response; a snapshot writes it (snapshot.py) so that another replica can end
and re-issue it. The engine's view of tools is here too (``engine_tools``,
``engine_tool_choice``): what a response offers the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import Converter
from gateway.protocol.session_config import beta_format, ga_format
from gateway.session.conversation import Item, Part
from gateway.session.mcp import McpTool
from orchestrator.engine import FunctionTool, ResponseRequest, ToolChoice, Usage


def engine_tools(tools: tuple[dict[str, Any], ...]) -> tuple[FunctionTool, ...]:
    """The function tools (an MCP server's tools are offered once listed: mcp.py)."""
    return tuple(
        FunctionTool(t["name"], t.get("description", ""), t.get("parameters") or {"type": "object", "properties": {}})
        for t in tools
        if t.get("type") == "function"
    )


def engine_tool_choice(
    choice: str | dict[str, Any], mcp: dict[str, McpTool] | None = None, *, functions: bool = False
) -> ToolChoice:
    """The engine's tool choice. ``{type: "mcp", server_label, name}``: that tool, as a
    function; without ``name``: ``required`` when the server's tools are the only ones
    offered (``functions``: function tools are offered too), else ``auto`` (the engine
    cannot be held to one server's tools)."""
    if isinstance(choice, dict):
        if choice.get("type") == "function":
            return ToolChoice("function", choice["name"])
        offered = mcp or {}
        name = choice.get("name")
        if name is not None:
            tool = offered.get(name)
            if tool is not None and tool.server.spec["server_label"] == choice["server_label"]:
                return ToolChoice("function", name)
            return ToolChoice("auto")  # (not listed: the model decides without it)
        label = choice["server_label"]
        if offered and not functions and all(t.server.spec["server_label"] == label for t in offered.values()):
            return ToolChoice("required")
        return ToolChoice("auto")
    return ToolChoice(choice)  # type: ignore[arg-type]


@dataclass(slots=True)
class Response:
    """A running response. Its outputs, in ``output_index`` order, are at most one
    assistant message (``message``, with its one content ``part``) and the
    function calls the engine makes (``calls``, by the engine's call index). A
    response that may call tools opens its message on the first text or audio;
    one that cannot, at once (its first delta then needs no announcement)."""

    id: str
    in_conversation: bool
    modalities: tuple[Literal["text", "audio"], ...]
    output_format: AudioFormat
    voice: str
    max_output_tokens: int | None
    metadata: dict[str, Any] | None
    converter: Converter  # the engine's audio to ``output_format`` (the deltas' audio), in one step
    awaiting: set[str]  # items whose transcript the engine still waits for
    instructions: str | None = None  # the response's own override, kept to re-issue it
    event_id: str | None = None  # the response.create that asked for it (echoed in its errors)
    usage: Usage | None = None
    outputs: list[Item] = field(default_factory=list)
    message: Item | None = None
    part: Part | None = None
    calls: dict[int, Item] = field(default_factory=dict)
    # The response.create's own tools, tool_choice, parallel_tool_calls (kept to re-issue it).
    overrides: dict[str, Any] = field(default_factory=dict)
    # MCP tools (responses.py runs them; none of this is in a snapshot: a takeover ends the
    # response). ``mcp``: what a call of each offered MCP tool runs, by engine name.
    mcp: dict[str, McpTool] = field(default_factory=dict)
    request: ResponseRequest | None = None  # the engine request of this round (a round after
    rounds: int = 1  # MCP results is the same request with the results in its context)
    input_items: list[Item] | None = None  # response.input's items (None: the conversation)
    open_call: Item | None = None  # an MCP call whose arguments are still streaming
    running: set[str] = field(default_factory=set)  # mcp_call items whose server has not answered
    waiting: set[str] = field(default_factory=set)  # mcp_approval_request items not answered yet
    backlog: list[Any] = field(default_factory=list)  # engine outputs held while a call runs
    ran: bool = False  # an MCP call ran (or was declined) this round: another round follows
    engine_done: bool = False  # this round's engine request finished
    finish_reason: str = "stop"
    source: bytearray = field(default_factory=bytearray)  # the engine's audio the deltas do not carry yet

    def index_of(self, item: Item) -> int:
        outputs = self.outputs
        if outputs and outputs[-1] is item:  # every delta of the item being written (the hot path)
            return len(outputs) - 1
        return next(i for i, out in enumerate(outputs) if out is item)

    def render(
        self, status: str, details: dict[str, Any] | None, *, beta: bool, conversation_id: str
    ) -> dict[str, Any]:
        """The ``realtime.response`` object of response.created (``in_progress``) and response.done."""
        resp = self
        usage = None
        if resp.usage is not None:
            u = resp.usage
            usage = {
                "total_tokens": u.input_tokens + u.output_tokens,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "input_token_details": {
                    "text_tokens": u.input_text_tokens,
                    "audio_tokens": u.input_audio_tokens,
                    **({} if beta else {"image_tokens": u.input_image_tokens}),  # beta: no images, no field
                    "cached_tokens": 0,
                },
                "output_token_details": {"text_tokens": u.output_text_tokens, "audio_tokens": u.output_audio_tokens},
            }
        out: dict[str, Any] = {
            "object": "realtime.response",
            "id": resp.id,
            "status": status,
            "status_details": details,
            "output": [it.render(beta) for it in resp.outputs] if status != "in_progress" else [],
            "conversation_id": conversation_id if resp.in_conversation else None,
            "max_output_tokens": "inf" if resp.max_output_tokens is None else resp.max_output_tokens,
            "usage": usage,
            "metadata": resp.metadata,
        }
        if beta:
            out["modalities"] = ["audio", "text"] if "audio" in resp.modalities else ["text"]
            out["voice"] = resp.voice
            out["output_audio_format"] = beta_format(resp.output_format)
        else:
            out["output_modalities"] = list(resp.modalities)
            out["audio"] = {"output": {"format": ga_format(resp.output_format), "voice": resp.voice}}
        return out
