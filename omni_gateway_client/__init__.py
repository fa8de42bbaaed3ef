"""Python SDK for the omni realtime gateway (OpenAI Realtime API, GA).

Needs only ``websockets`` and ``orjson``; imports nothing from the server.

Ten lines::

    import asyncio
    from omni_gateway_client import RealtimeClient

    async def main(pcm16: bytes) -> None:
        async with RealtimeClient("ws://127.0.0.1:8000/v1/realtime", model="omni-cascade",
                                  api_key="sk-...", binary=True) as rt:
            await rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await rt.append_audio(pcm16)  # a binary frame on the fast path, base64 JSON otherwise
            await rt.commit(); await rt.create_response()
            async for event in rt:  # dicts; audio deltas carry "delta" as bytes in both modes
                if event["type"] == "response.done": break

What it guarantees:

- Events arrive in ``server_event_seq`` order, each once: after a reconnect
  the gateway replays what was missed and the client drops anything at or
  below the last sequence number it delivered.
- A lost connection (network error, close 1001/1006/1011/1012/1013/4010) is
  re-established with exponential backoff and jitter (``ReconnectPolicy``)
  and the session resumed with ``session.resume``. The application sees a
  ``session.resumed`` event, then the replayed events, then live ones.
- Where the gap cannot be replayed, the application receives
  ``session.resync_required`` (the session config and the conversation) and
  the stream goes on from there.
- A refused resume raises ``ResumeFailed`` from the iterator, or, with
  ``resume_fallback="new_session"``, yields ``client.session_lost`` and goes
  on in a new session.
- The iterator ends quietly on a normal close (1000), on ``close()`` and on
  ``session.replaced`` (another connection took the session; close 4009). It
  raises ``Unauthorized`` (4001), ``SessionExpired`` (4008) or
  ``ConnectionLost`` (reconnect budget spent, reconnect disabled, protocol
  error) otherwise.
- While disconnected, sends are queued (``max_queued_sends``) and flushed in
  order after the resume; ``append_audio`` is dropped instead and counted in
  ``stats``.

See ``RealtimeClient`` for every parameter and limit.
"""

from omni_gateway_client.errors import (
    ConnectionLost,
    RealtimeError,
    ResumeFailed,
    SendQueueFull,
    SessionClosed,
    SessionExpired,
    Unauthorized,
)
from omni_gateway_client.frames import (
    BINARY_SUBPROTOCOL,
    FrameError,
    decode_audio_frame,
    decode_input_frame,
    encode_audio_frame,
    encode_input_frame,
)
from omni_gateway_client.options import ClientStats, ReconnectPolicy
from omni_gateway_client.realtime import RealtimeClient

__all__ = [
    "BINARY_SUBPROTOCOL",
    "ClientStats",
    "ConnectionLost",
    "FrameError",
    "RealtimeClient",
    "RealtimeError",
    "ReconnectPolicy",
    "ResumeFailed",
    "SendQueueFull",
    "SessionClosed",
    "SessionExpired",
    "Unauthorized",
    "decode_audio_frame",
    "decode_input_frame",
    "encode_audio_frame",
    "encode_input_frame",
]
