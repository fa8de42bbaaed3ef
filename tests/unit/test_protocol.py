"""The pure protocol layer: client event decoding, session configuration
parsing and rendering (GA and beta), and the binary frame layout."""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson
import pytest

from gateway.audio.codecs import AudioFormat
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.server_events import (
    BETA_NAMES,
    KIND_INPUT_AUDIO,
    KIND_OUTPUT_AUDIO,
    decode_input_frame,
    encode_audio_frame,
    encode_json,
)
from gateway.protocol.session_config import (
    OPENAI_VOICES,
    PCM,
    PCMA,
    PCMU,
    ConfigLimits,
    SessionConfig,
    Transcription,
    TurnDetection,
    apply_update,
    render,
)
from omni_gateway_client.frames import FrameError, decode_audio_frame, encode_input_frame

B64 = base64.b64encode(b"\x01\x02\x03\x04").decode()


def dec(event: dict[str, Any]) -> ce.ClientEvent:
    return ce.decode(orjson.dumps(event))


def refused(event: dict[str, Any] | str | bytes) -> ProtocolError:
    raw = event if isinstance(event, str | bytes) else orjson.dumps(event)
    with pytest.raises(ProtocolError) as info:
        ce.decode(raw)
    return info.value


# --- decode: every client event type, well formed -----------------------------------

GOOD_EVENTS: list[tuple[dict[str, Any], type]] = [
    ({"type": "session.update", "session": {"instructions": "hi"}}, ce.SessionUpdate),
    ({"type": "input_audio_buffer.append", "audio": B64}, ce.AudioAppend),
    ({"type": "input_audio_buffer.commit"}, ce.AudioCommit),
    ({"type": "input_audio_buffer.clear"}, ce.AudioClear),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        },
        ce.ItemCreate,
    ),
    ({"type": "conversation.item.retrieve", "item_id": "item_1"}, ce.ItemRetrieve),
    ({"type": "conversation.item.delete", "item_id": "item_1"}, ce.ItemDelete),
    (
        {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 10},
        ce.ItemTruncate,
    ),
    ({"type": "transcription_session.update", "session": {}}, ce.TranscriptionSessionUpdate),
    ({"type": "response.create"}, ce.ResponseCreate),
    ({"type": "response.cancel"}, ce.ResponseCancel),
    ({"type": "output_audio_buffer.clear"}, ce.OutputAudioClear),
    # Gateway extensions (resume): decoded here, their semantics are tested with resume.
    (
        {"type": "session.resume", "session_id": "sess_1", "resume_token": "rt_x", "last_received_server_event_seq": 3},
        ce.SessionResume,
    ),
    ({"type": "session.event_ack", "last_received_server_event_seq": 3}, ce.EventAck),
]


def test_good_events_cover_every_client_event_type() -> None:
    assert sorted(e["type"] for e, _ in GOOD_EVENTS) == sorted(ce.CLIENT_EVENT_TYPES)


@pytest.mark.parametrize(("event", "cls"), GOOD_EVENTS, ids=[e["type"] for e, _ in GOOD_EVENTS])
def test_each_client_event_type_decodes_with_its_event_id(event: dict[str, Any], cls: type) -> None:
    decoded = dec({**event, "event_id": "evt_42"})
    assert isinstance(decoded, cls)
    assert decoded.event_id == "evt_42"


def test_event_without_event_id_decodes_with_none() -> None:
    assert dec({"type": "input_audio_buffer.commit"}).event_id is None


def test_append_decodes_base64_audio_to_bytes() -> None:
    event = dec({"type": "input_audio_buffer.append", "audio": B64})
    assert isinstance(event, ce.AudioAppend)
    assert event.audio == b"\x01\x02\x03\x04"


def test_decode_accepts_bytes_as_well_as_text() -> None:
    assert isinstance(ce.decode(b'{"type":"input_audio_buffer.clear"}'), ce.AudioClear)
    assert isinstance(ce.decode('{"type":"input_audio_buffer.clear"}'), ce.AudioClear)


def test_item_create_carries_id_role_parts_and_previous_item_id() -> None:
    event = dec(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "id": "my_item",
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "hello"},
                    {"type": "input_audio", "audio": B64},
                    {"type": "input_audio", "transcript": "spoken"},
                ],
            },
        }
    )
    assert isinstance(event, ce.ItemCreate)
    assert event.previous_item_id == "root"
    assert event.item.id == "my_item"
    assert event.item.role == "user"
    assert event.item.content == (
        ce.PartSpec("input_text", text="hello"),
        ce.PartSpec("input_audio", audio=b"\x01\x02\x03\x04"),
        ce.PartSpec("input_audio", transcript="spoken"),
    )


