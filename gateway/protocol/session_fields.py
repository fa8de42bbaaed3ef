"""Validators for the fields of a session or a response (pure: no I/O).

Each takes the value a client sent and the ``param`` path it sent it at, and
returns the validated value, or raises ``ProtocolError`` naming that path.
The shapes are the GA Realtime API's (``openai.types.realtime``); values that
are kept as JSON (tools, truncation, tracing, ...) are returned as fresh
copies, so the configuration never shares objects with a client event.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal

from gateway.protocol.errors import Code, ProtocolError

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"
EAGERNESS = ("low", "medium", "high", "auto")
TRANSCRIPTION_DELAYS = ("minimal", "low", "medium", "high", "xhigh")
REASONING_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
MAX_TOOLS = 128  # more tools in one session or response: invalid_value


def err(message: str, param: str, code: str = Code.INVALID_VALUE) -> ProtocolError:
    return ProtocolError(code, message, param=param)


def check_keys(obj: dict[str, Any], allowed: set[str] | frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise err(f"Unknown parameter: '{prefix}.{key}'.", f"{prefix}.{key}", Code.UNKNOWN_PARAMETER)


def obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise err(f"'{param}' must be an object.", param, Code.INVALID_TYPE)
    return value


def num(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise err(f"'{param}' must be a number.", param, Code.INVALID_TYPE)
    if not lo <= value <= hi:
        raise err(f"'{param}' must be between {lo} and {hi}, got {value}.", param)
    return float(value)


def integer(value: Any, param: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(f"'{param}' must be an integer.", param, Code.INVALID_TYPE)
    if not lo <= value <= hi:
        raise err(f"'{param}' must be between {lo} and {hi}, got {value}.", param)
    return value


def boolean(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise err(f"'{param}' must be true or false.", param, Code.INVALID_TYPE)
    return value


def string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise err(f"'{param}' must be a string.", param, Code.INVALID_TYPE)
    return value


def opt_string(value: Any, param: str) -> str | None:
    return None if value is None else string(value, param)


def strings(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise err(f"'{param}' must be an array of strings.", param, Code.INVALID_TYPE)
    return tuple(value)


def choice(value: Any, param: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise err(f"'{param}' must be one of {', '.join(allowed)}; got {value!r}.", param)
    return str(value)


def modalities(value: Any, param: str, *, ga: bool = False) -> tuple[Literal["text", "audio"], ...]:
    """The beta's ``modalities`` (``["text"]``, ``["audio", "text"]``...) or, with ``ga``, the
    GA's ``output_modalities``, which the API takes only as ``["audio"]`` or ``["text"]``."""
    if (
        not isinstance(value, list)
        or not value
        or any(m not in ("text", "audio") for m in value)
        or (ga and len(value) != 1)
    ):
        raise err(f'\'{param}\' must be ["audio"] or ["text"].', param)
    # beta: ["audio", "text"] means audio with its transcript, as ["audio"] does.
    return ("audio",) if "audio" in value else ("text",)


# The API's bound on max_output_tokens (1..4096, or "inf"); kept so a client written to it
# sees the same answer here. Over it: integer_above_max_value, nothing applied. "inf" leaves
# the length to the engine's own limit (its model's context, its max_tokens setting).
MAX_OUTPUT_TOKENS = 4096


def max_tokens(value: Any, param: str) -> int | None:
    """``"inf"`` (or null): no limit beyond the engine's own."""
    if value == "inf" or value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_OUTPUT_TOKENS:
        raise err(
            f"Invalid '{param}': integer above maximum value. Expected a value <= {MAX_OUTPUT_TOKENS}, but got "
            f'{value} instead ("inf" leaves the length to the engine).',
            param,
            Code.INTEGER_ABOVE_MAX,
        )
    return integer(value, param, 1, MAX_OUTPUT_TOKENS)


def voice(value: Any, param: str, engine_voices: tuple[str, ...]) -> tuple[str, bool]:
    """``(name, custom)``: a voice name (OpenAI's or the engine's), or a custom voice
    ``{"id": ...}`` (``custom``: any id is accepted, and the GA session echoes it as that
    object; the engine speaks it with its default voice unless it has a voice of that name)."""
    if isinstance(value, dict):
        check_keys(value, {"id"}, param)
        return string(value.get("id"), f"{param}.id"), True
    name = string(value, param)
    if name not in OPENAI_VOICES and name not in engine_voices:
        names = ", ".join(OPENAI_VOICES + engine_voices)
        raise err(f'Unknown voice {name!r}; choose one of: {names} (or a custom voice as {{"id": ...}}).', param)
    return name, False


# --- tools ---------------------------------------------------------------------------


