"""``omni-gateway serve --workers N``: N gateway processes on one port.

**The supervisor owns the sockets.** The process the user started binds the
port before any worker exists: on Linux one ``SO_REUSEPORT`` socket per worker
slot, each handed to its slot's worker as an inherited file descriptor. The
kernel spreads new connections over the slots by a hash of their addresses,
so sessions spread evenly and no worker races the others for a shared accept
queue (with one shared socket the worker that happens to be idle takes a
whole burst of connections at once, and long-lived sessions pile up on it).
Because the supervisor keeps every socket open, a worker that dies loses no
connection: those hashed to its slot wait in the slot's backlog until its
replacement serves them (as long as a worker's start: about 1 s with the
passthrough engine, a few with the cascade's models). A bind error is
reported once, before anything starts. Elsewhere (SO_REUSEPORT does not
balance on macOS or the BSDs) every worker shares one socket.

**A worker is a whole gateway**: ``python -m gateway serve`` with the user's
own flags, its own engines, orchestrators, admission bounds and sessions, and
a replica id of its own (``<replica_id>-w<slot>`` when ``replica_id`` is set,
else the per-process default). The workers share only Redis: a session is
resumed on any worker exactly as on any replica. Limits per process (for
example ``max_sessions``) are per worker.

**The supervisor** starts the workers, restarts one that dies (at once, or
after a back-off that doubles from 0.5 s to 30 s while the slot keeps dying
within 10 s of its start), forwards SIGTERM/SIGINT to every worker (each
drains: /readyz 503, answers finish within ``drain_window_s``, sockets close
with 1012) and exits once all have; a second signal is forwarded too (the
workers exit at once). A worker that cannot start (exit code 3: its app, an
engine or the store failed; 2: its settings were refused) stops them all, and
the supervisor exits 3: retrying will not fix a configuration.
Workers run in their own process group, so a terminal's Ctrl-C reaches only
the supervisor, and on Linux get SIGTERM if the supervisor dies.

**Metrics, aggregated**: ``GET /metrics`` on the port reaches one worker,
which reads every sibling's exposition over a private Unix socket (in a 0700
directory the supervisor made) and answers with all of them, each sample
labelled ``worker="<slot>"``, plus ``omni_worker_up{worker}`` (0: that
worker did not answer within 2 s: dead, or still starting) and
``omni_worker_restarts{worker}``. One scrape target, and a worker's restart is
an ordinary counter reset of its own series (sum them in queries).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.routing import RoutingError, parse_routes
from gateway.settings import Settings

log = logging.getLogger("omni.workers")

WORKER_ENV = "_OMNI_GATEWAY_WORKER"  # the supervisor's word to a worker (its slot); not a setting
STARTUP_FAILURE = 3  # a worker's exit code when its app did not start (gateway/cli.py): stop all
REFUSED = 2  # a worker's exit code when its settings were refused: stop all too
BACKLOG = 2048  # per slot: connections the kernel queues before a worker accepts them (uvicorn's default)
FAST_DEATH_S = 10.0  # a worker dying sooner than this after its start is restarted with back-off
BACKOFF_S = (0.5, 30.0)  # the first back-off, doubled per fast death in a row, and its cap
POLL_S = 0.1  # how often the supervisor looks at its workers and signals
SCRAPE_TIMEOUT_S = 2.0  # a sibling that sends no metrics within this counts as down for that scrape
IN_PROCESS_ENGINES = ("vllm", "omni")  # a model per process: more workers would load it again each


# --- how many ------------------------------------------------------------------------------


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, bounded by a cgroup CPU
    quota (a container's CPU limit, which ``os.cpu_count()`` does not see)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroup_cpu_quota() -> float | None:
    try:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def loads_models_in_process(settings: Settings) -> bool:
    """Whether a route (or the video engine) loads a model into this process."""
    try:
        specs = parse_routes(settings.models, settings)
    except (RoutingError, OSError):
        return False  # the runtime reports a bad document when it starts
    in_process = any(s.engine in IN_PROCESS_ENGINES or s.options.get("thinker") == "vllm" for s in specs)
    return in_process or settings.video_engine == "omni"


def worker_count(settings: Settings) -> int:
    """``workers`` as set, or "auto": one per core with Redis and no in-process model, else 1."""
    if settings.workers is not None:
        return settings.workers
    if settings.redis_url is None or sys.platform == "win32" or loads_models_in_process(settings):
        return 1
    return available_cores()


def problems(settings: Settings) -> list[str]:
    """What ``workers`` cannot do with these settings (``serve`` refuses to start)."""
    n = settings.workers
    if n is None:
        return []
    if n < 1:
        return [f"--workers must be at least 1 (env OMNI_GATEWAY_WORKERS), not {n}"]
    if n > 1 and settings.redis_url is None:
        return [
            f"--workers {n} needs Redis: set --redis-url (env OMNI_GATEWAY_REDIS_URL). The embedded memory "
            "store lives in one process, so workers could not resume each other's sessions; "
            "without Redis run one worker (--workers 1, the default then)"
        ]
    if n > 1 and sys.platform == "win32":
        return ["--workers above 1 is not supported on Windows"]
    return []


# --- the supervisor ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """What the supervisor tells a worker (in ``WORKER_ENV``)."""

    slot: int
    count: int
    fd: int  # the inherited listening socket
    metrics_dir: str  # where every worker's private metrics socket lives
    restarts: int  # how many times this slot was started before

    def socket_path(self, slot: int) -> str:
        return os.path.join(self.metrics_dir, f"w{slot}.sock")

    def encode(self) -> str:
        return json.dumps([self.slot, self.count, self.fd, self.metrics_dir, self.restarts])

    @classmethod
    def decode(cls, raw: str) -> WorkerSlot:
        slot, count, fd, metrics_dir, restarts = json.loads(raw)
        return cls(int(slot), int(count), int(fd), str(metrics_dir), int(restarts))

    def settings(self, settings: Settings) -> Settings:
        """This worker's settings: its own replica id."""
        if settings.replica_id:
            return replace(settings, replica_id=f"{settings.replica_id}-w{self.slot}")
        return settings  # the default, <host>-<pid>-<random>, is per process already


