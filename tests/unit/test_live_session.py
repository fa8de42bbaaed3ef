"""GPT-Live, Sans-I/O: its strict decoder and configuration, and ``LiveSession`` driven
directly (client events in, Live events out, engine outputs fed back, timers fired),
with what a snapshot keeps for the replica that takes the session over."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
import pydantic
import pytest
from openai.types.live import ConnectServerEvent

from gateway.protocol import client_events as ce
from gateway.protocol import live_config as lc
from gateway.protocol import live_events as le
from gateway.protocol.dialects import LIVE
from gateway.protocol.errors import ProtocolError
from gateway.protocol.session_config import SessionConfig
from gateway.session.effects import Cancel, CutAudio, Feed, StartConversation, StartResponse, Wake
from gateway.session.events import LIVE_STATE_EVENTS
from gateway.session.kinds import kind_of, restore_kind
from gateway.session.live import USAGE_EVERY_S, LiveSession
from orchestrator.engine import (
    AnswerStarted,
    AudioChunk,
    AudioDelta,
    Finished,
    Heard,
    SpeechStarted,
    SpeechStopped,
    TextChunk,
    TextDelta,
)
from orchestrator.engines.passthrough import PassthroughEngine

INFO = PassthroughEngine().info
ConnectServerEvent = pydantic.TypeAdapter(ConnectServerEvent)
TONE = PassthroughEngine()._chunk  # 20 ms of 24 kHz PCM16


class Clock:
    """The pacing's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def session(config: dict[str, Any] | None = None, clock: Clock | None = None) -> LiveSession:
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=INFO, vad_factory=None,
                    pace_clock=clock or Clock())  # fmt: skip
    s.configure(config or {"model": "gpt-live-1"})
    s.start(resume_token="tok", configured=True, event_id="start")
    return s


def take(s: LiveSession) -> tuple[list[dict[str, Any]], list[Any]]:
    events, effects = s.take()
    return [orjson.loads(LIVE.encode(e)) for e in events], effects


def test_a_started_session_answers_its_start_and_asks_to_report_usage() -> None:
    s = session({"model": "gpt-live-1", "input": [{"role": "developer", "content": [{"text": "be kind"}]}]})
    events, effects = take(s)
    assert [e["type"] for e in events] == ["session.started", "info"]
    assert events[0]["client_event_id"] == "start" and events[0]["resume_token"] == "tok"
    assert events[1]["code"] == "voice_substituted" and "'tone'" in events[1]["message"]  # the passthrough's voice
    assert effects == [Wake(USAGE_EVERY_S, "usage")]
    assert [(it.role, it.content[0].text) for it in s.conversation] == [("system", "be kind")]


def test_usage_is_the_whole_seconds_of_the_session_timeline_and_is_reported_again() -> None:
    s = session()
    take(s)
    s.handle(ce.AudioAppend(None, bytes(48000 * 2 + 480)))  # 2.01 s heard
    s.wake("usage")
    events, effects = take(s)
    assert events[-1]["type"] == "session.usage.updated" and events[-1]["usage"] == {"seconds": 2.0}
    assert effects == [Wake(USAGE_EVERY_S, "usage")]


def test_commentary_is_said_after_the_answer_under_way_and_context_is_not_said() -> None:
    s = session()
    take(s)
    s.handle(le.ContextAppend("c1", "commentary", "first", None))
    events, effects = take(s)
    start = next(e for e in effects if isinstance(e, StartResponse))
    assert start.request.say == "first" and "first" in start.request.instructions
    s.handle(le.ContextAppend("c2", "commentary", "second", None))  # while "first" is said
    s.handle(le.ContextAppend("t", "thinking", "quiet", None))
    events, effects = take(s)
    assert [e["type"] for e in events] == ["session.commentary.appended", "session.thinking.appended"]
    assert not [e for e in effects if isinstance(e, StartResponse)]
    rid = start.request.request_id
    s.on_response(rid, TextDelta("first "))
    s.on_response(rid, AudioDelta(TONE))
    s.on_response(rid, Finished())
    events, effects = take(s)
    assert [e["type"] for e in events] == ["session.output_audio.delta", "session.output_transcript.delta"]
    assert events[1]["delta"] == "first " and events[1]["end_ms"] - events[1]["start_ms"] == 20
    again = next(e for e in effects if isinstance(e, StartResponse))
    assert again.request.say == "second"