def _function_tool(tool: dict[str, Any], param: str) -> dict[str, Any]:
    check_keys(tool, {"type", "name", "description", "parameters", "strict"}, param)
    name = string(tool.get("name"), f"{param}.name")
    if not name or len(name) > 64 or not all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name):
        raise err(f"'{param}.name' must be 1 to 64 letters, digits, '_' or '-'; got {name!r}.", f"{param}.name")
    out: dict[str, Any] = {"type": "function", "name": name}
    if tool.get("description") is not None:
        out["description"] = string(tool["description"], f"{param}.description")
    parameters = tool.get("parameters")
    if parameters is not None:
        schema = obj(parameters, f"{param}.parameters")
        if schema.get("type", "object") != "object":
            raise err(f"'{param}.parameters' must be a JSON schema of type object.", f"{param}.parameters")
        out["parameters"] = copy.deepcopy(schema)
    return out


def tools(value: Any, param: str, *, mcp: bool = True) -> tuple[dict[str, Any], ...]:
    """Function tools (``{type: "function", name, description, parameters}``) and
    MCP servers (``mcp_tool``), whose tools the gateway lists and calls itself; with
    ``mcp`` False (the beta and duplex dialects, which have no MCP events) those
    are refused as unsupported."""
    if not isinstance(value, list):
        raise err(f"'{param}' must be an array.", param, Code.INVALID_TYPE)
    if len(value) > MAX_TOOLS:
        raise err(f"'{param}' may list at most {MAX_TOOLS} tools, got {len(value)}.", param)
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    labels: set[str] = set()
    for i, raw in enumerate(value):
        p = f"{param}[{i}]"
        tool = obj(raw, p)
        kind = tool.get("type", "function")
        if kind == "function":
            parsed = _function_tool(tool, p)
            if parsed["name"] in names:
                raise err(f"Two tools are named {parsed['name']!r}.", f"{p}.name")
            names.add(parsed["name"])
            out.append(parsed)
        elif kind == "mcp":
            if not mcp:
                raise err(f"'{p}' is an MCP tool: MCP tools need the GA protocol (this dialect has no MCP events).",
                          f"{p}.type", Code.UNSUPPORTED)  # fmt: skip
            parsed = mcp_tool(tool, p)
            if parsed["server_label"] in labels:
                raise err(f"Two MCP tools are labelled {parsed['server_label']!r}.", f"{p}.server_label")
            labels.add(parsed["server_label"])
            out.append(parsed)
        else:
            raise err(f"'{p}.type' must be function or mcp; got {kind!r}.", f"{p}.type")
    return tuple(out)


# --- MCP servers (run by the gateway: gateway/hosting/mcp.py) ---------------------------

MCP_TOOL_KEYS = frozenset({
    "type", "server_label", "server_url", "connector_id", "tunnel_id", "allowed_tools", "require_approval",
    "headers", "authorization", "server_description", "allowed_callers", "defer_loading",
})  # fmt: skip
MAX_MCP_HEADERS = 32  # headers sent to one MCP server; more: invalid_value
MAX_MCP_HEADER_BYTES = 8 << 10  # one header's name and value, or the authorization token; larger: invalid_value
SECRET_MCP_FIELDS = ("authorization", "headers")  # never echoed (session.updated) nor logged
# Headers a session may not send to its MCP server: they would steer the request (where it goes,
# through which proxy, as whom it is forwarded) or its framing, not just add to it.
FORBIDDEN_MCP_HEADERS = frozenset({
    "host", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
    "te", "trailer", "transfer-encoding", "upgrade", "content-length", "content-type", "expect",
    "forwarded", "via", "x-real-ip", "x-original-url", "x-rewrite-url", "x-http-method-override",
    "mcp-session-id", "mcp-protocol-version",
})  # fmt: skip
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: what a header name may be


def forbidden_header(name: str) -> bool:
    """Whether an MCP tool's ``headers`` may not set ``name`` (any case): the steering and
    framing headers above, every ``x-forwarded-*`` and ``proxy-*``, and what is no header
    name at all."""
    lower = name.lower()
    return (
        lower in FORBIDDEN_MCP_HEADERS
        or lower.startswith(("x-forwarded-", "proxy-"))
        or lower.startswith(":")
        or not _TOKEN.match(name)
    )


def _tool_filter(value: Any, param: str) -> dict[str, Any]:
    """``{tool_names?: [...], read_only?: bool}``: the tools it names, and/or those the
    server marks read-only (``readOnlyHint``)."""
    f = obj(value, param)
    check_keys(f, {"tool_names", "read_only"}, param)
    out: dict[str, Any] = {}
    if f.get("tool_names") is not None:
        out["tool_names"] = list(strings(f["tool_names"], f"{param}.tool_names"))
    if f.get("read_only") is not None:
        out["read_only"] = boolean(f["read_only"], f"{param}.read_only")
    return out


