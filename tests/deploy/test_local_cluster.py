"""The local cluster: redis + 2 gateway replicas + nginx, real processes on 127.0.0.1.

Proves what production relies on from the proxy: health passes through, a
WebSocket upgrade is proxied, sessions spread round-robin with no stickiness,
a connect to a dead replica goes to the next one, and stopping leaves nothing
behind. nginx and redis-server are installed with apt-get when missing (see
deploy/local_cluster.py); only when that fails are these tests skipped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from deploy.local_cluster import PROXY_SETTINGS, Cluster, ClusterError, ensure_binaries, pid_alive  # noqa: E402

KEY = "sk-cluster-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def binaries() -> dict[str, str]:
    try:
        return ensure_binaries()
    except ClusterError as err:
        pytest.skip(f"nginx/redis-server unavailable and could not be installed: {err}")


@pytest.fixture
async def cluster(binaries: dict[str, str]) -> AsyncIterator[Cluster]:
    async with Cluster(replicas=2, engine="passthrough", api_keys=(KEY,)) as c:
        yield c


def _get(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers={**AUTH, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def get(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    return await asyncio.to_thread(_get, url, method, body)


async def metric(url: str, name: str) -> float:
    """One unlabelled sample from a replica's /metrics."""
    status, text = await get(url + "/metrics")
    assert status == 200
    match = re.search(rb"^" + name.encode() + rb" (\S+)$", text, re.MULTILINE)
    assert match, text[:500]
    return float(match.group(1))


async def sessions_active(url: str) -> float:
    return await metric(url, "omni_sessions_active")


@contextlib.asynccontextmanager
async def session(cluster: Cluster) -> AsyncIterator[dict[str, Any]]:
    """A WebSocket through nginx; yields its first event."""
    async with websockets.connect(cluster.url, additional_headers=AUTH, open_timeout=10, compression=None) as ws:
        yield orjson.loads(await asyncio.wait_for(ws.recv(), 10))


async def test_readyz_and_client_secrets_pass_through_nginx(cluster: Cluster) -> None:
    status, body = await get(cluster.http + "/readyz")
    assert status == 200 and json.loads(body)["status"] == "ready"
    status, body = await get(cluster.http + "/v1/realtime/client_secrets", "POST", b"{}")
    assert status == 200, body
    assert orjson.loads(body)["value"]
    assert (await get(cluster.http + "/metrics"))[0] == 404  # scraped per replica, not through the balancer


async def test_websocket_through_nginx_gets_session_created(cluster: Cluster) -> None:
    async with session(cluster) as first:
        assert first["type"] == "session.created"
    with pytest.raises(websockets.InvalidStatus) as refused:  # no key: refused by the gateway at the upgrade
        async with websockets.connect(cluster.url, open_timeout=10):
            pass
    assert refused.value.response.status_code == 401
    assert orjson.loads(refused.value.response.body)["error"]["code"] == "unauthorized"


async def test_sessions_spread_round_robin_across_replicas(cluster: Cluster) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(4):
            first = await stack.enter_async_context(session(cluster))
            assert first["type"] == "session.created"
        counts = [await sessions_active(r.http) for r in cluster.replicas]
    assert counts == [2.0, 2.0], counts


async def test_new_connections_skip_a_killed_replica(cluster: Cluster) -> None:
    old_pid = cluster.replicas[0].pid
    cluster.kill_replica(0, signal.SIGKILL)
    assert await cluster.await_exit(0) == -signal.SIGKILL
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(4):
            first = await stack.enter_async_context(session(cluster))
            assert first["type"] == "session.created"
        assert await sessions_active(cluster.replicas[1].http) == 4.0
    assert (await get(cluster.http + "/readyz"))[0] == 200

    replica = await cluster.astart_replica(0)  # back on the same port, which nginx already knows
    assert replica.pid != old_pid and replica.alive and replica.starts == 2
    assert (await get(replica.http + "/readyz"))[0] == 200
    # Back in the rotation once nginx's fail_timeout (3 s) has passed.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await metric(replica.http, "omni_sessions_total") == 0:
        assert loop.time() < deadline, "the restarted replica never got a connection"
        async with session(cluster) as first:
            assert first["type"] == "session.created"
        await asyncio.sleep(0.2)


