"""Requests answered by the replica that serves a session: a REST call on any replica asks the
owner, over the bus, and waits (bounded) for what it answered.

The request goes to the session's owner as a hangup does (``send_to_owner``: the owner named
by the session's lease), as ``{"type": "ask", "kind", "ref", "reply_to", ...}``; the owner's
bus listener hands it to the answerer its transport registered for ``kind``
(``HostContext.answerers``; a SIP transfer: ``sip.refer``), and publishes ``{"type":
"answer", "ref", "answer"}`` on the asking replica's channel, where the waiting request takes
it (``HostContext.asks``). An owner that has no answerer for ``kind`` answers
``{"unknown": true}``; one that died answers nothing (the asker's wait runs out).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import orjson

from gateway.hosting.context import HostContext
from gateway.store.base import StoreError, replica_channel

log = logging.getLogger("omni.ask")


class NoOwner(Exception):
    """No replica serves the session (or none was listening): nothing was asked."""


class AskUnavailable(Exception):
    """The store could not carry the question (down or failing): ask again shortly."""


async def ask_owner(ctx: HostContext, session_id: str, kind: str, fields: dict[str, Any],
                    timeout_s: float, *, owner: str | None = None) -> dict[str, Any]:  # fmt: skip
    """``kind`` with ``fields``, answered by the replica serving ``session_id`` (``owner``: that
    replica, known already: the store is not asked): its answer. Raises NoOwner, TimeoutError (no
    answer within ``timeout_s``), AskUnavailable (the store)."""
    ref = secrets.token_hex(8)
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    ctx.asks[ref] = future
    message = {**fields, "type": "ask", "kind": kind, "ref": ref, "reply_to": ctx.replica_id, "session_id": session_id}
    try:
        try:
            data = orjson.dumps(message)
            if owner is not None:
                sent = await ctx.store.publish(replica_channel(owner), data) > 0
            else:
                sent = await ctx.store.send_to_owner(session_id, data)
        except StoreError as exc:
            raise AskUnavailable(str(exc)) from exc
        if not sent:
            raise NoOwner(session_id)
        return await asyncio.wait_for(future, timeout_s)
    finally:
        ctx.asks.pop(ref, None)


async def answer_ask(ctx: HostContext, body: dict[str, Any]) -> None:
    """On the owner: answer an ``ask`` (the bus listener spawns this)."""
    ref, reply_to = body.get("ref"), body.get("reply_to")
    if not isinstance(ref, str) or not isinstance(reply_to, str):
        return
    answerer = ctx.answerers.get(str(body.get("kind", "")))
    try:
        answer = await answerer(body) if answerer is not None else {"unknown": True}
    except Exception:
        log.exception("answering %s for %s failed", body.get("kind"), reply_to)
        answer = {"unknown": True}
    message = {"type": "answer", "ref": ref, "answer": answer}
    try:
        await ctx.store.publish(replica_channel(reply_to), orjson.dumps(message))
    except Exception as exc:  # (the asker's wait runs out)
        log.warning("answering %s for %s: the bus failed: %s", body.get("kind"), reply_to, exc)


def answered(ctx: HostContext, body: dict[str, Any]) -> None:
    """On the asker: an ``answer`` came back (too late, or twice: dropped)."""
    future = ctx.asks.get(str(body.get("ref", "")))
    answer = body.get("answer")
    if future is not None and not future.done() and isinstance(answer, dict):
        future.set_result(answer)
