"""``omni-gateway serve --workers N``, with real processes: a supervisor and its
workers on one port (SO_REUSEPORT), a private redis-server, clients on raw sockets.

Proved here (docs/workers.md): sessions spread over the workers; a worker
SIGKILLed in the middle of an answer is restarted by the supervisor, and its
sessions resume on a sibling (the interrupted answer ends ``incomplete``, reason
``replica_lost``, and is re-issued whole, or the client is resynced); one scrape
of ``/metrics`` carries every worker's series, the loop-thread counters
included; SIGTERM drains every worker (answers finish, sockets close 1012) and
the supervisor exits 0 once they all have (a Ctrl-C, which reaches the whole
process group, drains each worker once); a worker that cannot start stops them
all. Which worker serves a session is read from its ownership lease in Redis: a
worker's replica id is ``<replica_id>-w<slot>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from support.gateway import Client, connect
from support.redis_server import REDIS_BINARY, RedisServer
from support.serve import Served, clean_env
from support.workers import ROOT, WORKERS, Workers, by_worker, scrape, serve_workers

pytestmark = pytest.mark.timeout(120)

WORDS = 50  # the passthrough engine's answer: 50 paced 20 ms chunks, a word before each
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@dataclass
class Session:
    client: Client
    session_id: str
    resume_token: str
    slot: int

    @property
    def last_seq(self) -> int:
        return max((e.get("server_event_seq") or 0 for e in self.client.events), default=0)


async def open_session(w: Workers, stack: contextlib.AsyncExitStack) -> Session:
    c = await stack.enter_async_context(connect(w.url))
    created = await c.wait_for("session.created")
    await c.send({"type": "session.update", "session": MANUAL})
    await c.wait_for("session.updated")
    await c.send({"type": "conversation.item.create", "item": TEXT})
    await c.wait_for("conversation.item.done")
    sid = created["session"]["id"]
    return Session(c, sid, created["resume_token"], await w.owner(sid))


async def spread(w: Workers, stack: contextlib.AsyncExitStack, per_worker: int) -> dict[int, list[Session]]:
    """Sessions until every worker holds ``per_worker`` (the kernel picks the worker of each)."""
    on: dict[int, list[Session]] = {slot: [] for slot in range(w.count)}
    for _ in range(60):
        s = await open_session(w, stack)
        on[s.slot].append(s)
        if all(len(v) >= per_worker for v in on.values()):
            return on
    counts = {k: len(v) for k, v in on.items()}
    raise AssertionError(f"60 connections did not reach every worker: {counts}")


async def resume_on(w: Workers, stack: contextlib.AsyncExitStack, s: Session, slot: int) -> Client:
    """A new connection that the kernel gave to worker ``slot`` (others are closed and
    retried), on which ``s`` is resumed."""
    for _ in range(60):
        c = await stack.enter_async_context(connect(w.url))
        created = await c.wait_for("session.created")
        if await w.owner(created["session"]["id"]) != slot:
            await c.ws.close()
            continue
        await c.send({"type": "session.resume", "session_id": s.session_id, "resume_token": s.resume_token,
                      "last_received_server_event_seq": s.last_seq})  # fmt: skip
        return c
    raise AssertionError(f"60 connections did not reach worker {slot}")


def words(events: list[dict[str, Any]], response_id: str) -> list[str]:
    kind = "response.output_audio_transcript.delta"
    return [e["delta"] for e in events if e["type"] == kind and e.get("response_id") == response_id]


async def test_sessions_on_a_sigkilled_worker_resume_on_a_sibling_and_the_worker_is_restarted(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with serve_workers(redis_server, tmp_path) as w, contextlib.AsyncExitStack() as stack:
        on = await spread(w, stack, per_worker=2)
        victim, sibling = 0, 1
        pids = w.pids()
        answering = on[victim][0]
        await answering.client.send({"type": "response.create"})
        await answering.client.wait_for(
            lambda e: e["type"] == "response.output_audio_transcript.delta" and e["delta"] == "w10 "
        )
        os.kill(pids[victim], signal.SIGKILL)
        # New connections meanwhile: those the kernel gives the dead worker's socket wait in its
        # backlog for the replacement; none is refused.
        fresh = [await stack.enter_async_context(connect(w.url)) for _ in range(6)]
        created = await asyncio.gather(*(c.wait_for("session.created", timeout=30) for c in fresh))
        assert len({e["session"]["id"] for e in created}) == len(fresh)
        for s in on[victim]:
            with contextlib.suppress(websockets.ConnectionClosed, AssertionError):
                await s.client.wait_for("never", timeout=5)  # until the dead worker's socket is gone
        for s in on[victim]:
            c = await resume_on(w, stack, s, sibling)
            first = await c.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required", "error"))
            assert first["type"] != "error", first
            assert await w.owner(s.session_id) == sibling  # the sibling holds the session now
            if s is not answering:
                assert first["type"] == "session.resumed", first
                await c.send({"type": "response.create"})  # the resumed session answers on the sibling
                done = await c.wait_for("response.done")
                assert done["response"]["status"] == "completed", done
                assert done["server_event_seq"] > s.last_seq
                continue
            # The interrupted answer: ended incomplete (replica_lost) and re-issued whole.
            done = await c.wait_for("response.done")
            if done["response"]["status"] == "incomplete":
                assert done["response"]["status_details"]["gateway_reason"] == "replica_lost", done
                done = await c.wait_for("response.done")
            seen = s.client.events + c.events[c.events.index(first) :]  # not the provisional session's
            assert done["response"]["status"] == "completed", done
            assert words(seen, done["response"]["id"]) == [f"w{i} " for i in range(WORDS)]
            seqs = [e["server_event_seq"] for e in seen if e.get("server_event_seq")]
            if first["type"] == "session.resumed":  # replayed: no gap, no duplicate
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        # The supervisor started the victim's slot again, and it serves.
        await asyncio.to_thread(w.wait_all_up, 60.0, {str(victim): 1.0, str(sibling): 0.0})
        assert w.pids()[victim] != pids[victim]
        assert "worker w0 (pid" in w.served.log(100_000) and "killed by SIGKILL" in w.served.log(100_000)


async def test_one_scrape_carries_every_workers_series(redis_server: RedisServer, tmp_path: Path) -> None:
    async with serve_workers(redis_server, tmp_path) as w, contextlib.AsyncExitStack() as stack:
        on = await spread(w, stack, per_worker=1)
        opened = {slot: len(sessions) for slot, sessions in on.items()}
        extra = 3  # input_audio_buffer.clear on one session of each worker, three times
        for sessions in on.values():
            for _ in range(extra):
                await sessions[0].client.send({"type": "input_audio_buffer.clear"})
            for _ in range(extra):
                await sessions[0].client.wait_for("input_audio_buffer.cleared")
        samples = scrape(w.port)
        assert by_worker(samples["omni_sessions_total"]) == {str(k): float(v) for k, v in opened.items()}
        assert by_worker(samples["omni_sessions_active"]) == {str(k): float(v) for k, v in opened.items()}
        # A loop-thread counter (orchestrator/metrics.py LoopCounter), from each worker.
        cleared = by_worker(samples["omni_client_events_total"], type="input_audio_buffer.clear")
        assert cleared == {str(k): float(extra) for k in range(w.count)}
        updates = by_worker(samples["omni_client_events_total"], type="session.update")
        assert updates == {str(k): float(v) for k, v in opened.items()}
        assert by_worker(samples["omni_worker_up"]) == {"0": 1.0, "1": 1.0}


async def test_ctrl_c_drains_every_worker_once_and_the_supervisor_waits_for_them(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with serve_workers(redis_server, tmp_path) as w, contextlib.AsyncExitStack() as stack:
        on = await spread(w, stack, per_worker=1)
        answering = [sessions[0] for sessions in on.values()]
        for s in answering:
            await s.client.send({"type": "response.create"})
            await s.client.wait_for("response.output_audio.delta")
        workers_before = w.pids()
        os.killpg(w.served.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        for s in answering:  # the answer finishes within the drain window, then 1012
            done = await s.client.wait_for("response.done", timeout=30)
            assert done["response"]["status"] == "completed", done
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await s.client.wait_for("never", timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        assert await asyncio.to_thread(w.served.wait_exit, 30) == 0, w.served.log()
        for pid in workers_before.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        log = w.served.log(100_000)
        assert log.count("exited: exit code 0") == WORKERS and "every worker has exited" in log


def test_a_worker_that_cannot_start_stops_them_all(tmp_path: Path) -> None:
    """A configuration no worker can serve (here a route file that does not exist) is not
    restarted in a loop: the supervisor stops and exits 3."""
    command = f"{sys.executable} -m gateway serve --workers 2 --engine passthrough"
    command += f" --redis-url redis://127.0.0.1:1/0 --models {tmp_path / 'missing.json'} --port 0"
    environ = clean_env(OMNI_GATEWAY_VIDEO_ENGINE="none", PYTHONPATH=str(ROOT))
    served = Served(command, port=0, cwd=ROOT, log_path=tmp_path / "fails.log", env=environ)
    try:
        assert served.wait_exit(60) == 3, served.log()
    finally:
        served.stop()
    log = served.log(100_000)
    assert "failed to start" in log and "cannot start" in log and "restarting" not in log


async def test_a_client_secret_minted_by_any_worker_connects_on_any(redis_server: RedisServer, tmp_path: Path) -> None:
    """Secrets live in the store: each POST reaches one worker and each socket another
    (the kernel's pick), and every secret opens its session once."""
    key = "sk-workers"
    async with serve_workers(redis_server, tmp_path, OMNI_GATEWAY_API_KEYS=key) as w:
        owners = set()
        for i in range(6):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{w.port}") as http:
                body = {"session": {"type": "realtime", "instructions": f"secret {i}"}}
                minted = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"},
                                         json=body)  # fmt: skip
            assert minted.status_code == 200, minted.text
            secret = minted.json()["value"]
            async with connect(w.url, subprotocols=["realtime", "openai-insecure-api-key." + secret]) as c:
                created = await c.wait_for("session.created")
                assert created["session"]["instructions"] == f"secret {i}"
                owners.add(await w.owner(created["session"]["id"]))
        assert owners <= set(range(w.count))
