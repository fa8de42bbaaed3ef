"""Resume on one gateway process: over the memory store (the embedded default)
and over a private Redis. The multi-replica proofs live in tests/cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "redis"])
async def gateway(request: pytest.FixtureRequest) -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", api_keys=("alice-key", "bob-key"), journal_max_events=200)
    if request.param == "redis":
        if not REDIS_BINARY:
            pytest.skip("redis-server is not installed")
        with RedisServer() as redis:
            settings = replace(settings, redis_url=redis.url)
            async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=40), vad_factory=None) as gw:
                yield gw
    else:
        async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=40), vad_factory=None) as gw:
            yield gw


ALICE = {"Authorization": "Bearer alice-key"}
BOB = {"Authorization": "Bearer bob-key"}


async def start_answer(c: Client) -> dict[str, Any]:
    created = await c.wait_for("session.created")
    await c.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        }
    )
    await c.send({"type": "response.create"})
    return created


async def collect_until_done(c: Client) -> list[dict[str, Any]]:
    events = []
    while True:
        event = await c.recv()
        events.append(event)
        if event["type"] == "response.done":
            return events


async def left_mid_answer(gateway: RunningGateway) -> tuple[str, str, int]:
    """A session whose socket closed a dozen events into an answer: (id, resume token, last seq seen)."""
    async with connect(gateway.url, headers=ALICE) as c:
        created = await start_answer(c)
        await c.wait_for(lambda e: e["type"] == "response.output_audio.delta" and e["server_event_seq"] > 12)
        last = c.events[-1]["server_event_seq"]
    return created["session"]["id"], created["resume_token"], last


async def test_dropped_socket_resumes_with_every_missed_event_exactly_once(gateway: RunningGateway) -> None:
    sid, token, last = await left_mid_answer(gateway)
    await asyncio.sleep(0.2)  # the answer goes on without a socket
    async with connect(gateway.url, headers=ALICE) as c2:
        await c2.wait_for("session.created")  # the provisional session, replaced by the resumed one
        await c2.send(
            {"type": "session.resume", "session_id": sid, "resume_token": token, "last_received_server_event_seq": last}
        )
        resumed = await c2.wait_for("session.resumed")
        assert resumed["session_id"] == sid and resumed["server_event_seq"] == 0
        assert resumed["replay_from"] == last + 1
        assert resumed["resume_token"] != token
        events = await collect_until_done(c2)
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))  # no gap, no duplicate
    assert events[-1]["response"]["status"] == "completed"
    assert len(events[-1]["response"]["output"][0]["content"][0]["transcript"].split()) == 40


async def test_resume_token_rotates_and_the_old_one_is_refused(gateway: RunningGateway) -> None:
    async with connect(gateway.url, headers=ALICE) as c:
        created = await c.wait_for("session.created")
    sid, token = created["session"]["id"], created["resume_token"]
    async with connect(gateway.url, headers=ALICE) as c2:
        await c2.wait_for("session.created")
        await c2.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                       "last_received_server_event_seq": 1})  # fmt: skip
        await c2.wait_for("session.resumed")
    async with connect(gateway.url, headers=ALICE) as c3:
        await c3.wait_for("session.created")
        await c3.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                       "last_received_server_event_seq": 1, "event_id": "ev1"})  # fmt: skip
        err = await c3.wait_for("error")
        assert err["error"]["code"] == "resume_token_invalid"
        assert err["error"]["event_id"] == "ev1"
        # The provisional session still works: a refused resume loses nothing.
        await c3.send({"type": "response.create"})
        assert (await c3.wait_for("response.done"))["response"]["status"] == "completed"


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("other_principal", "session_not_found"),  # exactly as a session that does not exist
        ("unknown_session", "session_not_found"),
        ("future_seq", "resume_seq_invalid"),
        ("not_first", "resume_not_first"),
    ],
)
async def test_bad_resume_attempts_get_coded_errors_and_no_data(gateway: RunningGateway, case: str, code: str) -> None:
    async with connect(gateway.url, headers=ALICE) as c:
        created = await c.wait_for("session.created")
        await c.send(
            {"type": "session.update", "session": {"type": "realtime", "instructions": "alice's secret instructions"}}
        )
        await c.wait_for("session.updated")
    sid, token = created["session"]["id"], created["resume_token"]
    resume = {"type": "session.resume", "session_id": sid, "resume_token": token, "last_received_server_event_seq": 2}
    headers = BOB if case == "other_principal" else ALICE
    if case == "unknown_session":
        resume["session_id"] = "sess_doesnotexist"
    if case == "future_seq":
        resume["last_received_server_event_seq"] = 10**9
    async with connect(gateway.url, headers=headers) as c2:
        await c2.wait_for("session.created")
        if case == "not_first":
            await c2.send({"type": "input_audio_buffer.clear"})
        await c2.send(resume)
        err = await c2.wait_for("error")
        assert err["error"]["code"] == code
        await c2.send({"type": "conversation.item.retrieve", "item_id": "nope"})
        await c2.wait_for("error")
    assert not any("secret" in str(e) for e in c2.events)


async def test_old_socket_is_told_it_was_replaced_and_closed_4009(gateway: RunningGateway) -> None:
    async with connect(gateway.url, headers=ALICE) as old:
        created = await old.wait_for("session.created")
        await old.send({"type": "session.update", "session": {"type": "realtime", "gateway_events": True}})
        await old.wait_for("session.updated")
        async with connect(gateway.url, headers=ALICE) as new:
            await new.wait_for("session.created")
            await new.send({"type": "session.resume", "session_id": created["session"]["id"],
                            "resume_token": created["resume_token"], "last_received_server_event_seq": 1})  # fmt: skip
            await new.wait_for("session.resumed")
            replaced = await old.wait_for("session.replaced")
            assert replaced["session_id"] == created["session"]["id"]
            with pytest.raises(Exception):  # noqa: B017 (the close is what we wait for)
                await old.recv(timeout=5)
            assert old.ws.close_code == 4009
            # The session lives on on the new socket.
            await new.send({"type": "response.create"})
            assert (await new.wait_for("response.done"))["response"]["status"] == "completed"


async def test_a_replaced_socket_that_did_not_opt_in_only_sees_the_close_4009(gateway: RunningGateway) -> None:
    """session.replaced is a gateway event the SDKs cannot parse: a plain client gets the close alone."""
    async with connect(gateway.url, headers=ALICE) as old:
        created = await old.wait_for("session.created")
        async with connect(gateway.url, headers=ALICE) as new:
            await new.wait_for("session.created")
            await new.send({"type": "session.resume", "session_id": created["session"]["id"],
                            "resume_token": created["resume_token"], "last_received_server_event_seq": 1})  # fmt: skip
            await new.wait_for("session.resumed")
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await old.recv(timeout=5)  # check_event refuses session.replaced here
            assert old.ws.close_code == 4009
            assert "session.replaced" not in old.types()


async def test_trimmed_gap_gets_resync_required_with_the_current_state(gateway: RunningGateway) -> None:
    async with connect(gateway.url, headers=ALICE) as c:
        created = await c.wait_for("session.created")
        for _ in range(3):  # 3 answers x ~90 events: past journal_max_events=200
            await c.send({"type": "response.create"})
            await c.wait_for("response.done")
    async with connect(gateway.url, headers=ALICE) as c2:
        await c2.wait_for("session.created")
        await c2.send({"type": "session.resume", "session_id": created["session"]["id"],
                       "resume_token": created["resume_token"], "last_received_server_event_seq": 1})  # fmt: skip
        resync = await c2.wait_for("session.resync_required")
        assert resync["last_server_event_seq"] >= 250
        assert len(resync["conversation"]) == 3  # the three assistant answers
        assert resync["session"]["id"] == created["session"]["id"]
        await c2.send({"type": "response.create"})
        done = await c2.wait_for("response.done")
        assert done["server_event_seq"] > resync["last_server_event_seq"]


async def test_event_ack_trims_the_journal(gateway: RunningGateway) -> None:
    async with connect(gateway.url, headers=ALICE) as c:
        created = await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done")
        await c.send({"type": "session.event_ack", "last_received_server_event_seq": done["server_event_seq"]})
        store = gateway.runtime.store
        for _ in range(100):  # acks are coalesced: the trim follows within ACK_TRIM_INTERVAL_S
            read = await store.read_events(created["session"]["id"], after_seq=0)
            if read.gap:
                break
            await asyncio.sleep(0.05)
    assert read.gap  # acked events are gone: replay from before them is impossible
    assert all(seq > done["server_event_seq"] for seq, _ in read.events)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_lease_loop_lets_go_of_a_session_another_replica_took(backend: str) -> None:
    """The runtime renews every lease of the replica together; a renewal the store
    refuses because another replica holds the lease ends the session here (4009)
    and leaves the other sessions alone."""
    settings = Settings(engine="passthrough", lease_ttl_s=0.3)  # renewed every 0.1 s
    with contextlib.ExitStack() as stack:
        if backend == "redis":
            if not REDIS_BINARY:
                pytest.skip("redis-server is not installed")
            settings = replace(settings, redis_url=stack.enter_context(RedisServer()).url)
        async with run_gateway(settings, vad_factory=None) as gw, connect(gw.url) as a, connect(gw.url) as b:
            sid_a = (await a.wait_for("session.created"))["session"]["id"]
            sid_b = (await b.wait_for("session.created"))["session"]["id"]
            await a.send({"type": "session.update", "session": {"type": "realtime", "gateway_events": True}})
            await a.wait_for("session.updated")
            store = gw.runtime.store
            await asyncio.sleep(0.5)  # several renewal rounds: both leases held all along
            assert (await store.owner_of(sid_a)).owner == gw.runtime.replica_id  # type: ignore[union-attr]
            await store.acquire(sid_a, "another-replica", 10_000)
            replaced = await a.wait_for("session.replaced", timeout=3)
            assert replaced["session_id"] == sid_a
            with pytest.raises(Exception):  # noqa: B017 (the close is what we wait for)
                await a.recv(timeout=5)
            assert a.ws.close_code == 4009
            assert sid_a not in gw.runtime.hosts
            await asyncio.sleep(0.3)
            owner_b = await store.owner_of(sid_b)
            assert owner_b is not None and owner_b.owner == gw.runtime.replica_id
            await b.send({"type": "response.create"})
            assert (await b.wait_for("response.done"))["response"]["status"] == "completed"


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


async def test_a_resume_only_socket_opens_no_session_before_its_resume(gateway: RunningGateway) -> None:
    sid, token, last = await left_mid_answer(gateway)
    async with connect(with_query(gateway.url, "resume=1"), headers=ALICE) as c2:
        await c2.send(
            {"type": "session.resume", "session_id": sid, "resume_token": token, "last_received_server_event_seq": last}
        )
        resumed = await c2.recv()  # the first event: no session.created of a throwaway session before it
        assert resumed["type"] == "session.resumed" and resumed["session_id"] == sid
        assert resumed["replay_from"] == last + 1
        events = await collect_until_done(c2)
    assert not any(e["type"] == "session.created" for e in c2.events)
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
    assert events[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("query", ["resume=1", "autostart=0"])
async def test_a_resume_only_socket_refuses_other_events_until_a_session_update_opens_one(
    gateway: RunningGateway, query: str
) -> None:
    async with connect(with_query(gateway.url, query), headers=ALICE) as c:
        await c.send({"type": "response.create", "event_id": "ev_early"})
        err = await c.recv()  # nothing was sent before it
        assert err["type"] == "error"
        assert (err["error"]["code"], err["error"]["param"], err["error"]["event_id"]) == (
            "session_not_open", "type", "ev_early"
        )  # fmt: skip
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "be brief"}})
        created = await c.wait_for("session.created")
        assert created["resume_token"]
        updated = await c.wait_for("session.updated")
        assert updated["session"]["instructions"] == "be brief"
        await c.send({"type": "response.create"})
        assert (await c.wait_for("response.done"))["response"]["status"] == "completed"
    resume = {"type": "session.resume", "session_id": "sess_doesnotexist", "resume_token": "rt_x",
              "last_received_server_event_seq": 0}  # fmt: skip
    async with connect(with_query(gateway.url, query), headers=ALICE) as c2:
        await c2.send(resume)
        refused = await c2.recv()
        assert refused["type"] == "error" and refused["error"]["code"] == "session_not_found"
        await c2.send({"type": "session.update", "session": {"type": "realtime"}})  # the socket goes on
        await c2.wait_for("session.created")
