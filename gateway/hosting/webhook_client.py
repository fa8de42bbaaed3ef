"""One webhook POST (I/O): a small HTTP/1.1 client on asyncio's streams, no dependency.

One connection per request (``Connection: close``), ``http`` or ``https`` (the system's
certificate store); the answer's status is what counts (its body is read and dropped, up to
``MAX_ANSWER_BYTES``). Any failure (no connection, a timeout, an answer that is not HTTP)
raises ``WebhookFailure``; the URL is the operator's and is never logged here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

from gateway.hosting.responses_backend import HttpResponse

MAX_ANSWER_BYTES = 64 << 10  # what is read of the answer, head and body


class WebhookFailure(Exception):
    """The webhook could not be delivered (the message says why)."""


async def post_json(url: str, body: bytes, headers: dict[str, str], *, timeout_s: float) -> int:
    """POST ``body`` (JSON) to ``url``; the answer's HTTP status."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookFailure("the URL is not http(s)")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    authority = host if parts.port is None else f"{host}:{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {authority}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close", "User-Agent: omni-realtime-gateway",
             *(f"{name}: {value}" for name, value in headers.items())]  # fmt: skip
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                parts.hostname, port, ssl=ssl.create_default_context() if tls else None
            )
            try:
                writer.write(request)
                await writer.drain()
                answer = HttpResponse()
                read = 0
                while answer.status is None:
                    data = await reader.read(MAX_ANSWER_BYTES)
                    read += len(data)
                    if not data:
                        answer.end()
                        break
                    answer.feed(data)
                    if read > MAX_ANSWER_BYTES:
                        break
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.shield(writer.wait_closed())
    except TimeoutError:
        raise WebhookFailure(f"no answer within {timeout_s:g} s") from None
    except (OSError, ssl.SSLError) as exc:
        raise WebhookFailure(f"unreachable ({type(exc).__name__})") from None
    except ValueError as exc:
        raise WebhookFailure(f"the answer is not HTTP/1.1 ({exc})") from None
    if answer.status is None:
        raise WebhookFailure("the connection closed without an answer")
    return answer.status