def test_item_type_defaults_to_message() -> None:
    event = dec(
        {
            "type": "conversation.item.create",
            "item": {"role": "system", "content": [{"type": "input_text", "text": "be brief"}]},
        }
    )
    assert isinstance(event, ce.ItemCreate)
    assert event.item.role == "system"


def test_beta_assistant_part_spellings_become_ga_names() -> None:
    event = dec(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "a"}, {"type": "audio", "transcript": "b"}],
            },
        }
    )
    assert isinstance(event, ce.ItemCreate)
    assert [p.type for p in event.item.content] == ["output_text", "output_audio"]


def test_assistant_input_text_is_stored_as_output_text() -> None:
    event = dec(
        {
            "type": "conversation.item.create",
            "item": {"role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
        }
    )
    assert isinstance(event, ce.ItemCreate)
    assert event.item.content[0].type == "output_text"


def test_truncate_carries_its_integers() -> None:
    event = dec({"type": "conversation.item.truncate", "item_id": "i", "content_index": 2, "audio_end_ms": 1500})
    assert event == ce.ItemTruncate(None, "i", 2, 1500)


def test_response_cancel_carries_response_id() -> None:
    assert dec({"type": "response.cancel", "response_id": "resp_1"}) == ce.ResponseCancel(None, "resp_1")


def test_response_create_without_response_uses_defaults() -> None:
    event = dec({"type": "response.create"})
    assert isinstance(event, ce.ResponseCreate)
    assert event.response == ce.ResponseParams()
    assert event.response.max_output_tokens == "unset"


def test_response_create_ga_shape_is_parsed() -> None:
    event = dec(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["text"],
                "instructions": "short",
                "audio": {"output": {"voice": "marin", "format": {"type": "audio/pcmu"}}},
                "max_output_tokens": 12,
                "temperature": 1,
                "conversation": "none",
                "metadata": {"k": "v"},
                "input": [
                    {"type": "item_reference", "id": "item_9"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
                ],
            },
        }
    )
    assert isinstance(event, ce.ResponseCreate)
    r = event.response
    assert r.output_modalities == ("text",)
    assert r.instructions == "short"
    assert r.voice == "marin"
    assert r.output_format == {"type": "audio/pcmu"}
    assert r.max_output_tokens == 12
    assert r.temperature == 1.0 and isinstance(r.temperature, float)
    assert r.conversation == "none"
    assert r.metadata == {"k": "v"}
    assert r.input is not None and r.input[0] == "item_9"
    assert isinstance(r.input[1], ce.ItemSpec)


def test_response_create_beta_shape_is_parsed() -> None:
    event = dec(
        {
            "type": "response.create",
            "response": {
                "modalities": ["audio", "text"],
                "voice": "alloy",
                "output_audio_format": "g711_ulaw",
                "max_response_output_tokens": "inf",
            },
        }
    )
    assert isinstance(event, ce.ResponseCreate)
    r = event.response
    assert r.output_modalities == ("audio",)
    assert r.voice == "alloy"
    assert r.output_format == "g711_ulaw"
    assert r.max_output_tokens is None


# --- decode: malformed input ------------------------------------------------------


@pytest.mark.parametrize("raw", ["{", "not json", b"\xff\xfe", ""])
def test_invalid_json_is_refused_with_invalid_json(raw: str | bytes) -> None:
    err = refused(raw)
    assert err.code == Code.INVALID_JSON
    assert err.event_id is None
    assert err.type == "invalid_request_error"


@pytest.mark.parametrize("raw", ["[]", "3", '"session.update"', "null"])
def test_json_that_is_not_an_object_is_refused(raw: str) -> None:
    assert refused(raw).code == Code.INVALID_JSON


def test_unknown_event_type_is_refused_with_param_type_and_event_id() -> None:
    err = refused({"type": "session.destroy", "event_id": "e1"})
    assert (err.code, err.param, err.event_id) == (Code.UNKNOWN_EVENT, "type", "e1")


def test_missing_type_is_refused_as_missing_parameter() -> None:
    err = refused({"event_id": "e2"})
    assert (err.code, err.param, err.event_id) == (Code.MISSING_FIELD, "type", "e2")


def test_non_string_type_is_refused() -> None:
    err = refused({"type": 7, "event_id": "e3"})
    assert err.code in (Code.MISSING_FIELD, Code.INVALID_TYPE)
    assert err.param == "type"
    assert err.event_id == "e3"


