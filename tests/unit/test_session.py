"""The Sans-I/O session state machine, driven directly: client events in,
server events and effects out, engine outputs fed back through on_response()
and on_transcription(). No socket, no engine task, no clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from support.session_driver import TONE, Driver

from gateway.audio.codecs import ulaw_encode
from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code
from gateway.protocol.session_config import OPENAI_VOICES, SessionConfig, TurnDetection
from gateway.session.effects import (
    Cancel,
    CloseSocket,
    EndInput,
    Feed,
    StartConversation,
    StartResponse,
    StartTranscription,
)
from gateway.session.session import RealtimeSession, SessionLimits
from orchestrator.engine import (
    AnswerStarted,
    AudioChunk,
    AudioDelta,
    Finished,
    Heard,
    Message,
    SpeechStarted,
    SpeechStopped,
    TextChunk,
    TextDelta,
    Usage,
)
from orchestrator.engines.passthrough import PassthroughEngine

RATE = 24000
MS = RATE * 2 // 1000  # bytes of 24 kHz PCM16 per millisecond


@pytest.fixture
def d() -> Driver:
    return Driver()


def assert_well_sequenced(events: list[dict[str, Any]], start: int = 1) -> None:
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(start, start + len(events)))
    ids = [e["event_id"] for e in events]
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == len(ids)


# --- event envelope ---------------------------------------------------------------


def test_start_emits_session_created_then_conversation_created() -> None:
    s = RealtimeSession(
        session_id="sess_x",
        config=SessionConfig(model="m", turn_detection=None),
        engine=PassthroughEngine().info,
        vad_factory=None,
    )
    s.start()
    events, effects = s.take()
    assert [e["type"] for e in events] == ["session.created", "conversation.created"]
    assert events[0]["server_event_seq"] == 1
    assert events[0]["session"]["id"] == "sess_x"
    assert events[0]["session"]["type"] == "realtime"
    # the conversation every response names (response.conversation_id)
    assert events[1]["conversation"] == {"id": s.conversation_id, "object": "realtime.conversation"}
    assert events[1]["server_event_seq"] == 2
    assert effects == []


def test_every_event_has_an_event_id_and_a_strictly_increasing_seq(d: Driver) -> None:
    d.user_text("hello")
    d.send({"type": "input_audio_buffer.append", "audio": _b64(bytes(200 * MS))})
    d.send({"type": "input_audio_buffer.commit"})
    d.send({"type": "conversation.item.retrieve", "item_id": "nope"})
    d.completed_audio_response()
    resp = d.respond()
    d.send({"type": "response.cancel"})
    d.output(resp, TextDelta("late"))
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}})
    assert len(d.events) > 25
    assert_well_sequenced(d.events)  # from session.created on
    assert d.session.seq == d.events[-1]["server_event_seq"]


def test_take_hands_over_events_once(d: Driver) -> None:
    d.user_text("x")
    assert d.session.take() == ([], [])


# --- input audio buffer --------------------------------------------------------------


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def append(d: Driver, ms: int, **extra: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    return d.send({"type": "input_audio_buffer.append", "audio": _b64(bytes(ms * MS)), **extra})


def test_first_append_starts_a_transcription_and_feeds_it(d: Driver) -> None:
    events, effects = append(d, 40)
    assert events == []
    assert isinstance(effects[0], StartTranscription)
    rid = effects[0].request.request_id
    assert rid.startswith("input_item_")
    assert effects[1] == Feed(rid, AudioChunk(bytes(40 * MS)))
    _, effects = append(d, 20)
    assert effects == [Feed(rid, AudioChunk(bytes(20 * MS)))]


def test_commit_ends_input_and_adds_a_user_audio_item(d: Driver) -> None:
    _, effects = append(d, 120)
    rid = effects[0].request.request_id
    events, effects = d.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert effects == [EndInput(rid)]
    assert d.types(events) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    item_id = events[0]["item_id"]
    assert rid == f"input_{item_id}"
    assert events[0]["previous_item_id"] is None
    item = events[1]["item"]
    assert (item["id"], item["role"], item["type"]) == (item_id, "user", "message")
    assert item["content"] == [{"type": "input_audio", "transcript": None}]


def test_commit_of_an_empty_buffer_is_refused(d: Driver) -> None:
    err = d.error({"type": "input_audio_buffer.commit", "event_id": "c0"})
    assert (err["code"], err["event_id"]) == (Code.BUFFER_TOO_SMALL, "c0")


def test_commit_of_less_than_100_ms_is_refused_and_keeps_the_audio(d: Driver) -> None:
    append(d, 80)
    err = d.error({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert (err["code"], err["event_id"]) == (Code.BUFFER_TOO_SMALL, "c1")
    append(d, 20)
    events, _ = d.send({"type": "input_audio_buffer.commit"})
    assert d.types(events)[0] == "input_audio_buffer.committed"


def test_second_commit_without_new_audio_is_refused(d: Driver) -> None:
    append(d, 100)
    d.send({"type": "input_audio_buffer.commit"})
    assert d.error({"type": "input_audio_buffer.commit"})["code"] == Code.BUFFER_TOO_SMALL


def test_clear_cancels_the_open_transcription_and_empties_the_buffer(d: Driver) -> None:
    _, effects = append(d, 200)
    rid = effects[0].request.request_id
    events, effects = d.send({"type": "input_audio_buffer.clear"})
    assert d.types(events) == ["input_audio_buffer.cleared"]
    assert effects == [Cancel(rid)]
    assert d.error({"type": "input_audio_buffer.commit"})["code"] == Code.BUFFER_TOO_SMALL


def test_clear_of_an_empty_buffer_is_acknowledged(d: Driver) -> None:
    events, effects = d.send({"type": "input_audio_buffer.clear"})
    assert (d.types(events), effects) == (["input_audio_buffer.cleared"], [])


def test_odd_byte_count_is_invalid_audio_for_pcm16(d: Driver) -> None:
    err = d.error({"type": "input_audio_buffer.append", "audio": _b64(b"\x00\x01\x02"), "event_id": "a1"})
    assert (err["code"], err["param"], err["event_id"]) == (Code.INVALID_AUDIO, "audio", "a1")


def test_append_over_max_append_ms_is_refused_and_dropped() -> None:
    d = Driver(limits=SessionLimits(max_append_ms=500))
    err = d.error({"type": "input_audio_buffer.append", "audio": _b64(bytes(501 * MS)), "event_id": "a2"})
    assert (err["code"], err["event_id"]) == (Code.APPEND_TOO_LARGE, "a2")
    assert d.error({"type": "input_audio_buffer.commit"})["code"] == Code.BUFFER_TOO_SMALL
    _, effects = append(d, 500)
    assert isinstance(effects[0], StartTranscription)


def test_buffer_over_max_buffer_ms_refuses_the_append_until_committed() -> None:
    d = Driver(limits=SessionLimits(max_buffer_ms=300))
    append(d, 200)
    err = d.error({"type": "input_audio_buffer.append", "audio": _b64(bytes(150 * MS)), "event_id": "a3"})
    assert (err["code"], err["event_id"]) == (Code.BUFFER_FULL, "a3")
    append(d, 100)  # exactly at the limit is fine
    events, _ = d.send({"type": "input_audio_buffer.commit"})
    assert d.types(events)[0] == "input_audio_buffer.committed"
    _, effects = append(d, 200)
    assert isinstance(effects[0], StartTranscription)


def test_clear_frees_the_buffer_for_more_audio() -> None:
    d = Driver(limits=SessionLimits(max_buffer_ms=300))
    append(d, 300)
    d.send({"type": "input_audio_buffer.clear"})
    events, _ = append(d, 300)
    assert events == []


def test_pcmu_input_is_decoded_and_resampled_for_the_engine() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        }
    )
    ulaw = ulaw_encode(bytes(2 * 800))  # 100 ms at 8 kHz, one byte a sample
    assert len(ulaw) == 800
    _, effects = d.send({"type": "input_audio_buffer.append", "audio": _b64(ulaw)})
    fed = b"".join(e.chunk.pcm for e in effects if isinstance(e, Feed))
    events, effects = d.send({"type": "input_audio_buffer.commit"})
    fed += b"".join(e.chunk.pcm for e in effects if isinstance(e, Feed))
    assert d.types(events)[0] == "input_audio_buffer.committed"  # 800 bytes of pcmu count as 100 ms
    assert len(fed) == 100 * MS  # all of it reached the engine at 24 kHz, the tail at commit
    assert isinstance(effects[-1], EndInput)


# --- transcription ----------------------------------------------------------------


def commit_turn(d: Driver, ms: int = 100) -> tuple[str, str]:
    _, effects = append(d, ms)
    rid = effects[0].request.request_id
    events, _ = d.send({"type": "input_audio_buffer.commit"})
    return rid, events[0]["item_id"]


def test_transcription_events_follow_the_engine_when_transcription_is_on() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    rid, item_id = commit_turn(d)
    s = d.session
    s.on_transcription(rid, TextDelta("hello"))
    s.on_transcription(rid, Finished(text="hello there", usage=Usage(input_audio_tokens=3)))
    events, _ = d.take()
    assert d.types(events) == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert (events[0]["item_id"], events[0]["delta"]) == (item_id, "hello")
    assert events[1]["delta"] == " there"  # what the final transcript adds: the deltas add up to it
    assert events[2]["transcript"] == "hello there"
    assert events[2]["usage"]["input_tokens"] == 3
    events, _ = d.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert events[0]["item"]["content"][0]["transcript"] == "hello there"


def test_a_revising_engines_transcript_goes_out_whole_so_the_deltas_add_up() -> None:
    """A decoder's partial hypotheses are revised by its final decode (pocketsphinx's
    "you said what is on whether" became "dude what is the weather"): the client gets one
    delta, the final transcript, never words the completed transcript takes back."""
    engine = dataclasses.replace(PassthroughEngine().info, revises_transcripts=True)
    d = Driver(engine=engine)
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    _, effects = append(d, 100)
    rid = effects[0].request.request_id
    d.session.on_transcription(rid, TextDelta("you said"))  # before the commit
    d.send({"type": "input_audio_buffer.commit"})
    d.session.on_transcription(rid, TextDelta(" what is on whether"))  # after it
    d.session.on_transcription(rid, Finished(text="dude what is the weather"))
    d.take()
    transcription = [e for e in d.events if "input_audio_transcription" in e["type"]]
    assert [(e["type"].rsplit(".", 1)[1], e.get("delta"), e.get("transcript")) for e in transcription] == [
        ("delta", "dude what is the weather", None),
        ("completed", None, "dude what is the weather"),
    ]


def test_transcript_is_kept_but_not_announced_when_transcription_is_off(d: Driver) -> None:
    rid, item_id = commit_turn(d)
    d.session.on_transcription(rid, TextDelta("1 "))
    d.session.on_transcription(rid, Finished(text="quiet words"))
    assert d.take() == ([], [])
    events, _ = d.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert events[0]["item"]["content"][0]["transcript"] == "quiet words"


def test_deltas_before_commit_are_held_until_the_item_exists() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    _, effects = append(d, 100)
    rid = effects[0].request.request_id
    d.session.on_transcription(rid, TextDelta("1 "))
    assert d.take()[0] == []  # the client has not seen the item id yet
    events, _ = d.send({"type": "input_audio_buffer.commit"})
    assert d.types(events)[-1] == "conversation.item.input_audio_transcription.delta"
    assert events[-1]["delta"] == "1 "


def test_late_transcription_output_of_a_cleared_buffer_is_dropped(d: Driver) -> None:
    _, effects = append(d, 100)
    rid = effects[0].request.request_id
    d.send({"type": "input_audio_buffer.clear"})
    d.session.on_transcription(rid, Finished(text="ghost"))
    assert d.take() == ([], [])


def test_failed_transcription_without_transcription_config_is_an_error_event(d: Driver) -> None:
    rid, _ = commit_turn(d)
    d.session.on_transcription_failed(rid, Code.TRANSCRIPTION_FAILED, "boom")
    events, _ = d.take()
    assert d.types(events) == ["error"]
    assert events[0]["error"]["code"] == Code.TRANSCRIPTION_FAILED


def test_failed_transcription_with_transcription_config_is_a_failed_event() -> None:
    d = Driver(transcription=None)
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    rid, item_id = commit_turn(d)
    d.session.on_transcription_failed(rid, Code.TRANSCRIPTION_FAILED, "boom")
    events, _ = d.take()
    assert d.types(events) == ["conversation.item.input_audio_transcription.failed"]
    assert events[0]["item_id"] == item_id
    assert events[0]["error"]["code"] == Code.TRANSCRIPTION_FAILED


# --- responses: lifecycle --------------------------------------------------------------

LIFECYCLE = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def test_response_lifecycle_events_come_in_the_ga_order(d: Driver) -> None:
    d.user_text("hi")
    start = len(d.events)
    resp_id = d.respond()
    d.output(
        resp_id,
        TextDelta("w0 "),
        AudioDelta(TONE),
        TextDelta("w1 "),
        AudioDelta(TONE),
        Finished(usage=Usage(input_text_tokens=1, output_text_tokens=2, output_audio_tokens=2)),
    )
    events = d.events[start:]
    assert d.types(events) == LIFECYCLE
    assert_well_sequenced(d.events)
    item_id = events[1]["item"]["id"]
    for e in events[1:-1]:
        if "response_id" in e:
            assert e["response_id"] == resp_id
        if "item_id" in e:
            assert e["item_id"] == item_id
    created, done = events[0]["response"], events[-1]["response"]
    assert (created["id"], created["status"], created["output"]) == (resp_id, "in_progress", [])
    assert done["status"] == "completed" and done["status_details"] is None
    assert done["usage"]["total_tokens"] == 5
    assert done["usage"]["output_token_details"] == {"text_tokens": 2, "audio_tokens": 2}
    out_item = done["output"][0]
    assert (out_item["id"], out_item["role"], out_item["status"]) == (item_id, "assistant", "completed")
    assert out_item["content"] == [{"type": "output_audio", "transcript": "w0 w1 "}]
    assert events[9]["transcript"] == "w0 w1 "
    assert events[2]["previous_item_id"] is not None  # after the user's item
    assert [e["delta"] for e in events if e["type"] == "response.output_audio.delta"] == [TONE, TONE]


def test_response_asks_for_the_engine_with_the_conversation(d: Driver) -> None:
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "be brief"}})
    d.user_text("first")
    d.user_text("second")
    start = len(d.effects)
    resp_id = d.respond(max_output_tokens=7, temperature=0.5)
    effects = d.effects[start:]
    assert [type(e) for e in effects] == [StartResponse, EndInput]
    req = effects[0].request
    assert req.request_id == resp_id
    assert req.messages == (Message("user", "first"), Message("user", "second"))
    assert req.instructions == "be brief"
    assert req.modalities == ("audio",)
    assert req.voice == "tone"  # an OpenAI voice mapped onto the engine's
    assert (req.max_output_tokens, req.temperature) == (7, 0.5)
    assert effects[1] == EndInput(resp_id)


def test_response_instructions_override_the_session_for_one_response(d: Driver) -> None:
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "session"}})
    d.respond(instructions="just this once")
    assert d.effects[-2].request.instructions == "just this once"


def test_text_only_response_streams_text_and_ignores_audio(d: Driver) -> None:
    resp_id = d.respond(output_modalities=["text"])
    events = d.output(resp_id, TextDelta("a"), AudioDelta(TONE), TextDelta("b"), Finished())
    assert d.types(events) == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[2]["text"] == "ab"
    assert events[-1]["response"]["output"][0]["content"] == [{"type": "output_text", "text": "ab"}]
    assert events[-1]["response"]["output_modalities"] == ["text"]
    added = [e for e in d.events if e["type"] == "response.content_part.added"][-1]
    assert added["part"] == {"type": "text", "text": ""}  # a content *part* is text|audio in the SDK


def test_pcmu_output_format_encodes_audio_deltas(d: Driver) -> None:
    resp_id = d.respond(audio={"output": {"format": {"type": "audio/pcmu"}}})
    events = d.output(resp_id, AudioDelta(TONE), Finished())
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio.delta"]
    assert sum(len(x) for x in deltas) == len(TONE) // 2 // 3  # one byte a sample, 24 kHz -> 8 kHz


def test_conversation_none_keeps_the_response_out_of_the_conversation(d: Driver) -> None:
    resp_id = d.respond(conversation="none")
    events = d.output(resp_id, TextDelta("x"), Finished())
    assert "conversation.item.added" not in d.types()
    assert "conversation.item.done" not in d.types(events)
    assert events[-1]["response"]["conversation_id"] is None
    assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == "x"
    assert len(d.session.conversation) == 0


def test_length_finish_is_an_incomplete_response(d: Driver) -> None:
    resp_id = d.respond()
    events = d.output(resp_id, TextDelta("w0 "), Finished("length"))
    done = events[-1]["response"]
    assert done["status"] == "incomplete"
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert done["output"][0]["status"] == "incomplete"


def test_second_response_while_one_is_active_is_refused(d: Driver) -> None:
    resp_id = d.respond()
    err = d.error({"type": "response.create", "event_id": "r2"})
    assert (err["code"], err["event_id"]) == (Code.RESPONSE_ACTIVE, "r2")
    assert resp_id in err["message"]
    d.output(resp_id, Finished())
    d.respond()  # free again once done


def test_response_with_unknown_voice_is_refused(d: Driver) -> None:
    err = d.error({"type": "response.create", "event_id": "v", "response": {"voice": "nobody"}})
    assert (err["code"], err["event_id"]) == (Code.INVALID_VALUE, "v")
    assert d.session.active_response_id is None


def test_response_with_unsupported_format_is_refused(d: Driver) -> None:
    err = d.error(
        {
            "type": "response.create",
            "event_id": "f",
            "response": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        }
    )
    assert (err["code"], err["event_id"]) == (Code.UNSUPPORTED_FORMAT, "f")


def test_response_input_references_items_and_adds_inline_ones(d: Driver) -> None:
    d.user_text("kept", item_id="keep")
    d.user_text("skipped")
    d.respond(
        input=[
            {"type": "item_reference", "id": "keep"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "inline"}]},
        ]
    )
    assert d.effects[-2].request.messages == (Message("user", "kept"), Message("user", "inline"))


def test_response_input_with_unknown_reference_is_item_not_found(d: Driver) -> None:
    err = d.error(
        {"type": "response.create", "event_id": "x", "response": {"input": [{"type": "item_reference", "id": "ghost"}]}}
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_NOT_FOUND, "response.input[0]", "x")


def test_engine_failure_fails_the_response(d: Driver) -> None:
    resp_id = d.respond()
    d.session.on_response_failed(resp_id, Code.ENGINE_ERROR, "kaput")
    events, effects = d.take()
    assert d.types(events)[0] == "error"
    assert events[0]["error"]["code"] == Code.ENGINE_ERROR
    done = events[-1]
    assert done["type"] == "response.done"
    assert done["response"]["status"] == "failed"
    assert done["response"]["status_details"]["error"]["code"] == Code.ENGINE_ERROR
    assert effects == []  # the request is gone already
    d.respond()


def test_response_waits_for_a_pending_transcript_and_streams_it_in(d: Driver) -> None:
    rid, _ = commit_turn(d)
    start = len(d.effects)
    resp_id = d.respond()
    assert [type(e) for e in d.effects[start:]] == [StartResponse]  # no final marker yet
    assert d.effects[start].request.messages == (Message("user", ""),)
    d.session.on_transcription(rid, Finished(text="what time is it"))
    _, effects = d.take()
    assert effects == [Feed(resp_id, TextChunk("what time is it")), EndInput(resp_id)]


def test_user_audio_item_is_transcribed_as_its_own_request(d: Driver) -> None:
    events, effects = d.send(
        {
            "type": "conversation.item.create",
            "item": {"id": "aud", "role": "user", "content": [{"type": "input_audio", "audio": _b64(bytes(50 * MS))}]},
        }
    )
    assert d.types(events) == ["conversation.item.added", "conversation.item.done"]
    assert effects[0] == StartTranscription(effects[0].request)
    assert effects[0].request.request_id == "input_aud"
    assert effects[1:] == [Feed("input_aud", AudioChunk(bytes(50 * MS))), EndInput("input_aud")]


def test_refused_item_with_two_audio_parts_starts_no_transcription(d: Driver) -> None:
    audio = {"type": "input_audio", "audio": _b64(bytes(100))}
    events, effects = d.send(
        {"type": "conversation.item.create", "event_id": "two", "item": {"role": "user", "content": [audio, audio]}}
    )
    assert d.types(events) == ["error"]
    assert events[0]["error"]["event_id"] == "two"
    assert effects == []


def test_user_audio_item_with_odd_bytes_is_invalid_audio(d: Driver) -> None:
    err = d.error(
        {
            "type": "conversation.item.create",
            "event_id": "ia",
            "item": {"role": "user", "content": [{"type": "input_audio", "audio": _b64(b"\x00\x01\x02")}]},
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.INVALID_AUDIO, "item.content[0].audio", "ia")


# --- cancel -------------------------------------------------------------------------


def test_cancel_ends_the_response_and_asks_to_abort_the_request(d: Driver) -> None:
    resp_id = d.respond()
    d.output(resp_id, TextDelta("w0 "), AudioDelta(TONE))
    events, effects = d.send({"type": "response.cancel", "event_id": "cx"})
    assert effects == [Cancel(resp_id)]
    assert d.types(events) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["status"] == "incomplete"
    assert done["output"][0]["content"][0]["transcript"] == "w0 "
    assert d.session.active_response_id is None


def test_output_racing_a_cancel_is_dropped(d: Driver) -> None:
    resp_id = d.respond()
    d.send({"type": "response.cancel"})
    assert d.output(resp_id, TextDelta("late"), AudioDelta(TONE), Finished()) == []


def test_cancel_by_matching_response_id(d: Driver) -> None:
    resp_id = d.respond()
    _, effects = d.send({"type": "response.cancel", "response_id": resp_id})
    assert effects == [Cancel(resp_id)]


def test_cancel_without_an_active_response_is_refused(d: Driver) -> None:
    err = d.error({"type": "response.cancel", "event_id": "c"})
    assert (err["code"], err["event_id"]) == (Code.RESPONSE_NOT_ACTIVE, "c")


def test_cancel_of_another_response_id_is_refused_and_leaves_the_active_one(d: Driver) -> None:
    resp_id = d.respond()
    err = d.error({"type": "response.cancel", "response_id": "resp_other", "event_id": "c"})
    assert (err["code"], err["param"], err["event_id"]) == (Code.RESPONSE_NOT_ACTIVE, "response_id", "c")
    assert d.session.active_response_id == resp_id


# --- truncate ---------------------------------------------------------------------


def test_truncate_keeps_the_transcript_of_the_audio_played(d: Driver) -> None:
    _, item_id = d.completed_audio_response(chunks=5)  # w0 at 0 ms, w1 at 20 ms, ...
    events, effects = d.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 30}
    )
    assert effects == []
    assert d.types(events) == ["conversation.item.truncated"]
    assert (events[0]["item_id"], events[0]["content_index"], events[0]["audio_end_ms"]) == (item_id, 0, 30)
    events, _ = d.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert events[0]["item"]["content"][0]["transcript"] == "w0 w1 "


def test_truncate_to_zero_empties_the_transcript(d: Driver) -> None:
    _, item_id = d.completed_audio_response()
    d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 0})
    events, _ = d.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert events[0]["item"]["content"][0]["transcript"] == ""


def test_truncate_past_the_audio_sent_is_refused(d: Driver) -> None:
    _, item_id = d.completed_audio_response(chunks=5)  # 100 ms
    err = d.error(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 500,
            "event_id": "t",
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.INVALID_TRUNCATE, "audio_end_ms", "t")


def test_truncate_of_a_user_item_is_refused(d: Driver) -> None:
    d.user_text("hi", item_id="u1")
    err = d.error({"type": "conversation.item.truncate", "item_id": "u1", "content_index": 0, "audio_end_ms": 0})
    assert (err["code"], err["param"]) == (Code.INVALID_TRUNCATE, "item_id")


def test_truncate_of_a_missing_content_index_is_refused(d: Driver) -> None:
    _, item_id = d.completed_audio_response()
    err = d.error({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 1, "audio_end_ms": 0})
    assert (err["code"], err["param"]) == (Code.INVALID_TRUNCATE, "content_index")


def test_truncate_of_a_text_part_is_refused(d: Driver) -> None:
    resp_id = d.respond(output_modalities=["text"])
    events = d.output(resp_id, TextDelta("t"), Finished())
    item_id = events[-1]["response"]["output"][0]["id"]
    err = d.error({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 0})
    assert err["code"] == Code.INVALID_TRUNCATE


def test_truncate_of_an_unknown_item_is_item_not_found(d: Driver) -> None:
    err = d.error(
        {
            "type": "conversation.item.truncate",
            "item_id": "ghost",
            "content_index": 0,
            "audio_end_ms": 0,
            "event_id": "t",
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_NOT_FOUND, "item_id", "t")


def test_refused_truncate_of_the_item_being_spoken_leaves_its_response_running(d: Driver) -> None:
    resp_id = d.respond()
    events = d.output(resp_id, TextDelta("w0 "), AudioDelta(TONE))
    item_id = events[0]["item_id"]
    events, effects = d.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 5000,
            "event_id": "t",
        }
    )
    assert d.types(events) == ["error"]
    assert events[0]["error"]["code"] == Code.INVALID_TRUNCATE
    assert effects == []
    assert d.session.active_response_id == resp_id


def test_truncate_of_the_item_being_spoken_cancels_its_response(d: Driver) -> None:
    resp_id = d.respond()
    events = d.output(resp_id, TextDelta("w0 "), AudioDelta(TONE), TextDelta("w1 "), AudioDelta(TONE))
    item_id = events[0]["item_id"]
    events, effects = d.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 10}
    )
    assert effects == [Cancel(resp_id)]
    types = d.types(events)
    assert types.index("response.done") < types.index("conversation.item.truncated")
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled"


# --- items: create, retrieve, delete, limits -------------------------------------------


def test_item_create_appends_and_reports_the_previous_item(d: Driver) -> None:
    first = d.user_text("a", item_id="a")
    second = d.user_text("b", item_id="b")
    assert (first["previous_item_id"], second["previous_item_id"]) == (None, "a")
    assert second["item"]["content"] == [{"type": "input_text", "text": "b"}]
    assert second["item"]["status"] == "completed"


def test_item_create_after_root_goes_first(d: Driver) -> None:
    d.user_text("a", item_id="a")
    events, _ = d.send(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {"id": "z", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        }
    )
    assert events[0]["previous_item_id"] is None
    resp = d.respond()
    assert [m.text for m in d.effects[-2].request.messages] == ["sys", "a"]
    assert resp


def test_item_create_after_a_given_item_is_inserted_there(d: Driver) -> None:
    d.user_text("a", item_id="a")
    d.user_text("c", item_id="c")
    events, _ = d.send(
        {
            "type": "conversation.item.create",
            "previous_item_id": "a",
            "item": {"id": "b", "role": "user", "content": [{"type": "input_text", "text": "b"}]},
        }
    )
    assert events[0]["previous_item_id"] == "a"
    d.respond()
    assert [m.text for m in d.effects[-2].request.messages] == ["a", "b", "c"]


def test_item_create_with_an_existing_id_is_refused(d: Driver) -> None:
    d.user_text("a", item_id="dup")
    err = d.error(
        {
            "type": "conversation.item.create",
            "event_id": "i",
            "item": {"id": "dup", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_EXISTS, "item.id", "i")


def test_item_create_after_an_unknown_item_is_refused(d: Driver) -> None:
    err = d.error(
        {
            "type": "conversation.item.create",
            "event_id": "i",
            "previous_item_id": "ghost",
            "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_NOT_FOUND, "previous_item_id", "i")


def test_retrieve_returns_the_item(d: Driver) -> None:
    d.user_text("hello", item_id="h")
    events, _ = d.send({"type": "conversation.item.retrieve", "item_id": "h"})
    assert d.types(events) == ["conversation.item.retrieved"]
    assert events[0]["item"]["content"] == [{"type": "input_text", "text": "hello"}]


def test_retrieve_of_an_unknown_item_is_item_not_found(d: Driver) -> None:
    err = d.error({"type": "conversation.item.retrieve", "item_id": "ghost", "event_id": "r"})
    assert (err["code"], err["param"], err["event_id"]) == (Code.ITEM_NOT_FOUND, "item_id", "r")


def test_delete_removes_the_item_from_the_conversation(d: Driver) -> None:
    d.user_text("a", item_id="a")
    d.user_text("b", item_id="b")
    events, _ = d.send({"type": "conversation.item.delete", "item_id": "a"})
    assert d.types(events) == ["conversation.item.deleted"]
    assert events[0]["item_id"] == "a"
    assert d.error({"type": "conversation.item.retrieve", "item_id": "a"})["code"] == Code.ITEM_NOT_FOUND
    assert d.error({"type": "conversation.item.delete", "item_id": "a"})["code"] == Code.ITEM_NOT_FOUND
    d.respond()
    assert [m.text for m in d.effects[-2].request.messages] == ["b"]


def test_delete_of_the_item_being_spoken_cancels_its_response(d: Driver) -> None:
    resp_id = d.respond()
    item_id = next(e for e in d.events if e["type"] == "response.output_item.added")["item"]["id"]
    events, effects = d.send({"type": "conversation.item.delete", "item_id": item_id})
    assert effects == [Cancel(resp_id)]
    assert d.types(events)[-1] == "conversation.item.deleted"
    assert "response.done" in d.types(events)


def test_conversation_over_max_items_deletes_the_oldest() -> None:
    d = Driver(limits=SessionLimits(max_items=3))
    for name in "abc":
        d.user_text(name, item_id=name)
    events, _ = d.send(
        {
            "type": "conversation.item.create",
            "item": {"id": "d", "role": "user", "content": [{"type": "input_text", "text": "d"}]},
        }
    )
    assert d.types(events) == ["conversation.item.deleted", "conversation.item.added", "conversation.item.done"]
    assert events[0]["item_id"] == "a"
    d.user_text("e", item_id="e")
    assert [e["item_id"] for e in d.events if e["type"] == "conversation.item.deleted"] == ["a", "b"]
    assert [it.id for it in d.session.conversation] == ["c", "d", "e"]


def test_conversation_over_max_conversation_bytes_deletes_the_oldest() -> None:
    d = Driver(limits=SessionLimits(max_conversation_bytes=1000))
    for name in "abc":
        d.user_text("é" * 200, item_id=name)  # 400 bytes each (200 characters)
    deleted = [e["item_id"] for e in d.events if e["type"] == "conversation.item.deleted"]
    assert deleted == ["a"] and [it.id for it in d.session.conversation] == ["b", "c"]
    d.user_text("x" * 5000, item_id="big")  # alone over the budget: kept, everything older goes
    assert [it.id for it in d.session.conversation] == ["big"]
    d.send({"type": "conversation.item.delete", "item_id": "big"})
    d.user_text("y" * 900, item_id="next")  # the deleted item no longer counts
    assert [it.id for it in d.session.conversation] == ["next"]


def test_an_answers_transcript_counts_in_max_conversation_bytes_once_it_is_done() -> None:
    d = Driver(limits=SessionLimits(max_conversation_bytes=400))
    d.user_text("x" * 100, item_id="first")
    resp_id = d.respond(output_modalities=["audio"])
    d.output(resp_id, *[out for i in range(10) for out in (TextDelta("word " * 4), AudioDelta(TONE))],
             Finished(usage=Usage(output_text_tokens=40)))  # fmt: skip
    answer = next(it for it in d.session.conversation if it.role == "assistant")
    assert len(answer.content[0].transcript or "") == 200 and len(answer.content[0].marks) == 10
    assert next(iter(d.session.conversation)).id == "first"  # nothing deleted mid-answer
    d.user_text("y" * 10, item_id="next")  # 100 + (200 + 10 marks) + 10: over 400
    assert [e["item_id"] for e in d.events if e["type"] == "conversation.item.deleted"] == ["first"]
    assert [it.id for it in d.session.conversation] == [answer.id, "next"]


# --- session.update through the session ---------------------------------------------


def update(d: Driver, session: dict[str, Any], event_id: str = "u") -> tuple[list[dict[str, Any]], list[Any]]:
    return d.send({"type": "session.update", "event_id": event_id, "session": {"type": "realtime", **session}})


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "passthrough"])
def test_known_transcription_models_are_accepted(d: Driver, model: str) -> None:
    events, _ = update(d, {"audio": {"input": {"transcription": {"model": model}}}})
    assert d.types(events) == ["session.updated"]
    assert events[0]["session"]["audio"]["input"]["transcription"]["model"] == model


def test_any_transcription_model_name_is_accepted_and_reaches_the_engine_stt(d: Driver) -> None:
    events, _ = update(d, {"audio": {"input": {"transcription": {"model": "gpt-realtime-whisper"}}}})
    assert d.types(events) == ["session.updated"]
    assert events[0]["session"]["audio"]["input"]["transcription"]["model"] == "gpt-realtime-whisper"


@pytest.mark.parametrize("voice", OPENAI_VOICES)
def test_openai_voices_are_accepted_by_the_session(d: Driver, voice: str) -> None:
    events, _ = update(d, {"audio": {"output": {"voice": voice}}})
    assert events[0]["session"]["audio"]["output"]["voice"] == voice


def test_unknown_voice_is_refused_by_the_session(d: Driver) -> None:
    err = d.error(
        {
            "type": "session.update",
            "event_id": "v",
            "session": {"type": "realtime", "audio": {"output": {"voice": "hal"}}},
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.INVALID_VALUE, "session.audio.output.voice", "v")
    assert d.session.config.voice == "alloy"


def test_pcm_at_16k_is_refused_by_the_session(d: Driver) -> None:
    err = d.error(
        {
            "type": "session.update",
            "event_id": "f",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        }
    )
    assert (err["code"], err["event_id"]) == (Code.UNSUPPORTED_FORMAT, "f")


def test_unknown_parameter_is_refused_and_nothing_applied(d: Driver) -> None:
    before = d.session.config
    err = d.error(
        {
            "type": "session.update",
            "event_id": "p",
            "session": {"type": "realtime", "instructions": "new", "mood": "happy"},
        }
    )
    assert (err["code"], err["param"], err["event_id"]) == (Code.UNKNOWN_PARAMETER, "session.mood", "p")
    assert d.session.config == before


def test_server_vad_is_refused_without_a_speech_detector(d: Driver) -> None:
    err = d.error(
        {
            "type": "session.update",
            "event_id": "t",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
        }
    )
    assert (err["code"], err["event_id"]) == (Code.INVALID_VALUE, "t")
    assert d.session.config.turn_detection is None


def test_turn_detection_null_is_accepted(d: Driver) -> None:
    events, _ = update(d, {"audio": {"input": {"turn_detection": None}}})
    assert events[0]["session"]["audio"]["input"]["turn_detection"] is None


def test_ignored_fields_are_applied_and_reported_as_warnings_to_clients_that_opted_in(d: Driver) -> None:
    events, _ = update(d, {"temperature": 0.2, "instructions": "x"})
    assert d.types(events) == ["session.updated"]  # session.warning is no SDK event: opt-in only
    assert d.session.config.temperature == 0.2
    events, _ = update(d, {"temperature": 0.3, "gateway_events": True})
    assert d.types(events) == ["session.updated", "session.warning"]
    assert events[1]["param"] == "session.temperature"
    assert events[1]["code"] == "unsupported_field"
    assert d.session.config.temperature == 0.3


def test_update_renders_the_whole_session_back(d: Driver) -> None:
    events, _ = update(d, {"instructions": "speak slowly", "output_modalities": ["text"]})
    session = events[0]["session"]
    assert session["id"] == "sess_test"
    assert session["instructions"] == "speak slowly"
    assert session["output_modalities"] == ["text"]
    resp_id = d.respond()
    assert d.effects[-2].request.modalities == ("text",)
    assert resp_id


def test_changing_the_input_format_mid_buffer_keeps_the_session_usable(d: Driver) -> None:
    append(d, 60)
    update(d, {"audio": {"input": {"format": {"type": "audio/pcma"}}}})
    events, _ = d.send({"type": "input_audio_buffer.append", "audio": _b64(bytes(400))})  # 50 ms of pcma
    assert events == []


# --- beta clients --------------------------------------------------------------------


def test_beta_session_renders_flat_shapes_and_beta_parts() -> None:
    d = Driver(beta=True)
    created = d.session.render_config()
    assert created["input_audio_format"] == "pcm16"
    assert "audio" not in created
    events, _ = d.send({"type": "session.update", "session": {"voice": "echo", "input_audio_format": "g711_ulaw"}})
    assert events[0]["session"]["voice"] == "echo"
    assert events[0]["session"]["input_audio_format"] == "g711_ulaw"
    resp_id = d.respond()
    events = d.output(resp_id, TextDelta("hi"), Finished())
    done = events[-1]["response"]
    assert done["modalities"] == ["audio", "text"]
    assert done["output_audio_format"] == "pcm16"
    assert done["output"][0]["content"] == [{"type": "audio", "transcript": "hi"}]


def test_beta_update_with_ga_shape_is_refused(d: Driver) -> None:
    b = Driver(beta=True)
    err = b.error({"type": "session.update", "session": {"audio": {"output": {"voice": "alloy"}}}})
    assert (err["code"], err["param"]) == (Code.UNKNOWN_PARAMETER, "session.audio")


# --- lifetime and shutdown ------------------------------------------------------------


def test_expire_reports_session_expired_cancels_and_closes_4008(d: Driver) -> None:
    resp_id = d.respond()
    _, effects = append(d, 50)
    input_rid = effects[0].request.request_id
    d.session.expire()
    events, effects = d.take()
    assert events[0]["type"] == "error"
    assert events[0]["error"]["code"] == Code.SESSION_EXPIRED
    assert Cancel(resp_id) in effects and Cancel(input_rid) in effects
    assert effects[-1] == CloseSocket(CloseCode.SESSION_EXPIRED, "session expired")


def test_shutdown_cancels_every_running_request(d: Driver) -> None:
    rid_committed, _ = commit_turn(d)
    _, effects = append(d, 50)
    rid_open = effects[0].request.request_id
    resp_id = d.respond()
    d.session.shutdown()
    _, effects = d.take()
    assert set(effects) == {Cancel(resp_id), Cancel(rid_open), Cancel(rid_committed)}
    d.session.shutdown()
    assert d.take() == ([], [])


def test_expires_at_follows_the_lifetime() -> None:
    s = RealtimeSession(
        session_id="s",
        config=SessionConfig(model="m", turn_detection=None),
        engine=PassthroughEngine().info,
        limits=SessionLimits(lifetime_s=60),
        created_at=1000.0,
    )
    assert s.expires_at == 1060
    assert s.render_config()["expires_at"] == 1060


def test_rate_limits_follow_each_response_done() -> None:
    s = RealtimeSession(
        session_id="s",
        config=SessionConfig(model="m", turn_detection=None),
        engine=PassthroughEngine().info,
        rate_limits=lambda: {
            "rate_limits": [{"name": "requests", "limit": 2, "remaining": 2, "reset_seconds": 0}],
            "tenant_limits": [],
        },
    )
    s.handle(ce.ResponseCreate(None))
    rid = s.active_response_id
    assert rid is not None
    s.take()
    s.on_response(rid, Finished())
    events, _ = s.take()
    assert [e["type"] for e in events][-2:] == ["response.done", "rate_limits.updated"]
    assert events[-1]["rate_limits"][0]["limit"] == 2
    assert events[-1]["tenant_limits"] == []  # the callback's fields, as given


def test_session_created_with_server_vad_config_but_no_detector_accepts_unrelated_updates() -> None:
    d = Driver(turn_detection=TurnDetection())
    events, _ = update(d, {"instructions": "hello"})
    assert d.types(events) == ["session.updated"]


def test_session_created_with_server_vad_config_but_no_detector_keeps_manual_turns() -> None:
    d = Driver(turn_detection=TurnDetection())
    _, effects = append(d, 100)
    events, _ = d.send({"type": "input_audio_buffer.commit"})
    assert d.types(events)[0] == "input_audio_buffer.committed"
    assert isinstance(effects[0], StartTranscription)


# --- an engine that takes its own turns (engine_turns.py) ---------------------------------


def test_server_turn_detection_on_an_engine_that_takes_turns_is_the_engines() -> None:
    engine = dataclasses.replace(PassthroughEngine().info, takes_turns=True)
    s = RealtimeSession(session_id="s", config=SessionConfig(model="m", turn_detection=None), engine=engine,
                        vad_factory=None)  # fmt: skip
    # Turn detection is the engine's: accepted with no speech detector here.
    s.handle(
        ce.SessionUpdate(None, {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
    )
    events, _ = s.take()
    assert [e["type"] for e in events] == ["session.updated"]
    s.handle(ce.AudioAppend(None, TONE))
    events, effects = s.take()
    assert events == [] and [type(e) for e in effects] == [StartConversation, Feed]
    rid = effects[0].request.request_id
    s.on_turn(rid, SpeechStarted(0.0))
    s.on_turn(rid, SpeechStopped(500.0))
    s.on_turn(rid, AnswerStarted())
    s.on_turn(rid, Heard("hello", final=True))
    s.on_turn(rid, AudioDelta(TONE))
    s.on_turn(rid, Finished())
    events, effects = s.take()
    types = [e["type"] for e in events]
    turn = ["speech_started", "speech_stopped", "committed"]
    assert types[:5] == [f"input_audio_buffer.{t}" for t in turn] + [
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert "response.created" in types and types.index("response.done") > types.index("response.output_audio.delta")
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert not [e for e in effects if isinstance(e, StartResponse | StartTranscription)]  # all the engine's
    item = next(it for it in s.conversation if it.role == "user")
    assert item.content[0].transcript == "hello" and not item.pending_transcription
    # Turns the client commits: the conversation ends, and audio goes to the input buffer again.
    s.handle(ce.SessionUpdate(None, {"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    _, effects = s.take()
    assert Cancel(rid) in effects
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = s.take()
    assert [type(e) for e in effects] == [StartTranscription, Feed]


def test_the_engines_transcripts_go_to_its_turns_in_order_and_none_is_left_waiting() -> None:
    engine = dataclasses.replace(PassthroughEngine().info, takes_turns=True)
    s = RealtimeSession(session_id="s", config=SessionConfig(model="m", turn_detection=TurnDetection()), engine=engine,
                        vad_factory=None)  # fmt: skip
    s.handle(ce.SessionUpdate(None, {"type": "realtime", "audio": {"input": {"transcription": {"model": "w"}}}}))
    s.handle(ce.AudioAppend(None, TONE))
    _, effects = s.take()
    rid = next(e for e in effects if isinstance(e, StartConversation)).request.request_id
    s.on_turn(rid, SpeechStarted())
    s.on_turn(rid, SpeechStopped())
    s.on_turn(rid, SpeechStarted())  # the caller goes on before the first turn's transcript came
    s.on_turn(rid, SpeechStopped())
    s.on_turn(rid, Heard("first", final=True))
    s.on_turn(rid, Heard("sec"))
    events, _ = s.take()
    first, second = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    done = [(e["item_id"], e["transcript"]) for e in events if e["type"].endswith("transcription.completed")]
    assert done == [(first, "first")]
    # The engine's turns end (turn detection off) before the second transcript is whole: the
    # item keeps what was heard, and an answer that reads it does not wait for it.
    s.handle(ce.SessionUpdate(None, {"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    events, effects = s.take()
    assert Cancel(rid) in effects
    assert [(e["item_id"], e["transcript"]) for e in events if e["type"].endswith("transcription.completed")] == [
        (second, "sec")
    ]
    assert not any(it.pending_transcription for it in s.conversation)
    s.handle(ce.ResponseCreate(None))
    _, effects = s.take()
    assert [type(e) for e in effects] == [StartResponse, EndInput]