def test_a_fixture_interrupts_the_answer_mutes_input_and_ends_on_its_timer() -> None:
    clock = Clock()
    s = session(clock=clock)
    take(s)
    s.handle(le.ContextAppend("c", "commentary", "talking", None))
    _, effects = take(s)
    rid = next(e for e in effects if isinstance(e, StartResponse)).request.request_id
    s.handle(le.FixturePlay("f", bytes(24000)))  # half a second
    events, effects = take(s)
    assert Cancel(rid) in effects and Wake(0.5, "fixture") in effects
    assert [e["type"] for e in events][:1] == ["session.output_audio.fixture.playing"]
    # Paced: 300 ms (the lead) go at once, in 100 ms deltas; the rest as the client plays it.
    audio = [e for e in events if e["type"] == "session.output_audio.delta"]
    assert [len(base64.b64decode(e["delta"])) for e in audio] == [4800] * 3
    assert s.fixture == "f"
    s.handle(ce.AudioAppend(None, TONE))  # heard as silence while it plays
    assert s.input_audio.audio_ms == 20
    s.wake("fixture")  # (early: its audio has not all gone out) it waits
    events, effects = take(s)
    assert not events and Wake(0.1, "fixture") in effects
    clock.now += 0.2
    s.wake("pace")
    events, _ = take(s)
    assert [len(base64.b64decode(e["delta"])) for e in events] == [4800] * 2
    s.wake("fixture")
    events, _ = take(s)
    assert events[-1] == {**events[-1], "type": "session.output_audio.fixture.played", "client_event_id": "f"}
    assert s.fixture is None


def test_a_snapshot_restores_the_live_session_on_another_replica() -> None:
    s = session({"model": "gpt-live-1", "audio": {"output": {"voice": {"id": "v1"}}}, "store": True})
    s.handle(le.InputMute("m", True))
    s.delegations["item_x"] = "client"
    s.handle(le.ContextAppend("c", "commentary", "pending", None))
    s.spelling.output_end_ms = 1234.0
    state = orjson.loads(orjson.dumps(s.snapshot_state(), default=str))
    again = restore_kind(state).restore(state, engine=INFO, vad_factory=None)
    assert isinstance(again, LiveSession) and again.dialect is LIVE
    assert again.live == s.live and again.muted and again.delegations == {"item_x": "client"}
    assert again.spelling.output_end_ms == 1234.0
    assert again.render_config() == s.render_config()
    assert Wake(USAGE_EVERY_S, "usage") in again.effects  # its usage reports go on where it lands


