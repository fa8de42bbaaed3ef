"""A GPT-Live session survives the death and the drain of the replica that served it
(nginx round-robin, redis-server, three ``--engine passthrough`` replicas: ``conftest.py``).

The client speaks GPT-Live on ``/v1/live/sessions`` and the gateway's resume extension:
when its socket drops it reconnects through nginx and sends ``session.resume`` with the
last ``server_event_seq`` it holds. The replica holding the session is SIGKILLed (or
drained) while the model is saying an appended commentary, at a different moment each
time. Proved, every time:

- no ``error`` event;
- nothing lost and nothing twice: the seqs the client holds go 1, 2, 3... (a replayed
  event it had is dropped by seq, as a resuming client does), or, when the client held
  events the store never got, ``session.resync_required`` says so and numbering goes on
  above them;
- the interrupted answer is said again, whole (the passthrough says the commentary's
  words, then ``w<i>`` to 50 words) on the replica that took the session over;
- the session goes on there: another commentary is said, and ``session.close`` ends it.
"""

from __future__ import annotations

import asyncio
import base64
import signal
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import websockets

if TYPE_CHECKING:
    from conftest import Harness

pytestmark = pytest.mark.timeout(300)

WORDS = ["one", "two", "three", *(f"w{i}" for i in range(3, 50))]  # what the passthrough says for "one two three"


class LiveClient:
    """A Live client that resumes: events by seq, a drop followed by ``session.resume``."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.events: list[dict[str, Any]] = []  # what the client holds, each once, in seq order
        self.resumes: list[str] = []  # session.resumed / session.resync_required, per reconnect
        self.session_id = ""
        self.token = ""
        self.ws: Any = None
        self.last_seq = 0

    async def open(self) -> None:
        self.ws = await websockets.connect(self.url, additional_headers=self.headers, max_size=None, open_timeout=10)
        await self.ws.send(orjson.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}).decode())
        started = await self.next()
        assert started["type"] == "session.started", started
        self.session_id, self.token = started["session"]["id"], started["resume_token"]

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next event the client did not hold yet (a replayed one it held is dropped)."""
        while True:
            event = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            seq = event.get("server_event_seq", 0)
            kind = event["type"]
            if kind in ("session.resumed", "session.resync_required"):
                self.resumes.append(kind)
                self.token = event["resume_token"]
                if kind == "session.resync_required":
                    self.last_seq = event["last_server_event_seq"]
                continue
            assert kind != "error", event
            if seq and seq <= self.last_seq:
                continue  # replayed: held already
            if seq:
                assert seq == self.last_seq + 1, f"gap: {self.last_seq} -> {seq} ({kind})"
                self.last_seq = seq
            self.events.append(event)
            return event

    async def resume(self) -> None:
        """The socket dropped: reconnect through the balancer and resume, until a replica takes it."""
        for attempt in range(50):
            try:
                self.ws = await websockets.connect(self.url, additional_headers=self.headers, max_size=None,
                                                   open_timeout=10)  # fmt: skip
                await self.ws.send(orjson.dumps({
                    "type": "session.resume", "session_id": self.session_id, "resume_token": self.token,
                    "last_received_server_event_seq": self.last_seq,
                }).decode())  # fmt: skip
                resumed = len(self.resumes)
                while len(self.resumes) == resumed:
                    await self.next()
                return
            except (TimeoutError, OSError, websockets.WebSocketException):
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
        raise AssertionError("the session was never resumed")

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(event).decode())

    def said_since(self, start: int) -> list[str]:
        return "".join(
            e["delta"] for e in self.events[start:] if e["type"] == "session.output_transcript.delta"
        ).split()


async def said_whole(c: LiveClient, words: list[str]) -> None:
    """Until the words of an answer said whole (from its start) are the client's last ones."""
    while True:
        said = c.said_since(0)
        if len(said) >= len(words) and said[-len(words) :] == words:
            return
        await c.next()