def current_worker(environ: MutableMapping[str, str] | None = None) -> WorkerSlot | None:
    """This process's slot when a supervisor started it (taken out of the environment,
    so that processes it starts in turn are not mistaken for workers)."""
    raw = (os.environ if environ is None else environ).pop(WORKER_ENV, None)
    return WorkerSlot.decode(raw) if raw else None


def bind_sockets(host: str, port: int, count: int, *, inheritable: bool = True) -> list[socket.socket]:
    """One listening socket per slot (SO_REUSEPORT on Linux), or one shared by all elsewhere."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reuseport = sys.platform.startswith("linux") and count > 1
    if reuseport:
        # SO_REUSEPORT would bind beside another process of this user that holds the port with it
        # too (a second gateway, sharing its connections): a plain bind proves the port is free.
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            port = probe.getsockname()[1]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count if reuseport else 1):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuseport:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # port 0: the siblings take the port the first got
            sock.listen(BACKLOG)
            sock.set_inheritable(inheritable)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets if reuseport else sockets * count


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    """Why ``host:port`` cannot be listened on, and what to do, in one line."""
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (another gateway?): stop what holds it, or pick another port "
                "with --port (env OMNI_GATEWAY_PORT)")  # fmt: skip
    if exc.errno == errno.EACCES:
        return f"not allowed to listen on port {port}: use a port above 1023 with --port (env OMNI_GATEWAY_PORT)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine: pass one of its own with --host (env OMNI_GATEWAY_HOST)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn: Linux sends the worker SIGTERM (a drain) if the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the supervisor died before the prctl took
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass(slots=True)
class _Running:
    process: subprocess.Popen[bytes]
    started: float


class Supervisor:
    """Starts ``count`` workers on ``sockets``, restarts those that die, and drains them
    all on SIGTERM/SIGINT. ``argv`` is the user's ``serve`` command line."""

    def __init__(self, argv: Sequence[str], sockets: Sequence[socket.socket], metrics_dir: str) -> None:
        self.argv = list(argv)
        self.sockets = list(sockets)
        self.metrics_dir = metrics_dir
        self.count = len(self.sockets)
        self.running: dict[int, _Running] = {}
        self.starts = [0] * self.count
        self._fast_deaths = [0] * self.count
        self._due: dict[int, float] = {}  # slot -> when to start it again
        self._signals: list[int] = []
        self.stopping = False
        self.failed = False

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in range(self.count):
                self._start(slot)
            while self.running or (self._due and not self.stopping):
                self._forward_signals()
                self._reap()
                self._start_due()
                time.sleep(POLL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failed:
            return STARTUP_FAILURE
        log.info("every worker has exited")
        return 0

    def _on_signal(self, sig: int, frame: object) -> None:
        self._signals.append(sig)

    def _forward_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if not self.stopping:
                log.info("%s: draining %d workers", signal.Signals(sig).name, len(self.running))
            else:
                log.info("%s again: the workers exit now", signal.Signals(sig).name)
            self.stop()

    def stop(self) -> None:
        """Drain every worker (a second call: they exit at once); no more restarts."""
        self.stopping = True
        self._due.clear()
        for worker in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)

    def _start(self, slot: int) -> None:
        slot_info = WorkerSlot(slot, self.count, self.sockets[slot].fileno(), self.metrics_dir, self.starts[slot])
        env = {**os.environ, WORKER_ENV: slot_info.encode()}
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", *self.argv],
            env=env,
            pass_fds=(slot_info.fd,),
            process_group=0,  # a terminal's Ctrl-C reaches the supervisor only: it forwards one SIGTERM
            preexec_fn=_die_with_parent(),  # safe: the supervisor has no threads
        )
        self.starts[slot] += 1
        self.running[slot] = _Running(process, time.monotonic())
        log.info("worker w%d started (pid %d)", slot, process.pid)

    def _reap(self) -> None:
        for slot, worker in list(self.running.items()):
            code = worker.process.poll()
            if code is None:
                continue
            del self.running[slot]
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if self.stopping:
                log.info("worker w%d (pid %d) exited: %s", slot, worker.process.pid, how)
                continue
            if code in (STARTUP_FAILURE, REFUSED):
                log.error("worker w%d failed to start (its log says why): stopping every worker", slot)
                self.failed = True
                self.stop()
                continue
            lived = time.monotonic() - worker.started
            self._fast_deaths[slot] = self._fast_deaths[slot] + 1 if lived < FAST_DEATH_S else 0
            deaths = self._fast_deaths[slot]
            delay = 0.0 if deaths == 0 else min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (deaths - 1))
            log.warning(
                "worker w%d (pid %d) died after %.1f s (%s); restarting in %.1f s",
                slot, worker.process.pid, lived, how, delay,
            )  # fmt: skip
            self._due[slot] = time.monotonic() + delay

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot, when in list(self._due.items()):
            if when <= now and not self.stopping:
                del self._due[slot]
                self._start(slot)


