#!/usr/bin/env python3
"""A local cluster on 127.0.0.1: one ``redis-server``, N gateway replicas and an
``nginx`` in front of them, each a child process of this one, all files in one
temporary run directory.

It is the production shape in miniature: nginx balances round-robin with no
sticky sessions (a session is not pinned to a replica; Redis is what lets it
come back anywhere), proxies WebSockets, and retries a connect that fails on a
dead replica on the next one.

As a script::

    python deploy/local_cluster.py up --replicas 3      # prints the URLs, runs until Ctrl-C

As a library (sync or async)::

    with Cluster(replicas=2) as cluster:                # or: async with Cluster(...) as cluster
        ... cluster.url ...                             # ws://127.0.0.1:<nginx>/v1/realtime
        cluster.kill_replica(0)                         # SIGKILL, like a crash
        cluster.start_replica(0)                        # back on the same port

Missing ``nginx`` or ``redis-server`` binaries are installed with
``apt-get install -y nginx redis-server`` (``apt-get update`` first only if the
install fails); the system services are never started. Every process is reaped
by ``stop()``, which is idempotent and also runs at interpreter exit; children
get SIGTERM if this process dies without stopping them (Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import ctypes
import http.client
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

if __package__ in (None, ""):  # run as a script: deploy/ is on the path, not the repo
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deploy.local_redis import TOPOLOGIES, Topology, TopologyError, start_topology

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
POLL_S = 0.02  # how often readiness and exits are polled
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")  # not on a non-root PATH

# The proxy settings shared with deploy/nginx.conf (a test keeps the two in step).
PROXY_SETTINGS = """\
proxy_http_version 1.1;
proxy_set_header Upgrade $http_upgrade;
proxy_set_header Connection $connection_upgrade;
proxy_set_header Host $http_host;
proxy_set_header X-Real-IP $remote_addr;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_buffering off;
proxy_request_buffering on;
client_max_body_size 1m;
client_body_timeout 10s;
proxy_connect_timeout 2s;
proxy_read_timeout 3600s;
proxy_send_timeout 3600s;
proxy_next_upstream error timeout http_503;
proxy_next_upstream_timeout 10s;
"""
# Never mark a replica failed (deploy/README.md, "The balancer"): a refused connect is retried on the next.
UPSTREAM_SERVER_PARAMS = "max_fails=0"  # see deploy/README.md: why no server is ever marked failed


class ClusterError(RuntimeError):
    """A cluster process failed to start, or a binary could not be installed."""


# --- binaries ---------------------------------------------------------------


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN_DIRS:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    return None


def ensure_binaries(names: Sequence[str] = ("nginx", "redis-server")) -> dict[str, str]:
    """Paths of ``names``; installs the missing ones with apt-get (how CI gets them)."""
    missing = [n for n in names if find_binary(n) is None]
    if missing:
        _apt_install(missing)
    paths = {n: find_binary(n) for n in names}
    still = [n for n, p in paths.items() if p is None]
    if still:
        raise ClusterError(f"{', '.join(still)} not found after apt-get install")
    return {n: p for n, p in paths.items() if p is not None}


def _apt_install(packages: Sequence[str]) -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        raise ClusterError(f"{', '.join(packages)} missing and there is no apt-get to install them")
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            raise ClusterError(f"{', '.join(packages)} missing; installing needs root (or sudo)")
        prefix = [sudo, "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, apt, "install", "-y", "--no-install-recommends", *packages]
    first = subprocess.run(install, env=env, capture_output=True, text=True)
    if first.returncode == 0:
        return
    subprocess.run([*prefix, apt, "update"], env=env, capture_output=True, text=True)
    second = subprocess.run(install, env=env, capture_output=True, text=True)
    if second.returncode != 0:
        raise ClusterError(f"apt-get install {' '.join(packages)} failed:\n{second.stderr[-2000:]}")


# --- small helpers ----------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago (held together, so no repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]


def http_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    """The status of ``GET path`` on 127.0.0.1:port, or None if nothing answers."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def redis_ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-chars:].decode(errors="replace") or "(empty log)"


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (nginx's workers), read from /proc."""
    found: list[int] = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields_after_name = stat.rsplit(")", 1)[-1].split()
        if len(fields_after_name) > 1 and fields_after_name[1] == str(pid):
            found.append(int(entry))
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when its parent thread dies.

    Only from the main thread: the signal follows the thread that forked, and a
    worker thread may end long before the cluster does.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


def _spawn(argv: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env) if env else None,
            cwd=str(REPO_ROOT), start_new_session=True, preexec_fn=_die_with_parent(),
        )  # fmt: skip


