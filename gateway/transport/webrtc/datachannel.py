"""The ``oai-events`` data channel: the WebSocket dialect's JSON events, both ways.

The browser opens the channel (OpenAI's clients create ``oai-events`` before the offer);
the gateway, answering, receives it as the ``datachannel`` event. Text messages go to the
session's decoder as a WebSocket text frame would (a non-JSON one is the decoder's to
answer with an ``invalid_json`` error, as on a WebSocket); a binary message has no meaning
in this dialect and goes to ``on_binary``.

Outgoing events wait in a small queue until the channel exists (the gateway may have
``session.created`` ready before the browser's channel arrives). Two limits are checked on
every send: the peer's ``a=max-message-size`` (Chromium: 256 KiB; RFC 8841's default when
absent is 64 KiB) - a larger message would make the peer reset the association, so it is
refused with :class:`MessageTooLarge` - and the bytes still buffered in SCTP, past which a
consumer that does not read is a slow consumer (:class:`ChannelOverflow`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from aiortc import RTCDataChannel

LABEL = "oai-events"
DEFAULT_MAX_MESSAGE_SIZE = 65536  # RFC 8841 section 6: no a=max-message-size means 64 KiB
MAX_BUFFERED_BYTES = 4 << 20
MAX_PENDING_BYTES = 8 << 20  # events queued before the channel exists (a resume's replay, session.created);
#   more: ChannelOverflow


class MessageTooLarge(ValueError):
    """An event larger than the peer accepts in one message."""


class ChannelOverflow(RuntimeError):
    """The peer is not reading: too much is buffered (or queued before the channel opened)."""


class EventChannel:
    def __init__(
        self,
        on_message: Callable[[str], None],
        *,
        on_binary: Callable[[bytes], None] | None = None,
        on_open: Callable[[], None] | None = None,
        on_close: Callable[[], None] | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
    ) -> None:
        self.on_message = on_message
        self.on_binary = on_binary
        self.on_open = on_open
        self.on_close = on_close
        self.max_message_size = max_message_size  # 0: the peer set no limit
        self.max_buffered_bytes = max_buffered_bytes
        self.channel: RTCDataChannel | None = None
        self._pending: deque[str] = deque()
        self._pending_bytes = 0
        self._closed = False
        self.received = 0
        self.sent = 0

    def accept(self, channel: RTCDataChannel) -> bool:
        """Take ``channel`` if it is ``oai-events`` (the first one); other channels are not ours."""
        if channel.label != LABEL or self.channel is not None or self._closed:
            return False
        self.channel = channel
        channel.on("message", self._received)
        channel.on("close", self._channel_closed)
        if channel.readyState == "open":
            self._opened()
        else:
            channel.on("open", self._opened)
        return True

    @property
    def open(self) -> bool:
        return self.channel is not None and self.channel.readyState == "open"

    @property
    def buffered_amount(self) -> int:
        return 0 if self.channel is None else self.channel.bufferedAmount

    def send(self, event: dict[str, Any] | str | bytes) -> bool:
        """Send one event (a dict, or its JSON text). False if the channel is closed.
        Raises MessageTooLarge or ChannelOverflow (see the module's docstring)."""
        if self._closed:
            return False
        text = (
            event
            if isinstance(event, str)
            else (event.decode() if isinstance(event, bytes) else orjson.dumps(event).decode())
        )
        size = len(text.encode()) if not text.isascii() else len(text)
        if self.max_message_size and size > self.max_message_size:
            raise MessageTooLarge(f"a {size}-byte event is over the peer's {self.max_message_size}-byte message limit")
        if not self.open:
            if self._pending_bytes + size > MAX_PENDING_BYTES:
                raise ChannelOverflow(f"{self._pending_bytes} bytes queued and the data channel has not opened")
            self._pending.append(text)
            self._pending_bytes += size
            return True
        if self.buffered_amount > self.max_buffered_bytes:
            raise ChannelOverflow(f"{self.buffered_amount} bytes buffered on the data channel: the peer is not reading")
        assert self.channel is not None
        self.channel.send(text)
        self.sent += 1
        return True

    def close(self) -> None:
        self._closed = True
        self._pending.clear()
        self._pending_bytes = 0
        if self.channel is not None and self.channel.readyState not in ("closing", "closed"):
            self.channel.close()

    def _opened(self) -> None:
        while self._pending and self.open:
            assert self.channel is not None
            self.channel.send(self._pending.popleft())
            self.sent += 1
        self._pending_bytes = 0 if not self._pending else self._pending_bytes
        if self.on_open is not None:
            self.on_open()

    def _received(self, message: str | bytes) -> None:
        self.received += 1
        if isinstance(message, str):
            self.on_message(message)
        elif self.on_binary is not None:
            self.on_binary(message)

    def _channel_closed(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        if self.on_close is not None:
            self.on_close()
