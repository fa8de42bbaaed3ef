"""The conversation within its limits (Sans-I/O).

``History`` owns the session's ``Conversation`` (conversation.py: the items, in
order), its id, and the accounting of ``max_items``, ``max_conversation_bytes``
and the images' ``max_images`` and ``max_image_pixels`` (the pixels their headers
declare, counted once, when the item is added): an item's size (``Item.counted_bytes``) is counted
as it is added and again each time an event says it changed (``changed``: an
answer's transcript, a transcription, a truncation), and when an item is added
past either limit the oldest items are deleted, each announced with
``conversation.item.deleted``: the bound may be passed by what the items grew
since the last item was added, never by more. It never deletes the item being added, nor one
that the running answer is still writing (``keep``).

It knows the limits, how to emit an event, and ``keep``; not the responses,
the input audio or the dialect.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable

from gateway.session.conversation import Conversation, Item
from gateway.session.limits import SessionLimits


class History:
    """See the module docstring."""

    def __init__(
        self,
        conversation: Conversation,
        limits: SessionLimits,
        emit: Callable[..., None],
        keep: Callable[[Item], bool],
    ) -> None:
        """``emit(type_, **fields)`` sends an event; ``keep(item)``: the item may not be evicted."""
        self.conversation = conversation
        self.id = "conv_" + secrets.token_hex(8)  # the conversation_id of responses
        self._limits = limits
        self._emit = emit
        self._keep = keep
        self._item_bytes: dict[str, int] = {}  # each item's size, as last counted
        self._bytes = 0
        self._images = 0  # input_image parts in the conversation
        self._pixels = 0  # ... and the pixels they declare

    def __len__(self) -> int:
        return len(self.conversation)

    def get(self, item_id: str) -> Item | None:
        return self.conversation.get(item_id)

    def insert(self, item: Item, previous_item_id: str | None) -> str | None:
        """Add ``item`` after ``previous_item_id`` (None: at the end), evicting the oldest
        items past the limits; returns the id of the item before it. The caller
        announces the item itself."""
        conversation = self.conversation
        prev = conversation.insert(item, previous_item_id)
        size = self._item_bytes[item.id] = item.counted_bytes()
        self._bytes += size
        self._count_images(item, 1)
        limits = self._limits
        while (
            len(conversation) > limits.max_items
            or self._bytes > limits.max_conversation_bytes
            or self._images > limits.max_images
            or self._pixels > limits.max_image_pixels
        ):
            oldest = conversation.oldest()
            assert oldest is not None
            if oldest is item or self._keep(oldest):
                break
            self.remove(oldest.id)
            self._emit("conversation.item.deleted", item_id=oldest.id)
        return prev

    def changed(self, item_id: str) -> None:
        """An event said the item changed: the conversation drops what it cached of it,
        and its size is counted again (deleting waits for the next insert: never in
        the middle of the event that announced the change)."""
        self.conversation.forget(item_id)
        old = self._item_bytes.get(item_id)
        item = self.conversation.get(item_id)
        if old is not None and item is not None:
            size = self._item_bytes[item_id] = item.counted_bytes()
            self._bytes += size - old

    def remove(self, item_id: str) -> Item:
        """Out of the conversation (the caller announces it)."""
        self._bytes -= self._item_bytes.pop(item_id, 0)
        item = self.conversation.remove(item_id)
        self._count_images(item, -1)
        return item

    def _count_images(self, item: Item, sign: int) -> None:
        images, pixels = item.images()
        self._images += sign * images
        self._pixels += sign * pixels

    def restore(self, items: Iterable[Item], conversation_id: str) -> None:
        """The items of a snapshot, in order (no limit applies: they fitted when written)."""
        self.id = conversation_id
        for item in items:
            self.conversation.insert(item)
            self._item_bytes[item.id] = size = item.counted_bytes()
            self._bytes += size
            self._count_images(item, 1)
