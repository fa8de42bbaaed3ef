"""The SDK's reconnect, resume, de-duplication, acknowledgement, resync,
takeover and refusal handling.

These run against ``sdk_support.FakeServer``, a small server written for the
tests that speaks exactly the resume protocol the SDK implements. That is
deliberate: what is under test is the client's logic (what it sends on a new
socket, what it drops, what it acks, when it gives up); the gateway's own
resume across replicas is tested elsewhere against the real server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import websockets
from sdk_support import FakeServer, FakeSession, fake_server, until

from omni_gateway_client import (
    ConnectionLost,
    RealtimeClient,
    ReconnectPolicy,
    ResumeFailed,
    SendQueueFull,
    SessionClosed,
    SessionExpired,
    Unauthorized,
)

pytestmark = pytest.mark.timeout(20)

FAST = ReconnectPolicy(initial_delay=0.01, max_delay=0.05, max_attempts=500, max_elapsed=10.0)


async def drain(rt: RealtimeClient) -> list[dict[str, Any]]:
    return [event async for event in rt]


async def go_down(fake: FakeServer, s: FakeSession, rt: RealtimeClient, code: int = 1012) -> None:
    """Drop the session's socket and keep the server refusing handshakes until ``fake.down = False``."""
    fake.down = True
    await fake.drop(s, code)
    await until(lambda: not rt.connected)


@pytest.mark.parametrize("code", [1001, 1006, 1011, 1012, 1013, 4010])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_a_lost_connection_is_resumed_and_the_gap_replayed_exactly_once(code: int, binary: bool) -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, api_key="sk", reconnect=FAST, binary=binary) as rt:
        s = fake.only_session()
        assert (await rt.recv(2))["type"] == "session.created"
        assert rt.session_id == s.id
        first_token = rt.resume_token
        assert first_token == s.token
        for i in range(3):
            await fake.emit(s, "response.output_text.delta", delta=f"a{i}")
        await fake.emit_audio(s, b"\x01\x02")
        before = [await rt.recv(2) for _ in range(4)]
        assert before[-1]["delta"] == b"\x01\x02"
        assert rt.last_seq == 5

        await go_down(fake, s, rt, code)
        for i in range(3):  # produced while the client is away: journaled, not sent
            await fake.emit(s, "response.output_text.delta", delta=f"b{i}")
        await fake.emit_audio(s, b"\x03\x04")
        fake.replay_overlap = 2  # the server also replays seq 4 and 5, which the client has
        await until(lambda: rt.stats.failed_attempts >= 2)  # it keeps trying while handshakes are refused
        fake.down = False

        resumed = await rt.recv(5)
        assert resumed["type"] == "session.resumed"
        assert (resumed["replay_from"], resumed["replay_to"]) == (6, 9)
        replayed = [await rt.recv(2) for _ in range(4)]
        assert [e["server_event_seq"] for e in replayed] == [6, 7, 8, 9]
        assert [e["delta"] for e in replayed] == ["b0", "b1", "b2", b"\x03\x04"]
        assert replayed[-1]["type"] == "response.output_audio.delta"
        await fake.emit(s, "response.done", response={"id": "resp_1", "output": []})
        live = await rt.recv(2)
        assert (live["type"], live["server_event_seq"]) == ("response.done", 10)

        resume = fake.connections[-1].events[0]
        assert resume == {"type": "session.resume", "session_id": s.id, "resume_token": first_token,
                          "last_received_server_event_seq": 5}  # fmt: skip
        assert rt.resume_token == s.token != first_token  # rotated
        assert rt.session_id == s.id
        await until(lambda: bool(s.acks) and s.acks[-1] >= 9)  # acked after the replay
        st = rt.stats
        assert (st.reconnects, st.resumes, st.duplicates_dropped, st.replayed_events, st.gaps) == (1, 1, 2, 4, 0)


