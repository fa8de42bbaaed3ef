"""What one connection is sent of its session, and when: journal semantics, no I/O.

A session's events reach a connection in journal order, and at the moment the
journal allows:

- **Hold** (write-ahead, and a resume's replay): while held, live events wait;
  holds nest, and at the last release the held events go out, except those
  with a seq the replay already carried (``release(after_seq)``: replay
  de-duplication by seq, so nothing is sent twice across a resume).
- **Commit gate** (``gated``: the duplex dialect): a session event goes out only
  once the store holds it (``committed``), so a replica's crash never leaves
  the client ahead of the store. Nothing passes an event that waits, and a
  close waits (at most ``GATE_CLOSE_WAIT_S``) for what the gate still holds,
  and what a hold keeps back, so that the last event sent is the last event
  (the duplex dialect's ``session.closed``); ``closed()`` awaits it.
- **Replay**: a journaled event sent again as it was first sent, neither held
  nor gated (the store has it).

Connection events (``send_now``: resumed, resync, errors that are not the
session's) bypass all three.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from gateway.hosting.peer import Peer

GATE_CLOSE_WAIT_S = 1.0  # a gated connection's close waits this long at most for its last events' commit


class Delivery:
    def __init__(self, peer: Peer, *, gated: bool) -> None:
        self.peer = peer
        self.gated = gated
        self._held: list[tuple[dict[str, Any], bytes]] | None = None  # live events held back
        self._holds = 0
        self._release_after = 0
        self._gate: deque[tuple[dict[str, Any], bytes]] = deque()
        self._committed = 0  # the store holds the session's events up to this seq
        self._close_after_gate: tuple[int, str] | None = None
        self._closed = asyncio.Event()  # the peer was closed through close()
        self.closing = False

    def send(self, event: dict[str, Any], data: bytes) -> None:
        """One live session event (``data``: its JSON in the client's dialect)."""
        if self._held is not None:
            self._held.append((event, data))
        else:
            self._pass(event, data)

    def send_now(self, data: bytes) -> None:
        """A connection event: now, ahead of anything held or gated."""
        self.peer.send(data)

    def replay(self, data: bytes) -> None:
        self.peer.send(data)

    def hold(self) -> None:
        self._holds += 1
        if self._held is None:
            self._held = []

    def release(self, after_seq: int) -> None:
        """End one hold; at the last, send the held events above the seqs the replay
        (up to ``after_seq``) already carried."""
        self._holds = max(0, self._holds - 1)
        self._release_after = max(self._release_after, after_seq)
        if self._holds:
            return
        held, self._held = self._held or [], None
        after, self._release_after = self._release_after, 0
        for event, data in held:
            if event["server_event_seq"] > after:
                self._pass(event, data)
        if self._close_after_gate is not None and not self._gate:
            self._close(*self._close_after_gate)

    def committed(self, seq: int) -> None:
        """The store holds the session's events up to ``seq``."""
        if seq <= self._committed:
            return
        self._committed = seq
        gate = self._gate
        while gate and gate[0][0]["server_event_seq"] <= seq:
            event, data = gate.popleft()
            self.peer.send(data, event)
        if not gate and self._close_after_gate is not None and not self._held:
            self._close(*self._close_after_gate)

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued, and on a gated connection after what waits for its
        commit or is held back."""
        self.closing = True
        # (Held events, waiting for their commit, go out first on any connection: a drain closes
        # right after the response.done that made the session idle, and the client should read it.)
        if self._held is not None or (self.gated and self._gate):
            self._close_after_gate = (code, reason)
            asyncio.get_running_loop().call_later(GATE_CLOSE_WAIT_S, self._give_up)
            return
        self._close(code, reason)

    async def closed(self) -> None:
        """Until ``close`` has closed the peer."""
        await self._closed.wait()

    def _give_up(self) -> None:
        """No commit in time (the session ended without one): what waits goes out anyway."""
        if self._close_after_gate is None:
            return
        held, self._held, self._holds = self._held or [], None, 0
        self._gate.extend(entry for entry in held if entry[0]["server_event_seq"] > self._release_after)
        last = max((event["server_event_seq"] for event, _ in self._gate), default=self._committed)
        self.committed(last)
        if self._close_after_gate is not None:  # (nothing was waiting: committed() had nothing to do)
            self._close(*self._close_after_gate)

    def _close(self, code: int, reason: str) -> None:
        self._close_after_gate = None
        self.peer.close(code, reason)
        self._closed.set()

    def _pass(self, event: dict[str, Any], data: bytes) -> None:
        if self.gated and (self._gate or event["server_event_seq"] > self._committed):
            self._gate.append((event, data))  # order holds: nothing passes what waits
            return
        self.peer.send(data, event)