def test_non_string_event_id_is_refused_as_invalid_type() -> None:
    err = refused({"type": "input_audio_buffer.commit", "event_id": 12})
    assert (err.code, err.param) == (Code.INVALID_TYPE, "event_id")


BAD_EVENTS: list[tuple[dict[str, Any], str, str]] = [
    # (event, code, param)
    ({"type": "session.update"}, Code.MISSING_FIELD, "session"),
    ({"type": "input_audio_buffer.append"}, Code.MISSING_FIELD, "audio"),
    ({"type": "input_audio_buffer.append", "audio": 5}, Code.INVALID_TYPE, "audio"),
    ({"type": "input_audio_buffer.append", "audio": "@@not base64@@"}, Code.INVALID_BASE64, "audio"),
    ({"type": "input_audio_buffer.append", "audio": "QUJD"[:3]}, Code.INVALID_BASE64, "audio"),
    ({"type": "conversation.item.create"}, Code.MISSING_FIELD, "item"),
    ({"type": "conversation.item.create", "item": {"role": "user"}}, Code.MISSING_FIELD, "item.content"),
    ({"type": "conversation.item.create", "item": {"role": "user", "content": []}}, Code.MISSING_FIELD, "item.content"),
    (
        {
            "type": "conversation.item.create",
            "item": {"role": "robot", "content": [{"type": "input_text", "text": "x"}]},
        },
        Code.INVALID_VALUE,
        "item.role",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "mcp_call", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        },
        Code.INVALID_VALUE,
        "item.type",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"id": "x" * 65, "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        },
        Code.INVALID_VALUE,
        "item.id",
    ),
    (
        {"type": "conversation.item.create", "item": {"role": "user", "content": ["text"]}},
        Code.INVALID_TYPE,
        "item.content[0]",
    ),
    (
        {"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_video"}]}},
        Code.INVALID_VALUE,
        "item.content[0].type",
    ),
    (
        {"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text"}]}},
        Code.MISSING_FIELD,
        "item.content[0].text",
    ),
    (
        {"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_audio"}]}},
        Code.MISSING_FIELD,
        "item.content[0].audio",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"role": "user", "content": [{"type": "input_audio", "audio": "!!"}]},
        },
        Code.INVALID_BASE64,
        "item.content[0].audio",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"role": "user", "content": [{"type": "input_audio", "transcript": 3}]},
        },
        Code.INVALID_TYPE,
        "item.content[0].transcript",
    ),
    (
        {
            "type": "conversation.item.create",
            "previous_item_id": 4,
            "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
        },
        Code.INVALID_TYPE,
        "previous_item_id",
    ),
    ({"type": "conversation.item.retrieve"}, Code.MISSING_FIELD, "item_id"),
    ({"type": "conversation.item.retrieve", "item_id": 1}, Code.INVALID_TYPE, "item_id"),
    ({"type": "conversation.item.delete"}, Code.MISSING_FIELD, "item_id"),
    ({"type": "conversation.item.delete", "item_id": ["a"]}, Code.INVALID_TYPE, "item_id"),
    ({"type": "conversation.item.truncate", "content_index": 0, "audio_end_ms": 0}, Code.MISSING_FIELD, "item_id"),
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 0}, Code.MISSING_FIELD, "content_index"),
    ({"type": "conversation.item.truncate", "item_id": "i", "content_index": 0}, Code.MISSING_FIELD, "audio_end_ms"),
    (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": "0", "audio_end_ms": 0},
        Code.INVALID_TYPE,
        "content_index",
    ),
    (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 1.5},
        Code.INVALID_TYPE,
        "audio_end_ms",
    ),
    (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": True},
        Code.INVALID_TYPE,
        "audio_end_ms",
    ),
    (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": -1, "audio_end_ms": 0},
        Code.INVALID_VALUE,
        "content_index",
    ),
    ({"type": "response.create", "response": "go"}, Code.INVALID_TYPE, "response"),
    (
        {"type": "response.create", "response": {"output_modalities": ["video"]}},
        Code.INVALID_VALUE,
        "response.output_modalities",
    ),
    (
        {"type": "response.create", "response": {"output_modalities": []}},
        Code.INVALID_VALUE,
        "response.output_modalities",
    ),
    ({"type": "response.create", "response": {"instructions": 3}}, Code.INVALID_TYPE, "response.instructions"),
    (
        {"type": "response.create", "response": {"max_output_tokens": 0}},
        Code.INVALID_VALUE,
        "response.max_output_tokens",
    ),
    (
        {"type": "response.create", "response": {"max_output_tokens": "many"}},
        Code.INVALID_VALUE,
        "response.max_output_tokens",
    ),
    ({"type": "response.create", "response": {"temperature": "hot"}}, Code.INVALID_TYPE, "response.temperature"),
    ({"type": "response.create", "response": {"conversation": "new"}}, Code.INVALID_VALUE, "response.conversation"),
    ({"type": "response.create", "response": {"input": "item_1"}}, Code.INVALID_TYPE, "response.input"),
    (
        {"type": "response.create", "response": {"input": [{"type": "item_reference"}]}},
        Code.INVALID_VALUE,
        "response.input[0].id",
    ),
    ({"type": "response.create", "response": {"metadata": [1]}}, Code.INVALID_TYPE, "response.metadata"),
    ({"type": "response.cancel", "response_id": 9}, Code.INVALID_TYPE, "response_id"),
    (
        {"type": "session.resume", "resume_token": "t", "last_received_server_event_seq": 0},
        Code.MISSING_FIELD,
        "session_id",
    ),
    (
        {"type": "session.resume", "session_id": "s", "last_received_server_event_seq": 0},
        Code.MISSING_FIELD,
        "resume_token",
    ),
    (
        {"type": "session.resume", "session_id": "s", "resume_token": "t", "last_received_server_event_seq": "1"},
        Code.INVALID_TYPE,
        "last_received_server_event_seq",
    ),
    ({"type": "session.event_ack"}, Code.MISSING_FIELD, "last_received_server_event_seq"),
    (
        {"type": "session.event_ack", "last_received_server_event_seq": -1},
        Code.INVALID_VALUE,
        "last_received_server_event_seq",
    ),
]


