"""Resuming a session on this replica, decided as a pure function.

A client sends ``session.resume`` (session id, resume token, the last seq it
holds) as the first event on a new socket. What this replica knows of the
session (``Held``: its own live host, or the store's snapshot) and what the
journal holds after the client's seq (``JournalRead``) decide, with no I/O, what
the transport does (``plan``):

- ``Refusal``: a coded error on the connection's new session, which goes on
  (unknown session, wrong token, another principal, a seq beyond anything the
  session sent); none reveals another user's data;
- ``Replay``: ``session.resumed``, then events ``replay_from..replay_to`` as
  first sent, then live events;
- ``Resync``: ``session.resync_required`` with the session's state: the events
  after the client's seq cannot be replayed.

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

RESUME_SEQ_SLACK = 1_000  # a client may hold this many events the journal lost in a crash

# Why a resume cannot replay (``Resync.reason``; vLLM-Omni's duplex reasons, in every dialect):
# the journal holds nothing after the client's seq (it was lost or expired), or it goes on but
# the events right after the client's seq were trimmed (its caps, an ack beyond that seq, or a
# loss the owner marked after a Redis restart).
JOURNAL_GAP = "journal_gap"
JOURNAL_OVERFLOW = "journal_overflow"


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

    @classmethod
    def from_snapshot(cls, state: dict[str, Any]) -> Held:
        return cls(state["token_hash"], state["principal"], state["seq"], live=False)


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
    reason: str  # JOURNAL_GAP | JOURNAL_OVERFLOW
    message: str  # the same, for a person


Plan = Refusal | Replay | Resync


def admit(held: Held | None, event: ce.SessionResume, principal: str) -> Refusal | None:
    """Whether ``principal`` may resume the session with ``event``; needs no journal."""
    if held is None:
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
    if held.principal != principal:
        return Refusal(Code.RESUME_FORBIDDEN, "This session belongs to another principal.", "session_id")
    last = event.last_received_server_event_seq
    if held.live and last > held.seq:
        return seq_refusal(last, held.seq)
    return None


def plan(held: Held | None, read: JournalRead, event: ce.SessionResume, principal: str) -> Plan:
    """What to do with the resume: ``read`` is the journal after the client's seq."""
    refusal = admit(held, event, principal)
    if refusal is not None:
        return refusal
    assert held is not None
    last = event.last_received_server_event_seq
    if read.gap:
        if read.first_seq is not None and read.first_seq > last + 1:
            return Resync(
                JOURNAL_OVERFLOW,
                f"Events {last + 1}..{read.first_seq - 1} are no longer kept; rebuild from the state sent here.",
            )
        return Resync(JOURNAL_GAP, "The events after your last seq are no longer kept; rebuild from the state here.")
    top = top_seq(held, read)
    if not held.live and last > top + RESUME_SEQ_SLACK:
        return seq_refusal(last, top)
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