async def test_a_reconnect_asks_for_a_resume_only_socket_and_the_server_opens_no_session_for_it() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, api_key="sk", reconnect=FAST, model="m") as rt:
        s = fake.only_session()
        await fake.emit(s, "response.output_text.delta", delta="a")
        assert [(await rt.recv(2))["type"] for _ in range(2)] == ["session.created", "response.output_text.delta"]
        assert "resume=1" not in fake.connections[0].path  # the first socket opens the session
        await fake.drop(s, 1012)
        assert (await rt.recv(5))["type"] == "session.resumed"
        again = fake.connections[-1]
        assert "resume=1" in again.path and "model=m" in again.path
        assert again.events[0]["type"] == "session.resume"  # first, and nothing opened before it
        assert fake.only_session() is s
        assert rt.stats.resumes == 1


async def test_a_server_that_opens_a_session_on_every_socket_is_resumed_all_the_same() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, api_key="sk", reconnect=FAST) as rt:
        fake.resume_only_sockets = False  # it ignores ?resume=1: a throwaway session.created comes first
        s = fake.only_session()
        await rt.recv(2)
        await fake.drop(s, 1006)
        resumed = await rt.recv(5)
        assert resumed["type"] == "session.resumed" and rt.session_id == s.id
        assert [e["type"] for e in fake.connections[-1].events].count("session.resume") == 1  # sent once
        await fake.emit(s, "response.output_text.delta", delta="live")
        assert (await rt.recv(2))["delta"] == "live"


async def test_acks_go_out_every_n_events_and_after_a_quiet_interval() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, ack_every=5, ack_interval=0.4) as rt:
        s = fake.only_session()
        for i in range(11):
            await fake.emit(s, "response.output_text.delta", delta=str(i))
        events = [await rt.recv(2) for _ in range(12)]
        assert [e["server_event_seq"] for e in events] == list(range(1, 13))
        await until(lambda: 10 in s.acks)
        assert s.acks == [5, 10]
        await until(lambda: s.acks[-1] == 12, timeout=2)  # the rest, once the timer fires
        await asyncio.sleep(0.5)
        assert s.acks == [5, 10, 12]  # nothing new: no further acks
        assert rt.stats.acks_sent == 3


async def test_sends_during_an_outage_are_flushed_in_order_after_the_resume_and_audio_is_dropped() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST, binary=True) as rt:
        s = fake.only_session()
        await go_down(fake, s, rt)
        await rt.send_text("while away")
        await rt.append_audio(b"\0" * 480)
        await rt.commit()
        await rt.create_response(output_modalities=["text"])
        assert (rt.stats.sends_queued, rt.stats.audio_appends_dropped, rt.stats.audio_bytes_dropped) == (3, 1, 480)
        fake.down = False
        await rt.wait_for("session.resumed", 5)
        await rt.append_audio(b"\1" * 4)  # live again: goes straight out, after the flushed ones
        await until(lambda: len(s.received) == 4)
        sent = [e["type"] for e in fake.connections[-1].events if e["type"] != "session.event_ack"]
        assert sent == ["session.resume", "conversation.item.create", "input_audio_buffer.commit", "response.create",
                        "binary.append"]  # fmt: skip
        assert s.received[0]["item"]["content"] == [{"type": "input_text", "text": "while away"}]
        assert s.received[2]["response"] == {"output_modalities": ["text"]}
        assert s.received[3]["audio"] == b"\1" * 4
        assert rt.stats.sends_flushed == 3


async def test_a_full_send_queue_refuses_further_sends() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST, max_queued_sends=2) as rt:
        s = fake.only_session()
        await go_down(fake, s, rt)
        await rt.commit()
        await rt.clear()
        with pytest.raises(SendQueueFull):
            await rt.commit()
        fake.down = False
        await rt.wait_for("session.resumed", 5)
        await until(lambda: [e["type"] for e in s.received] == ["input_audio_buffer.commit",
                                                                 "input_audio_buffer.clear"])  # fmt: skip


