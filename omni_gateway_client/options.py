"""Reconnect policy and counters."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How the client retries after losing its connection.

    Attempt ``n`` (from 0) waits ``min(max_delay, initial_delay * multiplier**n)``
    scaled by a random factor in ``[1 - jitter, 1]`` (so replicas drained at
    once are not hit by every client in the same millisecond), then connects
    and resumes. The client gives up, raising ``ConnectionLost`` with code
    ``reconnect_failed`` from the event iterator, after ``max_attempts``
    consecutive failed attempts or once ``max_elapsed`` seconds have passed
    since the connection was lost, whichever comes first (``None``: no limit).
    A successful resume resets both counters. After a close with 1012 (service
    restart: a drain handed the session over) the first attempt does not wait.
    """

    initial_delay: float = 0.1
    max_delay: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = 10
    max_elapsed: float | None = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** min(attempt, 64))
        factor = 1.0 - self.jitter * (rng or random).random()
        return max(0.0, base * factor)


NO_RECONNECT = ReconnectPolicy(max_attempts=0)


@dataclass(slots=True)
class ClientStats:
    """Counters since the client was created (read ``client.stats``)."""

    reconnects: int = 0  # connections re-established after a loss (resumed, resynced or fallen back)
    resumes: int = 0  # of those, resumed with the gap replayed (session.resumed)
    resyncs: int = 0  # session.resync_required received
    sessions_lost: int = 0  # resume refused and continued in a new session (client.session_lost)
    failed_attempts: int = 0  # reconnect attempts that failed and were retried
    replayed_events: int = 0  # events delivered from a replay (seq within replay_from..replay_to)
    duplicates_dropped: int = 0  # events with 0 < server_event_seq <= last delivered
    gaps: int = 0  # live events whose seq skipped ahead (should stay 0; a server bug if not)
    acks_sent: int = 0
    sends_queued: int = 0  # events queued while disconnected
    sends_flushed: int = 0  # queued events sent after a resume
    sends_discarded: int = 0  # queued events dropped because the session was lost
    audio_appends_dropped: int = 0  # append_audio calls while disconnected
    audio_bytes_dropped: int = 0
    undecodable_frames: int = 0  # binary frames or text messages the client could not parse