def _signal(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


# --- waiting, shared by the sync and the async drivers -----------------------


@dataclass
class _Until:
    """One wait of a start or stop sequence: ``check()`` until True or ``timeout_s``.

    ``check`` may raise ClusterError (a process died); ``expired`` runs on
    timeout and may raise too. ``blocking`` checks do network I/O; the async
    driver runs them in a thread.
    """

    check: Callable[[], bool]
    timeout_s: float
    expired: Callable[[], None] = lambda: None
    blocking: bool = False


_Steps = Iterator[_Until]


def _drive(steps: _Steps) -> None:
    for step in steps:
        deadline = time.monotonic() + step.timeout_s
        while not step.check():
            if time.monotonic() > deadline:
                step.expired()
                break
            time.sleep(POLL_S)


async def _adrive(steps: _Steps) -> None:
    loop = asyncio.get_running_loop()
    for step in steps:
        deadline = loop.time() + step.timeout_s
        while not (await asyncio.to_thread(step.check) if step.blocking else step.check()):
            if loop.time() > deadline:
                step.expired()
                break
            await asyncio.sleep(POLL_S)


def _exited(procs: Sequence[subprocess.Popen[bytes] | None]) -> Callable[[], bool]:
    return lambda: all(p is None or p.poll() is not None for p in procs)


# --- the cluster -------------------------------------------------------------


@dataclass
class Replica:
    index: int
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0  # how many times it was started

    @property
    def name(self) -> str:
        return f"r{self.index}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"ws://{HOST}:{self.port}/v1/realtime"


class Cluster:
    """Redis + ``replicas`` gateways + nginx on 127.0.0.1; see the module docstring.

    ``env`` is added to every replica's environment (``OMNI_GATEWAY_*`` settings);
    ``api_keys`` become ``OMNI_GATEWAY_API_KEYS``.
    """

    def __init__(
        self,
        replicas: int = 3,
        engine: str = "passthrough",
        api_keys: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        log_level: str | None = None,
        ready_timeout_s: float = 30.0,  # per process; then ClusterError with the tail of its log
        stop_timeout_s: float = 30.0,  # SIGTERM'd replicas still running then are SIGKILLed;
        #   longer than the gateway's drain (drain_window_s, default 20 s)
        keep_run_dir: bool = False,  # keep logs and configs after stop (debugging)
        redis: str = "single",  # single | sentinel | cluster (deploy/local_redis.py)
    ) -> None:
        if replicas < 1:
            raise ValueError("a cluster needs at least one replica")
        self.replicas_count = replicas
        self.engine = engine
        self.api_keys = tuple(api_keys)
        self.env = dict(env or {})
        self.log_level = log_level
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.keep_run_dir = keep_run_dir
        if redis not in TOPOLOGIES:
            raise ValueError(f"unknown Redis topology {redis!r}: one of {', '.join(TOPOLOGIES)}")
        self.redis_topology = redis
        self.topology: Topology | None = None  # sentinel, cluster: their processes
        self.run_dir: Path | None = None
        self.replicas: list[Replica] = []
        self.redis_port = 0
        self.nginx_port = 0
        self._bins: dict[str, str] = {}
        self._redis: subprocess.Popen[bytes] | None = None
        self._nginx: subprocess.Popen[bytes] | None = None
        self._started = False

    # --- addresses ---

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.nginx_port}"

    @property
    def url(self) -> str:
        return f"ws://{HOST}:{self.nginx_port}/v1/realtime"

    @property
    def redis_url(self) -> str:
        """The URL the replicas are given (``redis+sentinel://`` or ``redis+cluster://`` for those)."""
        if self.topology is not None:
            return self.topology.url
        return f"redis://{HOST}:{self.redis_port}/0"

    def pids(self) -> list[int]:
        """Every process of the cluster that is running now (nginx workers included)."""
        procs = [self._redis, self._nginx, *(r.process for r in self.replicas)]
        pids = [p.pid for p in procs if p is not None and p.poll() is None]
        if self.topology is not None:
            pids += self.topology.pids()
        if self._nginx is not None and self._nginx.poll() is None:
            pids += child_pids(self._nginx.pid)
        return pids

    # --- start ---

    def start(self) -> Cluster:
        self._prepare(ensure_binaries())
        try:
            _drive(self._start_steps())
        except BaseException:
            self.stop()
            raise
        return self

    async def astart(self) -> Cluster:
        self._prepare(await asyncio.to_thread(ensure_binaries))
        try:
            await _adrive(self._start_steps())
        except BaseException:
            self.stop()  # blocking, but no client is connected yet and a second cancel cannot cut it short
            raise
        return self

    def _prepare(self, bins: dict[str, str]) -> None:
        if self._started:
            raise ClusterError("a Cluster starts once; make a new one")
        self._started = True
        self._bins = bins
        self.run_dir = Path(tempfile.mkdtemp(prefix="omni-cluster-"))
        self.run_dir.chmod(0o755)  # nginx workers run as another user when we are root
        (self.run_dir / "tmp").mkdir()
        self.redis_port, self.nginx_port, *ports = free_ports(self.replicas_count + 2)
        self.replicas = [Replica(i, port, self.run_dir / f"replica-r{i}.log") for i, port in enumerate(ports)]
        (self.run_dir / "nginx.conf").write_text(
            nginx_config(self.run_dir, self.nginx_port, [r.port for r in self.replicas])
        )
        atexit.register(self.stop)

    def _start_steps(self) -> _Steps:
        yield from self._redis_steps()
        for replica in self.replicas:
            self._spawn_replica(replica)
        for replica in self.replicas:
            yield self._replica_ready(replica)
        yield from self._nginx_steps()

    def _redis_steps(self) -> _Steps:
        assert self.run_dir is not None
        if self.redis_topology != "single":  # started whole, blocking (in a thread for astart)
            yield _Until(self._start_topology, self.ready_timeout_s, blocking=True)
            return
        log = self.run_dir / "redis.log"
        self._redis = _spawn(
            [self._bins["redis-server"], "--port", str(self.redis_port), "--bind", HOST, "--save", "",
             "--appendonly", "no", "--dir", str(self.run_dir), "--daemonize", "no", "--protected-mode", "no"],
            log,
        )  # fmt: skip
        proc = self._redis
        yield _Until(lambda: self._alive_or_fail("redis-server", proc, log) and redis_ping(self.redis_port),
                     self.ready_timeout_s, lambda: self._timeout("redis-server", log), blocking=True)  # fmt: skip

    def _start_topology(self) -> bool:
        if self.topology is None:
            try:
                self.topology = start_topology(self.redis_topology)
            except TopologyError as err:
                raise ClusterError(str(err)) from err
        return True

    def _nginx_steps(self) -> _Steps:
        assert self.run_dir is not None
        log = self.run_dir / "nginx-error.log"
        # Before it reads the config nginx logs to its built-in path or stderr: both end up here.
        self._nginx = _spawn([self._bins["nginx"], "-p", str(self.run_dir), "-c", str(self.run_dir / "nginx.conf")],
                             log)  # fmt: skip
        proc = self._nginx
        yield _Until(lambda: self._alive_or_fail("nginx", proc, log) and http_status(self.nginx_port, "/readyz") == 200,
                     self.ready_timeout_s, lambda: self._timeout("nginx", log), blocking=True)  # fmt: skip

    def _spawn_replica(self, replica: Replica) -> None:
        # One process per replica (pid, logs and kills are per replica); env may say otherwise.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNI_GATEWAY_REPLICA_ID": replica.name,
               "OMNI_GATEWAY_WORKERS": "1"}  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        if self.api_keys:
            env["OMNI_GATEWAY_API_KEYS"] = ",".join(self.api_keys)
        env.update(self.env)
        argv = [sys.executable, "-m", "gateway", "serve", "--host", HOST, "--port", str(replica.port),
                "--engine", self.engine, "--redis-url", self.redis_url]  # fmt: skip
        if self.log_level:
            argv += ["--log-level", self.log_level]
        with open(replica.log_path, "ab") as log:
            log.write(f"--- start #{replica.starts + 1}: {' '.join(argv)}\n".encode())
        replica.process = _spawn(argv, replica.log_path, env)
        replica.starts += 1

    def _replica_ready(self, replica: Replica) -> _Until:
        proc, what = replica.process, f"replica {replica.name} (port {replica.port})"
        return _Until(
            lambda: self._alive_or_fail(what, proc, replica.log_path) and http_status(replica.port, "/readyz") == 200,
            self.ready_timeout_s, lambda: self._timeout(what, replica.log_path), blocking=True,
        )  # fmt: skip

    def _alive_or_fail(self, what: str, proc: subprocess.Popen[bytes] | None, log: Path) -> bool:
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            raise ClusterError(f"{what} exited with code {code} before it was ready; its log ends:\n{log_tail(log)}")
        return True

    def _timeout(self, what: str, log: Path) -> None:
        raise ClusterError(f"{what} was not ready after {self.ready_timeout_s:.0f}s; its log ends:\n{log_tail(log)}")

    # --- replicas and redis, one at a time ---

    def kill_replica(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL: a crash; SIGTERM: a drain) to replica ``i``; returns at once."""
        _signal(self.replicas[i].process, sig)

    def wait_exit(self, i: int, timeout_s: float = 30.0) -> int:
        """Wait for replica ``i`` to exit and reap it; its exit code (negative: a signal).
        Raises subprocess.TimeoutExpired after ``timeout_s``."""
        proc = self.replicas[i].process
        if proc is None:
            raise ClusterError(f"replica r{i} was never started")
        return proc.wait(timeout_s)

    async def await_exit(self, i: int, timeout_s: float = 30.0) -> int:
        proc = self.replicas[i].process
        if proc is None:
            raise ClusterError(f"replica r{i} was never started")
        await _adrive(iter([_Until(_exited([proc]), timeout_s)]))
        if proc.poll() is None:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        return proc.returncode

    def start_replica(self, i: int) -> Replica:
        """(Re)start replica ``i`` on its own port (nginx knows it) and wait for /readyz."""
        _drive(self._restart_replica_steps(i))
        return self.replicas[i]

    async def astart_replica(self, i: int) -> Replica:
        await _adrive(self._restart_replica_steps(i))
        return self.replicas[i]

    def _restart_replica_steps(self, i: int) -> _Steps:
        replica = self.replicas[i]
        if replica.alive:
            raise ClusterError(f"replica {replica.name} is still running (pid {replica.pid}); kill it first")
        if replica.process is not None:
            replica.process.wait()
        self._spawn_replica(replica)
        yield self._replica_ready(replica)

    def restart_redis(self) -> None:
        """Kill redis-server (SIGKILL) and start it again on the same port, empty."""
        _drive(self._restart_redis_steps())

    async def arestart_redis(self) -> None:
        await _adrive(self._restart_redis_steps())

    def _restart_redis_steps(self) -> _Steps:
        if self.topology is not None:
            raise ClusterError("restart_redis restarts a single Redis; a topology's nodes: cluster.topology")
        _signal(self._redis, signal.SIGKILL)
        yield _Until(_exited([self._redis]), 10.0)
        yield from self._redis_steps()

    # --- stop ---

    def stop(self) -> None:
        """nginx, then the replicas (SIGTERM, SIGKILL after stop_timeout_s), then redis;
        every process reaped, the run directory removed. Idempotent."""
        _drive(self._stop_steps())

    async def astop(self) -> None:
        """``stop()`` without blocking the event loop (clients may still be connected)."""
        try:
            await _adrive(self._stop_steps())
        except BaseException:
            self.stop()  # cancelled half-way: finish, blocking (every step is idempotent)
            raise

    def _stop_steps(self) -> _Steps:
        if not self._started:
            return
        # nginx first: no new connections, and open ones close, so replicas exit quickly.
        nginx = self._nginx
        workers = child_pids(nginx.pid) if nginx is not None and nginx.poll() is None else []
        yield from self._terminate([nginx], signal.SIGTERM, 5.0)
        for pid in workers:  # normally gone with their master; never leave one behind
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        yield from self._terminate([r.process for r in self.replicas], signal.SIGTERM, self.stop_timeout_s)
        yield from self._terminate([self._redis], signal.SIGTERM, 5.0)
        if self.topology is not None:
            self.topology.stop()
        if self.run_dir is not None and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def _terminate(self, procs: Sequence[subprocess.Popen[bytes] | None], sig: int, timeout: float) -> _Steps:
        for p in procs:
            _signal(p, sig)
        yield _Until(_exited(procs), timeout)
        for p in procs:
            _signal(p, signal.SIGKILL)
        yield _Until(_exited(procs), 10.0)  # poll() reaps them

    # --- context managers ---

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    async def __aenter__(self) -> Cluster:
        return await self.astart()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        await self.astop()


def nginx_config(run_dir: Path, listen_port: int, upstream_ports: Sequence[int]) -> str:
    """nginx.conf for the local cluster: every path inside ``run_dir``, foreground."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    connections = max(256, min(nofile // 2, 16384))  # a proxied socket holds two descriptors
    servers = "\n".join(f"        server {HOST}:{p} {UPSTREAM_SERVER_PARAMS};" for p in upstream_ports)
    tmp = run_dir / "tmp"
    proxy = textwrap.indent(PROXY_SETTINGS, " " * 12).rstrip()
    return f"""\
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {run_dir}/nginx.pid;
error_log {run_dir}/nginx-error.log warn;

events {{
    worker_connections {connections};
}}

http {{
    log_format upstream '$remote_addr [$time_local] "$request" $status upstream=$upstream_addr rt=$request_time';
    access_log {run_dir}/nginx-access.log upstream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}

    # Round-robin, no stickiness: a session may land anywhere and resume anywhere.
    upstream gateway {{
        zone gateway 64k;
{servers}
    }}

    server {{
        listen {HOST}:{listen_port};

        # Prometheus scrapes each replica directly; a balanced /metrics means nothing.
        location = /metrics {{
            return 404;
        }}

        location / {{
            proxy_pass http://gateway;
{proxy}
        }}
    }}
}}
"""