@pytest.mark.parametrize(("event", "code", "param"), BAD_EVENTS, ids=[f"{e['type']}:{p}:{c}" for e, c, p in BAD_EVENTS])
def test_malformed_event_is_refused_with_code_param_and_event_id(event: dict[str, Any], code: str, param: str) -> None:
    err = refused({**event, "event_id": "client_evt_7"})
    assert err.code == code, err.message
    assert err.param == param
    assert err.event_id == "client_evt_7"
    assert err.message


def test_session_update_with_non_object_session_is_invalid_type() -> None:
    err = refused({"type": "session.update", "session": "fast", "event_id": "e"})
    assert (err.code, err.param) == (Code.INVALID_TYPE, "session")


def test_item_part_text_of_wrong_type_is_invalid_type() -> None:
    err = refused(
        {"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", "text": 5}]}}
    )
    assert (err.code, err.param) == (Code.INVALID_TYPE, "item.content[0].text")


# --- session configuration: GA shape ----------------------------------------------

LIMITS = ConfigLimits(voices=("tone",), ignored_fields=("temperature", "tools", "noise_reduction"))
BASE = SessionConfig(model="m", turn_detection=None)


def ga(update: dict[str, Any], current: SessionConfig = BASE) -> tuple[SessionConfig, list[tuple[str, str]]]:
    """A GA update (with its required ``type``: ``realtime`` unless the test names one)."""
    return apply_update(current, {"type": "realtime", **update}, beta=False, limits=LIMITS)


def beta(update: dict[str, Any], current: SessionConfig = BASE) -> tuple[SessionConfig, list[tuple[str, str]]]:
    return apply_update(current, update, beta=True, limits=LIMITS)


def config_refused(update: dict[str, Any], *, is_beta: bool = False) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        apply_update(BASE, update if is_beta else {"type": "realtime", **update}, beta=is_beta, limits=LIMITS)
    return info.value


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "audio/pcm", "rate": 24000}, PCM),
        ({"type": "audio/pcm"}, PCM),
        ({"type": "audio/pcmu"}, PCMU),
        ({"type": "audio/pcma"}, PCMA),
    ],
)
def test_ga_audio_formats_are_accepted(fmt: dict[str, Any], expected: AudioFormat) -> None:
    cfg, _ = ga({"audio": {"input": {"format": fmt}, "output": {"format": fmt}}})
    assert cfg.input_format == expected
    assert cfg.output_format == expected


