"""Redis topologies on 127.0.0.1 from the ``redis-server`` binary alone: one server, a
Sentinel set (a master, replicas and three sentinels), or a Redis Cluster of three
masters. For the local cluster (``local_cluster.py --redis sentinel|cluster``) and the
tests; every process is a child of this one, with no persistence, in a temporary folder.

Every wait is for a state (``INFO replication``, ``SENTINEL get-master-addr-by-name``,
``CLUSTER INFO``), polled, never a fixed sleep::

    with SentinelRedis(replicas=1) as s:       # s.url: redis+sentinel://...
        s.failover()                           # SENTINEL FAILOVER; returns once the new master has a replica
        s.kill_master()                        # SIGKILL; returns once a replica was promoted
        s.restart_node(port)                   # the killed one, back as a replica of the new master

    with ClusterRedis(masters=3) as c:         # c.url: redis+cluster://...
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

HOST = "127.0.0.1"
POLL_S = 0.05
MASTER_NAME = "omni"  # the name sentinels monitor the master under


class TopologyError(RuntimeError):
    """A Redis process failed to start, or a state was not reached in time."""


def redis_binary() -> str:
    found = shutil.which("redis-server") or next(
        (p for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin") if os.access(p := f"{d}/redis-server", os.X_OK)), None
    )
    if not found:
        raise TopologyError("redis-server is not installed")
    return found


def free_ports(n: int, below: int = 65536) -> list[int]:
    """``n`` distinct ports below ``below`` that were free a moment ago (held together)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(64 * n):
            s = stack.enter_context(socket.socket())
            s.bind((HOST, 0))
            if (port := int(s.getsockname()[1])) < below:
                ports.append(port)
                if len(ports) == n:
                    return ports
    raise TopologyError(f"no {n} free ports below {below}")


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``check`` (errors count as False) until True; TopologyError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TopologyError(f"{what}: not after {timeout_s:.0f}s" + (f" (last error: {last!r})" if last else ""))
        time.sleep(POLL_S)


class Node:
    """One redis-server (or sentinel) process on a port of its own."""

    def __init__(self, port: int, folder: Path, args: Sequence[str], config: str | None = None,
                 password: str | None = None) -> None:  # fmt: skip
        self.port = port
        self.folder = folder
        self.args = list(args)
        self.config = config  # a sentinel's: written to a file it may rewrite
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, extra: Sequence[str] = ()) -> None:
        argv = [redis_binary()]
        if self.config is not None:
            conf = self.folder / "sentinel.conf"
            conf.write_text(self.config)
            argv += [str(conf), "--sentinel"]
        argv += ["--port", str(self.port), "--bind", HOST, "--dir", str(self.folder), "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", *self.args, *extra]  # fmt: skip
        with open(self.folder / "redis.log", "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)  # fmt: skip
        wait_until(lambda: self._alive_or_fail() and self.client().ping(), 15, f"redis on {self.port} answers PING")

    def _alive_or_fail(self) -> bool:
        if not self.alive:
            raise TopologyError(f"redis on port {self.port} exited; its log ends:\n{self.log_tail()}")
        return True

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(HOST, self.port, password=self.password, socket_timeout=2, socket_connect_timeout=2,
                           **kwargs)  # fmt: skip

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as c:
            return dict(c.info(section))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(sig)
            self.process.wait(10)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.folder / "redis.log").read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return "(no log)"


class Topology:
    """The processes of one Redis deployment; ``url`` is what the gateway is given."""

    url: str

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="omni-redis-"))
        self.nodes: list[Node] = []

    def start(self) -> Topology:
        raise NotImplementedError

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [n.process.pid for n in self.nodes if n.process is not None and n.alive]

    def __enter__(self) -> Topology:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()


class SingleRedis(Topology):
    def start(self) -> SingleRedis:
        (port,) = free_ports(1)
        self.nodes = [Node(port, self.dir / str(port), [])]
        self.nodes[0].start()
        self.url = f"redis://{HOST}:{port}/0"
        return self