def supervise(argv: Sequence[str], settings: Settings, count: int) -> int:
    """Bind the port, run ``count`` workers until they have all exited; the exit code."""
    try:
        sockets = bind_sockets(settings.host, settings.port, count)
    except OSError as exc:
        print(f"omni-gateway: {cannot_listen(settings.host, settings.port, exc)}", file=sys.stderr)
        return 2
    metrics_dir = tempfile.mkdtemp(prefix="omni-gateway-workers-")  # 0700: only we reach the workers
    port = sockets[0].getsockname()[1]
    mode = "SO_REUSEPORT" if len({s.fileno() for s in sockets}) > 1 else "one shared socket"
    log.info("%d workers on %s:%d (%s); /metrics answers for all of them", count, settings.host, port, mode)
    try:
        return Supervisor(argv, sockets, metrics_dir).run()
    finally:
        for sock in {s.fileno(): s for s in sockets}.values():
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


# --- in a worker: every worker's metrics from any one of them ---------------------------------


class WorkerMetrics:
    """A worker's side of the aggregated ``/metrics``: it answers its siblings on a
    private Unix socket with its own exposition, and ``scrape`` gathers them all."""

    def __init__(self, worker: WorkerSlot, registry: CollectorRegistry) -> None:
        self.worker = worker
        self.registry = registry
        self._server: asyncio.AbstractServer | None = None
        restarts = Gauge("omni_worker_restarts", "Times this worker's slot was started before it.", registry=registry)
        restarts.set(worker.restarts)

    async def start(self) -> None:
        path = self.worker.socket_path(self.worker.slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by the worker this one replaces
        self._server = await asyncio.start_unix_server(self._answer, path=path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(generate_latest(self.registry))
            await writer.drain()
        finally:
            writer.close()

    async def _read(self, slot: int) -> bytes | None:
        if slot == self.worker.slot:
            return generate_latest(self.registry)
        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(self.worker.socket_path(slot))
                try:
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None  # dead, or not serving yet

    async def scrape(self) -> bytes:
        texts = await asyncio.gather(*(self._read(slot) for slot in range(self.worker.count)))
        return merge_expositions([(str(slot), text) for slot, text in enumerate(texts)])


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge_expositions(parts: Sequence[tuple[str, bytes | None]]) -> bytes:
    """Prometheus text expositions of several workers as one: each sample labelled
    ``worker``, the samples of one metric together; ``None``: that worker is down."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("omni_worker_up", "1: this worker's metrics were read in this scrape.", labels=["worker"])
    for worker, text in parts:
        up.add_metric([worker], 0.0 if text is None else 1.0)
        if text is None:
            continue
        for family in text_string_to_metric_families(text.decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples.extend(s._replace(labels={**s.labels, "worker": worker}) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families.values(), up]))
    return generate_latest(registry)


__all__ = [
    "WORKER_ENV",
    "Supervisor",
    "WorkerMetrics",
    "WorkerSlot",
    "available_cores",
    "bind_sockets",
    "current_worker",
    "merge_expositions",
    "problems",
    "supervise",
    "worker_count",
]