async def test_resync_required_is_delivered_and_the_stream_continues_from_its_seq() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST) as rt:
        s = fake.only_session()
        await rt.recv(2)
        await go_down(fake, s, rt)
        await fake.emit(s, "response.output_text.delta", delta="lost")
        await fake.emit(s, "response.output_text.delta", delta="lost too")
        fake.resync_next = True
        fake.down = False
        resync = await rt.recv(5)
        assert resync["type"] == "session.resync_required"
        assert resync["last_server_event_seq"] == 3 and resync["session"] == {"id": s.id}
        assert rt.last_seq == 3
        assert rt.resume_token == s.token
        await fake.emit(s, "response.output_text.delta", delta="after")
        after = await rt.recv(2)
        assert (after["delta"], after["server_event_seq"]) == ("after", 4)
        assert (rt.stats.resyncs, rt.stats.gaps, rt.stats.reconnects) == (1, 0, 1)
        await until(lambda: bool(s.acks) and s.acks[-1] >= 3)


async def test_session_replaced_is_delivered_and_ends_the_iterator_without_reconnecting() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST) as rt:
        s = fake.only_session()
        await rt.recv(2)
        await fake.emit(s, "response.output_text.delta", delta="x")
        await rt.recv(2)
        # Another client takes the session over with the token.
        async with websockets.connect(fake.url, subprotocols=["realtime"]) as other:  # type: ignore[list-item]
            await other.recv()
            await other.send(orjson.dumps({"type": "session.resume", "session_id": s.id,
                                           "resume_token": rt.resume_token,
                                           "last_received_server_event_seq": 2}).decode())  # fmt: skip
            assert orjson.loads(await other.recv())["type"] == "session.resumed"
            rest = await asyncio.wait_for(drain(rt), 5)
        assert [e["type"] for e in rest] == ["session.replaced"]
        assert rest[0]["server_event_seq"] == 0
        await asyncio.sleep(0.1)
        assert len(fake.connections) == 2 and rt.stats.reconnects == 0
        with pytest.raises(SessionClosed):
            await rt.commit()


@pytest.mark.parametrize(
    ("refusal", "code"),
    [
        ("session_not_found", "session_not_found"),
        ("resume_token_invalid", "resume_token_invalid"),
        ("resume_forbidden", "resume_forbidden"),
        ("resume_seq_invalid", "resume_seq_invalid"),
        ("unknown_event", "resume_unsupported"),  # a server that does not know session.resume
    ],
)
async def test_a_refused_resume_raises_resume_failed_with_the_code(refusal: str, code: str) -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST) as rt:
        s = fake.only_session()
        fake.refuse = refusal
        await fake.drop(s, 1012)
        with pytest.raises(ResumeFailed) as failed:
            await asyncio.wait_for(drain(rt), 5)
        assert failed.value.code == code
        with pytest.raises(SessionClosed):
            await rt.commit()


async def test_a_real_token_mismatch_is_refused() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST) as rt:
        s = fake.only_session()
        s.token = "rt_rotated_elsewhere"
        await fake.drop(s, 1006)
        with pytest.raises(ResumeFailed) as failed:
            await asyncio.wait_for(drain(rt), 5)
        assert failed.value.code == "resume_token_invalid"


async def test_a_refused_resume_can_fall_back_to_a_new_session() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST, resume_fallback="new_session") as rt:
        old = fake.only_session()
        await rt.recv(2)
        await fake.emit(old, "response.output_text.delta", delta="old")
        await rt.recv(2)
        await go_down(fake, old, rt)
        await rt.commit()  # queued for the old session: discarded with it
        del fake.sessions[old.id]  # the server forgot the session
        fake.down = False
        lost = await rt.recv(5)
        assert lost["type"] == "client.session_lost"
        assert lost["code"] == "session_not_found" and lost["previous_session_id"] == old.id
        assert lost["discarded_sends"] == 1
        created = await rt.recv(2)
        new = fake.only_session()
        assert created["type"] == "session.created" and created["session"]["id"] == new.id
        assert rt.session_id == lost["session_id"] == new.id
        assert rt.resume_token == new.token and rt.last_seq == 1
        await fake.emit(new, "response.output_text.delta", delta="fresh")
        assert (await rt.recv(2))["delta"] == "fresh"
        await rt.clear()
        await until(lambda: [e["type"] for e in new.received] == ["input_audio_buffer.clear"])
        st = rt.stats
        assert (st.sessions_lost, st.sends_discarded, st.reconnects, st.resumes, st.gaps) == (1, 1, 1, 0, 0)
        assert "resume=1" not in fake.connections[-1].path  # its fallback is the session the socket opens


