"""Tenant limits on one gateway, over real sockets: each limit of the keys file
(and the settings' defaults, and a token's claims) holds exactly, is refused with
``rate_limit_exceeded`` (close 4029 at connect), shows in ``rate_limits.updated``
and in the per-tenant metrics. (Across replicas: tests/cluster/test_tenants_cluster.py.)"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.jwt_issuer import HS_SECRET, TestIssuer

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

ACME, BETA, OPERATOR = "sk-tenant-acme-1111", "sk-tenant-beta-2222", "sk-operator-3333"
PCM_MS = 24  # samples per ms at 24 kHz (audio/pcm)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_file(acme: dict[str, Any], beta: dict[str, Any]) -> str:
    return orjson.dumps({"tenants": [
        {"name": "acme", "key_sha256": sha(ACME), "limits": acme},
        {"name": "beta", "key_sha256": [sha(BETA)], "limits": beta, "models": ["omni-cascade"]},
    ]}).decode()  # fmt: skip


def settings(acme: dict[str, Any], beta: dict[str, Any] | None = None, **kwargs: Any) -> Settings:
    return Settings(engine="passthrough", video_engine="none", api_keys=(OPERATOR,), detach_grace_s=0.2,
                    drain_window_s=0.2, keys_file=keys_file(acme, beta or {}), **kwargs)  # fmt: skip


@contextlib.asynccontextmanager
async def gateway(s: Settings, **engine: Any) -> AsyncIterator[RunningGateway]:
    engine.setdefault("paced", False)
    engine.setdefault("audio_chunks", 3)
    async with run_gateway(s, engine=PassthroughEngine(**engine), vad_factory=None) as gw:
        yield gw


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def refused(gw: RunningGateway, key: str, *, says: str) -> None:
    """Accepted, then ``rate_limit_exceeded`` and close 4029, never a session."""
    async with connect(gw.url, headers=bearer(key)) as c:
        first = await c.recv()
        assert first["type"] == "error", first
        assert first["error"]["code"] == Code.RATE_LIMIT_EXCEEDED
        assert says in first["error"]["message"]
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(c.ws.recv(), 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4029
    assert "session.created" not in c.types()


async def at_window_start(gw: RunningGateway, window_ms: int, margin_ms: int) -> None:
    """Wait until at least ``margin_ms`` of a budget window are ahead."""
    probe = await gw.runtime.store.take_budget("probe", "probe", 0, limit=1, window_ms=window_ms)
    if probe.reset_ms < margin_ms:
        await asyncio.sleep(probe.reset_ms / 1000 + 0.02)


async def at_next_window(gw: RunningGateway, window_ms: int) -> None:
    """Wait for a new budget window, so that what was sent before counts in an earlier one."""
    probe = await gw.runtime.store.take_budget("probe", "probe", 0, limit=1, window_ms=window_ms)
    await asyncio.sleep(probe.reset_ms / 1000 + 0.02)


def sample(gw: RunningGateway, name: str, **labels: str) -> float:
    return gw.runtime.metrics.registry.get_sample_value(name, labels) or 0.0


# --- at connect -----------------------------------------------------------------------


async def test_each_tenant_gets_exactly_its_concurrent_sessions() -> None:
    async with gateway(settings({"max_sessions": 2}, {"max_sessions": 1})) as gw:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                c = await stack.enter_async_context(connect(gw.url, headers=bearer(ACME)))
                await c.wait_for("session.created")
            b = await stack.enter_async_context(connect(gw.url, headers=bearer(BETA)))
            await b.wait_for("session.created")
            await refused(gw, ACME, says="2 sessions open")
            await refused(gw, BETA, says="1 sessions open")
            op = await stack.enter_async_context(connect(gw.url, headers=bearer(OPERATOR)))  # no limit
            await op.wait_for("session.created")
            assert sample(gw, "omni_tenant_sessions_active", tenant="acme") == 2
            assert sample(gw, "omni_tenant_refusals_total", tenant="beta", limit="max_sessions") == 1
        # All closed: each tenant may open again.
        await asyncio.sleep(0.1)
        for key in (ACME, ACME, BETA):
            async with connect(gw.url, headers=bearer(key)) as c:
                await c.wait_for("session.created")


async def test_session_starts_per_minute_count_every_socket_opened() -> None:
    async with gateway(settings({"session_starts_per_min": 3})) as gw:
        for _ in range(3):
            async with connect(gw.url, headers=bearer(ACME)) as c:
                await c.wait_for("session.created")
        await refused(gw, ACME, says="opened 3 sessions in the last minute")
        async with connect(gw.url, headers=bearer(BETA)) as c:  # another tenant: its own count
            await c.wait_for("session.created")


async def test_defaults_from_settings_apply_to_everyone_without_their_own() -> None:
    s = settings({"max_sessions": 3}, tenant_max_sessions=1)
    async with gateway(s) as gw, connect(gw.url, headers=bearer(OPERATOR)) as c:
        await c.wait_for("session.created")
        await refused(gw, OPERATOR, says="1 sessions open")  # the default
        async with connect(gw.url, headers=bearer(ACME)) as a1, connect(gw.url, headers=bearer(ACME)) as a2:
            await a1.wait_for("session.created")  # acme's own limit: 3
            await a2.wait_for("session.created")
            async with connect(gw.url, headers=bearer(BETA)) as b:
                await b.wait_for("session.created")
                await refused(gw, BETA, says="1 sessions open")  # beta names none: the default


async def test_a_video_socket_counts_as_a_session() -> None:
    from orchestrator.engines.video import CpuVideoEngine

    s = settings({"max_sessions": 1})
    async with run_gateway(s, engine=PassthroughEngine(paced=False), vad_factory=None,
                           video_engine=CpuVideoEngine()) as gw:  # fmt: skip
        async with websockets.connect(gw.url + "/video", additional_headers=bearer(ACME)) as video:
            await asyncio.sleep(0.1)
            await refused(gw, ACME, says="1 sessions open")
            await video.close()
        await asyncio.sleep(0.1)
        async with connect(gw.url, headers=bearer(ACME)) as c:
            await c.wait_for("session.created")


async def test_a_token_carries_its_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = TestIssuer()
    async with gateway(settings({}, jwt_secret=HS_SECRET)) as gw:
        token = issuer.hs256("user-1", limits={"max_sessions": 1})
        async with connect(gw.url, headers=bearer(token)) as c:
            await c.wait_for("session.created")
            await refused(gw, token, says="1 sessions open")
            other = issuer.hs256("user-2", limits={"max_sessions": 1})  # another subject: its own
            async with connect(gw.url, headers=bearer(other)) as c2:
                await c2.wait_for("session.created")
        assert sample(gw, "omni_tenant_sessions_total", tenant="other") == 2  # every subject is one label


async def test_a_model_outside_the_tenants_list_is_refused_4003() -> None:
    async with gateway(settings({})) as gw, connect(gw.url + "?model=gpt-realtime", headers=bearer(BETA)) as c:
        err = await c.recv()
        assert err["error"]["code"] == Code.MODEL_NOT_ALLOWED
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(c.ws.recv(), 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4003


async def test_a_duplex_socket_that_opens_on_a_model_outside_the_list_is_refused_4003() -> None:
    async with gateway(settings({})) as gw, connect(gw.url + "?duplex=1&autostart=0", headers=bearer(BETA)) as c:
        await c.send({"type": "session.update", "session": {"model": "gpt-realtime"}, "event_id": "open"})
        err = await c.recv()
        assert err["type"] == "error" and err["error"]["code"] == Code.MODEL_NOT_ALLOWED, err
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(c.ws.recv(), 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4003


# --- as a session goes ----------------------------------------------------------------


async def manual(c: Client) -> None:
    await c.wait_for("session.created")
    await c.send(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
    )
    await c.wait_for("session.updated")


async def test_client_events_per_second_hold_exactly() -> None:
    async with gateway(settings({"events_per_s": 5})) as gw, connect(gw.url, headers=bearer(ACME)) as c:
        await manual(c)
        await at_next_window(gw, 1000)  # the update counts in an earlier second
        for i in range(8):
            await c.send({"type": "input_audio_buffer.clear", "event_id": f"e{i}"})
        answers = [await c.wait_for(lambda e: e["type"] in ("input_audio_buffer.cleared", "error")) for _ in range(8)]
        kinds = [a["type"] for a in answers]
        assert kinds.count("input_audio_buffer.cleared") == 5, kinds
        errors = [a["error"] for a in answers if a["type"] == "error"]
        assert [e["code"] for e in errors] == [Code.RATE_LIMIT_EXCEEDED] * 3
        assert "More than 5 client events in one second" in errors[0]["message"]
        await asyncio.sleep(1.0)  # a new second: events go through again, and the session went on
        await c.send({"type": "input_audio_buffer.clear"})
        await c.wait_for("input_audio_buffer.cleared")


async def test_input_audio_per_minute_holds_to_the_millisecond() -> None:
    async with gateway(settings({"audio_in_s_per_min": 1.0})) as gw, connect(gw.url, headers=bearer(ACME)) as c:
        await manual(c)
        await at_window_start(gw, 60_000, 10_000)
        for i, ms in enumerate((400, 400, 400, 200, 1)):
            audio = base64.b64encode(bytes(ms * PCM_MS * 2)).decode()
            await c.send({"type": "input_audio_buffer.append", "audio": audio, "event_id": f"a{i}"})
        await c.send({"type": "input_audio_buffer.commit", "event_id": "commit"})
        committed = await c.wait_for("input_audio_buffer.committed")
        errors = [e["error"] for e in c.events if e["type"] == "error"]
        assert [e["event_id"] for e in errors] == ["a2", "a4"]  # 400 + 400 + 200 = 1000 ms taken
        assert {e["code"] for e in errors} == {Code.RATE_LIMIT_EXCEEDED}
        assert "input audio limit of 1 s per minute" in errors[0]["message"]
        assert committed["item_id"]
        assert sample(gw, "omni_tenant_audio_input_seconds_total", tenant="acme") == pytest.approx(1.0)


async def test_binary_frames_count_toward_input_audio_too() -> None:
    async with gateway(settings({"audio_in_s_per_min": 0.5})) as gw:
        async with connect(gw.url, headers=bearer(ACME), subprotocols=["omni-binary.v1"]) as c:
            await manual(c)
            await at_window_start(gw, 60_000, 10_000)
            for ms in (300, 300):
                await c.ws.send(b"\x01\x00\x00\x00" + bytes(ms * PCM_MS * 2))
            err = await c.wait_for("error")
            assert err["error"]["code"] == Code.RATE_LIMIT_EXCEEDED


async def test_output_audio_per_minute_stops_a_response_and_refuses_the_next() -> None:
    s = settings({"audio_out_s_per_min": 0.5})
    async with gateway(s, audio_chunks=15, chunk_ms=20, paced=True) as gw, connect(gw.url, headers=bearer(ACME)) as c:
        await manual(c)
        await at_window_start(gw, 60_000, 10_000)
        audio_ms: list[float] = []
        statuses = []
        for _ in range(3):
            await c.send({"type": "response.create"})
            done = await c.wait_for("response.done")
            statuses.append(done["response"]["status"])
            deltas = [e for e in c.events if e["type"] == "response.output_audio.delta"
                      and e["response_id"] == done["response"]["id"]]  # fmt: skip
            audio_ms.append(sum(len(base64.b64decode(e["delta"])) for e in deltas) / 2 / PCM_MS)
        assert statuses == ["completed", "failed", "failed"]
        assert audio_ms[0] == pytest.approx(300)
        assert 500 <= audio_ms[0] + audio_ms[1] <= 500 + 3 * 20  # one round trip and a delta past it at most
        assert audio_ms[2] == 0  # refused before the engine was asked
        failed = [e for e in c.events if e["type"] == "error"]
        assert {e["error"]["code"] for e in failed} == {Code.RATE_LIMIT_EXCEEDED}


async def test_rate_limits_updated_reports_the_callers_remaining_limits() -> None:
    limits = {"max_sessions": 4, "session_starts_per_min": 10, "audio_out_s_per_min": 60, "events_per_s": 50}
    async with gateway(settings(limits)) as gw, connect(gw.url, headers=bearer(ACME)) as c:
        await manual(c)
        await c.send({"type": "response.create"})
        update = await c.wait_for("rate_limits.updated")
        assert update["rate_limits"] == [{"name": "requests", "limit": 10, "remaining": 9,
                                          "reset_seconds": pytest.approx(60, abs=2)}]  # fmt: skip
        by_name = {e["name"]: e for e in update["tenant_limits"]}
        assert set(by_name) == {"sessions", "session_starts_per_min", "output_audio_seconds_per_min",
                                "client_events_per_s"}  # fmt: skip
        assert (by_name["sessions"]["limit"], by_name["sessions"]["remaining"]) == (4, 3)
        out = by_name["output_audio_seconds_per_min"]
        assert out["limit"] == 60 and 59 < out["remaining"] < 60  # 3 chunks of 20 ms spent
        # (None until the store has named the window: the first lease may still be on its way)
        assert out["reset_seconds"] is None or 0 < out["reset_seconds"] <= 60
        assert by_name["client_events_per_s"]["limit"] == 50


async def test_without_limits_rate_limits_updated_is_empty_not_the_engines_slots() -> None:
    async with gateway(settings({})) as gw, connect(gw.url, headers=bearer(OPERATOR)) as c:
        await manual(c)
        await c.send({"type": "response.create"})
        update = await c.wait_for("rate_limits.updated")
        assert (update["rate_limits"], update["tenant_limits"]) == ([], [])


async def test_per_tenant_metrics_have_a_bounded_label_set() -> None:
    issuer = TestIssuer()
    async with gateway(settings({}, jwt_secret=HS_SECRET)) as gw, httpx.AsyncClient(base_url=gw.http) as http:
        for key in (ACME, BETA, OPERATOR, *(issuer.hs256(f"user-{i}") for i in range(5))):
            async with connect(gw.url, headers=bearer(key)) as c:
                await c.wait_for("session.created")
                await c.send({"type": "input_audio_buffer.clear"})
                await c.wait_for("input_audio_buffer.cleared")
        assert (await http.get("/metrics", headers=bearer(ACME))).status_code == 403  # a tenant, not an operator
        text = (await http.get("/metrics", headers=bearer(OPERATOR))).text
    labels = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("omni_tenant_sessions_total{")}  # fmt: skip
    assert labels == {"acme", "beta", "other"}
    assert 'omni_tenant_sessions_total{tenant="other"} 6.0' in text
    assert 'omni_tenant_client_events_total{tenant="acme"} 1.0' in text
