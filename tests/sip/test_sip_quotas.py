"""SIP calls are admitted against their tenant's session limits, as sockets are
(``gateway/quotas.py``): with ``tenant_max_sessions`` 1, a second call while one is up is
refused 486 Busy Here and an outbound dial (ours, GPT-Live's) 429 ``rate_limit_exceeded`` (before any SIP is
sent); once the first call ends (the caller's BYE), its seat is given back and a call is
answered again. A call accepted through the webhook is the accepting key's, and is admitted
against that key's tenant. A minimal Python caller on 127.0.0.1 places the calls
(``SipUac``)."""

from __future__ import annotations

import base64
import re

import httpx
import pytest
from support.gateway import free_port, run_gateway
from support.sip_peer import SipUac
from support.waiting import until
from support.webhook_receiver import receiver

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-exact!").decode()


def _tag(message: str) -> str | None:
    match = re.search(r"^To: .*;tag=([^;\s]+)", message, re.M)
    return match.group(1) if match else None


async def test_a_tenant_at_its_session_limit_gets_486_and_429_until_its_call_ends() -> None:
    # (auth off: the default session and the REST requests are one principal's, ``anonymous``)
    settings = Settings(video_engine="none", webrtc=False, engine="passthrough", sip_port=free_port(),
                        tenant_max_sessions=1)  # fmt: skip
    async with run_gateway(settings) as gw:
        first, second, third = [await SipUac.open(settings.sip_port) for _ in range(3)]
        try:
            first.invite()
            status, message = await first.response()
            assert status == 200, message
            to_tag = _tag(message)
            first.ack(to_tag)
            assert gw.runtime.session_count() == 1

            second.invite()
            status, message = await second.response()
            assert status == 486, message  # the tenant's one session is up: Busy Here
            second.ack(_tag(message))
            assert gw.runtime.metrics.registry.get_sample_value("omni_sip_refusals_total", {"status": "486"}) == 1.0

            dial = {"destination": "tel:+15551234567", "trunk": {"provider_url": "sip:127.0.0.1:5999"}}
            async with httpx.AsyncClient() as http:
                refused = await http.post(gw.http + "/v1/realtime/sip/calls", json=dial)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            live = {"session": {"model": "gpt-live-1"},
                    "transport": {"type": "sip", "destination": "+15551234567",
                                  "trunk": {"provider_url": "sip:127.0.0.1:5999", "caller_number": "+15550100",
                                            "auth": {"type": "digest", "username": "u", "password": "p"}}}}  # fmt: skip
            async with httpx.AsyncClient() as http:
                refused = await http.post(gw.http + "/v1/live/sessions", json=live)  # GPT-Live's dial
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert gw.runtime.session_count() == 1

            first.request("BYE", cseq=2, to_tag=to_tag)  # the first call ends: its seat is given back
            await until(lambda: gw.runtime.session_count() == 0 and not gw.runtime.quotas.seats, "the seat back")
            third.invite()
            status, message = await third.response()
            assert status == 200, message
            third.ack(_tag(message))
        finally:
            for uac in (first, second, third):
                uac.close()


async def test_a_call_accepted_through_the_webhook_is_admitted_against_the_accepting_key_s_tenant() -> None:
    async with receiver(SECRET) as hooks:
        settings = Settings(video_engine="none", webrtc=False, engine="passthrough", sip_port=free_port(),
                            api_keys=("k",), call_webhook_url=hooks.url, call_webhook_secret=SECRET,
                            tenant_max_sessions=1)  # fmt: skip
        async with run_gateway(settings) as gw, httpx.AsyncClient() as http:
            first, second = [await SipUac.open(settings.sip_port) for _ in range(2)]
            try:
                for n, uac in enumerate((first, second)):
                    uac.invite()
                    await until(lambda n=n: len(hooks.received) == n + 1, "the webhook")  # type: ignore[misc]
                    call_id = hooks.received[n].body["data"]["call_id"]
                    accepted = await http.post(f"{gw.http}/v1/realtime/calls/{call_id}/accept", json={},
                                               headers={"Authorization": "Bearer k"})  # fmt: skip
                    assert accepted.status_code == 200, accepted.text
                status, message = await first.response()
                assert status == 200, message
                first.ack(_tag(message))
                status, message = await second.response()
                assert status == 486, message  # the key's tenant has its one session up
                second.ack(_tag(message))
                assert gw.runtime.session_count() == 1
            finally:
                first.close()
                second.close()
