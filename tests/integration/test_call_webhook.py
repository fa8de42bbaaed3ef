"""An incoming phone call announced to the operator's backend, across two replicas.

Two gateway replicas on one real Redis (loopback), a real HTTP receiver for the webhook
(``tests/support/webhook_receiver.py``, checking the Standard Webhooks signature from the
specification), the Twilio simulator as the carrier (Twilio's cloud cannot run here). The
call's stream is held by replica A; the backend answers on replica B: accept (the session
opens on A with the configuration it sent), the sideband from B drives it, hangup from B
ends it; a GPT-Live accept from B opens a Live session on A, driven by a Live sideband on
B; reject ends a call before any audio; a call nobody answers is refused when its wait is
over.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

import httpx
import pytest
from support.gateway import RunningGateway, connect, run_gateway
from support.gateway import post as gateway_post
from support.live_sideband import attached
from support.redis_server import REDIS_BINARY, RedisServer
from support.twilio_sim import TwilioCall
from support.waiting import until
from support.webhook_receiver import Delivery, Receiver, receiver

from gateway.hosting.host import SessionHost
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-exact!").decode()
KEY = {"Authorization": "Bearer k"}
post = partial(gateway_post, headers=KEY)  # the API key's POST


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[RunningGateway, RunningGateway, Receiver]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    async with receiver(SECRET) as hooks:
        with RedisServer() as server:
            base = Settings(
                engine="passthrough",
                redis_url=server.url,
                api_keys=("k",),
                video_engine="none",
                call_webhook_url=hooks.url,
                call_webhook_secret=SECRET,
                call_accept_timeout_s=3.0,
            )
            engine = PassthroughEngine(audio_chunks=5, paced=False)
            async with (
                run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
                run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
            ):
                yield a, b, hooks


def twilio(gw: RunningGateway, **kwargs: Any) -> TwilioCall:
    return TwilioCall(f"ws://127.0.0.1:{gw.port}/v1/telephony/twilio", None, **kwargs)


async def hung_up(gw: RunningGateway, path: str, call: TwilioCall) -> None:
    """The hangup POSTed to ``gw``: 200, and the carrier's stream closes normally."""
    res = await post(gw, path)
    assert res.status_code == 200, res.text
    await asyncio.wait_for(call.closed.wait(), 10)
    assert call.close_code == 1000


