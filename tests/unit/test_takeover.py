"""The resume decision (gateway/hosting/takeover.py), a pure function: what this
replica knows of the session and what the journal holds after the client's seq
decide between a refusal, a replay and a resync. No store, no socket."""

from __future__ import annotations

import pytest

from gateway.hosting.takeover import (
    CLIENT_AHEAD,
    JOURNAL_TRIMMED,
    Held,
    Refusal,
    Replay,
    Resync,
    admit,
    plan,
    token_hash,
)
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code
from gateway.store.base import JournalRead

TOKEN = "rt_current"
ME = "key:me"


def resume(last: int, token: str = TOKEN, session_id: str = "sess_1") -> ce.SessionResume:
    return ce.SessionResume(
        event_id="evt_r", session_id=session_id, resume_token=token, last_received_server_event_seq=last
    )


def held(seq: int, *, live: bool = False, principal: str = ME) -> Held:
    return Held(token_hash(TOKEN), principal, seq, live=live)


def journal(*seqs: int, gap: bool = False, last: int | None = None) -> JournalRead:
    events = [(s, b'{"server_event_seq":%d}' % s) for s in seqs]
    top = last if last is not None else (seqs[-1] if seqs else None)
    return JournalRead(events=events, gap=gap, first_seq=seqs[0] if seqs else None, last_seq=top)


NOTHING = journal()


@pytest.mark.parametrize(
    ("known", "event", "code"),
    [
        (None, resume(3), Code.SESSION_NOT_FOUND),
        (held(10), resume(3, token="rt_old"), Code.RESUME_TOKEN_INVALID),
        (held(10, principal="key:other"), resume(3), Code.RESUME_FORBIDDEN),
        (held(10, live=True), resume(11), Code.RESUME_SEQ_INVALID),  # beyond anything it sent
    ],
    ids=["unknown", "stale-token", "other-principal", "seq-beyond-a-live-session"],
)
def test_a_refusal_is_decided_before_the_journal_is_read(
    known: Held | None, event: ce.SessionResume, code: str
) -> None:
    refusal = admit(known, event, ME)
    assert isinstance(refusal, Refusal) and refusal.code == code
    assert plan(known, journal(4, 5), event, ME) == refusal  # the same whatever the journal says
    err = refusal.error("evt_r")
    assert (err.code, err.event_id) == (code, "evt_r")


def test_a_refusal_names_no_other_users_data() -> None:
    refusal = admit(held(10, principal="key:other"), resume(3), ME)
    assert refusal is not None and "key:other" not in refusal.message


def test_the_events_after_the_clients_seq_are_replayed() -> None:
    outcome = plan(held(9), journal(4, 5, 6, 7), resume(3), ME)
    assert outcome == Replay(4, 7, journal(4, 5, 6, 7).events)


def test_nothing_to_replay_is_an_empty_window_after_the_clients_seq() -> None:
    outcome = plan(held(7), NOTHING, resume(7), ME)
    assert outcome == Replay(8, 7, [])


def test_a_live_session_replays_what_its_journal_holds() -> None:
    assert plan(held(7, live=True), journal(6, 7), resume(5), ME) == Replay(6, 7, journal(6, 7).events)


def test_a_gap_in_the_journal_is_a_resync() -> None:
    outcome = plan(held(9), journal(6, 7, gap=True), resume(3), ME)
    assert outcome == Resync(JOURNAL_TRIMMED)
    assert outcome.message


@pytest.mark.parametrize("ahead", [1, 13, 5000])
def test_a_client_ahead_of_the_store_is_a_divergence_never_a_resume(ahead: int) -> None:
    """The client holds events the store never got (their replica died before committing
    them): whatever the margin, it is resynced, not told the session resumed."""
    outcome = plan(held(9), journal(last=9), resume(9 + ahead), ME)
    assert outcome == Resync(CLIENT_AHEAD)
    assert "never received" in outcome.message


def test_the_journal_counts_as_what_the_store_holds() -> None:
    # The snapshot may be older than the journal's last event (deltas are not snapshotted).
    assert plan(held(5), journal(last=8), resume(8), ME) == Replay(9, 8, [])  # read after seq 8
    assert plan(held(5), journal(last=8), resume(9), ME) == Resync(CLIENT_AHEAD)


def test_a_live_session_is_never_ahead_of_itself() -> None:
    # Its host sent everything there is: a client beyond it is refused, not resynced.
    refusal = plan(held(7, live=True), journal(7), resume(8), ME)
    assert isinstance(refusal, Refusal) and refusal.code == Code.RESUME_SEQ_INVALID
