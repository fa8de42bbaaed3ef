"""The SDK's exceptions: one base type, each with a stable ``code``.

The event iterator raises these when the session cannot go on; the send
helpers raise ``SessionClosed`` and ``SendQueueFull``.
"""

from __future__ import annotations


class RealtimeError(Exception):
    """Base of every SDK error. ``code`` is stable; ``close_code`` is the
    WebSocket close code that ended the connection, when there was one."""

    code: str = "realtime_error"

    def __init__(self, message: str, *, code: str | None = None, close_code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.close_code = close_code


class Unauthorized(RealtimeError):
    """The gateway refused the credentials (HTTP 401 or 403 at the upgrade; close 4001 from
    servers that refuse after accepting). Not retried."""

    code = "unauthorized"


class SessionExpired(RealtimeError):
    """The session reached its maximum lifetime (close 4008). Not retried."""

    code = "session_expired"


class ResumeFailed(RealtimeError):
    """A reconnect could not resume the session.

    ``code`` is the server's refusal (``session_not_found``,
    ``resume_token_invalid``, ``resume_seq_invalid``; ``resume_forbidden`` from gateways
    before another principal's session was answered as ``session_not_found``), or
    ``resume_unsupported`` when the server gave no resume token or does not
    know ``session.resume``. With ``resume_fallback="new_session"`` the client
    continues in a new session instead and delivers ``client.session_lost``.
    """

    code = "resume_failed"


class ConnectionLost(RealtimeError):
    """The connection ended abnormally and was not (or could not be) re-established.

    ``code`` is ``reconnect_failed`` when the reconnect budget ran out,
    ``reconnect_disabled`` when reconnecting is off, ``no_credentials`` when
    only a single-use client secret was given, ``protocol_error`` for
    close codes that a reconnect would not fix (1002, 1003, 1007-1010), and
    ``model_not_allowed`` / ``model_not_found`` (close 4003 / 4004).
    """

    code = "connection_lost"


class SessionClosed(RealtimeError):
    """A send on a client that is not connected yet, was closed, or whose session ended."""

    code = "session_closed"


class SendQueueFull(RealtimeError):
    """A send during an outage found the queue of pending sends full; the event was not queued."""

    code = "send_queue_full"
