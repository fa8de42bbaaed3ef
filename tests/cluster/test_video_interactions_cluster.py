"""Video interactions across replicas: redis + 2 gateway replicas + nginx, real processes.

A browser streams video through nginx (it lands on either replica); the app
that steers it POSTs interactions to whichever replica its load balancer
picks. Posting to each replica directly covers both paths: the owner applies
the interaction itself, the other one forwards it over the Redis bus. Either
way the socket hears ``session.interaction.queued`` and sees the transition
in the chunk metadata. nginx and redis-server are installed with apt-get when
missing (deploy/local_cluster.py); only when that fails is this skipped.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import websockets

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from deploy.local_cluster import Cluster, ClusterError, ensure_binaries  # noqa: E402

pytestmark = pytest.mark.timeout(120)

KEY = "sk-video-cluster"
AUTH = {"Authorization": f"Bearer {KEY}"}
STREAM = {"prompt": "A red fox in snow", "width": 128, "height": 96, "fps": 24, "frames_per_chunk": 4}


@pytest.fixture(scope="module")
def binaries() -> dict[str, str]:
    try:
        return ensure_binaries()
    except ClusterError as err:
        pytest.skip(f"nginx/redis-server unavailable and could not be installed: {err}")


@pytest.fixture
def redis_topology(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "single"))


@pytest.fixture
async def cluster(binaries: dict[str, str], redis_topology: str) -> AsyncIterator[Cluster]:
    # drain_window_s: short, so that stopping the replicas does not wait for the 20 s default.
    # ready_timeout_s: the video engine loads torch, slow on a loaded machine.
    async with Cluster(replicas=2, engine="passthrough", api_keys=(KEY,), env={"OMNI_GATEWAY_DRAIN_WINDOW_S": "1"},
                       stop_timeout_s=15, ready_timeout_s=90, redis=redis_topology) as c:  # fmt: skip
        yield c


class Socket:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(event).decode())

    async def wait_for(self, kind: str, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.ws.recv()
                if isinstance(message, bytes):
                    assert self.events[-1]["type"] == "video.chunk_metadata"
                    assert len(message) == self.events[-1]["byte_length"]
                    continue
                event: dict[str, Any] = orjson.loads(message)
                self.events.append(event)
                assert event["type"] != "error", event
                if event["type"] == kind and all(_has(event, k, v) for k, v in fields.items()):
                    return event


def _has(event: dict[str, Any], key: str, value: Any) -> bool:
    got = event.get(key)
    return value in got if isinstance(got, list) else bool(got == value)


@pytest.mark.parametrize("redis_topology", ["single", "cluster"], indirect=True)
async def test_interactions_posted_to_each_replica_reach_the_socket(cluster: Cluster) -> None:
    video_url = f"ws://127.0.0.1:{cluster.nginx_port}/v1/realtime/video"
    async with websockets.connect(video_url, additional_headers=AUTH, open_timeout=10, max_size=None,
                                  compression=None) as ws, httpx.AsyncClient(timeout=10) as http:  # fmt: skip
        s = Socket(ws)
        await s.send({"type": "session.start", **STREAM})
        start = await s.wait_for("video.start")
        sid = start["session_id"]
        await s.wait_for("video.chunk_metadata")

        answers = []
        for replica in cluster.replicas:
            event_id = f"via-{replica.name}"
            body = {"interaction": {"event_id": event_id, "event": {"prompt": f"A lighthouse seen from {replica.name}"},
                                    "transition_chunks": 1}}  # fmt: skip
            r = await http.post(f"{replica.http}/v1/realtime/video/{sid}/interactions", json=body, headers=AUTH)
            assert r.status_code == 202, (replica.name, r.text)
            answers.append(r.json())
            await s.wait_for("session.interaction.queued", event_id=event_id)
            chunk = await s.wait_for("video.chunk_metadata", started_event_ids=event_id)
            assert event_id in chunk["completed_event_ids"]  # transition_chunks 1: one chunk

        # Exactly one replica owns the socket; the other forwarded over the bus.
        assert sorted(bool(a.get("forwarded")) for a in answers) == [False, True], answers
        assert all(a["session_id"] == sid and a["queued"] for a in answers)

        await s.send({"type": "session.stop"})
        done = await s.wait_for("session.done")
        assert done["stopped"] is True


LONG_STREAM = {"prompt": "A red fox in snow", "width": 64, "height": 48, "fps": 8, "frames_per_chunk": 4,
               "num_frames": 8 * 60}  # fmt: skip  # 60 s of video, two chunks a second, paced to the wall clock


@pytest.mark.timeout(180)
async def test_a_minute_long_stream_on_one_replica_takes_interactions_through_the_other_until_it_ends(
    cluster: Cluster,
) -> None:
    """The operator's scenario: A streams a video for 60 s; interactions POSTed to B at
    0.1 s, 25 s and 50 s (the last two long after a lease TTL of 15 s) are each forwarded
    and applied on A's stream; once the client has seen session.done, B answers 404."""
    a, b = cluster.replicas
    video_url = a.http.replace("http://", "ws://") + "/v1/realtime/video"
    loop = asyncio.get_running_loop()
    async with websockets.connect(video_url, additional_headers=AUTH, open_timeout=10, max_size=None,
                                  compression=None) as ws, httpx.AsyncClient(timeout=10) as http:  # fmt: skip
        s = Socket(ws)
        await s.send({"type": "session.start", **LONG_STREAM})
        sid = (await s.wait_for("video.start"))["session_id"]
        started = loop.time()
        for n, at in enumerate((0.1, 25.0, 50.0)):
            await asyncio.sleep(max(0.0, started + at - loop.time()))  # the scenario's clock, not a wait for state
            event_id = f"via-b-at-{at:g}s"
            body = {"interaction": {"event_id": event_id, "event": {"prompt": f"A lighthouse, take {n}"},
                                    "transition_chunks": 1}}  # fmt: skip
            r = await http.post(f"{b.http}/v1/realtime/video/{sid}/interactions", json=body, headers=AUTH)
            assert r.status_code == 202, (at, r.status_code, r.text)
            assert r.json()["forwarded"] is True
            await s.wait_for("session.interaction.queued", event_id=event_id)
            chunk = await s.wait_for("video.chunk_metadata", started_event_ids=event_id)
            assert event_id in chunk["completed_event_ids"]  # transition_chunks 1: applied within a chunk
        done = await s.wait_for("session.done", timeout=60)
        assert done["stopped"] is False  # it ran its whole minute
        assert loop.time() - started >= 55  # paced: a minute of video took about a minute
        body = {"interaction": {"event_id": "too-late", "event": {"prompt": "Nothing"}}}
        r = await http.post(f"{b.http}/v1/realtime/video/{sid}/interactions", json=body, headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found", r.text
