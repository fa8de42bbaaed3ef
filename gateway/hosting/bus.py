"""The bus listener: messages from other replicas about sessions this one serves."""

from __future__ import annotations

import orjson

from gateway.hosting.ask import answer_ask, answered
from gateway.hosting.calls import Links
from gateway.hosting.context import HostContext
from gateway.hosting.host import SessionHost
from gateway.store.base import replica_channel


async def listen_bus(ctx: HostContext) -> None:
    """Listen on this replica's channel until cancelled, and hand each message to the
    host of the session it names (``replaced``: another replica took the session;
    ``interaction``: a video interaction POSTed to another replica; ``hangup`` and
    ``sideband.*``: a WebRTC call's, ``calls.py``), to the sideband socket it names
    (``link``: what the call's replica sends back), or to the phone call it names
    (``call.accept``, ``call.reject``: ``incoming.py``), or to the requests asked of and
    answered by an owner (``ask``, ``answer``: ``ask.py``). A message for a
    session not served here (any more) is dropped: its sender learns nothing, as for
    a replica that died."""
    sub = await ctx.store.subscribe(replica_channel(ctx.replica_id))
    try:
        async for message in sub:
            try:
                body = orjson.loads(message.data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(body, dict):
                continue
            kind = body.get("type")
            if kind == "ask":
                ctx.spawn(answer_ask(ctx, body))  # a request of a session served here (ask.py)
                continue
            if kind == "answer":
                answered(ctx, body)  # the owner's answer to a request of this replica's
                continue
            host = ctx.hosts.get(body.get("session_id", ""))
            if isinstance(host, SessionHost) and str(body.get("type", "")).startswith("sideband."):
                if host.links is None:
                    host.links = Links(ctx, host)
                host.links.on_bus(body)  # a sideband socket on another replica, relayed
            elif host is not None:
                host.on_bus(body)
            elif (link := ctx.links.get(body.get("link", ""))) is not None:
                link.on_bus(body)  # for a sideband socket here, from the replica serving its call
            elif (incoming := ctx.incoming.get(body.get("call_id", ""))) is not None:
                incoming.on_bus(body)  # a call's accept or reject, taken on another replica (incoming.py)
    finally:
        await sub.close()
