"""The rolling-deploy report says what each long silence coincided with (tests/support/rolling.py,
printed by bench/rolling_deploy.py): the session's own handover, a replica starting, or neither,
and how many sessions were silent at one moment. Pure bookkeeping: no cluster, nothing timed."""

from __future__ import annotations

from support.rolling import Pause, Report, pauses


def test_silences_are_told_apart_by_what_they_coincided_with() -> None:
    report = Report(starting=[(10.0, 11.0)])  # a replica spawned at 10 s, ready at 11 s
    report.pauses = [
        Pause(began=10.5, ended=10.7, handover=True),  # its own socket changed: a handover first
        Pause(began=10.6, ended=10.8, handover=False),  # inside the start-up
        Pause(began=9.9, ended=10.1, handover=False),  # overlaps the start-up's beginning
        Pause(began=11.0, ended=11.2, handover=False),  # begins as it is ready: not within it
        Pause(began=20.0, ended=20.1, handover=False),
    ]
    line = pauses(report)
    assert "5 (1 in handover, 2 in replica starting, 2 in neither)" in line
    assert line.endswith("at most 2 at once")  # the first two, from 10.6 to 10.7 s


def test_no_long_silence_says_so() -> None:
    assert pauses(Report()).endswith(": 0 (0 in handover, 0 in replica starting, 0 in neither); at most 0 at once")