async def outage(harness: Harness, *, audio_deltas: int, how: str) -> str:
    c = LiveClient(harness.cluster.url.replace("/v1/realtime", "/v1/live/sessions"), harness.api_key)
    await c.open()
    owner = await harness.wait_owner(c.session_id)
    await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(bytes(9600)).decode()})
    await c.send({"type": "session.commentary.append", "content": "one two three", "delegation_id": None})
    while sum(e["type"] == "session.output_audio.delta" for e in c.events) < audio_deltas:
        await c.next()
    if how == "kill":
        harness.cluster.kill_replica(owner, signal.SIGKILL)
    else:
        harness.cluster.kill_replica(owner, signal.SIGTERM)  # a drain: 1012, the session handed over
    try:
        while True:
            await c.next(timeout=10)
    except (TimeoutError, websockets.ConnectionClosed):
        pass
    await c.resume()
    await said_whole(c, WORDS)  # the interrupted answer, said again whole (or finished, when it had been)
    new_owner = await harness.wait_owner(c.session_id)
    assert new_owner != owner
    mark = len(c.events)
    await c.send({"type": "session.commentary.append", "content": "one two three", "delegation_id": None})
    while c.said_since(mark) != WORDS:
        await c.next()
    await c.send({"type": "session.close"})
    while c.events[-1]["type"] != "session.closed":
        await c.next()
    await c.ws.close()
    return f"{how} of replica {owner} after {audio_deltas} deltas -> replica {new_owner}: {c.resumes}"


@pytest.mark.parametrize("how", ["kill", "drain"])
async def test_a_live_session_survives_its_replica_at_any_moment_of_an_answer(harness: Harness, how: str) -> None:
    for audio_deltas in (1, 7, 23, 41):
        await harness.ensure_all_up()
        print(await outage(harness, audio_deltas=audio_deltas, how=how))


async def test_the_official_sdk_resumes_a_live_session_through_a_drain(harness: Harness) -> None:
    """openai-python's ``client.live`` reconnects by itself when its socket closes 1012 (a
    drain); its ``on_reconnecting`` hook may change the URL of the next attempt, and the
    gateway resumes a session the URL names (``resume_session_id``, ``resume_token``,
    ``last_received_server_event_seq``: the resume extension). Through nginx, the replica
    holding the session is drained mid-answer: the SDK resumes on another, nothing is lost
    or twice, and the answer is said whole."""
    openai = pytest.importorskip("openai")
    await harness.ensure_all_up()
    held: dict[str, Any] = {"seq": 0, "token": "", "sid": ""}

    def on_reconnecting(event: Any) -> dict[str, Any]:
        return {"extra_query": {"resume_session_id": held["sid"], "resume_token": held["token"],
                                "last_received_server_event_seq": str(held["seq"])}}  # fmt: skip

    base = harness.cluster.url.replace("/v1/realtime", "/v1")
    client = openai.AsyncOpenAI(api_key=harness.api_key, websocket_base_url=base)
    said: list[str] = []
    resumed = 0
    async with client.live.connect(on_reconnecting=on_reconnecting, initial_delay=0.05) as conn:
        await conn.session.start(session={"model": "gpt-live-1"})
        await conn.session.commentary.append(content="one two three", delegation_id=None)
        owner: int | None = None
        deltas = 0
        async for event in conn:
            seq = getattr(event, "server_event_seq", 0) or 0
            if event.type in ("session.started", "session.resumed"):
                held["token"] = event.resume_token  # type: ignore[union-attr]
                if event.type == "session.started":
                    held["sid"] = event.session.id  # type: ignore[union-attr]
                    held["seq"] = seq
                    owner = await harness.wait_owner(held["sid"])
                else:
                    resumed += 1
                continue
            assert event.type not in ("error", "session.resync_required"), event
            if seq <= held["seq"]:
                continue  # replayed: held already
            assert seq == held["seq"] + 1, f"gap: {held['seq']} -> {seq}"
            held["seq"] = seq
            if event.type == "session.output_audio.delta":
                deltas += 1
                if deltas == 9 and owner is not None and resumed == 0:
                    harness.cluster.kill_replica(owner, signal.SIGTERM)  # a drain
            elif event.type == "session.output_transcript.delta":
                said.extend(event.delta.split())  # type: ignore[union-attr]
                if said[-len(WORDS) :] == WORDS:
                    break
        assert resumed == 1
        assert await harness.wait_owner(held["sid"]) != owner
        await conn.session.close()
