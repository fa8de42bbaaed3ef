"""Whether the store answers, as this replica last found it: what readiness reports, what
the store's calls fail fast on while it is down, and when its warnings are worth a line.

``StoreHealth`` is a sans-I/O record the store's I/O shell feeds (``RedisStore._call``
reports each call's fate; the probe, ``gateway/hosting/store_watch.py``, one call per
``redis_probe_interval_s``):

- ``unknown`` (a Redis store not yet reached): calls go to Redis; not ready;
- ``up``: calls go to Redis; ready;
- ``down`` (a call found Redis unreachable, refusing, or silent past ``redis_timeout_s``):
  calls fail at once with ``StoreUnavailable``, without touching Redis (nothing waits on a
  frozen Redis, nothing queues behind it), except the probe and, where nothing probes
  (``trial_interval_s`` not None: a bare store), one trial call at a time,
  ``trial_interval_s`` after the last one ended; the first call Redis answers makes it
  ``up`` again. A gateway probes (``store_watch.py``) and makes no trial calls: a trial
  is a session's call, and on a frozen Redis it would hold its sessions for a timeout.

A script's own error (Redis out of memory, a replica's ``READONLY``) is an answer: it fails
that call only, and the store stays ``up``.

``Throttle`` keeps one kind of warning to one line per interval, with how many it held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

State = Literal["unknown", "up", "down"]

WARNING_INTERVAL_S = 5.0  # one line per kind of store warning per this long (the rest are counted in it)


class StoreHealth:
    def __init__(
        self,
        state: State = "up",
        *,
        trial_interval_s: float | None = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state: State = state
        self.trial_interval_s = trial_interval_s
        self._next_trial = 0.0
        self._trial = False  # a trial call is under way
        self.reason = "" if state == "up" else "not reached yet"
        self._clock = clock
        self.since = clock()  # when the state began
        self.outages = 0  # times it went down
        self.recoveries = 0  # times it came back up after being down
        self.refused = 0  # calls failed at once while down (not sent to Redis)
        self.listeners: list[Callable[[StoreHealth], None]] = []  # called on every change of state
        self.on_refused: Callable[[], None] | None = None  # called for each call refused while down

    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def down(self) -> bool:
        return self.state == "down"

    def answered(self) -> None:
        """Redis answered a call."""
        if self.state != "up":
            if self.state == "down":
                self.recoveries += 1
            self._set("up", "")

    def unreachable(self, reason: str) -> None:
        """A call found Redis unreachable (refused, reset, or silent past the timeout)."""
        if self.state != "down":
            self.outages += 1
            self._next_trial = self._clock() + (self.trial_interval_s or 0.0)
            self._set("down", reason)

    def admit(self) -> bool:
        """Whether a call may go to Redis now: always, unless down; then only as the one
        trial (its end must be reported: ``answered``, ``unreachable`` or ``trial_over``)."""
        if self.state != "down":
            return True
        now = self._clock()
        if self.trial_interval_s is None or self._trial or now < self._next_trial:
            return False
        self._trial = True
        return True

    def trial_over(self) -> None:
        """A call ended (whatever its outcome): a trial under way is over."""
        if self._trial:
            self._trial = False
            self._next_trial = self._clock() + (self.trial_interval_s or 0.0)

    def refuse(self) -> str:
        """A call made while down, failed without touching Redis: the reason to give."""
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        return f"the store has been unreachable for {self._clock() - self.since:.1f} s ({self.reason})"

    def _set(self, state: State, reason: str) -> None:
        self.state, self.reason, self.since = state, reason, self._clock()
        for listener in list(self.listeners):
            listener(self)


class Throttle:
    """At most one log line per ``interval_s`` per key; the lines held back are counted and
    said in the next one (``"... (37 more like it in the last 5.0 s)"``)."""

    def __init__(self, interval_s: float = WARNING_INTERVAL_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self.suppressed = 0  # lines held back, in all

    def warning(self, logger: logging.Logger, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at WARNING unless a line of ``key`` went out less than
        ``interval_s`` ago; True when logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            self.suppressed += 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            logger.warning(msg + " (%d more like it in the last %.1f s)", *args, held, now - (last or now))
        else:
            logger.warning(msg, *args)
        if len(self._last) > 4096:  # (keys are kinds, not sessions: this only guards a mistake)
            self._last.clear()
        return True


THROTTLE = Throttle()  # the process's: every store warning goes through it