# --- command line ------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    began = time.monotonic()
    cluster = Cluster(replicas=args.replicas, engine=args.engine, api_keys=args.api_key or (),
                      log_level=args.log_level, keep_run_dir=args.keep_run_dir, redis=args.redis)  # fmt: skip
    try:
        cluster.start()
        print(f"cluster up in {time.monotonic() - began:.1f}s (run dir {cluster.run_dir})")
        print(f"  realtime  {cluster.url}")
        print(f"  http      {cluster.http}  (/readyz, /v1/realtime/client_secrets)")
        print(f"  redis     {cluster.redis_url}")
        for r in cluster.replicas:
            print(f"  {r.name:<9} {r.http}  pid {r.pid}  log {r.log_path}")
        print("Ctrl-C to stop.", flush=True)
        reported: set[int] = set()
        while not stop.wait(1.0):
            for r in cluster.replicas:
                if not r.alive and r.index not in reported:
                    reported.add(r.index)
                    code = r.process.returncode if r.process else None
                    print(f"replica {r.name} exited with code {code}; see {r.log_path}", flush=True)
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    print("cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="local_cluster.py",
        description="Run redis + N gateway replicas + nginx (round-robin, WebSocket) on 127.0.0.1.",
        epilog="Example: python deploy/local_cluster.py up --replicas 3 --api-key sk-local",
    )
    sub = parser.add_subparsers(dest="command")
    up = sub.add_parser("up", help="start the cluster, print its URLs, run until Ctrl-C")
    up.add_argument("--replicas", type=int, default=3, help="gateway replicas (default 3)")
    up.add_argument("--engine", default="passthrough", help="gateway engine (default passthrough)")
    up.add_argument("--api-key", action="append", help="accepted API key; repeat for several (default: no auth)")
    up.add_argument("--log-level", help="gateway log level")
    up.add_argument("--keep-run-dir", action="store_true", help="keep logs and configs after stopping")
    up.add_argument("--redis", choices=list(TOPOLOGIES), default="single",
                    help="Redis topology: one server (default), Sentinel (master, a replica, 3 sentinels) "
                         "or a 3-master cluster")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command != "up":
        parser.print_help()
        return 0 if args.command is None else 2
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
