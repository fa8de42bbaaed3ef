"""``Backend``: makes stores of one kind (memory or redis) for a contract test."""

from __future__ import annotations

import uuid
from typing import Any

from gateway.store import MemoryStore, SessionStore, create_store


class Backend:
    """Makes stores of one kind. ``store()`` gives a replica's store; ``peer()``
    gives another replica's view of the same data (memory: the same object)."""

    def __init__(self, kind: str, url: str | None, *, topology: str = "single") -> None:
        self.kind = kind  # memory | redis
        self.topology = topology  # of a redis kind: single | sentinel | cluster
        self.url = url
        self.prefix = f"test-{uuid.uuid4().hex[:10]}:"
        self._stores: list[SessionStore] = []
        self._options: dict[str, Any] = {}

    def store(self, **options: Any) -> SessionStore:
        self._options = {"key_prefix": self.prefix, **options}
        store = create_store(self.url, **self._options)
        self._stores.append(store)
        return store

    def peer(self, store: SessionStore) -> SessionStore:
        if isinstance(store, MemoryStore):
            return store
        peer = create_store(self.url, **self._options)
        self._stores.append(peer)
        return peer

    async def close(self) -> None:
        for store in self._stores:
            await store.close()
