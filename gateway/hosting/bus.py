"""The bus listener: messages from other replicas about sessions this one owns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.hosting.host import HostContext
from gateway.store.base import replica_channel

# Called with every message that is not for a session host (e.g. a video
# interaction forwarded from the replica that took the HTTP request).
OtherMessage = Callable[[dict[str, Any]], None]


async def listen_bus(ctx: HostContext, other: OtherMessage) -> None:
    """Listen on this replica's channel until cancelled: ``replaced`` stops the
    host of a session another replica took; anything else goes to ``other``."""
    sub = await ctx.store.subscribe(replica_channel(ctx.replica_id))
    try:
        async for message in sub:
            try:
                body = orjson.loads(message.data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(body, dict):
                continue
            if body.get("type") == "replaced":
                host = ctx.hosts.get(body.get("session_id", ""))
                if host is not None:
                    host.replaced()
            else:
                other(body)
    finally:
        await sub.close()
