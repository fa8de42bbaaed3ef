"""What the client knows about its session's event stream (Sans-I/O).

``SessionStream`` turns raw messages into events and keeps the state a
resume needs: the session id, the current resume token, the last
``server_event_seq`` delivered, the replay window, what was acknowledged. It
does no I/O; ``RealtimeClient`` feeds it messages and asks it what to send.

Ordering rules it enforces:

- an event with ``0 < server_event_seq <= last_seq`` is a duplicate (a replay
  overlapping what was already delivered) and is dropped;
- ``server_event_seq: 0`` marks a connection-level event (``session.resumed``,
  ``session.replaced``, ``session.resync_required``, refusals): delivered,
  never counted;
- ``session.resync_required`` moves ``last_seq`` to its
  ``last_server_event_seq``: the stream continues from there.
"""

from __future__ import annotations

import base64
import logging
from collections import OrderedDict
from typing import Any

import orjson

from omni_gateway_client.frames import AUDIO_DELTA, BETA_AUDIO_DELTA, FrameError, decode_audio_frame
from omni_gateway_client.options import ClientStats

log = logging.getLogger("omni.client")

AUDIO_DELTAS = frozenset({AUDIO_DELTA, BETA_AUDIO_DELTA})
_MAX_TRACKED_ITEMS = 256  # output items remembered to fill in binary deltas' response_id


class SessionStream:
    def __init__(self, *, beta: bool, ack_every: int, stats: ClientStats) -> None:
        self.audio_type = BETA_AUDIO_DELTA if beta else AUDIO_DELTA
        self.ack_every = max(1, ack_every)
        self.stats = stats
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq = 0
        self.acked = 0
        self.ack_due = False  # an ack should go out now (after a replay or a resync)
        self.replay: tuple[int, int] | None = None  # seq window announced by session.resumed
        self.replaced = False
        self._items: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # item id -> (response_id, output_index)

    # --- incoming -------------------------------------------------------------------------------

    def ingest(self, msg: str | bytes) -> dict[str, Any] | None:
        """Decode, de-duplicate and observe one message; None when it is not for the application."""
        if isinstance(msg, bytes):
            try:
                event = decode_audio_frame(msg, event_type=self.audio_type)
            except FrameError as exc:
                self.stats.undecodable_frames += 1
                log.warning("realtime session %s: dropped a binary frame: %s", self.session_id, exc)
                return None
            ids = self._items.get(event["item_id"])
            if ids is not None:
                event["response_id"], event["output_index"] = ids
        else:
            parsed = parse(msg)
            if parsed is None:
                self.stats.undecodable_frames += 1
                return None
            event = parsed
        seq = event.get("server_event_seq")
        if isinstance(seq, int) and seq > 0:
            if seq <= self.last_seq:
                self.stats.duplicates_dropped += 1
                return None
            if self.replay is not None and self.replay[0] <= seq <= self.replay[1]:
                self.stats.replayed_events += 1
            elif seq != self.last_seq + 1 and self.last_seq > 0:
                self.stats.gaps += 1
                log.warning("realtime session %s: event seq jumped from %d to %d", self.session_id, self.last_seq, seq)
            self.last_seq = seq
            if self.replay is not None and seq >= self.replay[1]:
                self.replay = None
                self.ack_due = True
        self.observe(event)
        return event

    def observe(self, event: dict[str, Any]) -> None:
        """Update the stream's state from one event (and turn base64 audio into bytes)."""
        kind = event.get("type")
        token = event.get("resume_token")
        if isinstance(token, str) and token:
            self.resume_token = token
        if kind in AUDIO_DELTAS:
            delta = event.get("delta")
            if isinstance(delta, str):
                try:
                    event["delta"] = base64.b64decode(delta)
                except ValueError:  # binascii.Error: left as the server sent it
                    self.stats.undecodable_frames += 1
        elif kind == "session.created":
            session = event.get("session")
            if isinstance(session, dict) and isinstance(session.get("id"), str):
                self.session_id = session["id"]
        elif kind == "session.resync_required":
            self._resync(event)
        elif kind == "session.replaced":
            self.replaced = True
        elif kind == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                self._items[item["id"]] = (event.get("response_id"), event.get("output_index"))
                while len(self._items) > _MAX_TRACKED_ITEMS:
                    self._items.popitem(last=False)
        elif kind == "response.done":
            for item in (event.get("response") or {}).get("output") or []:
                if isinstance(item, dict):
                    self._items.pop(item.get("id", ""), None)

    def _resync(self, event: dict[str, Any]) -> None:
        self.stats.resyncs += 1
        if isinstance(event.get("session_id"), str):
            self.session_id = event["session_id"]
        last = event.get("last_server_event_seq")
        if isinstance(last, int):
            self.last_seq = last
        self.replay = None
        self.ack_due = True
        self._items.clear()

    # --- resuming -------------------------------------------------------------------------------

    @property
    def can_resume(self) -> bool:
        return self.session_id is not None and self.resume_token is not None

    def resume_request(self) -> dict[str, Any]:
        return {
            "type": "session.resume",
            "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
        }

    def resumed(self, event: dict[str, Any]) -> None:
        """``session.resumed``: store the rotated token and expect the announced replay."""
        self.stats.resumes += 1
        if isinstance(event.get("session_id"), str):
            self.session_id = event["session_id"]
        self.observe(event)
        start, end = event.get("replay_from"), event.get("replay_to")
        if isinstance(start, int) and isinstance(end, int) and end >= start and end > self.last_seq:
            self.replay = (start, end)
        else:
            self.replay = None
            self.ack_due = True  # nothing to replay: ack right away

    def restart(self, created: dict[str, Any], highest_seq: int) -> str | None:
        """Continue in a new session (a refused resume); returns the previous session id."""
        previous = self.session_id
        self.session_id = self.resume_token = None
        self.acked = 0
        self.replay = None
        self.ack_due = False
        self._items.clear()
        self.observe(created)
        self.last_seq = highest_seq
        return previous

    # --- acknowledging --------------------------------------------------------------------------

    @property
    def ack_wanted(self) -> bool:
        """An ack should go out now (only servers that gave a resume token get acks)."""
        if self.resume_token is None:
            return False
        return self.ack_due or self.last_seq - self.acked >= self.ack_every

    def ack_request(self) -> dict[str, Any]:
        return {"type": "session.event_ack", "last_received_server_event_seq": self.last_seq}

    def acked_to(self, seq: int) -> None:
        self.acked = seq
        self.ack_due = False
        self.stats.acks_sent += 1


def parse(msg: str | bytes) -> dict[str, Any] | None:
    """A JSON text message as a dict; None for binary, non-JSON or non-object messages."""
    if isinstance(msg, bytes):
        return None
    try:
        event = orjson.loads(msg)
    except orjson.JSONDecodeError:
        log.warning("dropped a server message that is not JSON")
        return None
    return event if isinstance(event, dict) else None