def mcp_tool(tool: dict[str, Any], param: str) -> dict[str, Any]:
    """An MCP server the gateway connects to: ``server_label``, ``server_url`` (http or
    https; the operator's allow-list is checked when it is listed), and the optional
    ``allowed_tools``, ``require_approval`` (default ``always``, as the API's),
    ``headers``, ``authorization`` and ``server_description``. ``connector_id`` and
    ``tunnel_id`` name OpenAI's hosted connectors, which are not here: unsupported."""
    check_keys(tool, MCP_TOOL_KEYS, param)
    label = string(tool.get("server_label"), f"{param}.server_label")
    if not label or len(label) > 64 or not all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in label):
        raise err(f"'{param}.server_label' must be 1 to 64 letters, digits, '_' or '-'; got {label!r}.",
                  f"{param}.server_label")  # fmt: skip
    for hosted in ("connector_id", "tunnel_id"):
        if tool.get(hosted) is not None:
            raise err(
                f"'{param}.{hosted}' names one of OpenAI's hosted connectors, which this gateway does not have; "
                "give the 'server_url' of an MCP server instead.",
                f"{param}.{hosted}",
                Code.UNSUPPORTED,
            )
    url = tool.get("server_url")
    if url is None:
        raise err(f"'{param}.server_url' is required: the URL of the MCP server (streamable HTTP).",
                  f"{param}.server_url", Code.MISSING_FIELD)  # fmt: skip
    url = string(url, f"{param}.server_url")
    if not url.startswith(("http://", "https://")) or len(url) > 2048:
        raise err(f"'{param}.server_url' must be an http:// or https:// URL of at most 2048 characters.",
                  f"{param}.server_url")  # fmt: skip
    out: dict[str, Any] = {"type": "mcp", "server_label": label, "server_url": url}
    allowed = tool.get("allowed_tools")
    if allowed is not None:
        out["allowed_tools"] = (
            list(strings(allowed, f"{param}.allowed_tools"))
            if isinstance(allowed, list)
            else _tool_filter(allowed, f"{param}.allowed_tools")
        )
    approval = tool.get("require_approval")
    if approval is not None:
        if isinstance(approval, str):
            out["require_approval"] = choice(approval, f"{param}.require_approval", ("always", "never"))
        else:
            a = obj(approval, f"{param}.require_approval")
            check_keys(a, {"always", "never"}, f"{param}.require_approval")
            out["require_approval"] = {
                k: _tool_filter(a[k], f"{param}.require_approval.{k}") for k in ("always", "never") if a.get(k)
            }
    headers = tool.get("headers")
    if headers is not None:
        h = obj(headers, f"{param}.headers")
        if len(h) > MAX_MCP_HEADERS:
            raise err(f"'{param}.headers' may hold at most {MAX_MCP_HEADERS} headers.", f"{param}.headers")
        for name, value in h.items():
            if not isinstance(value, str) or len(name) + len(value) > MAX_MCP_HEADER_BYTES or not name.isascii():
                raise err(f"'{param}.headers' must map ASCII header names to strings of at most "
                          f"{MAX_MCP_HEADER_BYTES} bytes.", f"{param}.headers")  # fmt: skip
            if forbidden_header(name):
                raise err(f"'{param}.headers' may not set {name!r}: a hop-by-hop, routing or framing header "
                          "(Host, Connection, Forwarded, X-Forwarded-*, Proxy-*, Content-Length, ...) or no header "
                          "name at all.", f"{param}.headers.{name}")  # fmt: skip
            if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
                raise err(f"'{param}.headers.{name}' may not hold a control character (a line break above all).",
                          f"{param}.headers.{name}")  # fmt: skip
        out["headers"] = dict(h)
    auth = tool.get("authorization")
    if auth is not None:
        token = string(auth, f"{param}.authorization")
        if len(token) > MAX_MCP_HEADER_BYTES:
            raise err(f"'{param}.authorization' may be at most {MAX_MCP_HEADER_BYTES} bytes.",
                      f"{param}.authorization")  # fmt: skip
        out["authorization"] = token
    if tool.get("server_description") is not None:
        out["server_description"] = string(tool["server_description"], f"{param}.server_description")
    return out


def public_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the session echoes it: an MCP server's credentials left out."""
    if tool.get("type") != "mcp":
        return tool
    return {k: v for k, v in tool.items() if k not in SECRET_MCP_FIELDS}


