"""Connection-level server events (pure encoders).

These events belong to one socket, not to the session's event stream: they
carry ``server_event_seq: 0`` and are never journaled nor replayed
(``session.resumed``, ``session.resync_required``, ``session.replaced``, and
errors that come before a session exists or that refuse a resume on a socket
whose session is not the one asked for).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson


def connection_event(type_: str, **fields: Any) -> bytes:
    """A connection-level event: ``server_event_seq`` 0, never journaled or replayed."""
    return orjson.dumps({"type": type_, "event_id": "event_" + secrets.token_hex(8), "server_event_seq": 0, **fields})


def error_event(code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> bytes:
    """A connection-level error (``server_event_seq`` 0: not part of any session's journal)."""
    return connection_event(
        "error",
        error={"type": "invalid_request_error", "code": code, "message": message, "param": param, "event_id": event_id},
    )


def resumed_event(*, session_id: str, resume_token: str, replay_from: int, replay_to: int) -> bytes:
    """``session.resumed``: events ``replay_from..replay_to`` follow, as first sent, then live ones."""
    return connection_event(
        "session.resumed",
        session_id=session_id,
        resume_token=resume_token,
        replay_from=replay_from,
        replay_to=replay_to,
    )


def resync_event(
    *,
    session_id: str,
    resume_token: str,
    reason: str,
    message: str,
    session: dict[str, Any],
    conversation: list[dict[str, Any]],
    last_server_event_seq: int,
) -> bytes:
    """``session.resync_required``: the events after the client's seq cannot be replayed;
    here is the state to rebuild from (``reason`` is a code, ``message`` is for a person)."""
    return connection_event(
        "session.resync_required",
        session_id=session_id,
        resume_token=resume_token,
        reason=reason,
        message=message,
        session=session,
        conversation=conversation,
        last_server_event_seq=last_server_event_seq,
    )


def replaced_event(session_id: str) -> bytes:
    """``session.replaced``: another connection resumed this socket's session (close 4009 follows)."""
    return connection_event("session.replaced", session_id=session_id)
