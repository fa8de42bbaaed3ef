"""The store's health record and the warning throttle (gateway/store/health.py), on a fake clock."""

from __future__ import annotations

import logging

import pytest

from gateway.store.health import StoreHealth, Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_down_refuses_calls_until_an_answer_and_tells_its_listeners() -> None:
    clock = Clock()
    health = StoreHealth("unknown", trial_interval_s=None, clock=clock)
    changes: list[str] = []
    health.listeners.append(lambda h: changes.append(h.state))
    assert not health.up and health.admit()  # not reached yet: calls go, but it is not up
    health.answered()
    assert health.up and changes == ["up"]
    health.unreachable("TimeoutError: frozen")
    assert health.down and health.outages == 1
    clock.now += 3
    assert not health.admit()  # no trial calls where a probe brings it back
    assert "3.0 s" in health.refuse() and health.refused == 1
    health.unreachable("again")  # (already down: one outage)
    assert health.outages == 1
    health.answered()
    assert health.up and health.recoveries == 1 and changes == ["up", "down", "up"]


def test_a_bare_store_admits_one_trial_call_per_interval() -> None:
    clock = Clock()
    health = StoreHealth("up", trial_interval_s=0.5, clock=clock)
    health.unreachable("refused")
    assert not health.admit()  # the interval starts when it goes down
    clock.now += 0.5
    assert health.admit()  # the trial
    assert not health.admit()  # one at a time
    health.trial_over()
    assert not health.admit()
    clock.now += 0.5
    assert health.admit()


def test_the_throttle_logs_one_line_per_kind_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttle = Throttle(5.0, clock=clock)
    log = logging.getLogger("test.throttle")
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        assert throttle.warning(log, "flush", "flush failed for %s", "a")
        for sid in "bcd":
            assert not throttle.warning(log, "flush", "flush failed for %s", sid)
        assert throttle.warning(log, "renewal", "renewal failed")  # another kind: its own line
        clock.now += 5.0
        assert throttle.warning(log, "flush", "flush failed for %s", "e")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["flush failed for a", "renewal failed", "flush failed for e (3 more like it in the last 5.0 s)"]
    assert throttle.suppressed == 3
