"""Tenant limits on this replica, counted in the store so that they hold across replicas.

A principal's ``TenantLimits`` (gateway/tenants.py) are enforced here:

- **At connect** (``Quotas.admit``, one store round trip per socket, exact):
  open sockets (``max_sessions``) and sockets started in any 60 s
  (``session_starts_per_min``). Refused: ``error`` ``rate_limit_exceeded``,
  close **4029**. Each socket's entry is renewed every ``lease_ttl_s``/3 with
  the replica's other renewals (one pipelined round trip, ``run``); a replica
  that dies stops renewing, and its sockets stop counting within
  ``lease_ttl_s``.
- **As a session goes** (``Allowance``): input audio seconds and output audio
  seconds per clock minute, client messages per clock second. No store round
  trip per message or frame: a replica leases a principal's budget from the
  store a *chunk* at a time (an eighth of the limit, or what one message
  needs) and spends it locally; only when the chunk is spent does it ask
  again (so at most about 9 round trips per window per principal and
  replica). The store never grants past the limit (``take_budget`` is atomic),
  so inputs never exceed a limit in a window, however many replicas serve the
  principal. What this costs in precision: budget another replica holds
  unspent (at most one chunk each) is not available here until that replica's
  last socket of the principal closes (it gives it back) or the window ends;
  windows are fixed (clock minutes, seconds), so up to twice a limit can pass
  across a window boundary. Output audio cannot wait for the store: it is
  charged after it is made (the replica may run one round trip plus one delta
  past the limit before it learns that the window is spent).

While the store cannot be reached, a replica grants each principal one chunk
per window of its own (and says so in the log), so sessions go on with a
bounded allowance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.auth import Grant
from gateway.protocol.errors import Code, ProtocolError
from gateway.store.base import SessionStore, StateQuota, StoreError
from gateway.store.health import THROTTLE
from gateway.tenants import Tenant
from orchestrator.metrics import LoopCounter

log = logging.getLogger("omni.quotas")

MIN_KEPT_TTL_S = 60.0  # a tenant's kept_session_ttl_s below this is taken as this: the state of a
#   served session must outlive the gaps between its lease renewals by far
CHUNK_DIVISOR = 8  # a replica leases an eighth of a limit at a time (or what one message needs)
WINDOW_MS = {"audio_in": 60_000, "audio_out": 60_000, "events": 1_000}


class NeedBudget(Exception):
    """A message this replica has no budget for yet: await ``wait()`` (one store round
    trip), then handle it again (it is then taken or refused)."""

    def __init__(self, wait: Callable[[], Awaitable[None]]) -> None:
        self.wait = wait


class AdmissionUnavailable(Exception):
    """The store cannot say whether a connection is within its principal's limits now."""


@dataclass(frozen=True, slots=True)
class ConnectRefusal:
    code: str
    message: str
    limit: str


