"""Every session test also proves the incremental snapshot: after each ``take`` the item
records a host would have written (``take_item_changes``: the items the events named)
equal the items themselves, for every item that is not still being written by a
stream (the running answer's, or one whose transcription streams). An item changed
without an event naming it would leave a stale record in the store: this fails then."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.session import snapshot
from gateway.session.session import RealtimeSession

CHECKED = ("test_session", "test_duplex_session", "test_duplex_input_clock")  # modules that drive a bare session


@pytest.fixture(autouse=True)
def incremental_snapshots_stay_exact(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.module.__name__.rsplit(".", 1)[-1] not in CHECKED:
        yield
        return
    take = RealtimeSession.take
    records: dict[int, dict[str, bytes]] = {}  # id(session) -> the records a store would hold

    def checked_take(self: Any) -> Any:
        out = take(self)
        stored = records.setdefault(id(self), {})
        changed, dropped = self.take_item_changes()
        for item_id in dropped:
            stored.pop(item_id, None)
        for item_id in changed:
            item = self.conversation.get(item_id)
            if item is not None:
                stored[item_id] = snapshot.item_bytes(item)
        response = self.responses.current
        streaming = {out.id for out in response.outputs} if response is not None else set()
        for item in self.conversation:
            if item.id in streaming or item.pending_transcription:
                continue
            want = orjson.loads(snapshot.item_bytes(item))
            got = orjson.loads(stored[item.id]) if item.id in stored else None
            assert got == want, f"item {item.id} changed without an event naming it: stored {got}, now {want}"
        return out

    restore = RealtimeSession.restore.__func__  # type: ignore[attr-defined]

    def seeded_restore(cls: Any, state: dict[str, Any], **kwargs: Any) -> Any:
        """A restored session's store holds the records of the snapshot it came from."""
        session = restore(cls, state, **kwargs)
        records[id(session)] = {item.id: snapshot.item_bytes(item) for item in session.conversation}
        return session

    monkeypatch.setattr(RealtimeSession, "take", checked_take)
    monkeypatch.setattr(RealtimeSession, "restore", classmethod(seeded_restore))
    yield
