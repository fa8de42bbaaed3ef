"""The store watch: what this replica knows of the store between the sessions' own calls.

Every ``interval_s`` (``redis_probe_interval_s``) one probe (``SessionStore.probe``: one
round trip, sent even while the store is down) learns two things:

- whether the store answers: the probe is what brings ``store.health`` back up after an
  outage (readiness follows it: ``Runtime.ready``);
- whether the store still holds what it held: its *epoch* changes when Redis comes back
  empty (a restart without persistence, a failover to a replica that had nothing). Then
  this replica **writes back what it owns** at once: the lease loop renews every lease now,
  and each session whose lease the store no longer has is taken again and its whole state
  written (``SessionHost.renewal_refused`` -> ``_reacquire``), so a resume elsewhere finds it.

For ``restore_window_s`` after the store was found empty (or came back from an outage),
a resume that finds no session is not told ``session_not_found`` (final): its owner may
not have written it back yet, so it is refused ``store_unavailable`` (resume again
shortly). ``restoring()`` probes first, so a replica that had not noticed yet notices.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.hosting.context import HostContext
from gateway.store.base import StoreError
from gateway.store.health import THROTTLE

log = logging.getLogger("omni.store")


class StoreWatch:
    def __init__(self, ctx: HostContext, *, interval_s: float, restore_window_s: float) -> None:
        self.ctx = ctx
        # The probe alone brings the store back up: no session's call is sent to try (on a
        # frozen Redis a trial would hold its sessions for a whole timeout).
        ctx.store.health.trial_interval_s = None
        self.interval_s = interval_s
        self.restore_window_s = restore_window_s
        self.epoch: str | None = None  # the store's epoch as last probed (None: not yet)
        self.losses = 0  # times the store was found to have lost its data
        self._restoring_until = 0.0  # loop time: a session the store lacks may be one being written back
        self._recoveries = ctx.store.health.recoveries  # (as seen by the last probe)

    async def run(self) -> None:
        """Probe every ``interval_s`` until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)

    async def check(self) -> bool:
        """One probe; True when it found the store emptied since the last one (the write-back
        has been started then)."""
        store, metrics, loop = self.ctx.store, self.ctx.metrics, asyncio.get_running_loop()
        try:
            epoch = await store.probe()
        except StoreError as exc:
            THROTTLE.warning(log, "probe", "the store does not answer: %s", exc)
            epoch = None
        except Exception:  # a bug must not stop the watch
            log.exception("the store probe crashed")
            epoch = None
        health = store.health
        if epoch is None:
            return False
        lost = self.epoch is not None and epoch != self.epoch
        recovered = health.recoveries != self._recoveries
        self.epoch, self._recoveries = epoch, health.recoveries
        if lost:
            self.losses += 1
            metrics.store_losses.inc()
            log.warning("the store came back without its data (epoch %s, was another): writing back the %d "
                        "sessions served here", epoch, len(self.ctx.hosts))  # fmt: skip
        if lost or recovered:
            self._restoring_until = loop.time() + self.restore_window_s
            self.ctx.renew_now.set()  # every lease now: the lost ones are taken again and written back
        return lost

    async def restoring(self) -> bool:
        """A resume found no session: may its owner still be writing it back? (Probes first;
        raises nothing: a store that does not answer fails the resume on its own.)"""
        await self.check()
        return asyncio.get_running_loop().time() < self._restoring_until
