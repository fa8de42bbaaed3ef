"""A tenant's key reaches no log wherever a client puts it: ``omni-gateway serve`` at
DEBUG (uvicorn's access log and websockets' handshake lines included), real connection
attempts with the key in every place a credential can be. A keys-file key is known to
the gateway only by its hash, so only where it is, not what it is, can redact it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import sys
from pathlib import Path

import pytest
from support.gateway import free_port
from support.serve import Served, clean_env

from gateway import logs

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-tenant-9f3b7c21d4e8a6"
BASIC = base64.b64encode(f"user:{KEY}".encode()).decode()
UPGRADE = ("Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")  # fmt: skip

# (request line path, extra header lines): each an attempt a client might make
ATTEMPTS = [
    *[(f"/v1/realtime?model=omni-cascade&{name}={KEY}", "") for name in ("api_key", "key", "token", "client_secret")],
    ("/v1/realtime", f"api-key: {KEY}\r\n"),
    ("/v1/realtime", f"X-Api-Key: {KEY}\r\n"),
    ("/v1/realtime", f"Authorization: Basic {KEY}\r\n"),
    ("/v1/realtime", f"Authorization: Basic {BASIC}\r\n"),
    ("/v1/realtime", f"Authorization: Token {KEY}\r\n"),
    ("/v1/realtime", f"Authorization: {KEY}\r\n"),
    ("/v1/realtime", f"Cookie: theme=dark; session={KEY}\r\n"),
    ("/v1/realtime", f"Sec-WebSocket-Protocol: realtime, OpenAI-Insecure-Api-Key.{KEY}\r\n"),
    ("/v1/realtime", f"Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.{KEY}\r\n"),  # accepted
    ("/v1/realtime", f"Authorization: Bearer {KEY}\r\n"),  # accepted
]
HTTP_ATTEMPTS = [
    f"GET /v1/models?api_key={KEY} HTTP/1.1\r\nHost: x\r\n\r\n",
    f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY}\r\n\r\n",
    f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n",
    f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nCookie: k={KEY}\r\nContent-Length: 2\r\n\r\n{{}}",
]


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request``, read what comes for a moment (a 101 stays open: closed by us)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    received = bytearray()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(5):
            while b"\r\n\r\n" not in received:
                chunk = await loop.sock_recv(sock, 65536)
                if not chunk:
                    break
                received.extend(chunk)
    sock.close()
    return bytes(received)


async def test_a_key_in_any_place_a_credential_can_be_is_logged_nowhere_at_debug(tmp_path: Path) -> None:
    keys = {"tenants": [{"name": "acme", "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()]}]}
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(keys))
    port = free_port()
    command = (f"{sys.executable} -m gateway serve --engine passthrough --video-engine none "
               f"--keys-file {keys_file} --log-level debug")  # fmt: skip
    env = clean_env(OMNI_GATEWAY_PORT=str(port), PYTHONPATH=str(ROOT))
    served = Served(command, port=port, cwd=ROOT, log_path=tmp_path / "serve.log", env=env)
    try:
        await asyncio.to_thread(served.wait_ready, 60, "/healthz")
        statuses = []
        for path, extra in ATTEMPTS:
            answer = await exchange(port, f"GET {path} HTTP/1.1\r\n{UPGRADE}{extra}\r\n".encode())
            statuses.append(answer.split(b" ", 2)[1])
        for request in HTTP_ATTEMPTS:
            answer = await exchange(port, request.encode())
            statuses.append(answer.split(b" ", 2)[1])
    finally:
        served.stop()
    # the attempts were made and answered: refused (401) but for the accepted placements
    assert statuses[:-6] == [b"401"] * (len(ATTEMPTS) - 2) and statuses[-6:-4] == [b"101", b"101"]
    assert statuses[-4:] == [b"401", b"401", b"200", b"401"]
    text = (tmp_path / "serve.log").read_text()
    assert KEY not in text and BASIC not in text
    assert " DEBUG " in text and "< x-api-key: " + logs.REDACTED in text.lower()  # websockets' handshake lines
    assert f"GET /v1/models?api_key={logs.REDACTED} HTTP/1.1" in text  # uvicorn's access log, formatted
    assert "Logging error" not in text  # (a formatter given what it did not expect)