class SentinelRedis(Topology):
    """A master, ``replicas`` replicas and three sentinels (quorum 2), with a password on
    the data nodes and another on the sentinels: the URL carries both, and
    ``wait_replicas`` = ``replicas`` (a write counts once every replica has it: whichever
    one Sentinel promotes has it).

    ``down_after_ms``: how long the sentinels wait before they call a silent master down
    (a failover after a crash takes about this plus an election); low enough for a test,
    not so low that a busy machine's pause looks like a crash."""

    def __init__(self, replicas: int = 1, *, down_after_ms: int = 2000, password: str = "data-secret",
                 sentinel_password: str = "sentinel-secret") -> None:  # fmt: skip
        super().__init__()
        if replicas < 1:
            raise ValueError("Sentinel needs at least one replica to fail over to")
        self.replica_count = replicas
        self.down_after_ms = down_after_ms
        self.password = password
        self.sentinel_password = sentinel_password
        self.data: dict[int, Node] = {}  # port -> master or replica
        self.sentinels: list[Node] = []

    def start(self) -> SentinelRedis:
        ports = free_ports(1 + self.replica_count + 3)
        data_ports, sentinel_ports = ports[: 1 + self.replica_count], ports[1 + self.replica_count :]
        auth = ["--requirepass", self.password, "--masterauth", self.password]
        for port in data_ports:
            self.data[port] = Node(port, self.dir / str(port), auth, password=self.password)
        master = data_ports[0]
        self.data[master].start()
        for port in data_ports[1:]:
            self.data[port].start(["--replicaof", HOST, str(master)])
        self._wait_replicas(master, self.replica_count)
        # Started once the replicas are in: a sentinel's first INFO of the master names them.
        for port in sentinel_ports:
            node = Node(port, self.dir / f"sentinel-{port}", [], config=self._sentinel_conf(master),
                        password=self.sentinel_password)  # fmt: skip
            node.start()
            self.sentinels.append(node)
        self.nodes = [*self.data.values(), *self.sentinels]
        wait_until(lambda: all(self._knows_everyone(s) for s in self.sentinels), 30,
                   "every sentinel knows the replicas and the other sentinels")  # fmt: skip
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        self.url = (
            f"redis+sentinel://:{self.password}@{hosts}/{MASTER_NAME}/0"
            f"?sentinel_password={self.sentinel_password}&wait_replicas={self.replica_count}"
        )
        return self

    def _sentinel_conf(self, master: int) -> str:
        return (
            f"sentinel monitor {MASTER_NAME} {HOST} {master} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} 6000\n"
            f"sentinel parallel-syncs {MASTER_NAME} {self.replica_count}\n"
            f"sentinel auth-pass {MASTER_NAME} {self.password}\n"
            f"requirepass {self.sentinel_password}\n"
            f"sentinel sentinel-pass {self.sentinel_password}\n"
        )

    def _knows_everyone(self, sentinel: Node) -> bool:
        with sentinel.client() as c:
            replicas = c.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
            others = c.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)
        return len(replicas) >= self.replica_count and len(others) >= 2

    def _wait_replicas(self, master: int, n: int, timeout_s: float = 30) -> None:
        def linked() -> bool:
            info = self.data[master].info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]  # fmt: skip
            return info.get("role") == "master" and len(online) >= n

        wait_until(linked, timeout_s, f"master {master} has {n} replica(s) online")

    def master_port(self) -> int:
        """Where the sentinels say the master is (the first sentinel that answers)."""
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError, OSError), s.client() as c:
                _, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                return int(port)
        raise TopologyError("no sentinel answers")

    def _all_agree(self, port: int) -> bool:
        for s in self.sentinels:
            with s.client() as c:
                _, p = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                if int(p) != port:
                    return False
        return self.data[port].info("replication").get("role") == "master"

    def failover(self, timeout_s: float = 60) -> int:
        """SENTINEL FAILOVER; returns the new master's port once every sentinel names it and
        it has a replica online (what a write with ``wait_replicas=1`` needs)."""
        old = self.master_port()
        with self.sentinels[0].client() as c:
            c.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        return self._await_new_master(old, timeout_s, replicas=1)

    def kill_master(self, timeout_s: float = 60) -> tuple[int, int]:
        """SIGKILL the master; returns (its port, the promoted one's) once the sentinels
        agree on the new master and it has the other replicas (if any) online."""
        old = self.master_port()
        self.data[old].kill()
        return old, self._await_new_master(old, timeout_s, replicas=self.replica_count - 1)

    def _await_new_master(self, old: int, timeout_s: float, replicas: int) -> int:
        found: list[int] = []

        def moved() -> bool:
            port = self.master_port()
            if port == old or not self._all_agree(port):
                return False
            found[:] = [port]
            return True

        wait_until(moved, timeout_s, f"the sentinels agree on a master other than {old}")
        if replicas:
            self._wait_replicas(found[0], replicas, timeout_s)
        return found[0]

    def restart_node(self, port: int, timeout_s: float = 30) -> None:
        """Start a killed data node again (empty) as a replica of the current master, as its
        supervisor would with the configuration Sentinel rewrote; returns once it is online."""
        master = self.master_port()
        self.data[port].start(["--replicaof", HOST, str(master)])
        before = len([k for k in self.data[master].info("replication") if k.startswith("slave")])
        self._wait_replicas(master, max(1, before), timeout_s)