async def test_without_a_resume_token_a_lost_connection_cannot_resume() -> None:
    async with fake_server() as fake:
        fake.give_tokens = False
        async with RealtimeClient(fake.url, reconnect=FAST, ack_every=1, ack_interval=0.05) as rt:
            s = fake.only_session()
            await fake.emit(s, "response.output_text.delta", delta="x")
            await rt.recv(2)
            await rt.recv(2)
            await asyncio.sleep(0.15)
            assert s.acks == [] and rt.stats.acks_sent == 0  # acks only to servers that resume
            await fake.drop(s, 1012)
            with pytest.raises(ResumeFailed) as failed:
                await asyncio.wait_for(drain(rt), 5)
            assert failed.value.code == "resume_unsupported"
            assert all(e["type"] != "session.resume" for c in fake.connections for e in c.events)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (1000, None),
        (4009, None),
        (4001, Unauthorized),
        (4008, SessionExpired),
        (1008, ConnectionLost),
        (4003, ConnectionLost),
        (4004, ConnectionLost),
    ],
)
async def test_final_close_codes_end_the_session_without_reconnecting(code: int, error: type | None) -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST) as rt:
        s = fake.only_session()
        await fake.emit(s, "response.output_text.delta", delta="last words")
        await fake.drop(s, code)
        if error is None:
            events = await asyncio.wait_for(drain(rt), 5)
            assert [e["type"] for e in events] == ["session.created", "response.output_text.delta"]
        else:
            seen: list[dict[str, Any]] = []
            with pytest.raises(error) as raised:
                async for event in rt:
                    seen.append(event)
            assert len(seen) == 2  # everything received is delivered before the error
            assert raised.value.close_code == code
        await asyncio.sleep(0.1)
        assert len(fake.connections) == 1 and rt.stats.reconnects == 0


async def test_reconnecting_gives_up_when_the_attempt_budget_is_spent() -> None:
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=3, max_elapsed=None)
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=policy) as rt:
        await go_down(fake, fake.only_session(), rt)
        with pytest.raises(ConnectionLost) as lost:
            await asyncio.wait_for(drain(rt), 5)
        assert lost.value.code == "reconnect_failed" and lost.value.close_code == 1012
        assert "503" in str(lost.value)
        assert rt.stats.failed_attempts == 3


async def test_reconnecting_gives_up_when_the_time_budget_is_spent() -> None:
    policy = ReconnectPolicy(initial_delay=0.05, max_delay=0.05, jitter=0.0, max_attempts=None, max_elapsed=0.3)
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=policy) as rt:
        await go_down(fake, fake.only_session(), rt)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ConnectionLost) as lost:
            await asyncio.wait_for(drain(rt), 5)
        assert lost.value.code == "reconnect_failed"
        assert loop.time() - started < 1.0
        assert 3 <= rt.stats.failed_attempts <= 7


async def test_with_reconnect_disabled_a_lost_connection_raises() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=False) as rt:
        await fake.drop(fake.only_session(), 1012)
        with pytest.raises(ConnectionLost) as lost:
            await asyncio.wait_for(drain(rt), 5)
        assert lost.value.code == "reconnect_disabled"
        assert len(fake.connections) == 1


async def test_a_slow_resume_times_out_and_is_retried() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, reconnect=FAST, resume_timeout=0.2) as rt:
        s = fake.only_session()
        fake.resume_delay = 0.6  # the first attempt's session.resume goes unanswered for too long
        await fake.drop(s, 1012)
        assert (await rt.wait_for("session.resumed", 5))["session_id"] == s.id
        assert rt.stats.failed_attempts >= 1 and rt.stats.reconnects == 1
        await asyncio.sleep(0.6)  # the stale attempt wakes up and must not take the session back
        await fake.emit(s, "response.output_text.delta", delta="still here")
        assert (await rt.recv(2))["delta"] == "still here"


