"""Claiming a session for a resume: the store I/O around the pure decision in
``takeover.py``.

- The session runs here (its socket dropped, or another socket of the same
  client still holds it): its host is found in the registry, and the journal is
  read only after the new peer is attached (``Claim.read``), so that no event
  falls between the replay and the live stream.
- It runs elsewhere, or ran on a replica that died: the snapshot's head is loaded
  (not the item records: the conversation is read once the resume is answered,
  ``SessionHost.load_conversation``; a live old owner asked first to commit what it
  appended: ``FLUSH_ASK``, waited for at most ``TAKEOVER_FLUSH_WAIT_S``), the resume
  admitted, the lease taken (which fences the old owner's writes; the old owner is also told on its
  bus channel to stop at once), the head read again if the old owner may have committed
  since, the journal read, and the session restored here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.hosting.ask import AskUnavailable, NoOwner, ask_owner
from gateway.hosting.context import HostContext
from gateway.hosting.host import SessionHost
from gateway.hosting.takeover import Held, Refusal, admit, top_seq
from gateway.protocol import client_events as ce
from gateway.session import snapshot
from gateway.session.session import RealtimeSession
from gateway.store.base import JournalRead, StateQuota, StoreError, StoreUnavailable, replica_channel
from orchestrator.orchestrator import Orchestrator

FLUSH_ASK = "session.flush"  # (ask.py) a resuming replica asks the live owner to commit first
TAKEOVER_FLUSH_WAIT_S = 0.5  # the longest a resume waits for it; past it, the old owner is fenced as it is

# Rebuilds a session from its snapshot state on this replica; raises ProtocolError
# (model_not_found) when its model is not served here.
Restore = Callable[[dict[str, Any]], tuple[RealtimeSession, Orchestrator]]


@dataclass(slots=True)
class Claim:
    """A session this replica now serves for the resuming client."""

    host: SessionHost
    held: Held  # what was known of the session when the resume was admitted
    recovered: bool  # taken from the store: what died with the old owner must be ended
    _read: JournalRead | None
    _after: int
    # Why what was running ended with the old owner: "drained" (it handed the session over)
    # or "replica_lost" (it died): a response it cut ends incomplete with this gateway_reason.
    reason: str = "replica_lost"

    async def read(self) -> JournalRead:
        """Commit the host's snapshot (with the resume token just rotated: the client
        must be able to use it anywhere before it learns it) and, for a session live
        here, what is pending; then the journal after the client's seq. Call it once
        the peer is attached."""
        self.host.save_snapshot()
        await self.host.writer.flush()
        if self._read is None:
            self._read = await self.host.ctx.store.read_events(self.host.id, after_seq=self._after)
        return self._read


async def claim(
    ctx: HostContext,
    event: ce.SessionResume,
    principal: str,
    *,
    provisional: SessionHost | None,
    restore: Restore,
    quota: StateQuota | None = None,
    minted: str | None = None,
) -> Claim:
    """Take ``event.session_id`` for ``principal`` (its state kept within ``quota``; ``minted``:
    the binding of the resumer's client secret, see ``takeover.admit``). Raises
    ProtocolError (a refusal, before anyone is fenced) or StoreError."""
    sid, last = event.session_id, event.last_received_server_event_seq
    host = ctx.hosts.get(sid)
    if isinstance(host, SessionHost) and host is not provisional:
        held = Held(host.token_hash, host.principal, host.session.seq, live=True, minted=host.minted)
        _raise(admit(held, event, principal, minted), event)
        return Claim(host, held, recovered=False, _read=None, _after=last)
    previous = await ctx.store.owner_of(sid)
    if previous is not None and previous.owner != ctx.replica_id:
        # Before the snapshot is read: what the old owner commits now is in both the state
        # restored here and the journal replayed (read between them, the two would disagree).
        await _flushed_by(ctx, sid, previous.owner)
    # The snapshot's head only: what admitting and answering the resume need. The
    # conversation is read once the resume is answered (SessionHost.load_conversation).
    head = await ctx.store.load_snapshot(sid)
    state = realtime_head(head)
    if state is None and ctx.watch is not None and await ctx.watch.restoring():
        # The store came back a moment ago (maybe empty): the replica serving the session
        # may not have written it back yet. Not a final session_not_found: resume again.
        raise StoreUnavailable("the store has just come back; its sessions are being written back")
    found = Held.from_snapshot(state) if state is not None else None
    _raise(admit(found, event, principal, minted), event)
    assert state is not None and found is not None
    session, orchestrator = restore(state)  # (before the fence: a model not served here is refused first)
    fence = await ctx.store.acquire(sid, ctx.replica_id, ctx.lease_ttl_ms, quota=quota)
    if previous is not None and previous.owner != ctx.replica_id:
        # A live old owner may have committed between that read and the fence (its periodic
        # flush): the journal read below would have it and the state restored not (a finished
        # answer ended again as cut). After the fence nobody writes: read the head once more.
        again = await ctx.store.load_snapshot(sid)
        if again != head and (fresher := realtime_head(again)) is not None:
            state, found = fresher, Held.from_snapshot(fresher)
            session, orchestrator = restore(state)
        # The old owner may be alive (a dropped socket): tell it to stop now, on its
        # own channel (the lease already names us). Fencing stops its writes anyway.
        stop = orjson.dumps({"type": "replaced", "session_id": sid})
        await ctx.store.publish(replica_channel(previous.owner), stop)
    # After acquire nobody else writes this journal: one read serves the replay.
    read = await ctx.store.read_events(sid, after_seq=last)
    # Never reuse a seq the client may already hold (events sent but lost from the journal).
    session.seq = max(top_seq(found, read), last)
    host = SessionHost(
        ctx, session, orchestrator=orchestrator, principal=found.principal, token_hash=found.token_hash, fence=fence,
        quota=quota, head=state,
    )  # fmt: skip
    return Claim(host, found, recovered=True, _read=read, _after=last,
                 reason="drained" if state.get("ended_by") == "drain" else "replica_lost")  # fmt: skip


async def _flushed_by(ctx: HostContext, sid: str, owner: str) -> None:
    """Before fencing a live owner (a dropped socket: the session goes on there), ask it to
    commit what it has appended. It sends deltas before their commit, so its client may hold
    events the journal has not yet: without this, a client that reconnects faster than the
    owner's next flush (a busy machine) is ahead of what the resume reads, and gets a resync
    instead of its replay. A dead owner is not listening (asked of nobody: at once); a
    stalled one is not waited for past ``TAKEOVER_FLUSH_WAIT_S``."""
    with contextlib.suppress(NoOwner, TimeoutError, AskUnavailable):
        await ask_owner(ctx, sid, FLUSH_ASK, {}, TAKEOVER_FLUSH_WAIT_S, owner=owner)


async def flush_asked(ctx: HostContext, body: dict[str, Any]) -> dict[str, Any]:
    """On the owner: another replica takes the session over; commit what was appended first."""
    host = ctx.hosts.get(str(body.get("session_id", "")))
    if not isinstance(host, SessionHost) or host.ended:
        return {"found": False}
    try:
        await host.writer.flush()
    except StoreError:
        return {"found": True, "flushed": False}
    return {"found": True, "flushed": True}


def realtime_head(head: bytes | None) -> dict[str, Any] | None:
    """The head of a realtime session's snapshot (all but its item records), or None:
    nothing stored, or the snapshot of something else under that id (a video session's
    registration)."""
    if head is None:
        return None
    try:
        state = snapshot.loads(head)
    except ValueError:  # not JSON, not a realtime snapshot (no "v", another version)
        return None
    return state if "item_ids" in state or "items" in state else None


def _raise(refusal: Refusal | None, event: ce.SessionResume) -> None:
    if refusal is not None:
        raise refusal.error(event.event_id)
