"""The cascade's text brain: conversation in, text deltas out.

A ``Thinker`` is anything that turns the conversation into a stream of text
deltas (and, if it ``calls_tools``, of ``ToolCallDelta``s for the functions it
calls). The cascade ships only ``EchoThinker``, which does no thinking at
all and cannot call tools; plug a language model in by passing another
``Thinker`` to ``CascadeEngine`` (``VllmThinker`` calls tools).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from orchestrator.engine import FunctionTool, Message, ToolCallDelta, ToolChoice

NOTHING_HEARD = "I did not catch that."


class Thinker(Protocol):
    def think(self, messages: tuple[Message, ...], instructions: str, /) -> AsyncIterator[str | ToolCallDelta]:
        """Text deltas of the assistant's answer; they concatenate to the answer."""
        ...


class ToolThinker(Protocol):
    """A thinker that can call functions (its ``calls_tools`` is true): it is given
    the response's tools and may yield ``ToolCallDelta``s for the calls it makes."""

    calls_tools: bool

    def think(
        self,
        messages: tuple[Message, ...],
        instructions: str,
        /,
        *,
        tools: tuple[FunctionTool, ...],
        tool_choice: ToolChoice,
        parallel_tool_calls: bool,
    ) -> AsyncIterator[str | ToolCallDelta]: ...


class EchoThinker:
    """Not a model: repeats the last user message back as "You said: <text>".

    Yields the answer word by word (each word after the first with its
    leading space) so downstream streaming is exercised. With no user text
    in the conversation it answers "I did not catch that."
    """

    description = "EchoThinker (repeats the last user message; not a language model; cannot call tools)"
    follows_instructions = False  # the session warns that instructions have no effect
    calls_tools = False  # tools are ignored with tool_choice auto; required or a named function fail

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str | ToolCallDelta]:
        heard = ""
        for message in reversed(messages):
            if message.role == "user":
                heard = " ".join(message.text.split())
                break
        answer = f"You said: {heard}" if heard else NOTHING_HEARD
        for i, word in enumerate(answer.split(" ")):
            yield word if i == 0 else " " + word
