"""A SIP call under OpenAI's call control, across two replicas: the replica that holds the
call announces it to the operator's backend (``realtime.call.incoming`` with its
``call_id`` and the INVITE's ``sip_headers``, signed per Standard Webhooks and checked by a
real HTTP receiver written from that specification), the call rings until ``/accept`` or
``/reject`` reaches the *other* replica, and the call id the webhook named is the one the
session's hangup then uses. A minimal Python caller on 127.0.0.1 places the calls
(``support.sip_peer.SipUac``); a real redis-server on a loopback port joins the replicas.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from support.gateway import RunningGateway, free_port, run_gateway
from support.gateway import post as gateway_post
from support.redis_server import REDIS_BINARY, RedisServer
from support.sip_peer import SipUac
from support.waiting import until
from support.webhook_receiver import Receiver, receiver

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-exact!").decode()
KEY = {"Authorization": "Bearer k"}
post = partial(gateway_post, headers=KEY)  # the API key's POST


@contextlib.asynccontextmanager
async def two_replicas(**extra: Any) -> AsyncIterator[tuple[RunningGateway, RunningGateway, Receiver]]:
    """Replica A (with SIP) and replica B (without) on one loopback redis-server, and the webhook."""
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    async with receiver(SECRET) as hooks:
        with RedisServer() as server:
            base = Settings(engine="passthrough", redis_url=server.url, api_keys=("k",), video_engine="none",
                            webrtc=False, call_webhook_url=hooks.url, call_webhook_secret=SECRET,
                            call_accept_timeout_s=3.0, **extra)  # fmt: skip
            engine = PassthroughEngine(audio_chunks=5, paced=False)
            async with (
                run_gateway(replace(base, replica_id="ra", sip_port=free_port()), engine=engine,
                            vad_factory=None) as a,
                run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
            ):  # fmt: skip
                yield a, b, hooks


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[RunningGateway, RunningGateway, Receiver]]:
    async with two_replicas() as found:
        yield found


def _tag(message: str) -> str | None:
    match = re.search(r"^To: .*;tag=([^;\s]+)", message, re.M)
    return match.group(1) if match else None


async def test_a_call_announced_by_one_replica_is_accepted_on_the_other_and_hung_up_by_its_call_id(
    replicas: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, b, hooks = replicas
    uac = await SipUac.open(a.runtime.settings.sip_port)
    try:
        uac.invite(headers=("X-Customer: 42",))
        status, _ = await uac.response(final=False)
        await until(lambda: hooks.received, "the webhook")
        (hook,) = hooks.received
        assert hook.verified and hook.body["type"] == "realtime.call.incoming"
        call_id = hook.body["data"]["call_id"]
        headers = {h["name"]: h["value"] for h in hook.body["data"]["sip_headers"]}
        assert call_id.startswith("rtc_") and headers["Call-ID"] == uac.call_id and headers["X-Customer"] == "42"
        assert a.runtime.session_count() == 0  # it rings: no session yet
        accepted = await post(b, f"/v1/realtime/calls/{call_id}/accept", {"instructions": "Be brief."})
        assert accepted.status_code == 200, accepted.text
        status, message = await uac.response()
        assert status == 200 and f"X-Omni-Call-Id: {call_id}" in message
        uac.ack(_tag(message))
        session_id = "sess_" + call_id.removeprefix("rtc_")
        host = a.runtime.hosts[session_id]  # on the replica that holds the call, with what was accepted
        assert host.session.config.instructions == "Be brief."
        hung = await post(b, f"/v1/realtime/calls/{call_id}/hangup")  # the webhook's call id, from B
        assert hung.status_code == 200, hung.text
        assert (await uac.request_in("BYE")).startswith("BYE ")
        await until(lambda: session_id not in a.runtime.hosts, "the session to end")
    finally:
        uac.close()


async def test_a_reject_s_status_code_is_the_sip_final_response_and_no_answer_is_480(
    replicas: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, b, hooks = replicas
    uac = await SipUac.open(a.runtime.settings.sip_port)
    try:
        uac.invite()
        await until(lambda: hooks.received, "the webhook")
        call_id = hooks.received[0].body["data"]["call_id"]
        bad = await post(b, f"/v1/realtime/calls/{call_id}/reject", {"status_code": 200})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "status_code")
        rejected = await post(b, f"/v1/realtime/calls/{call_id}/reject", {"status_code": 486})
        assert rejected.status_code == 200, rejected.text
        status, message = await uac.response()
        assert status == 486
        uac.ack(_tag(message))
        again = await post(b, f"/v1/realtime/calls/{call_id}/reject")  # answered once only
        assert again.status_code == 404
    finally:
        uac.close()
    uac = await SipUac.open(a.runtime.settings.sip_port)
    try:
        uac.invite()
        status, message = await uac.response()  # nobody answers within call_accept_timeout_s
        assert status == 480
        uac.ack(_tag(message))
        assert a.runtime.session_count() == 0
    finally:
        uac.close()


async def test_a_refer_taken_on_another_replica_is_relayed_to_the_call_s_and_answers_what_the_trunk_said(
    replicas: tuple[RunningGateway, RunningGateway, Receiver],
) -> None:
    a, b, hooks = replicas  # (B has no SIP at all: only A holds the call)
    uac = await SipUac.open(a.runtime.settings.sip_port)
    try:
        uac.invite()
        await until(lambda: hooks.received, "the webhook")
        call_id = hooks.received[0].body["data"]["call_id"]
        assert (await post(b, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        status, message = await uac.response()
        assert status == 200
        uac.ack(_tag(message))
        unknown = await post(b, "/v1/realtime/calls/rtc_0000/refer", {"target_uri": "tel:+15551234567"})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "call_id_not_found")

        refused = asyncio.create_task(post(b, f"/v1/realtime/calls/{call_id}/refer", {"target_uri": "tel:+15550001"}))
        refer = await uac.request_in("REFER")  # sent by A, in the call's dialog
        assert "Refer-To: <tel:+15550001>" in refer
        uac.respond(refer, 603, "Decline")
        answer = await refused
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "call_transfer_failed" and "603" in answer.json()["error"]["message"]

        taken = asyncio.create_task(post(b, f"/v1/realtime/calls/{call_id}/refer", {"target_uri": "sip:agent@pbx"}))
        refer = await uac.request_in("REFER")
        while "Refer-To: <sip:agent@pbx>" not in refer:  # (the first one's retransmissions, sent before its answer)
            refer = await uac.request_in("REFER")
        uac.respond(refer, 202, "Accepted")
        answer = await taken
        assert (answer.status_code, answer.json()) == (200, {})
        assert not a.runtime.hosting.asks and not b.runtime.hosting.asks  # nothing left waiting
    finally:
        uac.close()


async def test_a_live_refer_taken_on_another_replica_is_relayed_to_the_call_s() -> None:
    async with two_replicas(call_webhook_live=True) as (a, b, hooks):
        uac = await SipUac.open(a.runtime.settings.sip_port)
        try:
            uac.invite()
            await until(lambda: len(hooks.received) == 2, "both announcements")
            (live,) = [h.body for h in hooks.received if h.body["type"] == "live.transport.incoming"]
            session_id = live["data"]["session_id"]
            accepted = await post(b, f"/v1/live/sessions/{session_id}/accept",
                                  {"session": {"type": "live", "model": "gpt-live-1"}})  # fmt: skip
            assert accepted.status_code == 200, accepted.text
            status, message = await uac.response()
            assert status == 200
            uac.ack(_tag(message))
            unknown = await post(b, "/v1/live/sessions/live_0000/refer", {"target_uri": "tel:+15551234567"})
            assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "session_not_found")
            taken = asyncio.create_task(post(b, f"/v1/live/sessions/{session_id}/refer", {"target_uri": "tel:+1555"}))
            refer = await uac.request_in("REFER")
            assert "Refer-To: <tel:+1555>" in refer
            uac.respond(refer, 202, "Accepted")
            answer = await taken
            assert (answer.status_code, answer.json()) == (200, {})
        finally:
            uac.close()
