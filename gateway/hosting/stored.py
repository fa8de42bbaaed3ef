"""Sessions kept for their client after they close (GPT-Live's ``store: true``), on any replica.

A session whose dialect keeps it (``RealtimeSession.retained``) leaves its state in
the store when it closes, until the store's idle TTL (``StoreLimits.idle_ttl_s``):
its snapshot (settings, conversation) and its journal. From there, on any replica,
its client may download its recording (``recording``) or start a new session that
carries it on (``load_stored`` is what a fork starts from: ``Runtime.fork_session``).

Only the principal that created the session sees it: to anyone else it is
``session_not_found``, as a session that does not exist is.
"""

from __future__ import annotations

from typing import Any

from gateway.hosting.context import HostContext
from gateway.protocol.errors import Code, ProtocolError
from gateway.session import snapshot
from gateway.session.kinds import restore_kind
from gateway.store.base import StoreError


def _not_found(session_id: str) -> ProtocolError:
    return ProtocolError(
        Code.SESSION_NOT_FOUND,
        f"No stored session {session_id!r}: it was never started with store: true, it belongs to another "
        "credential, or it was forgotten (stored sessions are kept for the store's idle TTL).",
        param="session_id",
    )


async def load_stored(ctx: HostContext, session_id: str, principal: str, minted: str | None = None) -> dict[str, Any]:
    """The state of the stored session ``session_id`` (its conversation included), for
    ``principal`` (and, for a client secret of binding ``minted``, only a session opened with
    a secret minted the same: ``takeover.admit``); raises ProtocolError (``session_not_found``)
    or StoreError."""
    loaded = await ctx.store.load_session(session_id)
    if loaded is None:
        raise _not_found(session_id)
    try:
        state = snapshot.assemble(*loaded)
        kind = restore_kind(state)
    except (ValueError, KeyError):  # not a realtime session's snapshot (a video session's registration)
        raise _not_found(session_id) from None
    if state.get("principal") != principal or not kind.cls.stored(state):
        raise _not_found(session_id)
    if minted is not None and state.get("minted") != minted:
        raise _not_found(session_id)
    return state


async def stored_model(ctx: HostContext, session_id: str, principal: str, minted: str | None = None) -> str:
    """The model of the stored session ``session_id`` (what a fork over WebRTC is admitted
    for before its call is answered); raises ProtocolError (``session_not_found``, or
    ``store_unavailable`` when the store cannot say)."""
    try:
        state = await load_stored(ctx, session_id, principal, minted)
    except StoreError:
        raise ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.") from None
    model: str = state["config"]["model"]
    return model


async def recording(ctx: HostContext, session_id: str, principal: str) -> tuple[bytes, str]:
    """The recording of the stored session ``session_id``: (content, media type)."""
    state = await load_stored(ctx, session_id, principal)
    journal = await ctx.store.read_events(session_id, after_seq=0)
    return restore_kind(state).cls.recording(state, [data for _, data in journal.events])
