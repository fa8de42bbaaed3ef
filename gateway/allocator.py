"""glibc's allocator, told to give memory back (the gateway sets it itself, at start-up).

Hostile input (15 MiB messages, items of 5 MB, conversations of 4 MiB) makes large
and medium blocks that live as long as a session. glibc keeps what they leave: a
freed block of 128 KiB or more raises its mmap threshold to that size (so the next
ones come from the heap, where they fragment it), and memory freed in the middle of
a heap or in a thread's arena goes back to the system only when trimmed. Measured
(``bench/fuzz_long.py``, docs/threat-model.md): RSS grows with every hostile round
and stays there. So, where glibc is the allocator:

- ``tune()``: ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` fixes the threshold (blocks of
  128 KiB or more are mapped and unmapped apart, never fragmenting a heap), and with
  it ``M_TRIM_THRESHOLD``;
- ``trim_loop()``: every ``malloc_trim_s``, a full garbage collection, then
  ``malloc_trim(0)`` (in a worker thread: it walks every arena), which returns the free
  pages of every heap, not only the top.

The collection is there because what a closed connection held is often in a reference
cycle (an exception and its traceback's frames, a generator and its owner), which only
a full collection frees, and CPython starts one by the count of objects made: a gateway
that went quiet after hostile input may not run one for an hour, and keeps what those
connections held (measured: ~55 MiB after a round of ``bench/fuzz_long.py``). To keep
its pause short, everything alive at start-up (modules, engines, the app) is frozen
first (``gc.freeze``): a collection then walks only what sessions made since. Each
pause is timed (``collect_seconds``, the longest in ``collect_max_s``; the runtime
exports each as ``omni_gc_pause_seconds``).

Elsewhere (musl, macOS, a Python without ``ctypes``) ``mallopt`` and ``malloc_trim``
are skipped, with one log line: the allocator there has its own behaviour and nothing
here depends on it; the collections above run on every platform.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("omni.allocator")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's own starting value, held fixed
TRIM_THRESHOLD_BYTES = 128 << 10  # free memory at the top of the heap beyond this is returned at once


def _glibc() -> Any | None:
    """The C library, if it is glibc with ``mallopt`` and ``malloc_trim``; else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version  # glibc only (musl and macOS have none)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


class Allocator:
    """This process's allocator settings: ``tuned`` once ``tune()`` succeeded."""

    def __init__(self, libc: Any | None = None) -> None:
        self.libc = libc
        self.tuned = False
        self._checked = False  # tune() looks once: mallopt is process-wide
        self.trims = 0  # malloc_trim calls made
        self.trim_seconds = 0.0  # spent in them
        self._frozen = False  # gc.freeze() done (once per process)
        self.collects = 0  # full collections made by trim_loop
        self.collect_seconds = 0.0  # the event loop's time in them
        self.collect_max_s = 0.0  # the longest

    def tune(self) -> bool:
        """Set the thresholds; False (and one log line) where glibc is not the allocator."""
        if self._checked:
            return self.tuned
        self._checked = True
        if self.libc is None:
            self.libc = _glibc()
        if self.libc is None:
            log.info("allocator: not glibc; leaving its settings as they are")
            return False
        ok = self.libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        ok = ok and self.libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        if not ok:
            log.warning("allocator: glibc %s refused mallopt; leaving its settings as they are", self.version())
            return False
        self.tuned = True
        log.info("allocator: glibc %s, mmap threshold %d KiB, trimmed periodically", self.version(),
                 MMAP_THRESHOLD_BYTES >> 10)  # fmt: skip
        return True

    def version(self) -> str:
        raw = self.libc.gnu_get_libc_version() if self.libc is not None else None
        return raw.decode() if isinstance(raw, bytes) else "?"

    def trim(self) -> None:
        """Give every heap's free pages back to the system (blocking: call it in a thread)."""
        if not self.tuned or self.libc is None:
            return
        began = time.perf_counter()
        self.libc.malloc_trim(0)
        self.trims += 1
        self.trim_seconds += time.perf_counter() - began

    def collect(self) -> float:
        """A full garbage collection (on the caller's thread: it holds the GIL throughout);
        returns the seconds it took."""
        began = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - began
        self.collects += 1
        self.collect_seconds += took
        self.collect_max_s = max(self.collect_max_s, took)
        return took

    async def trim_loop(self, interval_s: float, observe: Callable[[float], object] | None = None) -> None:
        """Every ``interval_s`` until cancelled: ``collect()`` (its pause to ``observe``), then
        ``trim()`` (a worker thread does its walk). What is alive when the first loop of the
        process starts is frozen: never collected, never walked again (once: a process that
        starts several runtimes, as the tests do, must not freeze what later ones leave)."""
        if not self._frozen:
            self._frozen = True
            gc.freeze()
        while True:
            await asyncio.sleep(interval_s)
            took = self.collect()
            if observe is not None:
                observe(took)
            await asyncio.to_thread(self.trim)


ALLOCATOR = Allocator()  # one per process: mallopt is process-wide
