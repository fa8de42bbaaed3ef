"""A drain no listener hears: two replicas on one Redis (real sockets, real store),
clients that never stop asking for answers, and replica A drained (what SIGTERM
runs). Each session is handed over at its own first idle moment (between
answers), its socket closed with 1012, paced apart; no answer is cut while the
window lasts, and each session resumes on B with nothing lost or repeated. An
answer the window does cut is ended where it resumes as drained, not as a lost
replica. (The process-level drain, SIGTERM through nginx, is in tests/cluster.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.runtime import DRAIN_GAP_S
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

KEY = {"Authorization": "Bearer k"}
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.fixture
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    window, chunks = request.param
    with RedisServer() as server:
        base = Settings(engine="passthrough", redis_url=server.url, api_keys=("k",), video_engine="none",
                        drain_window_s=window)  # fmt: skip
        engine = PassthroughEngine(audio_chunks=chunks, paced=True)  # an answer lasts chunks x 20 ms
        async with (
            run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
        ):
            yield a, b


class Talker:
    """A client that asks for answer after answer, and after a 1012 resumes on the other
    replica and goes on (a response.create sent as the socket closed may not have been
    read: after the resume it asks again unless the replay shows one running)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []  # server_event_seq of every event received, in order
        self.done: list[dict[str, Any]] = []  # every response.done
        self.closed_at: float | None = None
        self.close_code: int | None = None
        self.last_before_close: str | None = None
        self.resumed: dict[str, Any] | None = None
        self.answers = 0  # answers completed before the drain's close

    def heard(self, events: list[dict[str, Any]]) -> None:
        """What one connection delivered of the session, in order."""
        for event in events:
            if "server_event_seq" in event:
                self.seqs.append(event["server_event_seq"])
            if event["type"] == "response.done":
                self.done.append(event)

    async def talk(self, a: RunningGateway, b: RunningGateway, answers_after: int) -> None:
        async with connect(a.url, headers=KEY) as c:
            created = await c.wait_for("session.created")
            await c.send({"type": "conversation.item.create", "item": TEXT})
            sid, token = created["session"]["id"], created["resume_token"]
            try:
                while True:
                    await c.send({"type": "response.create"})
                    await c.wait_for("response.done", 30)
                    self.answers += 1
            except websockets.ConnectionClosed as closed:
                self.close_code = closed.rcvd.code if closed.rcvd else None
                self.closed_at = asyncio.get_running_loop().time()
            self.heard(c.events)
            self.last_before_close = next((e["type"] for e in reversed(c.events) if e["type"] != "rate_limits.updated"),
                                          None)  # fmt: skip
        async with connect(b.url, headers=KEY) as c2:
            await c2.wait_for("session.created")  # (a new session's, which the resume replaces)
            await c2.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                           "last_received_server_event_seq": self.seqs[-1]})  # fmt: skip
            self.resumed = await c2.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required"))
            start = len(c2.events)
            await self._go_on(c2, answers_after)
            self.heard(c2.events[start:])

    async def _go_on(self, c: Client, answers: int) -> None:
        """After the resume: the replay, then ``answers`` more completed answers (a response
        the resuming replica re-issues counts; a create that meets it is answered busy)."""
        replay_to = (self.resumed or {}).get("replay_to") or 0
        replay = [await c.recv(30) for _ in range(max(0, replay_to - self.seqs[-1]))]
        running = False
        for event in replay:
            running = event["type"] == "response.created" or (running and event["type"] != "response.done")
        if not running:
            await c.send({"type": "response.create"})
        completed = 0
        while completed < answers:
            event = await c.recv(30)
            if event["type"] == "error":
                assert event["error"]["code"] == "conversation_already_has_active_response", event
            elif event["type"] == "response.done" and event["response"]["status"] == "completed":
                completed += 1
                if completed < answers:
                    await c.send({"type": "response.create"})


@pytest.mark.parametrize("replicas", [(20.0, 25)], indirect=True)
async def test_a_drain_hands_each_session_over_between_answers_and_cuts_none(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    talkers = [Talker() for _ in range(6)]
    tasks = [asyncio.create_task(t.talk(a, b, answers_after=1)) for t in talkers]
    while sum(t.answers for t in talkers) < 12:  # noqa: ASYNC110 (every one is talking)
        await asyncio.sleep(0.02)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await a.runtime.drain()
    took = loop.time() - began
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert took < 10, f"the drain took {took:.1f} s: it waited for every session at once"
    for t in talkers:
        assert t.close_code == 1012 and t.last_before_close == "response.done", (t.close_code, t.last_before_close)
        statuses = [d["response"]["status"] for d in t.done]
        assert set(statuses) == {"completed"}, statuses  # no answer cut, none ended as lost
        assert t.seqs == sorted(set(t.seqs)), "an event lost or repeated across the handover"
        assert t.resumed is not None and t.resumed["type"] == "session.resumed"
    closes = sorted(t.closed_at for t in talkers if t.closed_at is not None)
    gap = min(DRAIN_GAP_S, 20.0 / (4 * len(talkers)))
    assert closes[-1] - closes[0] >= gap * (len(closes) - 1) * 0.9, closes  # paced, not a herd


@pytest.mark.parametrize("replicas", [(0.3, 200)], indirect=True)
async def test_an_answer_the_window_cuts_is_ended_as_drained_and_asked_again(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    talker = Talker()
    task = asyncio.create_task(talker.talk(a, b, answers_after=1))
    while not any(h.session.active_response_id for h in a.runtime.hosts.values()):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    await a.runtime.drain()  # a 4 s answer, a 0.3 s window
    await asyncio.wait_for(task, 60)
    assert talker.close_code == 1012
    cut = [d["response"] for d in talker.done if d["response"]["status"] != "completed"]
    assert len(cut) == 1 and cut[0]["status"] == "incomplete"
    assert cut[0]["status_details"]["gateway_reason"] == "drained"
    assert talker.done[-1]["response"]["status"] == "completed"  # re-issued on B (or asked again), answered
    assert talker.seqs == sorted(set(talker.seqs))
