"""The Redis URL forms the gateway accepts, read into a ``RedisTarget`` (no I/O here).

=====================================================================  ==============================
form                                                                   topology
=====================================================================  ==============================
``redis://[[user]:password@]host[:port][/db]`` (also ``rediss://``,    one Redis (or a proxy / a
``unix://``: anything redis-py's ``Redis.from_url`` reads)             managed endpoint that follows
                                                                       its own failovers)
``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]``    Sentinel: the master named
``/<master name>[/db]``                                                ``master name``, found through
                                                                       any of the listed sentinels
                                                                       (port 26379 by default) and
                                                                       followed after a failover
``redis+cluster://[[user]:password@]host[:port][,host[:port]...]``     Redis Cluster: the listed
(or ``redis://host:port?cluster=true``)                                nodes are where the client
                                                                       learns the slot map; db 0 only
=====================================================================  ==============================

The user and password in the URL authenticate to Redis itself (master, replicas, cluster
nodes). Query options:

- ``sentinel_password``, ``sentinel_username`` (Sentinel): the sentinels' own credentials
  (``requirepass`` in sentinel.conf), when they have any.
- ``wait_replicas=N`` (single and Sentinel; Sentinel's default is 1, single's 0): a write
  counts only once N replicas have it (``WAIT`` after each write, on the same connection).
  This is what lets a Sentinel failover lose nothing acknowledged: the replica Sentinel
  promotes has every write a session was told is stored. Past ``wait_timeout_ms`` with
  fewer replicas the write raises ``StoreUnavailable`` (its effect may stay on the master;
  every write is idempotent, and it is retried): while the master has no replica, nothing
  can be stored, exactly as during an outage. ``wait_replicas=0`` trades that for
  availability: a failover may then lose the last writes before it (those sessions'
  clients get ``session.resync_required``). Not on a cluster (refused).
- ``wait_timeout_ms`` (default 1000): how long one ``WAIT`` may take.

Anything else in the query of a ``redis://`` URL is redis-py's (``Redis.from_url``); the
``+sentinel`` and ``+cluster`` forms refuse options they do not know, so a typo is an error
at start-up, not a silent default. TLS (``rediss+sentinel``, ``rediss+cluster``) is not
supported yet: refused with that message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

Topology = Literal["single", "sentinel", "cluster"]

SENTINEL_PORT = 26379  # Sentinel's own default port
REDIS_PORT = 6379
DEFAULT_WAIT_TIMEOUT_MS = 1000  # one WAIT; below the store's 2 s socket timeout
OUR_OPTIONS = ("cluster", "wait_replicas", "wait_timeout_ms")
SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username", "wait_replicas", "wait_timeout_ms")
CLUSTER_OPTIONS = ("cluster", "wait_replicas", "wait_timeout_ms")  # (the wait ones: refused, saying why)


class RedisUrlError(ValueError):
    """A Redis URL the store cannot use; the message says what to write instead."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    topology: Topology
    url: str  # single: the URL for ``Redis.from_url``, our own options removed
    nodes: tuple[tuple[str, int], ...] = ()  # sentinel: the sentinels; cluster: the startup nodes
    master: str = ""  # sentinel: the master's name
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    wait_replicas: int = 0
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    def describe(self) -> str:
        """For logs: the topology and where, never a password."""
        where = ",".join(f"{h}:{p}" for h, p in self.nodes)
        if self.topology == "sentinel":
            return f"sentinel master {self.master!r} via {where} (db {self.db})"
        if self.topology == "cluster":
            return f"cluster via {where}"
        parts = urlsplit(self.url)
        return f"redis at {parts.hostname or parts.path}:{parts.port or REDIS_PORT}"


