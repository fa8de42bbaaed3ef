"""The cascade's text brain: conversation in, text deltas out.

A ``Thinker`` is anything that turns the conversation into a stream of text
deltas. The cascade ships only ``EchoThinker``, which does no thinking at
all; plug a language model in by passing another ``Thinker`` to
``CascadeEngine``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from orchestrator.engine import Message

NOTHING_HEARD = "I did not catch that."


class Thinker(Protocol):
    def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        """Text deltas of the assistant's answer; they concatenate to the answer."""
        ...


class EchoThinker:
    """Not a model: repeats the last user message back as "You said: <text>".

    Yields the answer word by word (each word after the first with its
    leading space) so downstream streaming is exercised. With no user text
    in the conversation it answers "I did not catch that."
    """

    description = "EchoThinker (repeats the last user message; not a language model)"

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        heard = ""
        for message in reversed(messages):
            if message.role == "user":
                heard = " ".join(message.text.split())
                break
        answer = f"You said: {heard}" if heard else NOTHING_HEARD
        for i, word in enumerate(answer.split(" ")):
            yield word if i == 0 else " " + word
