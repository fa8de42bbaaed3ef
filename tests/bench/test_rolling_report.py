"""The rolling-deploy report says what each long silence coincided with (tests/support/rolling.py,
printed by bench/rolling_deploy.py): the session's own handover, the clients' own process
stalling, a replica starting, or neither, how many sessions were silent at one moment, and the
largest silences less the clients' stalls. Pure bookkeeping: no cluster, nothing timed."""

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
    assert "5 (1 in handover, 0 in clients' stall, 2 in replica starting, 2 in neither)" in line
    assert line.endswith("at most 2 at once; the longest 200 ms, in replica starting")  # (10.6-10.7 s: two)


def test_a_silence_the_clients_own_process_caused_is_said_and_taken_out() -> None:
    # Three sessions: one silent 300 ms, 250 of them while the clients' loop ran nothing; one
    # silent 200 ms with 40 ms of that stall in it (not half: the load's); one never 100 ms.
    report = Report(silences=[0.3, 0.2, 0.08], silence_of={0: 0.3, 1: 0.2, 2: 0.08}, stalls=[(5.0, 5.25)])
    report.pauses = [Pause(4.95, 5.25, False, session=0), Pause(5.21, 5.41, False, session=1)]
    assert "2 (0 in handover, 1 in clients' stall, 0 in replica starting, 1 in neither)" in pauses(report)
    assert sorted(round(s, 3) for s in report.silences_without_stalls()) == [0.05, 0.08, 0.16]


def test_no_long_silence_says_so() -> None:
    line = pauses(Report())
    assert line.endswith(": 0 (0 in handover, 0 in clients' stall, 0 in replica starting, 0 in neither); "
                         "at most 0 at once")  # fmt: skip