def parse_redis_url(url: str) -> RedisTarget:
    """Read ``url`` (one of the forms in the module doc); raises ``RedisUrlError``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("rediss+sentinel", "rediss+cluster"):
        raise RedisUrlError(f"{scheme}:// (TLS to Sentinel or a cluster) is not supported yet")
    if scheme == "redis+sentinel":
        return _sentinel(parts)
    if scheme == "redis+cluster":
        return _cluster(parts, _options(parts.query, CLUSTER_OPTIONS, scheme))
    if scheme not in ("redis", "rediss", "unix"):
        raise RedisUrlError(
            f"unknown Redis URL scheme {parts.scheme!r}: use redis://, rediss://, unix://, "
            "redis+sentinel:// or redis+cluster://"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OUR_OPTIONS}
    if _flag(ours.get("cluster", "")):
        if scheme != "redis":
            raise RedisUrlError(f"cluster=true works with redis:// only, not {scheme}://")
        return _cluster(parts, ours)
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k not in OUR_OPTIONS])))
    wait, timeout = _wait(ours, default=0)
    return RedisTarget("single", rest, wait_replicas=wait, wait_timeout_ms=timeout)


def _sentinel(p: SplitResult) -> RedisTarget:
    options = _options(p.query, SENTINEL_OPTIONS, "redis+sentinel")
    path = [s for s in p.path.split("/") if s]
    if not path or len(path) > 2:
        raise RedisUrlError(
            "redis+sentinel:// needs the master's name as its path: "
            "redis+sentinel://[:password@]host:26379[,host:26379...]/<master name>[/db]"
        )
    wait, timeout = _wait(options, default=1)
    username, password, nodes = _userinfo_and_hosts(p.netloc, SENTINEL_PORT, "redis+sentinel")
    return RedisTarget(
        "sentinel",
        "",
        nodes=nodes,
        master=unquote(path[0]),
        db=_db(path[1] if len(path) > 1 else "0"),
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        wait_replicas=wait,
        wait_timeout_ms=timeout,
    )


def _cluster(p: SplitResult, options: dict[str, str]) -> RedisTarget:
    if "wait_replicas" in options or "wait_timeout_ms" in options:
        raise RedisUrlError("wait_replicas is not supported on a cluster (WAIT follows one node's connection)")
    path = [s for s in p.path.split("/") if s]
    if len(path) > 1 or (path and _db(path[0]) != 0):
        raise RedisUrlError("a Redis Cluster has database 0 only: drop the /<db> from the URL")
    username, password, nodes = _userinfo_and_hosts(p.netloc, REDIS_PORT, "redis+cluster")
    return RedisTarget("cluster", "", nodes=nodes, username=username, password=password)


def _options(query: str, allowed: tuple[str, ...], scheme: str) -> dict[str, str]:
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise RedisUrlError(f"{scheme}:// does not take {', '.join(unknown)} (it takes: {', '.join(allowed)})")
    return options


def _userinfo_and_hosts(
    netloc: str, default_port: int, scheme: str
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # "redis://secret@host" is redis-py's reading too: the part is a password
            username, password = None, unquote(user)
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        if not item:
            raise RedisUrlError(f"{scheme}:// needs host:port[,host:port...] (an empty one in {hosts!r})")
        host, port = _host_port(item, default_port, scheme)
        nodes.append((host, port))
    return username, password, tuple(nodes)


def _host_port(item: str, default_port: int, scheme: str) -> tuple[str, int]:
    if item.startswith("["):  # [::1]:26379
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise RedisUrlError(f"{scheme}:// has an address with no host: {item!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RedisUrlError(f"{scheme}:// has a bad port in {item!r}")
    return host, int(port_text)


def _db(text: str) -> int:
    if not text.isdigit():
        raise RedisUrlError(f"the database must be a number, not {text!r}")
    return int(text)


def _wait(options: dict[str, str], *, default: int) -> tuple[int, int]:
    def number(name: str, fallback: int, low: int) -> int:
        raw = options.get(name, "")
        if raw == "":
            return fallback
        if not raw.isdigit() or int(raw) < low:
            raise RedisUrlError(f"{name} must be a whole number >= {low}, not {raw!r}")
        return int(raw)

    return number("wait_replicas", default, 0), number("wait_timeout_ms", DEFAULT_WAIT_TIMEOUT_MS, 1)


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def redis_url_problem(url: str | None) -> str | None:
    """What is wrong with ``url`` (for the CLI's start-up checks), or None."""
    if not url:
        return None
    try:
        parse_redis_url(url)
    except RedisUrlError as err:
        return f"the Redis URL cannot be used: {err}"
    return None
