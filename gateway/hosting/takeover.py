"""Resuming a session on this replica, decided as a pure function.

A client sends ``session.resume`` (session id, resume token, the last seq it
holds) as the first event on a new socket. What this replica knows of the
session (``Held``: its own live host, or the store's snapshot) and what the
journal holds after the client's seq (``JournalRead``) decide, with no I/O, what
the transport does (``plan``):

- ``Refusal``: a coded error on the connection's new session, which goes on
  (unknown session or another principal's, both ``session_not_found``; wrong
  token; a seq beyond anything the session sent); none reveals another user's
  data;
- ``Replay``: ``session.resumed``, then events ``replay_from..replay_to`` as
  first sent, then live events;
- ``Resync``: ``session.resync_required`` with the session's state, when the
  events after the client's seq cannot be replayed (``reason``:
  ``journal_trimmed``), or when the client holds events the store never got
  (``client_ahead``: they were sent by a replica that died before its journal
  batch was committed). Write-ahead makes the second case one of deltas only:
  every state change the client saw is in the store, so the state sent is the
  one it saw, and the answer those deltas belonged to is ended ``incomplete``
  and re-issued right after.

``admit`` is the part of the decision that needs no journal; the shell
(``claim.py``) calls it before it fences the session's owner, so that a refused
resume never disturbs the session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.store.base import JournalRead

# Why a resume cannot replay (``Resync.reason``, machine-readable), and what to tell a person.
JOURNAL_TRIMMED = "journal_trimmed"
CLIENT_AHEAD = "client_ahead"
RESYNC_MESSAGES = {
    JOURNAL_TRIMMED: "The events after your last seq are no longer kept (trimmed, acknowledged or expired).",
    CLIENT_AHEAD: "You hold events this session's store never received (their replica died before "
    "committing them); rebuild from this state.",
}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_resume_token() -> str:
    return "rt_" + secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class Held:
    """What this replica knows of the session to resume."""

    token_hash: str  # sha256 of the current resume token
    principal: str  # who created the session (only they may resume it)
    seq: int  # the highest seq known to be sent: everything, for a live host
    live: bool  # True: a host on this replica serves it; False: read from the store
    minted: str | None = None  # the binding of the client secret that opened it (None: a key or token did)

    @classmethod
    def from_snapshot(cls, state: dict[str, Any]) -> Held:
        minted = state.get("minted")
        return cls(state["token_hash"], state["principal"], state["seq"], live=False,
                   minted=minted if isinstance(minted, str) else None)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str
    param: str | None = None

    def error(self, event_id: str | None) -> ProtocolError:
        return ProtocolError(self.code, self.message, param=self.param, event_id=event_id)


@dataclass(frozen=True, slots=True)
class Replay:
    replay_from: int
    replay_to: int  # = replay_from - 1 when there is nothing to replay
    events: list[tuple[int, bytes]]


@dataclass(frozen=True, slots=True)
class Resync:
    reason: str  # JOURNAL_TRIMMED | CLIENT_AHEAD

    @property
    def message(self) -> str:
        return RESYNC_MESSAGES[self.reason]


Plan = Refusal | Replay | Resync


def admit(held: Held | None, event: ce.SessionResume, principal: str, minted: str | None = None) -> Refusal | None:
    """Whether ``principal`` may resume the session with ``event``; needs no journal.
    ``minted``: the resumer came with a client secret, of this binding (``Minted.binding``):
    it resumes only a session opened with a secret minted for the same (its principal's key
    or token resumes any of the principal's sessions).

    The owner is checked before the token, and another principal's session (or, for a
    client secret, one it was not minted for) is answered exactly as one that does not
    exist: a stolen token tells its thief nothing (not whether it is valid, nor whether
    the session is there)."""
    if held is None or held.principal != principal or (minted is not None and held.minted != minted):
        return Refusal(
            Code.SESSION_NOT_FOUND,
            f"No session {event.session_id!r} to resume (unknown or expired); start a new session.",
            "session_id",
        )
    if not hmac.compare_digest(token_hash(event.resume_token), held.token_hash):
        return Refusal(
            Code.RESUME_TOKEN_INVALID,
            "The resume token is not valid for this session "
            "(each resume rotates it: use the one from the last session.resumed).",
            "resume_token",
        )
    last = event.last_received_server_event_seq
    if held.live and last > held.seq:
        return seq_refusal(last, held.seq)
    return None


def plan(
    held: Held | None, read: JournalRead, event: ce.SessionResume, principal: str, minted: str | None = None
) -> Plan:
    """What to do with the resume: ``read`` is the journal after the client's seq.
    Refuses only what ``admit`` refuses."""
    refusal = admit(held, event, principal, minted)
    if refusal is not None:
        return refusal
    assert held is not None
    last = event.last_received_server_event_seq
    if read.gap:
        return Resync(JOURNAL_TRIMMED)
    if last > top_seq(held, read):  # a live host refused that in admit: it sent everything
        return Resync(CLIENT_AHEAD)
    replay_to = read.last_seq if read.events and read.last_seq is not None else last
    return Replay(last + 1, replay_to, read.events)


def top_seq(held: Held, read: JournalRead) -> int:
    """The highest seq the store (or the live host) knows the session sent."""
    return max(held.seq, read.last_seq or 0)


def seq_refusal(last: int, top: int) -> Refusal:
    return Refusal(
        Code.RESUME_SEQ_INVALID,
        f"last_received_server_event_seq {last} is beyond anything this session sent ({top}).",
        "last_received_server_event_seq",
    )
