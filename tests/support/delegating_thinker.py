"""A scripted cascade thinker that delegates: a stand-in for a language model that calls functions.

The CPU here runs no model that decides, reliably, to call a function (the vLLM tests'
tiny model has random weights), so the GPT-Live delegation tests give the real cascade
(pocketsphinx, eSpeak NG) this thinker: offered the ``delegate`` function, it calls it
with the task "Answer the user: <what it heard>"; offered none, it says "Okay.". It
follows no instructions, so what an answer must say (``ResponseRequest.say``: an
acknowledgement, a delegated result) is said as it is. It is a script, said so in every
test that uses it: what it proves is the gateway's part (the call, the delegation, the
acknowledgement, the result said), not a model's judgement."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from orchestrator.engine import FunctionTool, Message, ToolCallDelta, ToolChoice

AUTO = ToolChoice()


class DelegatingThinker:
    description = "DelegatingThinker (a test script: calls delegate with what it heard; not a language model)"
    follows_instructions = False
    calls_tools = True

    def __init__(self) -> None:
        self.tasks: list[str] = []  # the tasks it delegated

    async def think(
        self,
        messages: tuple[Message, ...],
        instructions: str,
        /,
        *,
        tools: tuple[FunctionTool, ...] = (),
        tool_choice: ToolChoice = AUTO,
        parallel_tool_calls: bool = True,
    ) -> AsyncIterator[str | ToolCallDelta]:
        heard = next((m.text for m in reversed(messages) if m.role == "user" and m.text.strip()), "")
        if any(t.name == "delegate" for t in tools) and heard:
            task = f"Answer the user: {heard}"
            self.tasks.append(task)
            yield ToolCallDelta(0, orjson.dumps({"task": task}).decode(), call_id=f"call_{len(self.tasks)}",
                                name="delegate")  # fmt: skip
            return
        yield "Okay."