def test_the_live_kind_hands_out_live_ids() -> None:
    assert kind_of(LIVE).id_prefix == "live_" and kind_of(LIVE).cls is LiveSession


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ({"type": "session.input_audio.append", "audio": "AAAA", "x": 1}, "unknown_parameter", "x"),
        ({"type": "session.input_audio.append"}, "missing_required_parameter", "audio"),
        ({"type": "session.commentary.append", "content": "x"}, "missing_required_parameter", "delegation_id"),
        ({"type": "session.output_audio.fixture.play", "audio": "AAAA"}, "invalid_audio_format", "audio"),  # 3 bytes
        ({"type": "transport.dtmf.send", "event": "12"}, "invalid_value", "event"),
        ({"type": "decision.item.delete", "item_id": "x"}, "decisions_unsupported", "type"),
        ({"type": "input_audio_buffer.commit"}, "unknown_event", "type"),
        ({"type": "session.close", "event_id": 7}, "invalid_type", "event_id"),
    ],
)
def test_a_client_event_is_strict(raw: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        le.decode(orjson.dumps(raw))
    assert (exc.value.code, exc.value.param) == (code, param)


def test_a_fixture_longer_than_thirty_seconds_is_refused() -> None:
    audio = bytes(2 * 24000 * 31)
    raw = orjson.dumps({"type": "session.output_audio.fixture.play", "audio": base64.b64encode(audio).decode()})
    with pytest.raises(ProtocolError) as exc:
        le.decode(raw)
    assert exc.value.param == "audio" and "30 s" in exc.value.message


def test_the_configuration_renders_what_it_was_given_and_refuses_changes_it_cannot_make() -> None:
    shown = [{"type": "session.output_transcript.delta"}, {"type": "response.event", "response_event": "response.done"}]
    live = lc.parse_start({"model": "m", "delegation": {"type": "responses", "responses": {"model": "b"}},
                           "client": {"data_channel": {"allowed_client_events": [],
                                                       "allowed_server_events": shown}}})  # fmt: skip
    rendered = lc.render(live, session_id="live_1", expires_at=0)
    assert rendered["delegation"] == {"type": "responses", "responses": {"model": "b"}}
    assert rendered["client"]["data_channel"]["allowed_server_events"][0] == {"type": "session.output_transcript.delta"}
    assert lc.from_dict(orjson.loads(orjson.dumps(lc.to_dict(live)))) == live
    updated = lc.parse_update(live, {"delegation": {"type": "responses", "responses": {"instructions": "x"}}})
    assert updated.delegation is not None and updated.delegation.responses == {"model": "b", "instructions": "x"}
    for update, param in (
        ({"delegation": None}, "session.delegation"),
        ({"delegation": {"type": "client"}}, "session.delegation.type"),
        ({"triggers": [{"type": "decisions"}]}, "session.triggers"),
        ({"audio": {}}, "session.audio"),
    ):
        with pytest.raises(ProtocolError) as exc:
            lc.parse_update(live, update)
        assert exc.value.param == param


def test_every_live_state_event_marks_a_snapshot_that_restores_it() -> None:
    """As tests/unit/test_state_events.py proves for the Realtime API: each Live event that
    says the session changed marks it for a snapshot (write-ahead), and a session rebuilt
    from that snapshot holds the change; the audio and transcript deltas never ask for one."""
    s = LiveSession(session_id="live_state", config=SessionConfig(model="m"), engine=INFO, vad_factory=None)
    s.configure({"model": "gpt-live-1"})
    seen: set[str] = set()

    def step(action: Any, *, quiet: bool = False) -> LiveSession:
        """``quiet``: the step sends deltas only and changes nothing a snapshot keeps."""
        s.dirty = False
        action()
        events, _ = take(s)
        changed = {e["type"] for e in events} & LIVE_STATE_EVENTS
        seen.update(changed)
        if changed:
            assert s.dirty, f"{sorted(changed)} did not mark the session for a snapshot"
        if quiet:
            assert not s.dirty and events, [e["type"] for e in events]
        state = orjson.loads(orjson.dumps(s.snapshot_state()))
        restored = LiveSession.restore(state, engine=INFO, vad_factory=None)
        assert restored.render_config() == s.render_config() and restored.muted == s.muted
        assert [(it.role, it.content[0].text) for it in restored.conversation] == [
            (it.role, it.content[0].text) for it in s.conversation
        ]
        return restored

    step(lambda: s.start(resume_token="tok"))
    step(lambda: s.handle(le.InputMute("m", True)))
    step(lambda: s.handle(le.InputMute("u", False)))
    step(lambda: s.handle(le.SessionUpdate("up", {"triggers": []})))
    for kind in ("instructions", "thinking"):
        step(lambda kind=kind: s.handle(le.ContextAppend(kind, kind, f"some {kind}", None)))  # type: ignore[misc]
    step(lambda: s.handle(le.ContextAppend("c", "commentary", "said", None)))
    rid = s.active_response_id
    assert rid is not None
    step(lambda: (s.on_response(rid, TextDelta("said ")), s.on_response(rid, AudioDelta(TONE))))  # opens the answer
    step(lambda: (s.on_response(rid, TextDelta("more ")), s.on_response(rid, AudioDelta(TONE))), quiet=True)
    step(lambda: s.on_response(rid, Finished()))  # (unsent: the answer's end is in the snapshot all the same)
    step(lambda: s.handle(le.FixturePlay("f", bytes(4800))))
    step(lambda: s.wake("fixture"))
    restored = step(lambda: s.handle(le.Close("bye")))
    assert restored.closed
    # session.delegation.created: tests/unit/test_live_delegation.py (its own step).
    assert seen == LIVE_STATE_EVENTS - {"session.delegation.created"}, sorted(LIVE_STATE_EVENTS - seen)


def test_a_websocket_answer_is_paced_and_a_barge_in_drops_what_was_not_sent() -> None:
    clock = Clock()
    s = session(clock=clock)
    take(s)
    s.handle(le.ContextAppend("c", "commentary", "talking", None))
    _, effects = take(s)
    rid = next(e for e in effects if isinstance(e, StartResponse)).request.request_id
    s.on_response(rid, TextDelta("one two three four "))
    s.on_response(rid, AudioDelta(TONE * 50))  # a second, made at once
    s.on_response(rid, Finished())
    events, effects = take(s)
    audio = [e for e in events if e["type"] == "session.output_audio.delta"]
    said = [e for e in events if e["type"] == "session.output_transcript.delta"]
    assert sum(len(base64.b64decode(e["delta"])) for e in audio) == 300 * 48  # the lead, not the second
    assert "".join(e["delta"] for e in said) == "one "  # 30% of its audio: its first word
    assert said[-1]["end_ms"] - said[0]["start_ms"] == 300
    wakes = [e.after_s for e in effects if isinstance(e, Wake) and e.key == "pace"]
    assert wakes == [pytest.approx(0.1)] and s.output_pending  # (a drain waits for it)
    clock.now += 0.1
    s.wake("pace")
    events, _ = take(s)
    assert [len(base64.b64decode(e["delta"])) for e in events if e["type"] == "session.output_audio.delta"] == [4800]
    s.spelling.spell("input_audio_buffer.speech_started", {"audio_start_ms": 0, "item_id": "item_u"})  # barge-in
    assert not s.output_pending
    clock.now += 5
    s.wake("pace")
    events, _ = take(s)
    assert not [e for e in events if e["type"].startswith("session.output")]  # nothing more of it, nor its words


class LevelVad:
    """A speech detector by loudness with graded probabilities (rms / 10,000, at most 1): a
    stand-in where the test is about the wake threshold, not detection."""

    FRAME = 512

    def __init__(self) -> None:
        self._rest = b""

    def process(self, pcm16_16k: bytes) -> list[float]:
        data = self._rest + pcm16_16k
        n = len(data) // (2 * self.FRAME)
        self._rest = data[n * 2 * self.FRAME :]
        frames = np.frombuffer(data[: n * 2 * self.FRAME], "<i2").astype(np.float64).reshape(n, self.FRAME)
        return [min(1.0, float(rms) / 10_000) for rms in np.sqrt((frames**2).mean(axis=1))]

    def reset(self) -> None:
        self._rest = b""


def tone(ms: int, amplitude: float) -> bytes:
    t = np.arange(24 * ms) / 24000
    return (amplitude * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()


def hear(s: LiveSession, pcm: bytes) -> None:
    for at in range(0, len(pcm), 960):  # 20 ms appends
        s.handle(ce.AudioAppend(None, pcm[at : at + 960]))


def test_a_wake_policy_pauses_inference_until_speech_and_again_when_idle() -> None:
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=INFO, vad_factory=LevelVad)
    s.configure({"model": "gpt-live-1", "idle_timeout_s": 1, "wake_policy": {"type": "speech", "vad_threshold": 0.8}},
                media=True)  # fmt: skip
    s.start(resume_token="tok", configured=True)
    take(s)
    assert s.paused  # the first wake is speech's
    hear(s, tone(1000, 0))
    s.handle(le.ContextAppend("c", "commentary", "later", None))  # nothing is said while paused
    hear(s, tone(600, 8485))  # speech at 0.6: under the policy's 0.8, no wake
    events, effects = take(s)
    assert s.paused and not [e for e in effects if isinstance(e, StartResponse)]
    assert "session.resumed" not in [e["type"] for e in events]
    hear(s, tone(600, 20_000) + tone(800, 0))  # clear speech: it wakes inference and is the model's turn
    events, effects = take(s)
    types = [e["type"] for e in events]
    assert not s.paused and types.count("session.resumed") == 1
    for e in events:
        if e["type"] in ("session.resumed", "session.paused"):
            ConnectServerEvent.validate_python(e)  # (a Live WebRTC session's events: the SDK's shapes)
    rid = next(e for e in effects if isinstance(e, StartResponse)).request.request_id
    s.on_response(rid, AudioDelta(TONE))
    s.on_response(rid, Finished())
    _, effects = take(s)
    assert any(isinstance(e, StartResponse) for e in effects)  # the commentary waited for the wake
    said = next(e for e in effects if isinstance(e, StartResponse)).request.request_id
    s.on_response(said, Finished())
    hear(s, tone(900, 0))  # under a second idle: still active
    assert not s.paused
    hear(s, tone(200, 0))
    events, _ = take(s)
    assert s.paused and [e["type"] for e in events].count("session.paused") == 1
    usage = s.usage()
    assert usage["active_seconds"] + usage["paused_seconds"] == usage["seconds"] and usage["paused_seconds"] >= 1
    state = orjson.loads(orjson.dumps(s.snapshot_state(), default=str))
    again = restore_kind(state).restore(state, engine=INFO, vad_factory=LevelVad)
    assert isinstance(again, LiveSession) and again.paused and again.usage() == usage


def test_a_wake_policy_is_refused_without_a_speech_detector_and_idle_timeout_without_a_policy() -> None:
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=INFO, vad_factory=None)
    with pytest.raises(ProtocolError) as err:
        s.configure({"model": "gpt-live-1", "wake_policy": {"type": "speech"}}, media=True)
    assert (err.value.code, err.value.param) == ("unsupported", "session.wake_policy")
    with pytest.raises(ProtocolError) as err:
        lc.parse_start({"model": "gpt-live-1", "idle_timeout_s": 5}, media=True)
    assert (err.value.code, err.value.param) == ("invalid_value", "session.idle_timeout_s")


