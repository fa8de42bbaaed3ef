"""The gateway tunes glibc's allocator itself at start-up (gateway/allocator.py).

Proved on the real allocator, in a fresh process (mallopt is process-wide): after a
large block is freed, glibc's own dynamic threshold would serve a 4 MiB block from the
heap (where hostile input fragments it); once the runtime has started, that block is
mapped apart (``mallinfo2().hblkhd`` counts it), unless ``malloc_trim_s`` is 0."""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import allocator

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, ctypes, sys
from gateway.runtime import Runtime
from gateway.settings import Settings

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

async def main() -> None:
    rt = Runtime(Settings(engine="passthrough", video_engine="none", malloc_trim_s=float(sys.argv[1])))
    await rt.start()
    try:
        libc.free(libc.malloc(8 << 20))  # glibc's dynamic threshold would now be 8 MiB
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(4 << 20)
        print(libc.mallinfo2().hblkhd - before)
        libc.free(block)
    finally:
        await rt.close()

asyncio.run(main())
"""


def mapped_after_start(malloc_trim_s: float) -> int:
    """Bytes of a 4 MiB block that glibc mapped apart, in a runtime started with the setting."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(malloc_trim_s)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return int(out.stdout.strip().splitlines()[-1])


glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only"
)


@glibc_only
def test_the_started_gateway_maps_large_blocks_apart() -> None:
    assert mapped_after_start(10.0) >= 4 << 20


@glibc_only
def test_malloc_trim_s_0_leaves_glibc_as_it_is() -> None:
    assert mapped_after_start(0.0) == 0  # glibc's own dynamic threshold: from the heap


@glibc_only
def test_trim_gives_memory_back_and_counts_it() -> None:
    alloc = allocator.Allocator()
    assert alloc.tune() and alloc.tune()  # checked once, the same answer after
    alloc.trim()
    assert alloc.trims == 1 and alloc.trim_seconds > 0


def test_without_glibc_nothing_is_set_and_one_line_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(allocator, "_glibc", lambda: None)  # as on musl or macOS
    alloc = allocator.Allocator()
    with caplog.at_level(logging.INFO, logger="omni.allocator"):
        assert not alloc.tune()
        assert not alloc.tune()
    assert [r.getMessage() for r in caplog.records] == ["allocator: not glibc; leaving its settings as they are"]
    alloc.trim()  # a no-op, not a crash
    assert alloc.trims == 0


CYCLE_PROBE = """
import asyncio, gc, sys, time, weakref
from gateway.runtime import Runtime
from gateway.settings import Settings

class Node:
    pass

async def main() -> None:
    rt = Runtime(Settings(engine="passthrough", video_engine="none", malloc_trim_s=0.05))
    await rt.start()
    try:
        deadline = time.monotonic() + 20
        while not gc.get_freeze_count() and time.monotonic() < deadline:  # the loop froze what start-up made
            await asyncio.sleep(0.01)
        node = Node()
        node.me, node.payload = node, bytes(16 << 20)  # what a closed connection leaves: a cycle
        gc.collect()
        gc.collect()  # (it lived long enough to be in the oldest generation)
        gone = weakref.ref(node)
        del node
        deadline = time.monotonic() + 20
        while gone() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        pauses = rt.metrics.gc_pauses.collect()[0].samples
        print(gone() is None, next(s.value for s in pauses if s.name.endswith("_count")))
    finally:
        await rt.close()

asyncio.run(main())
"""


@glibc_only
def test_a_quiet_gateway_collects_cycles_and_times_the_pause() -> None:
    """A cycle in the oldest generation (a closed connection's, say) is freed by the
    gateway's own full collection, though the process makes too few objects for CPython
    to start one; each pause is in omni_gc_pause_seconds."""
    out = subprocess.run([sys.executable, "-c", CYCLE_PROBE], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    freed, pauses = out.stdout.split()
    assert freed == "True"
    assert float(pauses) >= 1