async def test_a_single_use_client_secret_is_replaced_by_the_factory_on_reconnect() -> None:
    minted = iter(["ek_second", "ek_third"])

    async def factory() -> str:
        return next(minted)

    options: dict[str, Any] = {"client_secret": "ek_first", "client_secret_factory": factory, "reconnect": FAST}
    async with fake_server() as fake, RealtimeClient(fake.url, **options) as rt:
        await fake.drop(fake.only_session(), 1012)
        await rt.wait_for("session.resumed", 5)
        offered = [c.subprotocols for c in fake.connections]
        assert "openai-insecure-api-key.ek_first" in offered[0]
        assert "openai-insecure-api-key.ek_second" in offered[1]
        assert all(c.authorization is None for c in fake.connections)


async def test_an_api_key_is_used_for_reconnects_after_a_client_secret() -> None:
    async with fake_server() as fake, \
            RealtimeClient(fake.url, client_secret="ek_once", api_key="sk-key", reconnect=FAST) as rt:  # fmt: skip
        await fake.drop(fake.only_session(), 1012)
        await rt.wait_for("session.resumed", 5)
        first, second = fake.connections
        assert "ek_once" in first.subprotocols and first.authorization is None
        assert "openai-insecure-api-key" not in second.subprotocols and second.authorization == "Bearer sk-key"


async def test_a_lone_client_secret_cannot_reconnect() -> None:
    async with fake_server() as fake, RealtimeClient(fake.url, client_secret="ek_once", reconnect=FAST) as rt:
        await fake.drop(fake.only_session(), 1012)
        with pytest.raises(ConnectionLost) as lost:
            await asyncio.wait_for(drain(rt), 5)
        assert lost.value.code == "no_credentials"
        assert len(fake.connections) == 1


async def test_offered_subprotocols_follow_the_options() -> None:
    async with fake_server() as fake:
        async with RealtimeClient(fake.url, beta=True, binary=True) as rt:
            assert rt.binary
        async with RealtimeClient(fake.url) as rt:
            assert not rt.binary
        first, second = (c.subprotocols for c in fake.connections)
        assert first == "omni-binary.v1, realtime, openai-beta.realtime-v1"
        assert second == "realtime"


async def test_close_while_a_lost_connection_is_being_wound_down_returns_and_stops_reconnecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by bench/chaos.py: ``close()`` came while the connection task was ending a
    lost connection (waiting for its ack timer to stop). The cancellation was swallowed
    there, the task reconnected, and ``close()`` waited for it forever."""
    winding_down = asyncio.Event()
    original = RealtimeClient._ack_ticker

    async def slow_to_stop(self: RealtimeClient, ws: Any) -> None:
        try:
            await original(self, ws)
        except asyncio.CancelledError:
            winding_down.set()
            await asyncio.sleep(0.3)  # an ack in flight: the pump waits for it
            raise

    monkeypatch.setattr(RealtimeClient, "_ack_ticker", slow_to_stop)
    async with fake_server() as fake:
        rt = RealtimeClient(fake.url, reconnect=FAST)
        await rt.connect()
        await fake.drop(fake.only_session(), 1012)
        await asyncio.wait_for(winding_down.wait(), 5)
        await asyncio.wait_for(rt.close(), 5)  # hung here before the fix
        connections = len(fake.connections)
        await asyncio.sleep(0.3)
        assert len(fake.connections) == connections  # and nothing reconnects behind its back
        assert not rt.connected


async def test_after_a_1012_the_first_reconnect_does_not_wait() -> None:
    """1012 (service restart) is a drain handing the session over: the SDK reconnects at
    once (the drain paces its handovers), whatever the policy's first delay (here 60 s,
    past the test's timeout)."""
    patient = ReconnectPolicy(initial_delay=60.0, max_delay=60.0, jitter=0.0)
    async with fake_server() as fake, RealtimeClient(fake.url, api_key="sk", reconnect=patient) as rt:
        s = fake.only_session()
        assert (await rt.recv(2))["type"] == "session.created"
        await fake.drop(s, 1012)
        resumed = await rt.recv(5)
        assert resumed["type"] == "session.resumed"
        assert rt.stats.reconnects == 1 and rt.stats.failed_attempts == 0
