"""Slow request bodies cannot hold a replica (issue 33, finding 1), over real sockets.

A body is read only after the request's credential was checked: a caller without one is
answered 401 as soon as its head is in, and the connection closes, its body unread. A
body that does not arrive within ``request_timeout_s`` (a byte dripped now and then) gets
408 and the socket closes. A body being read leaves the count of sockets not yet
upgraded (``max_pending_connections``), which stays for those that proved nothing, and is
bounded on its own (``max_request_bodies``: one more gets 503 unread). A client that
goes away mid-body is an INFO line, never an ERROR with a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from support.gateway import RunningGateway, run_gateway
from test_pre_upgrade_sockets import Raw, error_of, status_of

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

KEY = "sk-slow-bodies-5c2e"
BODY_ROUTES = ["/v1/realtime/calls", "/v1/realtime/client_secrets", "/v1/realtime/video/sess_x/interactions"]


def gateway(**kwargs: Any) -> Any:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), **kwargs)
    return run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None)


def post_head(path: str, length: int = 100_000, key: str | None = KEY) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    kind = "application/sdp" if path.endswith("/calls") else "application/json"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: {kind}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip


@contextlib.asynccontextmanager
async def dripping(port: int, head: bytes) -> AsyncIterator[Raw]:
    """A connection that sent ``head`` and then drips its body, a byte every 0.2 s."""
    raw = await Raw.open(port)
    await raw.send(head)

    async def drip() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                await raw.send(b"x")
                await asyncio.sleep(0.2)

    task = asyncio.ensure_future(drip())
    try:
        yield raw
    finally:
        task.cancel()
        raw.close()


async def counts_reach(gw: RunningGateway, *, pending: int | None = None, bodies: int | None = None) -> None:
    protocol = gw.server.config.http_protocol_class
    deadline = time.monotonic() + 10
    while (pending is not None and protocol.pending.n != pending) or (
        bodies is not None and protocol.bodies.n != bodies
    ):
        assert time.monotonic() < deadline, f"pending {protocol.pending.n}, bodies {protocol.bodies.n}"
        await asyncio.sleep(0.01)


async def healthz(port: int) -> int:
    raw = await Raw.open(port)
    try:
        await raw.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await raw.response(timeout=5.0))[0]
    finally:
        raw.close()


@pytest.mark.parametrize("path", BODY_ROUTES)
async def test_a_body_without_a_credential_is_answered_401_at_once_and_never_read(path: str) -> None:
    """Was: the offer (or mint) was read first, for as long as the drip lasted."""
    async with gateway(request_timeout_s=60) as gw, dripping(gw.port, post_head(path, key=None)) as raw:
        answer = await raw.until_eof(5.0)  # far sooner than the 100,000 s the body would take
        assert status_of(answer) == 401
        assert error_of(answer)["code"] == Code.UNAUTHORIZED


@pytest.mark.parametrize("path", BODY_ROUTES)
async def test_a_dripped_body_with_a_credential_gets_408_at_the_request_deadline(path: str) -> None:
    async with gateway(request_timeout_s=1.0) as gw, dripping(gw.port, post_head(path)) as raw:
        start = time.monotonic()
        answer = await raw.until_eof(10.0)
        assert status_of(answer) == 408
        assert error_of(answer)["code"] == Code.REQUEST_TIMEOUT
        assert time.monotonic() - start < 8.0
        await counts_reach(gw, pending=0, bodies=0)


async def test_bodies_being_read_leave_the_pending_count_and_are_bounded_apart() -> None:
    """Five dripping bodies with a key, against a cap of three sockets not yet upgraded:
    /healthz is still served (they do not count there); past max_request_bodies (5) one
    more body is refused 503 unread, and /healthz goes on."""
    async with gateway(max_pending_connections=3, max_request_bodies=5, request_timeout_s=60) as gw:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(5):
                await stack.enter_async_context(dripping(gw.port, post_head("/v1/realtime/client_secrets")))
            await counts_reach(gw, pending=0, bodies=5)
            assert await healthz(gw.port) == 200
            extra = await stack.enter_async_context(dripping(gw.port, post_head("/v1/realtime/client_secrets")))
            answer = await extra.until_eof(5.0)
            assert status_of(answer) == 503
            assert error_of(answer)["code"] == Code.SERVER_BUSY
            assert await healthz(gw.port) == 200
        await counts_reach(gw, pending=0, bodies=0)


async def test_under_a_flood_of_dripping_bodies_healthz_answers_within_a_second() -> None:
    """64 callers without a credential and 16 with one, each dripping a body, against the
    default caps: every /healthz probe is answered, each within a second."""
    async with gateway(max_pending_connections=32, max_request_bodies=16, request_timeout_s=60) as gw:
        async with contextlib.AsyncExitStack() as stack:
            anonymous = [await stack.enter_async_context(dripping(gw.port, post_head("/v1/realtime/calls", key=None)))
                         for _ in range(64)]  # fmt: skip
            for _ in range(16):
                await stack.enter_async_context(dripping(gw.port, post_head("/v1/realtime/calls")))
            await counts_reach(gw, bodies=16)
            for raw in anonymous[:4]:
                assert status_of(await raw.until_eof(5.0)) == 401
            for _ in range(10):
                start = time.monotonic()
                assert await healthz(gw.port) == 200
                assert time.monotonic() - start < 1.0


async def test_a_client_that_closes_mid_body_is_an_info_line_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with gateway(request_timeout_s=60) as gw:
        for path in BODY_ROUTES:
            raw = await Raw.open(gw.port)
            await raw.send(post_head(path) + b"x" * 10)
            await counts_reach(gw, bodies=1)
            raw.close()
            await counts_reach(gw, bodies=0)
        deadline = time.monotonic() + 10
        while sum("before its body was in" in r.getMessage() for r in caplog.records) < len(BODY_ROUTES):
            assert time.monotonic() < deadline, "no INFO line for each client that went away"
            await asyncio.sleep(0.02)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    ]


async def test_an_honest_offer_and_mint_are_still_taken() -> None:
    """What an honest client does is unchanged: a mint, and a call whose offer is refused for
    what it is (400), not for when it came."""
    async with gateway() as gw:
        raw = await Raw.open(gw.port)
        body = orjson.dumps({"session": {"type": "realtime"}})
        await raw.send(post_head("/v1/realtime/client_secrets", len(body)) + body)
        status, answer = await raw.response()
        assert status == 200 and orjson.loads(answer)["value"].startswith("ek_")
        await raw.send(post_head("/v1/realtime/calls", 9) + b"not sdp!!")
        status, answer = await raw.response()
        assert status == 400 and orjson.loads(answer)["error"]["code"] == "invalid_offer"
        raw.close()
