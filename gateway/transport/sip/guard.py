"""Who may place a call here, and how often: SIP is attacked constantly, Sans-I/O.

- An allow-list of trunk addresses (``sip_allowed_sources``: IPs or CIDR networks; empty:
  loopback only). An INVITE from anywhere else is answered 403 Forbidden, before anything
  about the call is looked at; any other request from there (OPTIONS scans, REGISTER
  floods) is dropped unanswered.
- INVITEs per source per minute (``sip_invites_per_source_per_min``) and overall
  (``sip_invites_per_min``), token buckets refilled continuously: one over the rate is
  answered 503 Service Unavailable with ``Retry-After``. At most ``MAX_SOURCES`` sources are
  tracked (the least recently seen forgotten), so spoofed sources cannot grow memory.
- Calls at once (``sip_max_calls``): one more is answered 486 Busy Here.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

MAX_SOURCES = 4096
LOOPBACK = ("127.0.0.0/8", "::1/128")
Verdict = Literal["ok", "forbidden", "rate_limited", "busy"]


def parse_networks(entries: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The allow-list's networks; raises ValueError naming an entry that is not an address or network."""
    out = []
    for entry in entries:
        entry = entry.strip()
        if entry:
            try:
                out.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"sip_allowed_sources: {entry!r} is not an IP address or network") from None
    return tuple(out)


@dataclass
class _Bucket:
    tokens: float
    at: float


class Guard:
    def __init__(self, allowed: Iterable[str], *, per_source_per_min: int, per_min: int, max_calls: int) -> None:
        self.networks = parse_networks(allowed) or parse_networks(LOOPBACK)
        self.per_source = per_source_per_min
        self.overall = per_min
        self.max_calls = max_calls
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._all: _Bucket | None = None
        # counters
        self.forbidden = 0
        self.rate_limited = 0
        self.busy = 0
        self.unauthenticated = 0  # INVITEs answered 401 (no valid digest answer: the server counts them)

    def allows(self, source: str) -> bool:
        try:
            addr = ipaddress.ip_address(source)
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self.networks)

    def invite(self, source: str, now: float, calls: int) -> Verdict:
        """May an INVITE from ``source`` start a call now (``calls`` in progress)?"""
        if not self.allows(source):
            self.forbidden += 1
            return "forbidden"
        if self.per_source and not self._take(self._source(source, now), self.per_source, now):
            self.rate_limited += 1
            return "rate_limited"
        if self.overall:
            if self._all is None:
                self._all = _Bucket(float(self.overall), now)
            if not self._take(self._all, self.overall, now):
                self.rate_limited += 1
                return "rate_limited"
        if self.max_calls and calls >= self.max_calls:
            self.busy += 1
            return "busy"
        return "ok"

    def _source(self, source: str, now: float) -> _Bucket:
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = _Bucket(float(self.per_source), now)
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(source)
        return bucket

    @staticmethod
    def _take(bucket: _Bucket, per_min: int, now: float) -> bool:
        bucket.tokens = min(float(per_min), bucket.tokens + (now - bucket.at) * per_min / 60.0)
        bucket.at = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
