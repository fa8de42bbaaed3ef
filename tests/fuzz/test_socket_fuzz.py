"""A seeded socket-level fuzzer against a real gateway: hostile frames of every client
event type (tests/support/fuzz.py) mixed with probes that must still be answered.

It fails on any ERROR record or traceback in the gateway's log, on an error event
without a code, on a close code docs/errors.md does not document, on a probe left
unanswered on a socket that stayed open, and on memory that keeps growing. The long
version is bench/fuzz_long.py (100,000+ inputs, with figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
from collections.abc import Iterator

import psutil
import pytest
from support.fuzz import DOCUMENTED_CLOSES, FuzzStats, fuzz_worker
from support.gateway import run_gateway

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(240)

WORKERS = 8
INPUTS_PER_WORKER = 400


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.bad.append(record)


@contextlib.contextmanager
def server_log() -> Iterator[Collect]:
    """Attached once the server runs (uvicorn's logging config replaces its loggers' handlers)."""
    handler = Collect()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]  # uvicorn's does not propagate
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def pin_malloc_mmap_threshold() -> None:
    """glibc raises its mmap threshold each time a large block is freed, after which
    large messages come from the heap and its fragments stay in RSS: RSS would then
    measure the allocator's history, not what the gateway holds. Pinned (what
    ``MALLOC_MMAP_THRESHOLD_=131072`` does at start-up), blocks of 128 KiB and more
    are mapped and unmapped, and RSS after a round is what is still held."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD


async def test_hostile_input_gets_coded_errors_and_leaves_sessions_answering() -> None:
    pin_malloc_mmap_threshold()
    settings = Settings(engine="passthrough", video_engine="none", max_frame_bytes=2 << 20, detach_grace_s=0.3,
                        journal_ttl_s=1.0)  # fmt: skip
    engine = PassthroughEngine(audio_chunks=3, paced=False)
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
        with server_log() as log:
            process = psutil.Process(os.getpid())
            store = gw.runtime.store

            async def round_(first_seed: int) -> tuple[list[FuzzStats], int]:
                workers = (
                    fuzz_worker(gw.port, seed=s, inputs=INPUTS_PER_WORKER, timeout=30.0)  # a bound: CI shares 2 cores
                    for s in range(first_seed, first_seed + WORKERS)
                )
                results = await asyncio.gather(*workers)
                await asyncio.sleep(1.5)  # the sessions end (detach_grace_s) and their state expires (journal_ttl_s)
                store._next_sweep = 0.0  # type: ignore[attr-defined]  # the memory store's periodic sweep, now
                store._tick()  # type: ignore[attr-defined]
                gc.collect()
                return list(results), process.memory_info().rss

            warm, rss_warm = await round_(1000)  # allocator pools and caches reach their working size
            results, rss_after = await round_(0)
            sessions_left = gw.runtime.session_count()
    stats = FuzzStats()
    for r in (*warm, *results):
        stats.merge(r)
    summary = (
        f"{stats.inputs} inputs over {stats.sockets} sockets: {stats.errors} coded errors "
        f"{dict(sorted(stats.errors_by_code.items()))}, closes {stats.closes}, "
        f"probes {stats.probes_answered}/{stats.probes_sent}, RSS {rss_warm >> 20} -> {rss_after >> 20} MiB"
    )
    print(summary)
    assert not log.bad, [r.getMessage() for r in log.bad[:5]]
    assert stats.errors_without_code == 0, summary
    assert not stats.unreadable, stats.unreadable[:5]
    assert set(stats.closes) <= DOCUMENTED_CLOSES | {1006}, summary  # 1006: our own abort of the socket
    assert not stats.unanswered, (stats.unanswered[:5], summary)
    assert stats.errors > stats.inputs // 5 and len(stats.errors_by_code) >= 8, summary  # the hostile inputs were read
    assert sessions_left == 0, "sessions were not released"
    assert rss_after - rss_warm < 32 << 20, summary  # a second round as hostile as the first keeps nothing
