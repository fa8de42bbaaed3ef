"""Function calling for the vLLM engines, with vLLM's own machinery.

``ToolCalling`` holds what one response needs: the tools in the chat
template's shape (``chat_tools``, passed to ``apply_chat_template(tools=...)``),
the structured-output constraint, and a reader that turns the streamed text
into ``TextDelta``s and ``ToolCallDelta``s:

- ``tool_choice`` ``function`` (one named function) and ``required``: vLLM's
  structured outputs (``get_json_schema_from_tools``: the function's parameter
  schema, or an array of ``{name, parameters}`` over every tool, one item at
  most without ``parallel_tool_calls``) constrain the output, so even a tiny
  random-weight model returns a call whose arguments validate against the
  schema; the JSON is read as it streams by vLLM's
  ``extract_named_tool_call_streaming`` / ``extract_required_tool_call_streaming``.
  Whitespace outside strings is not generated (``disable_any_whitespace``: set
  engine-wide by ``VllmEngine.start``, where vLLM's xgrammar backend reads it;
  an ``AsyncLLM`` passed in keeps its own setting), so a small model cannot
  pad a call forever.
- ``auto``: the tools are rendered into the prompt and the model decides;
  its calls are recognised by the route's ``tool_parser`` (a vLLM
  ``--tool-call-parser`` name: ``hermes``, ``llama3_json``, ``mistral``, ...),
  streamed by the parser's ``extract_tool_calls_streaming``. Without a
  ``tool_parser`` the model could not be understood when it calls, so
  ``auto`` answers in text and the tools are not offered (as ``vllm serve``
  needs ``--tool-call-parser`` for ``auto``).

A limit and what happens when it is hit: a call the model leaves unfinished
at ``max_output_tokens`` ends the response ``incomplete`` with the arguments
so far (not valid JSON), as OpenAI's API does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from orchestrator.engine import (
    EngineError,
    EngineOutput,
    Message,
    ResponseRequest,
    TextDelta,
    ToolCallDelta,
)


def chat_messages(
    messages: Sequence[Message], instructions: str, image_placeholder: str | None = None
) -> list[dict[str, Any]]:
    """The conversation as chat-template messages (OpenAI chat format, which HF
    templates read): assistant calls as ``tool_calls`` (arguments as objects
    where they parse), results as ``tool`` messages. A turn's images become
    ``image_placeholder`` lines before its text, as vLLM renders a string-content
    template's images (None: images are left out)."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for m in messages:
        content = m.text
        if m.images and image_placeholder is not None:
            content = "\n".join([image_placeholder] * len(m.images) + ([m.text] if m.text else []))
        entry: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        chat.append(entry)
    return chat


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class ToolCalling:
    """Tools for one response (see the module docstring); built only when
    ``request.calls_tools``."""

    def __init__(self, request: ResponseRequest, tokenizer: Any, tool_parser: str | None) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.tool_parsers import ToolParserManager
        from vllm.tool_parsers.utils import get_json_schema_from_tools

        choice = request.tool_choice
        self.mode = choice.mode
        self.name = choice.name
        self.chat_tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
            }
            for t in request.tools
        ]
        api_choice: Any = choice.mode
        if choice.mode == "function":
            api_choice = {"type": "function", "function": {"name": choice.name}}
        try:
            self._api = ChatCompletionRequest(
                messages=[],
                tools=self.chat_tools,
                tool_choice=api_choice,
                parallel_tool_calls=request.parallel_tool_calls,
            )
        except ValueError as exc:
            raise EngineError("invalid_tools", f"vLLM refused the tools: {exc}") from exc
        self.skip_special_tokens = True
        self.structured_outputs: Any = None
        self._parser: Any = None
        if self.mode in ("function", "required"):
            schema = get_json_schema_from_tools(
                tool_choice=self._api.tool_choice,
                tools=self._api.tools,
                parallel_tool_calls=request.parallel_tool_calls,
            )
            self.structured_outputs = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        elif tool_parser is not None:
            try:
                parser_cls = ToolParserManager.get_tool_parser(tool_parser)
            except KeyError as exc:
                raise EngineError("invalid_tool_parser", f"vLLM has no tool parser {tool_parser!r}") from exc
            self._parser = parser_cls(tokenizer, self._api.tools)
            self._api = self._parser.adjust_request(self._api)
            self.skip_special_tokens = self._api.skip_special_tokens
        else:
            self.chat_tools = []  # auto without a parser: answered in text, tools not offered
        self._tokenizer = tokenizer
        self._text = ""
        self._ids: list[int] = []
        self._named_sent = False

    @property
    def offered(self) -> bool:
        """Whether the prompt offers the tools (else this response is text only)."""
        return bool(self.chat_tools)

    def feed(self, delta: str, ids: Sequence[int]) -> list[EngineOutput]:
        """The outputs for one streamed piece of the model's text."""
        previous, previous_ids = self._text, self._ids
        self._text, self._ids = previous + delta, previous_ids + list(ids)
        if self.mode == "function":
            from vllm.tool_parsers.streaming import extract_named_tool_call_streaming

            if not delta:
                return []
            message, self._named_sent = extract_named_tool_call_streaming(
                delta_text=delta,
                function_name=self.name or "",
                function_name_returned=self._named_sent,
                tool_call_idx=0,
                tool_call_id_type="random",
                tokenizer=self._tokenizer,
            )
        elif self.mode == "required":
            from vllm.tool_parsers.streaming import extract_required_tool_call_streaming

            message, _ = extract_required_tool_call_streaming(
                previous_text=previous, current_text=self._text, tool_call_idx=0, tool_call_id_type="random"
            )
        elif self._parser is not None:
            message = self._parser.extract_tool_calls_streaming(
                previous, self._text, delta, previous_ids, self._ids, list(ids), self._api
            )
        else:
            return [TextDelta(delta)] if delta else []
        return _outputs(message)


def _outputs(message: Any) -> list[EngineOutput]:
    """vLLM's ``DeltaMessage`` as engine outputs."""
    if message is None:
        return []
    out: list[EngineOutput] = []
    if message.content:
        out.append(TextDelta(message.content))
    # By index: a parser may hand a call's last arguments beside the next call's start, and
    # the session finishes each call as the next begins.
    for call in sorted(message.tool_calls or [], key=lambda c: c.index):
        function = call.function
        if isinstance(function, dict):  # some parsers hand over the dumped model
            name, arguments = function.get("name"), function.get("arguments")
        elif function is not None:
            name, arguments = function.name, function.arguments
        else:
            name, arguments = None, None
        out.append(ToolCallDelta(call.index, arguments or "", call_id=call.id, name=name))
    return out