def test_ga_pcm_at_16k_is_refused_as_unsupported() -> None:
    err = config_refused({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
    assert err.code == Code.UNSUPPORTED_FORMAT
    assert err.param == "session.audio.input.format.rate"


def test_ga_unknown_format_type_is_refused_as_unsupported() -> None:
    err = config_refused({"audio": {"output": {"format": {"type": "audio/opus"}}}})
    assert (err.code, err.param) == (Code.UNSUPPORTED_FORMAT, "session.audio.output.format.type")


@pytest.mark.parametrize(("name", "expected"), [("pcm16", PCM), ("g711_ulaw", PCMU), ("g711_alaw", PCMA)])
def test_beta_audio_formats_are_accepted(name: str, expected: AudioFormat) -> None:
    cfg, _ = beta({"input_audio_format": name, "output_audio_format": name})
    assert (cfg.input_format, cfg.output_format) == (expected, expected)


def test_beta_unknown_format_is_refused_as_unsupported() -> None:
    err = config_refused({"input_audio_format": "opus"}, is_beta=True)
    assert (err.code, err.param) == (Code.UNSUPPORTED_FORMAT, "session.input_audio_format")


@pytest.mark.parametrize("value", [{"type": "audio/pcm"}, ["pcm16"]])
def test_beta_format_of_wrong_json_type_is_refused_not_crashed(value: Any) -> None:
    err = config_refused({"input_audio_format": value}, is_beta=True)
    assert err.code in (Code.UNSUPPORTED_FORMAT, Code.INVALID_TYPE)
    assert err.param == "session.input_audio_format"


def test_turn_detection_null_disables_server_vad() -> None:
    with_vad = SessionConfig(model="m")
    cfg, _ = ga({"audio": {"input": {"turn_detection": None}}}, with_vad)
    assert cfg.turn_detection is None
    cfg, _ = beta({"turn_detection": None}, with_vad)
    assert cfg.turn_detection is None


def test_turn_detection_server_vad_fields_are_parsed_and_defaulted() -> None:
    cfg, _ = ga(
        {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 300}}}}
    )
    assert cfg.turn_detection == TurnDetection(threshold=0.7, silence_duration_ms=300)


def test_turn_detection_update_keeps_fields_not_given() -> None:
    current = SessionConfig(model="m", turn_detection=TurnDetection(threshold=0.9, prefix_padding_ms=100))
    cfg, _ = beta({"turn_detection": {"type": "server_vad", "silence_duration_ms": 700}}, current)
    assert cfg.turn_detection == TurnDetection(threshold=0.9, prefix_padding_ms=100, silence_duration_ms=700)


@pytest.mark.parametrize(
    ("td", "code", "param"),
    [
        ({"type": "vad_of_the_future"}, Code.INVALID_VALUE, "type"),
        ({"threshold": 1.5}, Code.INVALID_VALUE, "threshold"),
        ({"threshold": "high"}, Code.INVALID_TYPE, "threshold"),
        ({"silence_duration_ms": 2.5}, Code.INVALID_TYPE, "silence_duration_ms"),
        ({"create_response": "yes"}, Code.INVALID_TYPE, "create_response"),
        ({"idle_timeout_ms": 10}, Code.INVALID_VALUE, "idle_timeout_ms"),
        ({"sensitivity": 1}, Code.UNKNOWN_PARAMETER, "sensitivity"),
    ],
)
def test_bad_turn_detection_is_refused(td: dict[str, Any], code: str, param: str) -> None:
    err = config_refused({"audio": {"input": {"turn_detection": td}}})
    assert (err.code, err.param) == (code, f"session.audio.input.turn_detection.{param}")


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-realtime-whisper", "my-own-stt"])
def test_any_transcription_model_name_parses(model: str) -> None:
    """No allow-list: every name routes to the engine's speech-to-text."""
    cfg, _ = ga({"audio": {"input": {"transcription": {"model": model, "language": "en"}}}})
    assert cfg.transcription is not None
    assert (cfg.transcription.model, cfg.transcription.language) == (model, "en")
    cfg, _ = beta({"input_audio_transcription": {"model": model}})
    assert cfg.transcription is not None and cfg.transcription.model == model