class ClusterRedis(Topology):
    """A Redis Cluster of ``masters`` masters and no replicas, all slots assigned."""

    def __init__(self, masters: int = 3) -> None:
        super().__init__()
        self.masters = masters

    def start(self) -> ClusterRedis:
        # A node's port must leave room for its bus port (+10000) unless given one: both are.
        ports = free_ports(2 * self.masters, below=55535)
        self.bus_ports = ports[self.masters :]
        for port, bus in zip(ports[: self.masters], self.bus_ports, strict=True):
            node = Node(port, self.dir / str(port), ["--cluster-enabled", "yes", "--cluster-port", str(bus),
                                                     "--cluster-config-file", "nodes.conf",
                                                     "--cluster-node-timeout", "5000"])  # fmt: skip
            node.start()
            self.nodes.append(node)
        # Slots by hand (CLUSTER ADDSLOTSRANGE, MEET): no redis-cli needed.
        per = 16384 // self.masters
        for i, node in enumerate(self.nodes):
            last = 16383 if i == self.masters - 1 else (i + 1) * per - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
        with self.nodes[0].client() as c:
            for node, bus in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
                c.execute_command("CLUSTER", "MEET", HOST, node.port, bus)
        wait_until(self._ok, 60, f"a {self.masters}-master cluster reports cluster_state:ok on every node")
        self.url = "redis+cluster://" + ",".join(f"{HOST}:{n.port}" for n in self.nodes)
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            with node.client() as c:
                info = c.execute_command("CLUSTER", "INFO")
            if isinstance(info, dict):
                fields = {str(k): str(v) for k, v in info.items()}
            else:
                text = info.decode() if isinstance(info, bytes) else str(info)
                fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
            if fields.get("cluster_state") != "ok" or fields.get("cluster_known_nodes") != str(self.masters):
                return False
        return True


TOPOLOGIES: dict[str, type[Topology]] = {"single": SingleRedis, "sentinel": SentinelRedis, "cluster": ClusterRedis}


def start_topology(name: str) -> Topology:
    """A started topology by name (single, sentinel, cluster)."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown Redis topology {name!r}: one of {', '.join(TOPOLOGIES)}")
    topology = TOPOLOGIES[name]()
    return topology.__enter__()
