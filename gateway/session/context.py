"""Truncation: which conversation items a response's model sees (pure).

The session's ``truncation`` decides what happens when the conversation no
longer fits the engine's context (``EngineInfo.max_context_tokens``, less room
for the answer: ``max_output_tokens``, or a quarter of the context when that is
unbounded):

- ``"auto"`` (default): the oldest items are left out until the rest fits;
- ``{"type": "retention_ratio", "retention_ratio": r, "token_limits":
  {"post_instructions": n}}``: once over the budget (or over ``n`` tokens after
  the instructions, when given), the oldest items are left out until what is
  kept is at most ``r`` of it, so truncation happens in larger, rarer steps;
- ``"disabled"``: everything is sent; an engine whose context overflows fails
  the response.

Only the engine's input is cut: the conversation keeps its items (the item
budget, ``max_conversation_items``, deletes the oldest ones for good). A
function call output whose call was left out is left out too (templates need
the pair). Tokens are estimated, not counted: 4 characters a token plus 4 per
item, a stable upper bound for English with the tokenizers we serve.
"""

from __future__ import annotations

from typing import Any

from gateway.session.conversation import Item

CHARS_PER_TOKEN = 4
TOKENS_PER_ITEM = 4


def estimate_tokens(item: Item) -> int:
    chars = (
        sum(len(p.content_text) for p in item.content) + len(item.arguments) + len(item.output) + len(item.name or "")
    )
    return chars // CHARS_PER_TOKEN + TOKENS_PER_ITEM


def fit_context(
    items: list[Item],
    instructions: str,
    truncation: str | dict[str, Any],
    max_context_tokens: int | None,
    max_output_tokens: int | None,
) -> list[Item]:
    if truncation == "disabled":
        return items
    limit: int | None = None
    if max_context_tokens is not None:
        room = max_output_tokens if max_output_tokens is not None else max_context_tokens // 4
        limit = max(0, max_context_tokens - room - len(instructions) // CHARS_PER_TOKEN)
    ratio = 1.0
    if isinstance(truncation, dict):
        ratio = float(truncation["retention_ratio"])
        post = (truncation.get("token_limits") or {}).get("post_instructions")
        if post is not None:
            limit = post if limit is None else min(limit, post)
    if limit is None:
        return items
    sizes = [estimate_tokens(it) for it in items]
    total = sum(sizes)
    if total <= limit:
        return items
    target = min(limit, int(limit * ratio))
    start = 0
    while start < len(items) and total > target:
        total -= sizes[start]
        start += 1
    kept = items[start:]
    calls = {it.call_id for it in kept if it.type == "function_call"}
    return [it for it in kept if it.type != "function_call_output" or it.call_id in calls]