async def test_a_live_accept_on_the_other_replica_opens_the_calls_live_session_which_its_sideband_there_drives(
    cluster: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    # GPT-Live's accept (/v1/live/sessions/live_x/accept) of a stream held by A, on B: the
    # same single-use token and bus as the Realtime accept, the session in the Live dialect.
    a, b, hooks = cluster
    answers: list[tuple[str, httpx.Response]] = []

    async def backend(delivery: Delivery) -> None:
        live_id = "live_" + delivery.body["data"]["call_id"].removeprefix("rtc_")
        session = {"type": "live", "model": "gpt-live-1", "instructions": "Answer the phone."}
        answers.append((live_id, await post(b, f"/v1/live/sessions/{live_id}/accept", {"session": session})))

    hooks.on_event = backend
    call = twilio(a, call_sid="CA-live")
    await call.connect()
    try:
        await until(lambda: answers, "the backend's Live accept")
        live_id, accepted = answers[0]
        assert accepted.status_code == 200, accepted.text
        host = a.runtime.hosting.hosts[live_id]  # open on A, and stored, when the accept answered
        assert isinstance(host, SessionHost) and host.session.config.instructions == "Answer the phone."
        async with attached(b, live_id, KEY, serving=a) as sideband:  # relayed from B to A
            await sideband.send({"type": "session.commentary.append", "content": "Hello.", "delegation_id": None})
            await sideband.wait_for("session.commentary.appended")
            await until(lambda: any(m.get("event") == "media" for m in call.received), "the answer on the call")
            await sideband.wait_for("session.output_audio.delta")
        await hung_up(b, f"/v1/live/sessions/{live_id}/hangup", call)
    finally:
        await call.close()


async def test_a_call_announced_on_one_replica_is_accepted_driven_and_hung_up_from_the_other(
    cluster: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, b, hooks = cluster
    answers: list[httpx.Response] = []

    async def backend(delivery: Delivery) -> None:  # the operator's backend: accept on replica B
        call_id = delivery.body["data"]["call_id"]
        answers.append(
            await post(
                b,
                f"/v1/realtime/calls/{call_id}/accept",
                {"type": "realtime", "instructions": "You answer phones.", "model": "omni-cascade"},
            )
        )

    hooks.on_event = backend
    # A busy replica A: its session takes a while to open after the accept reaches it.
    store = a.runtime.hosting.store
    acquire = store.acquire

    async def slow_acquire(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)
        return await acquire(*args, **kwargs)

    store.acquire = slow_acquire  # type: ignore[method-assign]
    call = twilio(a, call_sid="CA-accepted")
    await call.connect()
    try:
        await until(lambda: answers, "the backend's accept")
        assert answers[0].status_code == 200, answers[0].text
        [delivery] = hooks.received
        assert delivery.verified  # signed with the whsec_ secret, Standard Webhooks
        assert delivery.path == "/hooks/calls"
        event = delivery.body
        assert event["type"] == "realtime.call.incoming" and event["object"] == "event"
        assert delivery.headers["webhook-id"] == event["id"]
        data = event["data"]
        call_id = data["call_id"]
        assert call_id.startswith("rtc_")
        assert (data["carrier"], data["carrier_call_id"], data["stream_id"]) == (
            "twilio",
            "CA-accepted",
            call.stream_sid,
        )
        names = {h["name"] for h in data["headers"]}  # the upgrade's headers, as the carrier sent them
        assert "host" in names and "sec-websocket-key" not in names
        # The accept answered once the session was open on A, the stream's replica, with the
        # accepted configuration, and stored: the backend's next step, at once, finds it.
        session_id = "sess_" + call_id.removeprefix("rtc_")
        host = a.runtime.hosting.hosts[session_id]
        assert isinstance(host, SessionHost)
        assert host.session.config.instructions == "You answer phones."
        assert host.output_format.codec == "pcmu"
        # The sideband, from B, drives it: the answer's audio reaches the caller through A.
        async with connect(b.url + f"?call_id={call_id}", headers=KEY) as sideband:
            await sideband.send({"type": "response.create"})
            await sideband.wait_for("response.done")
        await until(lambda: any(m.get("event") == "media" for m in call.received), "the answer's audio")
        # A second accept finds nothing waiting.
        again = await post(b, f"/v1/realtime/calls/{call_id}/accept", {"type": "realtime"})
        assert again.status_code == 404 and again.json()["error"]["code"] == "call_id_not_found"
        await hung_up(b, f"/v1/realtime/calls/{call_id}/hangup", call)  # from B: the stream closes on A
    finally:
        await call.close()


async def test_a_rejected_call_ends_before_any_audio_and_an_unanswered_one_when_its_wait_is_over(
    cluster: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, b, hooks = cluster
    rejected = twilio(a, call_sid="CA-rejected")
    await rejected.connect()
    await until(lambda: hooks.received, "the announcement")
    call_id = hooks.received[0].body["data"]["call_id"]
    res = await post(b, f"/v1/realtime/calls/{call_id}/reject")
    assert res.status_code == 200, res.text
    await asyncio.wait_for(rejected.closed.wait(), 10)
    assert rejected.close_code == 1000
    assert not [m for m in rejected.received if m.get("event") == "media"]
    assert not [h for h in a.runtime.hosting.hosts.values() if isinstance(h, SessionHost)]
    await rejected.close()
    # Nobody answers: refused when call_accept_timeout_s is over; a late accept finds nothing.
    unanswered = twilio(a, call_sid="CA-unanswered")
    await unanswered.connect()
    await until(lambda: len(hooks.received) == 2, "the second announcement")
    await asyncio.wait_for(unanswered.closed.wait(), 15)
    assert unanswered.close_code == 4001
    late = hooks.received[1].body["data"]["call_id"]
    res = await post(b, f"/v1/realtime/calls/{late}/accept", {"type": "realtime"})
    assert res.status_code == 404
    await unanswered.close()
    # Accept and reject need a credential.
    async with httpx.AsyncClient() as http:
        res = await http.post(b.http + f"/v1/realtime/calls/{late}/reject")
    assert res.status_code == 401


async def test_a_webhook_that_does_not_take_the_event_refuses_the_call(
    cluster: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, _, hooks = cluster
    hooks.status = 500
    call = twilio(a)
    await call.connect()
    await asyncio.wait_for(call.closed.wait(), 15)
    assert call.close_code == 4001 and len(hooks.received) == 1
    await call.close()
