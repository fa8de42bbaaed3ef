"""How far audio sent is ahead of a listener that plays it as it arrives (pure: the time is passed in).

A player (a carrier's buffer, a Live client's speaker) plays each piece of
audio in its own duration, from when the piece before it has played, or from
when it arrives if the player was idle. So, by the clock, the sender knows when
the listener's ear will have reached the end of what was sent (``ear_at``), and
keeps that at most ``lead_ms`` ahead of now: a piece goes only while what was
sent plus it stays within the lead. An engine that writes a 15 s answer in one
second still has at most ``lead_ms`` of it in the player's buffer, which is all
a barge-in can no longer take back.

Used by the phone bridge's ``Playout`` (gateway/transport/telephony/playout.py)
and GPT-Live's paced output (gateway/session/live_output.py).
"""

from __future__ import annotations

_EPS_MS = 0.001  # (sums of float seconds: a piece that fits to this much fits)


class LeadClock:
    """The listener's ear, by the clock (seconds, any monotonic origin)."""

    def __init__(self, lead_ms: float) -> None:
        if lead_ms <= 0:
            raise ValueError("lead_ms must be positive")
        self.lead_ms = lead_ms
        self.ear_at = 0.0  # when the listener will have heard all that was sent

    def ahead_ms(self, now: float) -> float:
        """How far what was sent is ahead of the listener's ear."""
        return max(0.0, (self.ear_at - now) * 1000)

    def room(self, now: float, ms: float) -> bool:
        """Whether ``ms`` more may go now and stay within the lead (a piece longer than the
        lead goes once the listener has heard everything before it)."""
        ahead = self.ahead_ms(now)
        return ahead + ms <= self.lead_ms + _EPS_MS or ahead <= _EPS_MS

    def wait_s(self, now: float, ms: float) -> float:
        """How long until ``ms`` more may go (0: now)."""
        ahead = self.ahead_ms(now)
        over = ahead + min(ms, self.lead_ms) - self.lead_ms
        if ahead <= _EPS_MS or over <= _EPS_MS:
            return 0.0
        return over / 1000

    def sent(self, now: float, ms: float) -> None:
        """``ms`` of audio went out at ``now``: it plays after what the listener still has."""
        self.ear_at = max(self.ear_at, now) + ms / 1000

    def reset(self) -> None:
        """The listener's buffer was emptied (a carrier's ``clear``): it has nothing ahead."""
        self.ear_at = 0.0