def test_a_session_keeps_its_lead_on_the_replica_that_restores_it() -> None:
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=INFO, vad_factory=None,
                    output_lead_ms=150)  # fmt: skip
    s.configure({"model": "gpt-live-1"})
    s.start(resume_token="tok", configured=True)
    state = orjson.loads(orjson.dumps(s.snapshot_state(), default=str))
    again = restore_kind(state).restore(state, engine=INFO, vad_factory=None)  # (built with the default lead)
    assert isinstance(again, LiveSession) and again.spelling.output is not None
    assert again.spelling.output.lead_ms == 150


# --- an engine that takes its own turns (engine_turns.py) ---------------------------------


def turns_session(clock: Clock | None = None) -> LiveSession:
    """A session on an engine that takes its own turns, with no speech detector here."""
    engine = replace(INFO, takes_turns=True)
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=engine, vad_factory=None,
                    pace_clock=clock or Clock())  # fmt: skip
    s.configure({"model": "gpt-live-1", "instructions": "Be brief."})
    s.start(resume_token="tok", configured=True, event_id="start")
    take(s)
    return s


def test_an_engine_that_takes_its_turns_hears_everything_and_its_answers_and_barge_in_pass_through() -> None:
    clock = Clock()
    s = turns_session(clock)
    s.handle(ce.AudioAppend(None, TONE * 5))
    _, effects = take(s)
    (start,) = [e for e in effects if isinstance(e, StartConversation)]
    rid = start.request.request_id
    assert start.request.instructions == "Be brief."
    assert [type(e) for e in effects] == [StartConversation, Feed]  # no turn of the gateway's own
    assert effects[1].chunk == AudioChunk(TONE * 5)  # (24 kHz in, 24 kHz to the engine)
    s.handle(le.InputMute(None, True))
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = take(s)
    assert [e.chunk for e in effects if isinstance(e, Feed)] == [AudioChunk(bytes(len(TONE)))]  # muted: silence
    s.handle(le.InputMute(None, False))
    # Silent context reaches the conversation under way (commentary does not: the gateway says it).
    s.handle(le.ContextAppend(None, "instructions", "Speak slowly.", None))
    s.handle(le.ContextAppend(None, "commentary", "The table is booked.", None))
    _, effects = take(s)
    assert [e.chunk for e in effects if isinstance(e, Feed)] == [TextChunk("Speak slowly.")]
    (say,) = [e for e in effects if isinstance(e, StartResponse)]  # said by an answer of the gateway's
    s.on_response(say.request.request_id, Finished())
    take(s)
    # The engine's turn: speech, its transcript, then an answer it starts by itself.
    s.on_turn(rid, SpeechStarted(20.0))
    s.on_turn(rid, SpeechStopped(100.0))
    s.on_turn(rid, Heard("hello there", final=True))
    s.on_turn(rid, AnswerStarted())
    s.on_turn(rid, TextDelta("Hi "))
    s.on_turn(rid, AudioDelta(TONE * 50))  # a second of it, paced out
    events, effects = take(s)
    heard = [e for e in events if e["type"] == "session.input_transcript.delta"]
    assert [(e["delta"], e["start_ms"], e["end_ms"]) for e in heard] == [("hello there", 20, 100)]
    assert sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "session.output_audio.delta") > 0
    assert any(it.role == "user" and it.as_message().text == "hello there" for it in s.conversation)
    assert not [e for e in effects if isinstance(e, StartResponse)]  # the engine's answer: no request of ours
    # The engine hears the caller over its answer: what was not sent of it is not.
    s.on_turn(rid, SpeechStarted())
    events, effects = take(s)
    assert any(isinstance(e, CutAudio) for e in effects) and not s.output_pending
    assert s.active_response_id is None
    s.on_turn(rid, AudioDelta(TONE * 10))  # (what the engine made of it before it stopped)
    s.on_turn(rid, Finished())
    clock.now += 5
    s.wake("pace")
    events, _ = take(s)
    assert not [e for e in events if e["type"] == "session.output_audio.delta"]
    for e in events:
        ConnectServerEvent.validate_python(e)