class Allowance:
    """One principal's budget of one kind (audio_in, audio_out, events), leased here
    from the store a chunk at a time. Units: milliseconds of audio, or messages."""

    def __init__(self, store: SessionStore, principal: str, kind: str, limit: int) -> None:
        self.store, self.principal, self.kind, self.limit = store, principal, kind, limit
        self.window_ms = WINDOW_MS[kind]
        self.chunk = max(1, math.ceil(limit / CHUNK_DIVISOR))
        self.balance = 0  # leased for the current window and not spent (negative: output owed)
        self.exhausted = False  # the store has nothing left for this window
        self.window: int | None = None
        self.used_seen = 0  # units of the window given out by the store (to every replica), last seen
        self.holders = 0  # sockets of the principal here that spend it
        self._ends_at = 0.0  # loop time when the window ends
        self._refill: asyncio.Task[None] | None = None
        self._degraded_at: float | None = None  # when a chunk was last granted locally (store down)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _roll(self) -> None:
        if self.window is not None and self._now() >= self._ends_at:
            # The window is over: a lease belonged to it (a debt is forgiven with it).
            self.balance, self.exhausted, self.window, self.used_seen = 0, False, None, 0

    def reset_seconds(self) -> float | None:
        """Until the current window ends; None before the store has named it."""
        return None if self.window is None else max(0.0, self._ends_at - self._now())

    def remaining(self) -> int:
        self._roll()
        # Given out by the store, less what is leased here unspent, plus what is owed here.
        return max(0, min(self.limit, self.limit - self.used_seen + self.balance))

    # --- inputs: prepaid -------------------------------------------------------------

    def take(self, amount: int) -> bool | None:
        """Spend ``amount``: True (taken), False (the window's budget is spent),
        None (not here yet: ``await refill(amount)`` and take again)."""
        self._roll()
        if self.balance >= amount:
            self.balance -= amount
            return True
        return False if self.exhausted else None

    async def refill(self, amount: int) -> None:
        """Lease what ``amount`` needs (at least a chunk) from the store; one at a time."""
        if self._refill is None or self._refill.done():
            self._refill = asyncio.get_running_loop().create_task(self._lease(amount))
        await asyncio.shield(self._refill)

    async def _lease(self, amount: int) -> None:
        self._roll()
        want = max(self.chunk, amount - self.balance)
        try:
            budget = await self.store.take_budget(
                self.principal, self.kind, want, limit=self.limit, window_ms=self.window_ms
            )
        except StoreError as exc:
            self._degrade(exc)
            return
        if self.window is not None and budget.window != self.window:
            self.balance = max(0, self.balance)  # a new window: what was owed went with the old one
        self.window = budget.window
        self._ends_at = self._now() + budget.reset_ms / 1000
        self.balance += budget.granted
        self.used_seen = budget.used
        self.exhausted = budget.granted < want

    def _degrade(self, exc: StoreError) -> None:
        now = self._now()
        if self._degraded_at is None or now - self._degraded_at >= self.window_ms / 1000:
            THROTTLE.warning(log, "budget", "%s budget of %s: store unavailable (%s); granting one chunk here",
                             self.kind, self.principal, exc)  # fmt: skip
            self._degraded_at = now
            self.balance += self.chunk
            self._ends_at = max(self._ends_at, now + self.window_ms / 1000)
        else:
            self.exhausted = True
            self._ends_at = max(self._ends_at, self._degraded_at + self.window_ms / 1000)

    # --- output: postpaid -------------------------------------------------------------

    def charge(self, amount: int) -> bool:
        """Output already made: owe it if need be (the lease follows in the background).
        False once the window's budget is spent: stop making more."""
        self._roll()
        self.balance -= amount
        if self.balance < 0 and not self.exhausted and (self._refill is None or self._refill.done()):
            # the debt and a chunk ahead
            self._refill = asyncio.get_running_loop().create_task(self._lease(self.chunk))
        return not (self.exhausted and self.balance <= 0)

    def available(self) -> bool:
        """Whether output may start now."""
        self._roll()
        return not (self.exhausted and self.balance <= 0)

    async def give_back(self) -> None:
        """Return what is leased and unspent (the last socket of the principal here closed)."""
        self._roll()
        unspent, window = self.balance, self.window
        if unspent <= 0 or window is None or self._degraded_at is not None:
            return
        self.balance = 0
        with contextlib.suppress(StoreError):
            await self.store.return_budget(self.principal, self.kind, unspent, window=window)


