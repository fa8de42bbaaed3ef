"""Every state-changing event marks the session for a snapshot, and the snapshot
then holds the state the event announces (what write-ahead commits before the
event reaches the client). Deltas never ask for a snapshot: they stay batched.

Driven on the Sans-I/O session, as test_session.py is: each step starts with a
clean ``dirty`` flag, and after it the session is rebuilt from its
``snapshot_state`` on a "new replica" and compared with what the events said.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.session_config import SessionConfig
from gateway.session.events import LIVE_STATE_EVENTS, REALTIME_STATE_EVENTS, STATE_EVENTS
from gateway.session.session import RealtimeSession
from orchestrator.engine import AudioDelta, Finished, TextDelta
from orchestrator.engines.passthrough import PassthroughEngine

INFO = PassthroughEngine().info
TONE = PassthroughEngine()._chunk  # 20 ms of 24 kHz PCM16
SILENCE_200MS = b"\x00\x00" * 4800


class Steps:
    def __init__(self, *, beta: bool = False) -> None:
        self.session = RealtimeSession(
            session_id="sess_state",
            config=SessionConfig(model="m", turn_detection=None),
            engine=INFO,
            vad_factory=None,
            beta=beta,
        )
        self.seen: set[str] = set()

    def step(self, action: Any) -> tuple[list[dict[str, Any]], RealtimeSession]:
        """Run ``action`` from a clean snapshot flag; returns its events and the
        session as another replica would rebuild it from the snapshot."""
        s = self.session
        s.dirty = False
        action(s)
        events, _ = s.take()
        kinds = {e["type"] for e in events}
        changed = kinds & STATE_EVENTS
        self.seen |= changed
        if changed:
            assert s.dirty, f"{sorted(changed)} did not mark the session for a snapshot"
        else:
            assert not s.dirty, f"{sorted(kinds)} asked for a snapshot: deltas must stay batched"
        state = orjson.loads(orjson.dumps(s.snapshot_state()))  # as the store keeps it
        return events, RealtimeSession.restore(state, engine=INFO, vad_factory=None)

    def client(self, event: dict[str, Any]) -> Any:
        return lambda s: s.handle(ce.decode(orjson.dumps(event)))


def _items(session: RealtimeSession) -> list[tuple[str, str, str]]:
    return [(it.id, it.role, it.status) for it in session.conversation]


def test_every_state_event_marks_a_snapshot_that_holds_what_it_announces() -> None:
    t = Steps()

    events, restored = t.step(lambda s: s.start(resume_token="rt_x"))
    assert restored.id == "sess_state" and restored.render_config() == events[0]["session"]

    update = {"type": "realtime", "instructions": "be brief", "audio": {"output": {"voice": "tone"}}}
    events, restored = t.step(t.client({"type": "session.update", "session": update}))
    updated = next(e for e in events if e["type"] == "session.updated")
    assert restored.render_config() == updated["session"]

    def commit_audio(s: RealtimeSession) -> None:
        s.append_audio(SILENCE_200MS, None)
        s.handle(ce.decode(orjson.dumps({"type": "input_audio_buffer.commit"})))

    events, restored = t.step(commit_audio)
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] in {it.id for it in restored.conversation}

    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
    events, restored = t.step(t.client({"type": "conversation.item.create", "item": text}))
    added = next(e for e in events if e["type"] == "conversation.item.added")
    assert restored.conversation.get(added["item"]["id"]) is not None
    assert _items(restored) == _items(t.session)

    events, restored = t.step(t.client({"type": "response.create"}))
    created = next(e for e in events if e["type"] == "response.created")
    assert restored.active_response_id == created["response"]["id"]  # a takeover knows it started
    response_id = created["response"]["id"]

    _, restored = t.step(lambda s: [s.on_response(response_id, o) for o in (TextDelta("w0 "), AudioDelta(TONE))])
    assert restored.active_response_id == response_id

    events, restored = t.step(lambda s: s.on_response(response_id, Finished()))
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert restored.active_response_id is None  # a takeover will not end it again
    answer = done["response"]["output"][0]["id"]
    assert restored.conversation.get(answer) is not None
    assert restored.conversation.get(answer).status == "completed"  # type: ignore[union-attr]

    truncate = {"type": "conversation.item.truncate", "item_id": answer, "content_index": 0, "audio_end_ms": 10}
    events, restored = t.step(t.client(truncate))
    assert [e["type"] for e in events] == ["conversation.item.truncated"]
    assert restored.conversation.get(answer).content[0].audio_ms == 10  # type: ignore[union-attr]

    events, restored = t.step(t.client({"type": "conversation.item.delete", "item_id": added["item"]["id"]}))
    assert [e["type"] for e in events] == ["conversation.item.deleted"]
    assert restored.conversation.get(added["item"]["id"]) is None
    assert _items(restored) == _items(t.session)

    # The beta's transcription sessions (a beta session is rebuilt as a beta one).
    b = Steps(beta=True)
    b.step(lambda s: s.start(resume_token="rt_x"))
    update = {"input_audio_transcription": {"model": "whisper-1"}}
    events, restored = b.step(b.client({"type": "transcription_session.update", "session": update}))
    assert [e["type"] for e in events] == ["transcription_session.updated"]
    assert restored.config.type == "transcription" and restored.config.transcription is not None
    seen = t.seen | b.seen
    assert seen == REALTIME_STATE_EVENTS, f"never produced: {sorted(REALTIME_STATE_EVENTS - seen)}"


def test_the_state_events_are_the_ones_the_readme_names() -> None:
    # docs/sessions.md (GPT-Live's in docs/live.md): the events that reach the
    # client only once stored.
    assert LIVE_STATE_EVENTS == {
        "session.started",
        "session.updated",
        "session.input_audio.muted",
        "session.input_audio.unmuted",
        "session.instructions.appended",
        "session.thinking.appended",
        "session.commentary.appended",
        "session.delegation.created",
        "session.output_audio.fixture.playing",
        "session.output_audio.fixture.played",
        "session.closed",
    }
    assert REALTIME_STATE_EVENTS == {
        "session.created",
        "session.updated",
        "transcription_session.updated",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.deleted",
        "conversation.item.truncated",
        "response.created",
        "response.done",
    }
