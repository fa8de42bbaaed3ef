"""Two gateway replicas in one test process, on one private Redis: real sockets,
real store, no balancer; the client picks the replica. (The crash proofs, with
real processes killed, are in tests/cluster.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer
from support.waiting import until

from gateway.hosting import claim, takeover
from gateway.settings import Settings
from gateway.store.base import StoreUnavailable
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = Settings(engine="passthrough", redis_url=server.url, api_keys=("k",), video_engine="none")
        engine = PassthroughEngine(audio_chunks=5, paced=False)
        async with (
            # A serves streaming video too (the CPU engine), B does not.
            run_gateway(replace(base, replica_id="ra", video_engine="cpu"), engine=engine, vad_factory=None) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
        ):
            yield a, b


KEY = {"Authorization": "Bearer k"}


async def test_a_client_ahead_of_the_store_is_resynced_with_the_state_it_saw(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    """A client claims events the store never got (as when their replica died before its
    journal batch was committed): the other replica answers session.resync_required
    (reason client_ahead) with the stored state, never session.resumed."""
    a, b = replicas
    async with connect(a.url, headers=KEY) as c:
        created = await c.wait_for("session.created")
        await c.send({"type": "conversation.item.create", "item": TEXT})
        added = await c.wait_for("conversation.item.added")
        await c.send({"type": "response.create"})
        await c.wait_for("rate_limits.updated")
        last = c.events[-1]["server_event_seq"]
    sid = created["session"]["id"]
    async with connect(b.url, headers=KEY) as c2:
        await c2.wait_for("session.created")
        claimed = last + 7  # seven events nobody stored
        await c2.send({"type": "session.resume", "session_id": sid, "resume_token": created["resume_token"],
                       "last_received_server_event_seq": claimed})  # fmt: skip
        answer = await c2.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required", "error"))
        assert answer["type"] == "session.resync_required", answer
        assert answer["reason"] == "client_ahead" and answer["message"]
        assert answer["last_server_event_seq"] == claimed  # numbering goes on above what the client holds
        ids = [it["id"] for it in answer["conversation"]]
        assert ids[0] == added["item"]["id"] and len(ids) == 2  # the user's item and the answer
        # The session goes on on B, numbered after the client's seq.
        await c2.send({"type": "response.create"})
        done = await c2.wait_for("response.done")
        assert done["server_event_seq"] > claimed
        assert done["response"]["status"] == "completed"


async def test_a_client_secret_minted_on_one_replica_connects_once_on_any(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    async with httpx.AsyncClient(base_url=a.http) as http:
        body = {"session": {"type": "realtime", "instructions": "x"}}
        minted = await http.post("/v1/realtime/client_secrets", headers=KEY, json=body)
    assert minted.status_code == 200, minted.text
    secret = minted.json()["value"]
    credential = ["realtime", "openai-insecure-api-key." + secret]
    async with connect(b.url, subprotocols=credential) as c:  # minted on A, used on B
        created = await c.wait_for("session.created")
        assert created["session"]["instructions"] == "x"  # the settings it was minted with
    for gw in (a, b):  # and used up, everywhere: refused at the upgrade
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(gw.url, subprotocols=credential):
                pass
        assert refused.value.response.status_code == 401
        assert orjson.loads(refused.value.response.body)["error"]["code"] == "unauthorized"


async def test_a_realtime_resume_naming_a_video_session_is_session_not_found(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    """The id of a streaming video session (registered in the store by replica A) is no
    realtime session: a resume naming it, on either replica, is refused as unknown."""
    a, b = replicas
    async with websockets.connect(a.url + "/video", additional_headers=KEY, open_timeout=10) as video:
        async with asyncio.timeout(10):  # polling: the replica signals nothing a test can wait on
            while not a.runtime.video_sockets:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            (vid,) = a.runtime.video_sockets
            while await a.runtime.store.load_snapshot(vid) is None:  # noqa: ASYNC110 (until registered)
                await asyncio.sleep(0.01)
        for gw in (a, b):
            async with connect(gw.url, headers=KEY) as c:
                await c.wait_for("session.created")
                await c.send({"type": "session.resume", "session_id": vid, "resume_token": "rt_guess",
                              "last_received_server_event_seq": 0, "event_id": "ev_r"})  # fmt: skip
                err = await c.wait_for("error")
                assert err["error"]["code"] == "session_not_found", err
                assert err["error"]["event_id"] == "ev_r"
                # The connection's own session goes on.
                await c.send({"type": "conversation.item.create", "item": TEXT})
                await c.wait_for("conversation.item.done")
        await video.close()


async def _session_with_items(gw: RunningGateway, n: int) -> tuple[str, str, int]:
    """A session on ``gw`` holding ``n`` text items (ids item_0..): (id, resume token, last seq)."""
    async with connect(gw.url, headers=KEY) as c:
        created = await c.wait_for("session.created")
        for i in range(n):
            item = {**TEXT, "id": f"item_{i}", "content": [{"type": "input_text", "text": f"message {i}"}]}
            await c.send({"type": "conversation.item.create", "item": item})
        await c.wait_for(lambda e: e["type"] == "conversation.item.done" and e["item"]["id"] == f"item_{n - 1}")
        return created["session"]["id"], created["resume_token"], c.events[-1]["server_event_seq"]


async def _resumed(c: Client, sid: str, token: str, last: int) -> dict[str, Any]:
    """Resume ``sid`` on the fresh connection ``c``: its session.resumed."""
    await c.wait_for("session.created")
    await c.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                  "last_received_server_event_seq": last})  # fmt: skip
    return await c.wait_for("session.resumed")


async def test_a_resume_is_answered_before_the_conversation_is_read(
    replicas: tuple[RunningGateway, RunningGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover answers from the snapshot's head and the journal: session.resumed comes
    while B's read of the conversation is still held back (so what a resume costs does not
    grow with the conversation); the client's next events wait for the conversation and
    then find all of it."""
    a, b = replicas
    sid, token, last = await _session_with_items(a, 40)
    store = b.runtime.store
    read_begun, go_on = asyncio.Event(), asyncio.Event()
    real = store.load_session

    async def held_back(session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        read_begun.set()
        await go_on.wait()
        return await real(session_id)

    monkeypatch.setattr(store, "load_session", held_back)
    async with connect(b.url, headers=KEY) as c:
        resumed = await _resumed(c, sid, token, last)  # (the read has not returned)
        assert resumed["session_id"] == sid
        await read_begun.wait()
        await c.send({"type": "conversation.item.retrieve", "item_id": "item_0", "event_id": "ev_get"})
        await c.send({"type": "response.create"})
        go_on.set()
        got = await c.wait_for("conversation.item.retrieved")
        assert got["item"]["content"][0]["text"] == "message 0"
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        assert not [e for e in c.events if e["type"] == "error"]


async def test_a_session_moved_back_and_forth_keeps_its_conversation_in_records(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    """A -> B -> A: each takeover writes the snapshot's head without the items (they stay
    one record each: the head does not grow with the conversation), and the conversation
    is whole at the end."""
    a, b = replicas
    sid, token, last = await _session_with_items(a, 25)
    for gw in (b, a):
        async with connect(gw.url, headers=KEY) as c:
            resumed = await _resumed(c, sid, token, last)
            token = resumed["resume_token"]
            head = orjson.loads(await gw.runtime.store.load_snapshot(sid) or b"{}")
            assert head["token_hash"] == takeover.token_hash(token)  # (the claim's own snapshot)
            assert "items" not in head and len(head["item_ids"]) == 25
    async with connect(b.url, headers=KEY) as c:
        await _resumed(c, sid, token, last)
        for i in (0, 12, 24):
            await c.send({"type": "conversation.item.retrieve", "item_id": f"item_{i}"})
            got = await c.wait_for("conversation.item.retrieved")
            assert got["item"]["content"][0]["text"] == f"message {i}"


async def test_a_conversation_the_store_cannot_give_after_the_answer_means_resume_again(
    replicas: tuple[RunningGateway, RunningGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails between session.resumed and the conversation's read: the client is
    told (store_unavailable, close 1013: try again later) and its next resume finds the
    session whole."""
    a, b = replicas
    sid, token, last = await _session_with_items(a, 5)
    store = b.runtime.store
    real = store.load_session
    failures = [StoreUnavailable("redis: connection lost (a test's)")]

    async def fails_once(session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        if failures:
            raise failures.pop()
        return await real(session_id)

    monkeypatch.setattr(store, "load_session", fails_once)
    async with connect(b.url, headers=KEY) as c:
        resumed = await _resumed(c, sid, token, last)
        err = await c.wait_for("error")
        assert err["error"]["code"] == "store_unavailable", err
        with pytest.raises(websockets.ConnectionClosed):
            await c.recv()
        assert c.ws.close_code == 1013
    async with connect(b.url, headers=KEY) as c:
        await _resumed(c, sid, resumed["resume_token"], last)
        await c.send({"type": "conversation.item.retrieve", "item_id": "item_4"})
        got = await c.wait_for("conversation.item.retrieved")
        assert got["item"]["content"][0]["text"] == "message 4"


@contextlib.asynccontextmanager
async def owner_and_taker(engine: PassthroughEngine) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    """Replica A, the owner, answering on ``engine`` and committing its journal only when asked
    (``journal_flush_ms`` 30 s), and replica B, which takes sessions over, on one Redis."""
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = Settings(engine="passthrough", redis_url=server.url, api_keys=("k",), video_engine="none")
        async with (
            run_gateway(replace(base, replica_id="ra", journal_flush_ms=30_000), engine=engine, vad_factory=None) as a,
            run_gateway(
                replace(base, replica_id="rb"), engine=PassthroughEngine(audio_chunks=5), vad_factory=None
            ) as b,
        ):
            yield a, b


async def test_a_dropped_socket_resumed_on_another_replica_replays_what_its_owner_had_not_committed() -> None:
    """Its owner sends deltas before their commit (one flush per ``journal_flush_ms`` while
    busy), so a client that reconnects elsewhere faster than the owner's next flush holds
    events the journal has not yet: issue 34's resync instead of replay on a busy machine. The
    resuming replica asks the live owner to commit first (claim.py, ``FLUSH_ASK``): a replay,
    never a resync. Here the owner flushes at most every 30 s while it answers, so without the
    ask the client is ahead of the journal every time."""
    async with owner_and_taker(PassthroughEngine(audio_chunks=200)) as (a, b):
        async with connect(a.url, headers=KEY) as c:
            created = await c.wait_for("session.created")
            await c.send({"type": "response.create"})
            await c.wait_for(lambda e: e["type"] == "response.output_audio.delta" and e["server_event_seq"] > 20)
            last = c.events[-1]["server_event_seq"]
        async with connect(b.url, headers=KEY) as c2:
            await c2.wait_for("session.created")
            sid, token = created["session"]["id"], created["resume_token"]
            await c2.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                           "last_received_server_event_seq": last})  # fmt: skip
            answer = await c2.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required", "error"))
            assert answer["type"] == "session.resumed", answer
            assert answer["replay_from"] == last + 1, answer  # (what the owner made since: replayed)


async def test_a_commit_by_the_old_owner_between_the_snapshot_read_and_the_fence_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34: the live old owner's periodic flush can land after the resuming replica read
    the snapshot and before its lease fences the owner. The journal (read after the fence) has
    that commit; the state restored must have it too, or an answer that finished there is
    believed running and ended once more as cut (response.done incomplete after the completed
    one). Here the owner flushes only when asked, and the test makes that flush land exactly
    in the window."""
    async with owner_and_taker(PassthroughEngine(audio_chunks=40)) as (a, b):
        async with connect(a.url, headers=KEY) as c:
            created = await c.wait_for("session.created")
            await c.send({"type": "response.create"})
            await c.wait_for(lambda e: e["type"] == "response.output_audio.delta")
            last = c.events[-1]["server_event_seq"]
        sid, token = created["session"]["id"], created["resume_token"]
        store, real = b.runtime.store, b.runtime.store.load_snapshot
        raced: list[bool] = []

        async def read_then_owner_commits(session_id: str) -> bytes | None:
            head = await real(session_id)
            if session_id == sid and not raced:  # the first read: the one admitting the resume
                owner = a.runtime.hosting.hosts[sid]
                async with asyncio.timeout(20):
                    while owner.session.active_response_id is not None:  # noqa: ASYNC110 (the answer ends)
                        await asyncio.sleep(0.02)
                await owner.writer.flush()  # its periodic flush, landing in the window
                raced.append(True)
            return head

        monkeypatch.setattr(store, "load_snapshot", read_then_owner_commits)
        async with connect(b.url, headers=KEY) as c2:
            resumed = await _resumed(c2, sid, token, last)
            assert raced, "the owner's commit was not placed in the window"
            await c2.send({"type": "response.create"})
            after = resumed["replay_to"]
            second = await c2.wait_for(lambda e: e["type"] == "response.done" and e["server_event_seq"] > after)
            dones = [e["response"] for e in c2.events if e["type"] == "response.done"]
            assert [d["status"] for d in dones] == ["completed", "completed"], dones
            assert dones[0]["id"] != second["response"]["id"]


async def test_a_stalled_old_owner_does_not_hold_the_resume_and_is_fenced() -> None:
    """The resuming replica asks the live owner to commit first, but an owner that does not
    answer (stalled: a frozen event loop, a lost bus message) is not waited for past
    ``TAKEOVER_FLUSH_WAIT_S``: the resume is answered (a resync here: the client holds events
    the stalled owner never committed) and the old owner, fenced, lets the session go."""
    async with owner_and_taker(PassthroughEngine(audio_chunks=200)) as (a, b):
        asked = asyncio.Event()
        never = asyncio.Event()

        async def stalled(body: dict[str, Any]) -> dict[str, Any]:
            asked.set()
            await never.wait()  # (the asker's wait runs out first)
            return {}

        a.runtime.hosting.answerers[claim.FLUSH_ASK] = stalled
        async with connect(a.url, headers=KEY) as c:
            created = await c.wait_for("session.created")
            await c.send({"type": "response.create"})
            await c.wait_for(lambda e: e["type"] == "response.output_audio.delta" and e["server_event_seq"] > 20)
            last = c.events[-1]["server_event_seq"]
        sid, token = created["session"]["id"], created["resume_token"]
        async with connect(b.url, headers=KEY) as c2:
            await c2.wait_for("session.created")
            await c2.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                           "last_received_server_event_seq": last})  # fmt: skip
            answer = await c2.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required", "error"))
            assert asked.is_set(), "the old owner was not asked to commit"
            assert answer["type"] in ("session.resumed", "session.resync_required"), answer
            await until(lambda: sid not in a.runtime.hosting.hosts, "the old owner to let the session go", 20)
            # The answer the stalled owner was making ended as cut; the next one is made here.
            cut = next(e["response"]["id"] for e in c.events if e["type"] == "response.created")
            await c2.send({"type": "response.create"})
            done = await c2.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] != cut)
            assert done["response"]["status"] == "completed"
        never.set()
