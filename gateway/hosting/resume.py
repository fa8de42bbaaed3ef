"""A resume carried out through a connection's door: the session claimed (``claim.py``),
attached, then the takeover plan (``takeover.py``) said and done: replay what the client
missed, or send the state to resync from, then live, with nothing sent twice."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gateway.hosting.claim import claim
from gateway.hosting.context import HostContext
from gateway.hosting.host import Attached, SessionHost
from gateway.hosting.takeover import Replay, Resync, plan
from gateway.protocol import client_events as ce
from gateway.protocol import dialects
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.store.base import StateQuota, StoreError

log = logging.getLogger("omni.door")


class Resuming(Attached, Protocol):
    """What a resume needs of the connection's door (``door.Door``)."""

    ctx: HostContext
    sessions: Any  # door.Sessions: restore_session
    principal: str
    minted: str | None  # the binding of the connection's client secret (None: a key or token)
    dialect: dialects.Dialect
    generation: int

    @property
    def quota(self) -> StateQuota | None:
        """What the store may keep of the principal's sessions."""

    def took_over(self, host: SessionHost) -> None:
        """The session came to this connection: attach it."""


async def take_over(door: Resuming, event: ce.SessionResume, provisional: SessionHost | None) -> None:
    """Move ``event.session_id`` onto ``door``'s connection and carry out the plan. Raises
    ProtocolError (a refusal, before anyone is fenced) or StoreError."""
    assert door.sessions is not None
    taken = await claim(door.ctx, event, door.principal, provisional=provisional,
                        restore=door.sessions.restore_session, quota=door.quota, minted=door.minted)  # fmt: skip
    host, last = taken.host, event.last_received_server_event_seq
    held_token = host.token_hash  # the one the client holds: its again if the resume fails
    token = host.rotate_token()
    delivery = door.delivery
    delivery.hold()  # live events from here on wait until the replay is out
    door.took_over(host)
    try:
        read = await taken.read()
    except StoreError:
        # Attached but cannot replay: let the client retry the resume shortly, with the token
        # it holds (it never learnt the rotated one).
        host.restore_token(held_token)
        delivery.release(host.session.seq)
        again = ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; resume again shortly.",
                              event_id=event.event_id)  # fmt: skip
        delivery.send_now(door.dialect.refusal(again))
        delivery.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
        host.detach(door)
        if provisional is not None:
            await provisional.end(reason="resume failed", delete=True)
        return
    outcome = plan(taken.held, read, event, door.principal, door.minted)
    s = host.session
    if isinstance(outcome, Resync) and not await _load_conversation(door, host, provisional, held=True):
        return  # (the state to resync from is the conversation: read it first)
    if isinstance(outcome, Resync):
        delivery.send_now(door.dialect.resync(dialects.Resync(
            session_id=s.id, resume_token=token, reason=outcome.reason, message=outcome.message,
            session=s.render_config(), conversation=[it.render(s.beta) for it in s.conversation],
            last_server_event_seq=s.seq, generation=door.generation,
        )))  # fmt: skip
        delivery.release(s.seq)
    elif isinstance(outcome, Replay):
        delivery.send_now(door.dialect.resumed(dialects.Resumed(
            session_id=s.id, resume_token=token, replay_from=outcome.replay_from, replay_to=outcome.replay_to,
            generation=door.generation, session=s.render_config(),
        )))  # fmt: skip
        for _, data in outcome.events:
            delivery.replay(data)
        delivery.release(outcome.replay_to or 0)  # what was held and the replay carried: not again
    else:  # admitted before the claim, so a refusal cannot come now
        raise AssertionError(f"a refusal after the claim: {outcome}")
    door.ctx.metrics.resumes.labels("resync" if isinstance(outcome, Resync) else "replayed").inc()
    log.info("session %s resumed (last seq %d, %d replayed, gap=%s)", s.id, last, len(read.events), read.gap)
    # The resume is answered: now the conversation (its cost is the conversation's, not
    # the resume's). The connection's next messages wait until it is in.
    if not await _load_conversation(door, host, provisional):
        return
    if not host.ended:  # (it may have been taken again meanwhile)
        if taken.recovered:
            s.recover(taken.reason)
        host.flush()  # also writes the snapshot with the rotated token
    if provisional is not None:
        await provisional.end(reason="replaced by a resumed session", delete=True)


async def _load_conversation(door: Resuming, host: SessionHost, provisional: SessionHost | None, *,
                             held: bool = False) -> bool:  # fmt: skip
    """The conversation of a session restored without it; False when the store could not
    give it: the client is told to resume again shortly (the socket closes with 1013).
    ``held``: the delivery's hold of the resume is still on."""
    try:
        await host.load_conversation()
        return True
    except StoreError as exc:
        log.warning("session %s: its conversation could not be read (%s); the client resumes again", host.id, exc)
    if held:
        door.delivery.release(host.session.seq)
    again = ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; resume again shortly.")
    door.delivery.send_now(door.dialect.refusal(again))
    door.delivery.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
    host.detach(door)
    await host.end(reason="its conversation could not be read", delete=False)
    if provisional is not None:
        await provisional.end(reason="resume failed", delete=True)
    return False