def tool_choice(value: Any, param: str) -> str | dict[str, Any]:
    """``auto``, ``none``, ``required``, ``{type: "function", name}`` or ``{type: "mcp", server_label, name?}``."""
    if isinstance(value, str):
        return choice(value, param, ("auto", "none", "required"))
    choice_obj = obj(value, param)
    kind = choice_obj.get("type")
    if kind == "function":
        check_keys(choice_obj, {"type", "name"}, param)
        return {"type": "function", "name": string(choice_obj.get("name"), f"{param}.name")}
    if kind == "mcp":
        check_keys(choice_obj, {"type", "server_label", "name"}, param)
        string(choice_obj.get("server_label"), f"{param}.server_label")
        opt_string(choice_obj.get("name"), f"{param}.name")
        return copy.deepcopy(choice_obj)
    raise err(f"'{param}' must be auto, none, required, or an object of type function or mcp.", param)


def check_tool_choice_names(
    choice_value: str | dict[str, Any], tool_list: tuple[dict[str, Any], ...], param: str
) -> None:
    if isinstance(choice_value, dict) and choice_value.get("type") == "mcp":
        labels = {t["server_label"] for t in tool_list if t.get("type") == "mcp"}
        if choice_value["server_label"] not in labels:
            raise err(
                f"tool_choice names the MCP server {choice_value['server_label']!r}, which is not in tools "
                f"({', '.join(sorted(labels)) or 'none'}).",
                f"{param}.server_label",
            )
    if isinstance(choice_value, dict) and choice_value.get("type") == "function":
        known = {t["name"] for t in tool_list if t.get("type") == "function"}
        if choice_value["name"] not in known:
            raise err(
                f"tool_choice names the function {choice_value['name']!r}, which is not in tools "
                f"({', '.join(sorted(known)) or 'none'}).",
                f"{param}.name",
            )


# --- the rest of the session ---------------------------------------------------------


def truncation(value: Any, param: str) -> str | dict[str, Any]:
    """``auto``, ``disabled`` or ``{type: "retention_ratio", retention_ratio, token_limits?}``."""
    if isinstance(value, str):
        return choice(value, param, ("auto", "disabled"))
    t = obj(value, param)
    check_keys(t, {"type", "retention_ratio", "token_limits"}, param)
    if t.get("type") != "retention_ratio":
        raise err(f"'{param}.type' must be retention_ratio.", f"{param}.type")
    out: dict[str, Any] = {
        "type": "retention_ratio",
        "retention_ratio": num(t.get("retention_ratio"), f"{param}.retention_ratio", 0.0, 1.0),
    }
    if t.get("token_limits") is not None:
        limits = obj(t["token_limits"], f"{param}.token_limits")
        check_keys(limits, {"post_instructions"}, f"{param}.token_limits")
        out["token_limits"] = {}
        if limits.get("post_instructions") is not None:
            out["token_limits"]["post_instructions"] = integer(
                limits["post_instructions"], f"{param}.token_limits.post_instructions", 1, 10_000_000
            )
    return out


def noise_reduction(value: Any, param: str) -> dict[str, Any] | None:
    """null (off) or ``{type: near_field|far_field, strength?: 0..1}``."""
    if value is None:
        return None
    nr = obj(value, param)
    check_keys(nr, {"type", "strength"}, param)
    out: dict[str, Any] = {"type": choice(nr.get("type"), f"{param}.type", ("near_field", "far_field"))}
    if nr.get("strength") is not None:
        out["strength"] = num(nr["strength"], f"{param}.strength", 0.0, 1.0)
    return out


def tracing(value: Any, param: str) -> str | dict[str, Any] | None:
    if value is None or value == "auto":
        return value
    t = obj(value, param)
    check_keys(t, {"group_id", "metadata", "workflow_name"}, param)
    opt_string(t.get("group_id"), f"{param}.group_id")
    opt_string(t.get("workflow_name"), f"{param}.workflow_name")
    return copy.deepcopy(t)


def prompt(value: Any, param: str) -> dict[str, Any] | None:
    """A stored prompt reference ``{id, version?, variables?}`` (kept and echoed)."""
    if value is None:
        return None
    p = obj(value, param)
    check_keys(p, {"id", "version", "variables"}, param)
    string(p.get("id"), f"{param}.id")
    opt_string(p.get("version"), f"{param}.version")
    if p.get("variables") is not None:
        obj(p["variables"], f"{param}.variables")
    return copy.deepcopy(p)


def reasoning(value: Any, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    r = obj(value, param)
    check_keys(r, {"effort"}, param)
    out: dict[str, Any] = {}
    if r.get("effort") is not None:
        out["effort"] = choice(r["effort"], f"{param}.effort", REASONING_EFFORTS)
    return out


def include(value: Any, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    names = strings(value, param)
    for i, name in enumerate(names):
        if name != LOGPROBS_INCLUDE:
            raise err(f"'{param}[{i}]' must be {LOGPROBS_INCLUDE!r}; got {name!r}.", f"{param}[{i}]")
    return names