async def test_new_connections_never_meet_a_draining_replica(cluster: Cluster) -> None:
    """A draining replica answers every upgrade 503 (Retry-After: 0), and nginx
    (proxy_next_upstream http_503) takes the connection to the other: through the
    balancer no client sees the drain. The drain is held open by a session with
    uncommitted audio on replica 0 (not idle: it is handed over only at the window's end)."""
    url = cluster.replicas[0].url
    async with websockets.connect(url, additional_headers=AUTH, open_timeout=10, compression=None) as held:
        await asyncio.wait_for(held.recv(), 10)  # session.created
        update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        await held.send(orjson.dumps({"type": "session.update", "session": update}).decode())
        audio = base64.b64encode(bytes(4800)).decode()  # 100 ms, left in the buffer
        await held.send(orjson.dumps({"type": "input_audio_buffer.append", "audio": audio}).decode())
        while orjson.loads(await asyncio.wait_for(held.recv(), 10))["type"] != "session.updated":
            pass
        cluster.kill_replica(0, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (await get(cluster.replicas[0].http + "/readyz"))[0] != 503:
            assert loop.time() < deadline, "replica 0 never began to drain"
            await asyncio.sleep(0.05)
        with pytest.raises(websockets.InvalidStatus) as refused:  # asked directly: refused at the upgrade
            async with websockets.connect(url, additional_headers=AUTH, open_timeout=10):
                pass
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "0"
        assert orjson.loads(refused.value.response.body)["error"]["code"] == "server_busy"
        before = await metric(cluster.replicas[1].http, "omni_sessions_total")
        for _ in range(4):  # round-robin would give replica 0 two of them
            async with session(cluster) as first:
                assert first["type"] == "session.created"
        assert await metric(cluster.replicas[1].http, "omni_sessions_total") == before + 4


async def test_restart_redis_comes_back_on_the_same_port(cluster: Cluster) -> None:
    url = cluster.redis_url
    await cluster.arestart_redis()
    assert cluster.redis_url == url
    reader, writer = await asyncio.open_connection("127.0.0.1", cluster.redis_port)
    writer.write(b"PING\r\n")
    assert await asyncio.wait_for(reader.readline(), 5) == b"+PONG\r\n"
    writer.close()


async def test_stop_leaves_no_process_behind(binaries: dict[str, str]) -> None:
    cluster = await Cluster(replicas=2, api_keys=(KEY,)).astart()
    pids = cluster.pids()
    assert len(pids) == 5  # redis, 2 replicas, nginx master and its worker
    run_dir = cluster.run_dir
    assert run_dir is not None and run_dir.is_dir()
    async with session(cluster):  # a client still connected while the cluster stops
        await cluster.astop()
    assert [p for p in pids if pid_alive(p)] == []
    assert all(r.process is not None and r.process.returncode is not None for r in cluster.replicas)
    assert not run_dir.exists()
    assert cluster.pids() == []
    cluster.stop()  # idempotent


def test_sync_api_starts_and_stops(binaries: dict[str, str]) -> None:
    with Cluster(replicas=1) as cluster:
        pids = cluster.pids()
        assert _get(cluster.http + "/readyz")[0] == 200
    assert [p for p in pids if pid_alive(p)] == []


def test_a_replica_that_cannot_start_fails_with_its_log(binaries: dict[str, str]) -> None:
    with pytest.raises(ClusterError, match="replica r0") as info:
        Cluster(replicas=1, env={"OMNI_GATEWAY_MAX_SESSIONS": "many"}).start()
    assert "invalid literal for int()" in str(info.value)  # the tail of the replica's log


def test_deploy_nginx_conf_uses_the_same_proxy_settings() -> None:
    shipped = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    directives = [" ".join(line.split("#", 1)[0].split()) for line in shipped.splitlines()]
    missing = [line for line in PROXY_SETTINGS.splitlines() if line.strip() and line.strip() not in directives]
    assert missing == []
    balancing = [d for d in directives if d.split(" ", 1)[0] in ("ip_hash;", "hash", "sticky", "least_conn;")]
    assert balancing == []  # plain round-robin, no affinity


def test_k8s_and_compose_manifests_parse() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "compose.yaml").read_text())
    assert {"redis", "gateway-1", "gateway-2", "nginx"} <= set(compose["services"])
    docs = [d for f in sorted((REPO_ROOT / "deploy" / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    from gateway.settings import Settings

    assert pod["terminationGracePeriodSeconds"] > Settings().drain_window_s  # the drain is never cut short


async def test_nginx_reads_a_slow_body_whole_before_a_replica_sees_it(binaries: dict[str, str]) -> None:
    """Issue 33, finding 1: a body dripped through the proxy for longer than the replica's
    request_timeout_s still reaches the replica whole, at once (nginx buffers it), so the
    replica's deadline never fires (with proxy_request_buffering off: 408 from the replica)."""
    env = {"OMNI_GATEWAY_REQUEST_TIMEOUT_S": "1"}
    async with Cluster(replicas=1, engine="passthrough", api_keys=(KEY,), env=env) as cluster:
        body = b'{"session": {"type": "realtime"}}'
        host, port = cluster.http.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode())  # fmt: skip
        for byte in body[:12]:  # 3 s of drip: three times the replica's deadline
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.25)
        writer.write(body[12:])
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b'"value":"ek_' in answer