def test_transcription_null_turns_transcription_off() -> None:
    cfg, _ = ga({"audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    cfg, _ = ga({"audio": {"input": {"transcription": None}}}, cfg)
    assert cfg.transcription is None


@pytest.mark.parametrize("voice", OPENAI_VOICES)
def test_every_openai_voice_is_accepted(voice: str) -> None:
    assert ga({"audio": {"output": {"voice": voice}}})[0].voice == voice
    assert beta({"voice": voice})[0].voice == voice


def test_openai_voices_run_from_alloy_to_cedar() -> None:
    assert OPENAI_VOICES[0] == "alloy" and OPENAI_VOICES[-1] == "cedar"
    assert {"ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin"} <= set(OPENAI_VOICES)


def test_engine_voice_is_accepted() -> None:
    assert ga({"audio": {"output": {"voice": "tone"}}})[0].voice == "tone"


def test_unknown_voice_is_refused() -> None:
    err = config_refused({"audio": {"output": {"voice": "gandalf"}}})
    assert (err.code, err.param) == (Code.INVALID_VALUE, "session.audio.output.voice")
    err = config_refused({"voice": "gandalf"}, is_beta=True)
    assert (err.code, err.param) == (Code.INVALID_VALUE, "session.voice")


@pytest.mark.parametrize(
    ("update", "param", "is_beta"),
    [
        ({"instructions": "x", "colour": "blue"}, "session.colour", False),
        ({"audio": {"input": {"format": {"type": "audio/pcm"}, "gain": 2}}}, "session.audio.input.gain", False),
        ({"audio": {"output": {"pitch": 2}}}, "session.audio.output.pitch", False),
        ({"audio": {"video": {}}}, "session.audio.video", False),
        ({"voice": "alloy"}, "session.voice", False),  # a beta field in a GA update
        ({"output_modalities": ["text"]}, "session.output_modalities", True),  # a GA field in a beta update
        (
            {"input_audio_transcription": {"model": "whisper-1", "beam": 4}},
            "session.input_audio_transcription.beam",
            True,
        ),
    ],
)
def test_unknown_parameter_is_refused(update: dict[str, Any], param: str, is_beta: bool) -> None:
    err = config_refused(update, is_beta=is_beta)
    assert (err.code, err.param) == (Code.UNKNOWN_PARAMETER, param)


def test_refused_update_returns_nothing_and_leaves_current_untouched() -> None:
    current = SessionConfig(model="m", instructions="old", turn_detection=None)
    with pytest.raises(ProtocolError):
        apply_update(
            current,
            {"type": "realtime", "instructions": "new", "audio": {"output": {"voice": "nobody"}}},
            beta=False,
            limits=LIMITS,
        )
    assert current.instructions == "old"


def test_ga_update_applies_every_field_it_names() -> None:
    cfg, warnings = ga(
        {
            "type": "realtime",
            "model": "m",
            "instructions": "be kind",
            "output_modalities": ["text"],
            "max_output_tokens": 200,
            "audio": {"output": {"voice": "verse", "speed": 1.25}},
            "tracing": "auto",
            "tool_choice": "none",
        }
    )
    assert cfg.instructions == "be kind"
    assert cfg.output_modalities == ("text",)
    assert cfg.max_output_tokens == 200
    assert (cfg.voice, cfg.speed) == ("verse", 1.25)
    assert (cfg.tracing, cfg.tool_choice) == ("auto", "none")
    assert warnings == []


def test_ga_session_type_is_realtime_or_transcription() -> None:
    err = config_refused({"type": "translation"})
    assert (err.code, err.param) == (Code.INVALID_VALUE, "session.type")
    cfg, _ = ga({"type": "transcription"})
    assert cfg.type == "transcription"


def test_model_of_a_session_cannot_change() -> None:
    err = config_refused({"model": "other"})
    assert (err.code, err.param) == (Code.INVALID_VALUE, "session.model")


@pytest.mark.parametrize(
    ("update", "param", "code"),
    [
        ({"output_modalities": ["smell"]}, "session.output_modalities", Code.INVALID_VALUE),
        ({"max_output_tokens": 0}, "session.max_output_tokens", Code.INVALID_VALUE),
        ({"max_output_tokens": "lots"}, "session.max_output_tokens", Code.INVALID_TYPE),
        ({"temperature": 3}, "session.temperature", Code.INVALID_VALUE),
        ({"instructions": 5}, "session.instructions", Code.INVALID_TYPE),
        ({"tools": {}}, "session.tools", Code.INVALID_TYPE),
        ({"audio": []}, "session.audio", Code.INVALID_TYPE),
        ({"audio": {"output": {"speed": 4}}}, "session.audio.output.speed", Code.INVALID_VALUE),
    ],
)
def test_bad_ga_values_are_refused_with_their_param(update: dict[str, Any], param: str, code: str) -> None:
    err = config_refused(update)
    assert (err.code, err.param) == (code, param)


def test_max_output_tokens_inf_means_no_limit() -> None:
    cfg, _ = ga({"max_output_tokens": 10})
    assert ga({"max_output_tokens": "inf"}, cfg)[0].max_output_tokens is None
    assert beta({"max_response_output_tokens": "inf"}, cfg)[0].max_output_tokens is None


def test_beta_update_applies_flat_fields() -> None:
    cfg, _ = beta(
        {
            "modalities": ["text"],
            "voice": "shimmer",
            "instructions": "x",
            "speed": 0.5,
            "max_response_output_tokens": 7,
            "input_audio_transcription": {"model": "gpt-4o-transcribe"},
        }
    )
    assert cfg.output_modalities == ("text",)
    assert (cfg.voice, cfg.instructions, cfg.speed, cfg.max_output_tokens) == ("shimmer", "x", 0.5, 7)
    assert cfg.transcription is not None and cfg.transcription.model == "gpt-4o-transcribe"


def test_fields_the_engine_ignores_produce_warnings_not_errors() -> None:
    cfg, warnings = ga({"temperature": 0.3, "tools": [{"type": "function", "name": "f"}], "instructions": "x"})
    assert cfg.temperature == 0.3
    assert len(cfg.tools) == 1
    assert sorted(p for p, _ in warnings) == ["session.temperature", "session.tools"]
    assert all(msg for _, msg in warnings)


def test_ignored_field_set_to_its_neutral_value_gives_no_warning() -> None:
    _, warnings = ga({"tools": []})
    assert warnings == []


def test_noise_reduction_is_validated_and_warned_under_each_dialect_name() -> None:
    cfg, warnings = beta({"input_audio_noise_reduction": {"type": "near_field"}})
    assert cfg.noise_reduction == {"type": "near_field"}
    assert [p for p, _ in warnings] == ["session.input_audio_noise_reduction"]
    cfg, warnings = ga({"audio": {"input": {"noise_reduction": {"type": "far_field", "strength": 0.5}}}})
    assert cfg.noise_reduction == {"type": "far_field", "strength": 0.5}
    assert [p for p, _ in warnings] == ["session.audio.input.noise_reduction"]
    for bad, param in (({"type": "loud"}, "type"), ({"type": "near_field", "strength": 2}, "strength")):
        err = config_refused({"audio": {"input": {"noise_reduction": bad}}})
        assert err.param == f"session.audio.input.noise_reduction.{param}"


# --- session configuration: rendering ----------------------------------------------


def test_render_ga_shape() -> None:
    cfg = SessionConfig(
        model="m", instructions="i", input_format=PCMU, output_format=PCM, voice="coral", turn_detection=None
    )
    out = render(cfg, session_id="sess_1", expires_at=123, beta=False)
    assert out["type"] == "realtime"
    assert out["object"] == "realtime.session"
    assert (out["id"], out["model"], out["expires_at"]) == ("sess_1", "m", 123)
    assert out["output_modalities"] == ["audio"]
    assert out["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert out["audio"]["input"]["turn_detection"] is None
    assert out["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "coral", "speed": 1.0}
    assert out["max_output_tokens"] == "inf"
    for beta_only in ("voice", "modalities", "input_audio_format", "max_response_output_tokens"):
        assert beta_only not in out


def test_render_beta_shape() -> None:
    cfg = SessionConfig(
        model="m", input_format=PCMA, output_format=PCM, voice="ash", max_output_tokens=50, transcription=None
    )
    out = render(cfg, session_id="sess_1", expires_at=123, beta=True)
    assert out["object"] == "realtime.session"
    assert out["modalities"] == ["audio", "text"]
    assert out["voice"] == "ash"
    assert out["input_audio_format"] == "g711_alaw"
    assert out["output_audio_format"] == "pcm16"
    assert out["max_response_output_tokens"] == 50
    assert out["turn_detection"]["type"] == "server_vad"
    assert out["input_audio_transcription"] is None
    for ga_only in ("audio", "output_modalities", "type", "max_output_tokens"):
        assert ga_only not in out


def test_render_text_only_modalities() -> None:
    cfg = SessionConfig(model="m", output_modalities=("text",))
    assert render(cfg, session_id="s", expires_at=0, beta=True)["modalities"] == ["text"]
    assert render(cfg, session_id="s", expires_at=0, beta=False)["output_modalities"] == ["text"]


@pytest.mark.parametrize("is_beta", [False, True])
def test_a_rendered_session_applies_back_unchanged(is_beta: bool) -> None:
    cfg = SessionConfig(
        model="m",
        instructions="x",
        input_format=PCMU,
        output_format=PCMA,
        voice="sage",
        turn_detection=TurnDetection(threshold=0.6),
        max_output_tokens=99,
        transcription=Transcription(model="whisper-1", language="de"),
    )
    rendered = render(cfg, session_id="s", expires_at=1, beta=is_beta)
    again, _ = apply_update(SessionConfig(model="m"), rendered, beta=is_beta, limits=LIMITS)
    assert again == cfg


# --- server event encoding ------------------------------------------------------------


def test_encode_json_base64s_audio_bytes() -> None:
    event = {"type": "response.output_audio.delta", "event_id": "e", "delta": b"\x00\x01\x02"}
    out = orjson.loads(encode_json(event, beta=False))
    assert out["type"] == "response.output_audio.delta"
    assert base64.b64decode(out["delta"]) == b"\x00\x01\x02"


def test_encode_json_leaves_text_deltas_alone() -> None:
    out = orjson.loads(encode_json({"type": "response.output_text.delta", "delta": "hi"}, beta=False))
    assert out["delta"] == "hi"


@pytest.mark.parametrize(("ga_name", "beta_name"), sorted(BETA_NAMES.items()))
def test_encode_json_uses_beta_names_for_beta_clients(ga_name: str, beta_name: str) -> None:
    event = {"type": ga_name, "event_id": "e"}
    assert orjson.loads(encode_json(event, beta=True))["type"] == beta_name
    assert orjson.loads(encode_json(event, beta=False))["type"] == ga_name
    assert event["type"] == ga_name  # the session's event is not mutated


def test_encode_json_keeps_names_common_to_both_protocols() -> None:
    assert orjson.loads(encode_json({"type": "response.done"}, beta=True))["type"] == "response.done"


# --- binary frames -----------------------------------------------------------------


@pytest.mark.parametrize("id_len", range(0, 41))
def test_audio_frame_header_is_4_byte_aligned_and_round_trips(id_len: int) -> None:
    item_id = ("item_" + "x" * 40)[:id_len]
    payload = bytes(range(256)) * 3
    event = {
        "type": "response.output_audio.delta",
        "item_id": item_id,
        "content_index": 3,
        "server_event_seq": 2**40 + 5,
        "delta": payload,
    }
    frame = encode_audio_frame(event)
    assert frame[0] == KIND_OUTPUT_AUDIO
    header_len = frame[1]
    assert header_len % 4 == 0
    assert header_len >= 13 + id_len
    assert header_len - (13 + id_len) < 4  # padding is the minimum
    assert frame[header_len:] == payload
    assert frame[13 + id_len : header_len] == bytes(header_len - 13 - id_len)
    decoded = decode_audio_frame(frame)
    assert decoded == {
        "type": "response.output_audio.delta",
        "server_event_seq": 2**40 + 5,
        "item_id": item_id,
        "content_index": 3,
        "delta": payload,
    }


def test_audio_frame_integers_are_big_endian() -> None:
    frame = encode_audio_frame({"item_id": "ab", "content_index": 0x0102, "server_event_seq": 0x0A0B, "delta": b""})
    assert frame[2:4] == b"\x01\x02"
    assert struct.unpack(">Q", frame[4:12]) == (0x0A0B,)
    assert frame[12] == 2 and frame[13:15] == b"ab"
    assert len(frame) == 16


def test_audio_frame_refuses_an_item_id_too_long_for_the_header() -> None:
    with pytest.raises(ValueError):
        encode_audio_frame({"item_id": "x" * 250, "content_index": 0, "server_event_seq": 1, "delta": b""})


def test_decode_audio_frame_refuses_an_input_frame() -> None:
    with pytest.raises(FrameError):
        decode_audio_frame(encode_input_frame(b"\x00" * 32))


def test_input_frame_round_trips() -> None:
    audio = b"\x10\x20" * 100
    frame = encode_input_frame(audio)
    assert frame[:4] == bytes((KIND_INPUT_AUDIO, 0, 0, 0))
    assert decode_input_frame(frame) == audio


def test_empty_input_frame_carries_no_audio() -> None:
    assert decode_input_frame(encode_input_frame(b"")) == b""


@pytest.mark.parametrize("frame", [b"", b"\x01", b"\x01\x00\x00", b"\x02\x00\x00\x00abcd", b"\x00\x00\x00\x00ab"])
def test_malformed_input_frame_is_invalid_audio_format(frame: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_input_frame(frame)
    assert (info.value.code, info.value.param) == (Code.INVALID_AUDIO, "binary")