def test_commentary_waits_for_the_callers_turn_the_engine_hears_and_its_answer() -> None:
    s = turns_session()
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = take(s)
    rid = next(e for e in effects if isinstance(e, StartConversation)).request.request_id
    s.on_turn(rid, SpeechStarted())
    s.handle(le.ContextAppend(None, "commentary", "Your table is booked.", None))
    s.on_turn(rid, SpeechStopped())
    _, effects = take(s)
    assert not [e for e in effects if isinstance(e, StartResponse)]  # the caller has the floor
    s.on_turn(rid, AnswerStarted())  # the engine answers the caller (before its transcript is whole)
    s.on_turn(rid, Heard("is it booked", final=True))
    _, effects = take(s)
    assert not [e for e in effects if isinstance(e, StartResponse)]  # its answer goes first
    s.on_turn(rid, TextDelta("Let me see."))
    s.on_turn(rid, Finished())
    _, effects = take(s)
    (say,) = [e for e in effects if isinstance(e, StartResponse)]
    assert say.request.say == "Your table is booked."
    # A turn the engine does not answer: said once its transcript is whole.
    s.on_response(say.request.request_id, Finished())
    s.on_turn(rid, SpeechStarted())
    s.handle(le.ContextAppend(None, "commentary", "It is for two.", None))
    s.on_turn(rid, SpeechStopped())
    s.on_turn(rid, Heard("thanks", final=True))
    _, effects = take(s)
    assert [e.request.say for e in effects if isinstance(e, StartResponse)] == ["It is for two."]


