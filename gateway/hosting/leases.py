"""The lease renewal loop: every session lease of this replica, realtime and video, renewed together."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.hosting.context import HostContext
from gateway.store.base import StoreError
from gateway.store.health import THROTTLE

log = logging.getLogger("omni.host")


async def renew_leases(ctx: HostContext) -> None:
    """Renew every host's lease a third of the TTL apart: one loop (and, on Redis,
    one pipelined round trip) per replica, not a task per session. A lease the
    store refuses is its host's to sort out (``renewal_refused``): after Redis came back
    empty, that is how each session is taken again and written back. ``ctx.renew_now``
    starts a round at once (the store watch sets it when the store comes back). Runs until
    cancelled."""
    period = ctx.lease_ttl_ms / 3000
    while True:
        with contextlib.suppress(TimeoutError):  # the period, or sooner when asked (ctx.renew_now)
            async with asyncio.timeout(period):
                await ctx.renew_now.wait()
        ctx.renew_now.clear()
        hosts = [h for h in ctx.hosts.values() if not h.ended]
        if not hosts:
            continue
        fences = [h.fence for h in hosts]
        quotas = [getattr(h, "quota", None) for h in hosts]  # (a video host keeps no ledger)
        try:
            renewed = await ctx.store.renew_many(
                ctx.replica_id, ctx.lease_ttl_ms, [(h.id, f) for h, f in zip(hosts, fences, strict=True)], quotas
            )
        except StoreError as exc:
            THROTTLE.warning(log, "renewal", "lease renewal of %d sessions failed: %s", len(hosts), exc)
            continue
        except Exception:  # a bug must not stop every lease of the replica for good
            log.exception("lease renewal of %d sessions crashed", len(hosts))
            continue
        for host, fence, ok in zip(hosts, fences, renewed, strict=True):
            if not ok:
                ctx.spawn(host.renewal_refused(fence))