class TenantMetrics:
    """Per-tenant series; the label set is bounded: keys-file names and ``other``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sessions = Gauge("omni_tenant_sessions_active", "Open sockets by tenant.", ["tenant"], registry=r)
        self.sessions_total = Counter("omni_tenant_sessions_total", "Sockets admitted by tenant.", ["tenant"],
                                      registry=r)  # fmt: skip
        self.refusals = Counter("omni_tenant_refusals_total", "What a tenant limit refused, by tenant and limit.",
                                ["tenant", "limit"], registry=r)  # fmt: skip
        self.events = LoopCounter("omni_tenant_client_events", "Client messages by tenant.", "tenant", r)
        self.audio_in = LoopCounter("omni_tenant_audio_input_seconds", "Input audio accepted by tenant.", "tenant", r)
        self.audio_out = LoopCounter("omni_tenant_audio_output_seconds", "Output audio made by tenant.", "tenant", r)


class Quotas:
    """This replica's side of every principal's limits (see the module doc)."""

    def __init__(self, store: SessionStore, registry: CollectorRegistry, *, ttl_ms: int) -> None:
        self.store = store
        self.ttl_ms = ttl_ms
        self.metrics = TenantMetrics(registry)
        self._allowances: dict[tuple[str, str, int], Allowance] = {}
        self.seats: set[Seat] = set()
        self._seen: dict[str, tuple[int, int, float]] = {}  # principal -> (open, starts, starts reset at)

    async def admit(self, grant: Grant) -> Seat | ConnectRefusal:
        """A new socket of ``grant``'s principal: its seat, or why it is refused.
        Raises AdmissionUnavailable when the store cannot say."""
        limits, label = grant.tenant.limits, grant.tenant.label
        conn_id = secrets.token_hex(8)
        if limits.max_sessions or limits.session_starts_per_min:
            try:
                admission = await self.store.admit_connection(
                    grant.principal, conn_id, max_open=limits.max_sessions,
                    starts_per_min=limits.session_starts_per_min, ttl_ms=self.ttl_ms,
                )  # fmt: skip
            except StoreError as exc:
                raise AdmissionUnavailable(str(exc)) from exc
            reset_s = admission.reset_ms / 1000
            self._seen[grant.principal] = (admission.open, admission.starts, self._now() + reset_s)
            if not admission.ok:
                self.metrics.refusals.labels(label, admission.refused or "").inc()
                if admission.refused == "max_sessions":
                    message = (f"This credential has {limits.max_sessions} sessions open, its limit; close one "
                               "or try again later.")  # fmt: skip
                else:
                    message = (f"This credential opened {limits.session_starts_per_min} sessions in the last "
                               f"minute, its limit; try again in {reset_s:.0f} s.")  # fmt: skip
                return ConnectRefusal(Code.RATE_LIMIT_EXCEEDED, message, admission.refused or "")
        seat = Seat(self, grant, conn_id)
        self.seats.add(seat)
        self.metrics.sessions.labels(label).inc()
        self.metrics.sessions_total.labels(label).inc()
        return seat

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def allowance(self, principal: str, kind: str, limit: int) -> Allowance:
        key = (principal, kind, limit)
        found = self._allowances.get(key)
        if found is None:
            found = self._allowances[key] = Allowance(self.store, principal, kind, limit)
        return found

    async def release(self, seat: Seat) -> None:
        self.seats.discard(seat)
        self.metrics.sessions.labels(seat.tenant.label).dec()
        for allowance in seat.held:
            allowance.holders -= 1
            if allowance.holders <= 0:
                self._allowances.pop((allowance.principal, allowance.kind, allowance.limit), None)
                if allowance.kind != "audio_out":  # (output is charged after the fact: nothing to give)
                    await allowance.give_back()
        if seat.tenant.limits.max_sessions:
            with contextlib.suppress(StoreError):
                await self.store.release_connection(seat.principal, seat.conn_id)

    def seen(self, principal: str) -> tuple[int, int, float]:
        """(open, starts, seconds until the oldest start leaves the minute), as last seen."""
        open_, starts, reset_at = self._seen.get(principal, (0, 0, 0.0))
        return open_, starts, max(0.0, reset_at - self._now())

    async def run(self) -> None:
        """Renew this replica's open-socket entries every third of their TTL, all in one
        round trip; a refused renewal is retried at the next. Runs until cancelled."""
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            seats = [s for s in self.seats if s.tenant.limits.max_sessions]
            if not seats:
                continue
            try:
                counts = await self.store.refresh_connections([(s.principal, s.conn_id) for s in seats], self.ttl_ms)
            except StoreError as exc:
                THROTTLE.warning(log, "tenant-entries", "renewing %d tenant entries failed: %s", len(seats), exc)
                continue
            for seat, count in zip(seats, counts, strict=True):
                _, starts, reset_at = self._seen.get(seat.principal, (0, 0, 0.0))
                self._seen[seat.principal] = (count, starts, reset_at)


class Seat:
    """One socket's share of its principal's limits: what the transport asks per
    message and per append, and what the session host asks about output."""

    def __init__(self, quotas: Quotas, grant: Grant, conn_id: str) -> None:
        self.quotas = quotas
        self.principal = grant.principal
        self.tenant: Tenant = grant.tenant
        self.conn_id = conn_id
        limits = grant.tenant.limits
        m, label = quotas.metrics, grant.tenant.label
        self._events_metric, self._in_metric = m.events.labels(label), m.audio_in.labels(label)
        self._out_metric = m.audio_out.labels(label)

        def hold(kind: str, limit: int) -> Allowance | None:
            if not limit:
                return None
            allowance = quotas.allowance(self.principal, kind, limit)
            allowance.holders += 1
            return allowance

        self.events = hold("events", limits.events_per_s)
        self.audio_in_budget = hold("audio_in", round(limits.audio_in_s_per_min * 1000))
        # (the session host may charge output after the socket closed: the object stays usable)
        self.audio_out_budget = hold("audio_out", round(limits.audio_out_s_per_min * 1000))
        self.held = [a for a in (self.events, self.audio_in_budget, self.audio_out_budget) if a is not None]
        self._closed = False
        floor = max(MIN_KEPT_TTL_S, 2 * quotas.ttl_ms / 1000)
        self.state_quota = StateQuota(  # what the store may keep of the principal's sessions
            self.principal,
            max_bytes=round(limits.max_state_mib * (1 << 20)),
            max_kept=limits.max_kept_sessions,
            ttl_s=max(floor, limits.kept_session_ttl_s) if limits.kept_session_ttl_s else 0.0,
        )

    def refused(self, limit: str) -> None:
        """Count a refusal by ``limit`` (one the store decided: max_state_mib)."""
        self.quotas.metrics.refusals.labels(self.tenant.label, limit).inc()

    # --- inputs (the transport) -------------------------------------------------------------

    def message(self) -> None:
        """One client message. Raises NeedBudget, or ProtocolError when over the limit."""
        self._events_metric.inc()
        allowance = self.events
        if allowance is not None and not self._spend(allowance, 1):
            self.quotas.metrics.refusals.labels(self.tenant.label, "events_per_s").inc()
            raise ProtocolError(
                Code.RATE_LIMIT_EXCEEDED,
                f"More than {allowance.limit} client events in one second: this one was dropped "
                f"(the count starts again in {allowance.reset_seconds() or 0:.1f} s).",
            )

    def audio_in(self, ms: float, event_id: str | None) -> None:
        """Input audio about to be appended. Raises NeedBudget, or ProtocolError."""
        allowance = self.audio_in_budget
        if allowance is not None and not self._spend(allowance, math.ceil(ms)):
            self.quotas.metrics.refusals.labels(self.tenant.label, "audio_in_s_per_min").inc()
            raise ProtocolError(
                Code.RATE_LIMIT_EXCEEDED,
                f"This credential's input audio limit of {allowance.limit / 1000:g} s per minute is reached: "
                f"this append was dropped (it starts again in {allowance.reset_seconds() or 0:.0f} s).",
                event_id=event_id,
            )
        self._in_metric.inc(ms / 1000)

    async def work(self) -> None:
        """Work done for the principal that no client message paid for (an MCP listing a
        session.update asked for): one client event of the ``events_per_s`` budget, waited
        for when the window's is spent (the caller bounds the wait)."""
        self._events_metric.inc()
        allowance = self.events
        if allowance is None:
            return
        while True:
            taken = allowance.take(1)
            if taken:
                return
            if taken is None:
                await allowance.refill(1)
            else:
                await asyncio.sleep(max(0.01, allowance.reset_seconds() or 0.05))

    def _spend(self, allowance: Allowance, amount: int) -> bool:
        taken = allowance.take(amount)
        if taken is None:
            raise NeedBudget(lambda: allowance.refill(amount))
        return taken

    # --- output (the session host) ------------------------------------------------------------

    def output_allowed(self) -> bool:
        return self.audio_out_budget is None or self.audio_out_budget.available()

    def audio_out(self, ms: float) -> bool:
        """Output audio made; False when the window's budget is spent (stop the response)."""
        self._out_metric.inc(ms / 1000)
        return self.audio_out_budget is None or self.audio_out_budget.charge(math.ceil(ms))

    def output_refusal(self) -> str:
        allowance = self.audio_out_budget
        assert allowance is not None
        return (f"This credential's output audio limit of {allowance.limit / 1000:g} s per minute is reached "
                f"(it starts again in {allowance.reset_seconds() or 0:.0f} s).")  # fmt: skip

    # --- what rate_limits.updated reports ------------------------------------------------------

    def rate_limits(self) -> dict[str, Any]:
        """``rate_limits`` in OpenAI's names (``requests``: sessions started per minute),
        and every limit of the caller in ``tenant_limits`` (the same fields)."""
        limits = self.tenant.limits
        open_, starts, reset_s = self.quotas.seen(self.principal)
        entries: list[dict[str, Any]] = []
        openai: list[dict[str, Any]] = []
        if limits.max_sessions:
            left = max(0, limits.max_sessions - open_)
            entries.append({"name": "sessions", "limit": limits.max_sessions, "remaining": left, "reset_seconds": None})
        if limits.session_starts_per_min:
            starts_entry = {"limit": limits.session_starts_per_min,
                            "remaining": max(0, limits.session_starts_per_min - starts),
                            "reset_seconds": round(reset_s, 3)}  # fmt: skip
            openai.append({"name": "requests", **starts_entry})
            entries.append({"name": "session_starts_per_min", **starts_entry})
        for name, allowance, scale in (
            ("input_audio_seconds_per_min", self.audio_in_budget, 1000),
            ("output_audio_seconds_per_min", self.audio_out_budget, 1000),
            ("client_events_per_s", self.events, 1),
        ):
            if allowance is not None:
                entries.append({"name": name, "limit": allowance.limit / scale if scale > 1 else allowance.limit,
                                "remaining": allowance.remaining() / scale if scale > 1 else allowance.remaining(),
                                "reset_seconds": _rounded(allowance.reset_seconds())})  # fmt: skip
        return {"rate_limits": openai, "tenant_limits": entries}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.quotas.release(self)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