def test_a_failed_conversation_is_said_and_the_next_audio_starts_another() -> None:
    s = turns_session()
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = take(s)
    first = next(e for e in effects if isinstance(e, StartConversation)).request.request_id
    s.on_turns_failed(first, "upstream_lost", "upstream: the socket closed")
    events, _ = take(s)
    assert [(e["type"], e["error"]["code"]) for e in events] == [("error", "upstream_lost")]
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = take(s)
    second = next(e for e in effects if isinstance(e, StartConversation)).request.request_id
    assert second != first
    s.on_turn(first, AnswerStarted())  # (the conversation that failed says nothing more)
    assert s.active_response_id is None
    s.handle(le.Close(None))
    _, effects = take(s)
    assert Cancel(second) in effects


def test_a_restored_session_opens_its_own_conversation_with_what_was_said_as_context() -> None:
    s = turns_session()
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = take(s)
    rid = next(e for e in effects if isinstance(e, StartConversation)).request.request_id
    s.on_turn(rid, Heard("book a table", final=True))
    take(s)
    state = orjson.loads(orjson.dumps(s.snapshot_state(), default=str))
    engine = replace(INFO, takes_turns=True)
    again = restore_kind(state).restore(state, engine=engine, vad_factory=None)
    assert isinstance(again, LiveSession)
    again.effects.clear()
    again.handle(ce.AudioAppend(None, TONE))  # (the conversation was the lost replica's)
    (start,) = [e for e in again.effects if isinstance(e, StartConversation)]
    assert [(m.role, m.text) for m in start.request.messages if m.role == "user"] == [("user", "book a table")]


def test_a_wake_policy_is_refused_where_the_engine_takes_the_turns() -> None:
    s = LiveSession(session_id="live_test", config=SessionConfig(model="m"), engine=replace(INFO, takes_turns=True),
                    vad_factory=lambda: LevelVad())  # fmt: skip
    with pytest.raises(ProtocolError) as err:
        s.configure({"model": "gpt-live-1", "wake_policy": {"type": "speech"}}, media=True)
    assert err.value.code == "unsupported" and err.value.param == "session.wake_policy"
