"""Every GA session field, on the Sans-I/O session: accepted whole (a valid GA
``session.update`` is never refused), echoed in the SDK's shape, acted on
where the engine can (semantic VAD, idle timeout, transcription options,
truncation, logprobs, transcription sessions) and reported once where it
cannot. Every event is checked against the SDK's models by the Driver."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import orjson
import pydantic
import pytest
from openai.types.beta.realtime import TranscriptionSessionUpdatedEvent as BetaTranscriptionSessionUpdated
from openai.types.realtime import RealtimeServerEvent, SessionUpdatedEvent
from support.session_driver import TONE, Driver, EnergyVad

from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import TurnDetection
from gateway.session import snapshot
from gateway.session.context import fit_context
from gateway.session.conversation import Item, Part
from gateway.session.effects import Cancel, EndInput, StartResponse, StartTranscription
from gateway.session.snapshot import config_from_dict
from gateway.session.turns import SEMANTIC_WAITS, semantic_silence_ms
from orchestrator.engine import AudioDelta, Finished, TextDelta, TokenLogprob
from orchestrator.engines.passthrough import PassthroughEngine

MS = 48  # bytes of 24 kHz PCM16 per ms
SERVER_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RealtimeServerEvent)

# Every field of the SDK's RealtimeSessionCreateRequest, with a non-default value.
FULL_GA_SESSION: dict[str, Any] = {
    "type": "realtime",
    "model": "test-model",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "max_output_tokens": 512,
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low"},
    "prompt": {"id": "pmpt_123", "version": "2", "variables": {"city": "Paris"}},
    "tracing": {"workflow_name": "support", "group_id": "g1", "metadata": {"k": "v"}},
    "truncation": {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 8000}},
    "include": ["item.input_audio_transcription.logprobs"],
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
        {"type": "mcp", "server_label": "docs", "server_url": "https://example.invalid/mcp"},
    ],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "audio": {
        "input": {
            "format": {"type": "audio/pcmu"},
            "noise_reduction": {"type": "near_field", "strength": 0.7},
            "transcription": {
                "model": "gpt-realtime-whisper",
                "language": "en",
                "prompt": "names: Ada",
                "languages": ["en", "fr"],
                "keywords": ["Ada", "Lovelace"],
                "delay": "low",
            },
            "turn_detection": {
                "type": "semantic_vad",
                "eagerness": "high",
                "create_response": True,
                "interrupt_response": False,
            },
        },
        "output": {"format": {"type": "audio/pcma"}, "voice": {"id": "voice_1234"}, "speed": 1.2},
    },
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def update(d: Driver, session: dict[str, Any]) -> list[dict[str, Any]]:
    events, _ = d.send({"type": "session.update", "session": {"type": "realtime", **session}})
    return events


def test_a_session_update_with_every_ga_field_is_accepted_and_echoed_in_the_sdk_shape() -> None:
    d = Driver(vad_factory=EnergyVad, gateway_events=True)
    events = update(d, FULL_GA_SESSION)
    assert d.types(events)[0] == "session.updated", events
    s = events[0]["session"]
    assert s["reasoning"] == {"effort": "low"} and s["parallel_tool_calls"] is False
    assert s["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": False,
    }  # fmt: skip
    assert s["audio"]["input"]["transcription"]["keywords"] == ["Ada", "Lovelace"]
    assert s["audio"]["output"]["voice"] == {"id": "voice_1234"}  # a custom voice comes back as it went
    assert s["truncation"]["retention_ratio"] == 0.5
    assert s["include"] == ["item.input_audio_transcription.logprobs"]
    assert s["tool_choice"] == {"type": "function", "name": "get_weather"}
    # What no engine here does is reported once each (the client opted in to session.warning).
    warned = {e["param"] for e in events if e["type"] == "session.warning"}
    assert {"session.tracing", "session.prompt", "session.reasoning", "session.audio.input.noise_reduction",
            "session.audio.input.transcription.delay", "session.tools"} <= warned  # fmt: skip
    again = update(d, FULL_GA_SESSION)
    assert d.types(again) == ["session.updated"]  # reported once per session


def test_a_custom_voice_comes_back_as_the_object_typed_clients_read_the_id_of() -> None:
    """Where the SDK types a voice as a name or ``VoiceID`` (the GA session of session.created
    and .updated), a custom voice is the object; where it types a name only (the response
    object of response.created/done, the beta's session), it is the name."""
    d = Driver()
    events = update(d, {"audio": {"output": {"voice": {"id": "voice_7f3a"}}}})
    assert events[0]["session"]["audio"]["output"]["voice"] == {"id": "voice_7f3a"}
    typed = SERVER_EVENTS.validate_python(events[0])  # as openai-agents reads every event
    assert isinstance(typed, SessionUpdatedEvent)
    assert typed.session.audio.output.voice.id == "voice_7f3a"  # type: ignore[union-attr]
    # In a snapshot and back (another replica renders the same object).
    restored = config_from_dict(orjson.loads(snapshot.dumps({"config": d.session.config}))["config"])
    assert restored == d.session.config and restored.custom_voice
    events = update(d, {"instructions": "Be brief."})  # an update that does not name the voice keeps it
    assert events[0]["session"]["audio"]["output"]["voice"] == {"id": "voice_7f3a"}
    # response.create's own custom voice: RealtimeResponse types the voice as a name
    events, _ = d.send({"type": "response.create", "response": {"audio": {"output": {"voice": {"id": "voice_9"}}}}})
    created = next(e for e in events if e["type"] == "response.created")
    assert created["response"]["audio"]["output"]["voice"] == "voice_9"
    d.session.handle(ce.decode(b'{"type": "response.cancel"}'))
    d.take()
    events = update(d, {"audio": {"output": {"voice": "marin"}}})  # a name again: a name
    assert events[0]["session"]["audio"]["output"]["voice"] == "marin"
    # The beta's session types the voice as a name: the custom voice's id
    b = Driver(beta=True)
    events, _ = b.send({"type": "session.update", "session": {"voice": {"id": "voice_7f3a"}}})
    assert events[0]["session"]["voice"] == "voice_7f3a"


def test_a_full_session_is_never_refused_in_the_beta_dialect_either() -> None:
    d = Driver(beta=True, vad_factory=EnergyVad)
    events, _ = d.send(
        {
            "type": "session.update",
            "session": {
                "modalities": ["text", "audio"],
                "voice": "verse",
                "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                "input_audio_noise_reduction": {"type": "far_field"},
                "turn_detection": {"type": "semantic_vad", "eagerness": "low"},
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "tool_choice": "f",
                "max_response_output_tokens": "inf",
                "tracing": "auto",
            },
        }
    )
    assert d.types(events) == ["session.updated"]
    s = events[0]["session"]
    assert s["turn_detection"]["eagerness"] == "low"
    assert s["tool_choice"] == "f"  # beta names a forced function by its name


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"reasoning": {"effort": "extreme"}}, "session.reasoning.effort"),
        ({"truncation": {"type": "retention_ratio", "retention_ratio": 2}}, "session.truncation.retention_ratio"),
        ({"truncation": "sometimes"}, "session.truncation"),
        ({"include": ["everything"]}, "session.include[0]"),
        ({"tools": [{"type": "function", "name": "has space"}]}, "session.tools[0].name"),
        ({"tools": [{"type": "web_search"}]}, "session.tools[0].type"),
        ({"tool_choice": "sometimes"}, "session.tool_choice"),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
         "session.audio.input.turn_detection.eagerness"),
        ({"audio": {"input": {"transcription": {"keywords": "Ada"}}}}, "session.audio.input.transcription.keywords"),
        ({"audio": {"output": {"voice": {"name": "x"}}}}, "session.audio.output.voice.name"),
        ({"prompt": {"version": "1"}}, "session.prompt.id"),
    ],
)  # fmt: skip
def test_invalid_values_of_the_new_fields_are_refused_with_their_param(session: dict[str, Any], param: str) -> None:
    d = Driver(vad_factory=EnergyVad)
    before = d.session.config
    err = d.error({"type": "session.update", "event_id": "u", "session": {"type": "realtime", **session}})
    assert err["param"] == param, err
    assert err["event_id"] == "u"
    assert d.session.config == before


# --- transcription options reach the engine --------------------------------------------


def test_transcription_model_language_prompt_and_keywords_reach_the_engine() -> None:
    d = Driver()
    update(d, {"audio": {"input": {"transcription": {"model": "my-stt", "language": "fr", "prompt": "p",
                                                     "keywords": ["Ada"], "languages": ["fr"]}}}})  # fmt: skip
    _, effects = d.send({"type": "input_audio_buffer.append", "audio": b64(bytes(100 * MS))})
    start = next(e for e in effects if isinstance(e, StartTranscription)).request
    assert (start.model, start.language, start.prompt, start.keywords, start.languages, start.logprobs) == (
        "my-stt", "fr", "p", ("Ada",), ("fr",), False,
    )  # fmt: skip


def test_include_logprobs_asks_the_engine_and_carries_them_in_the_transcription_events() -> None:
    d = Driver()
    update(d, {"include": ["item.input_audio_transcription.logprobs"],
               "audio": {"input": {"transcription": {"model": "whisper-1"}}}})  # fmt: skip
    _, effects = d.send({"type": "input_audio_buffer.append", "audio": b64(bytes(200 * MS))})
    request = next(e for e in effects if isinstance(e, StartTranscription)).request
    assert request.logprobs
    d.send({"type": "input_audio_buffer.commit"})
    lp = (TokenLogprob("hello", -0.25, tuple(b"hello")),)
    d.session.on_transcription(request.request_id, TextDelta("hello", logprobs=lp))
    d.session.on_transcription(request.request_id, Finished(text="hello"))
    events, _ = d.take()
    delta = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta")
    done = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    expected = [{"token": "hello", "logprob": -0.25, "bytes": list(b"hello")}]
    assert delta["logprobs"] == expected and done["logprobs"] == expected


def test_without_include_no_logprobs_are_sent_even_if_the_engine_has_them() -> None:
    d = Driver()
    update(d, {"audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    _, effects = d.send({"type": "input_audio_buffer.append", "audio": b64(bytes(200 * MS))})
    request = next(e for e in effects if isinstance(e, StartTranscription)).request
    d.send({"type": "input_audio_buffer.commit"})
    d.session.on_transcription(request.request_id, TextDelta("hi", logprobs=(TokenLogprob("hi", -1.0),)))
    events, _ = d.take()
    assert "logprobs" not in events[-1]


# --- semantic VAD --------------------------------------------------------------------


def test_semantic_silence_follows_the_transcript_within_the_eagerness_bounds() -> None:
    complete, unknown, trailing = SEMANTIC_WAITS["high"]
    assert semantic_silence_ms("", "high") == unknown
    assert semantic_silence_ms("what is your name", "high") == complete
    assert semantic_silence_ms("what is your name?", "high") == complete
    assert semantic_silence_ms("I want to go to the", "high") == trailing
    assert semantic_silence_ms("so um", "high") == trailing
    assert semantic_silence_ms("well,", "high") == trailing
    assert SEMANTIC_WAITS["low"][2] == 8000 and SEMANTIC_WAITS["medium"][2] == 4000 and trailing == 2000
    assert SEMANTIC_WAITS["auto"] == SEMANTIC_WAITS["medium"]


def semantic_turn(transcript: str) -> int:
    """Silence (ms) streamed after 300 ms of speech before semantic VAD ended the turn."""
    d = Driver(vad_factory=EnergyVad, turn_detection=TurnDetection(type="semantic_vad", eagerness="high"))
    _, effects = d.send({"type": "input_audio_buffer.append", "audio": b64(TONE * 15)})
    request = next(e for e in effects if isinstance(e, StartTranscription)).request
    d.session.on_transcription(request.request_id, TextDelta(transcript))
    d.take()
    for silent_ms in range(20, 10_000, 20):
        events, _ = d.send({"type": "input_audio_buffer.append", "audio": b64(bytes(20 * MS))})
        if "input_audio_buffer.speech_stopped" in d.types(events):
            assert "response.created" in d.types(events)  # create_response: the turn is answered
            return silent_ms
    raise AssertionError("the turn never ended")


def test_semantic_vad_ends_a_finished_phrase_sooner_than_one_that_trails_off() -> None:
    finished = semantic_turn("what is your name")
    trailing = semantic_turn("I would like to")
    complete_ms, _, trailing_ms = SEMANTIC_WAITS["high"]
    assert complete_ms <= finished < complete_ms + 200, finished
    assert trailing_ms <= trailing < trailing_ms + 200, trailing


# --- idle timeout ----------------------------------------------------------------------


def test_idle_timeout_after_the_answer_played_triggers_an_empty_turn_and_a_response() -> None:
    d = Driver(vad_factory=EnergyVad, turn_detection=TurnDetection(idle_timeout_ms=5000))
    resp = d.respond()
    d.output(resp, TextDelta("hi"), *[AudioDelta(TONE)] * 10, Finished())
    played_ms = 200  # 10 chunks of 20 ms
    silence = b64(bytes(100 * MS))
    for _ in range((5000 + played_ms) // 100 - 1):
        events, _ = d.send({"type": "input_audio_buffer.append", "audio": silence})
        assert "input_audio_buffer.timeout_triggered" not in d.types(events)
    events, effects = d.send({"type": "input_audio_buffer.append", "audio": silence})
    types = d.types(events)
    assert types[:5] == [
        "input_audio_buffer.timeout_triggered", "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.done", "response.created",
    ], types  # fmt: skip
    timeout = events[0]
    assert timeout["audio_end_ms"] - timeout["audio_start_ms"] >= 5000
    assert any(isinstance(e, StartResponse) for e in effects)
    # Not again until the next answer has ended.
    events, _ = d.send({"type": "input_audio_buffer.append", "audio": silence})
    assert "input_audio_buffer.timeout_triggered" not in d.types(events)


def test_idle_timeout_is_not_armed_before_any_answer_and_speech_disarms_it() -> None:
    d = Driver(vad_factory=EnergyVad, turn_detection=TurnDetection(idle_timeout_ms=5000, create_response=False))
    for _ in range(60):
        events, _ = d.send({"type": "input_audio_buffer.append", "audio": b64(bytes(100 * MS))})
        assert "input_audio_buffer.timeout_triggered" not in d.types(events)


# --- transcription sessions ---------------------------------------------------------------


def test_a_transcription_session_transcribes_turns_and_creates_no_response() -> None:
    d = Driver(vad_factory=EnergyVad)
    events, _ = d.send({"type": "session.update", "session": {
        "type": "transcription",
        "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}, "turn_detection": {"type": "server_vad"}}},
    }})  # fmt: skip
    s = events[0]["session"]
    assert (s["type"], s["object"]) == ("transcription", "realtime.transcription_session")
    assert "output_modalities" not in s and "tools" not in s
    events, effects = d.send({"type": "input_audio_buffer.append", "audio": b64(TONE * 20 + bytes(800 * MS))})
    assert "input_audio_buffer.committed" in d.types(events)
    assert "response.created" not in d.types(events)
    assert not any(isinstance(e, StartResponse) for e in effects)
    request = next(e for e in effects if isinstance(e, StartTranscription)).request
    d.session.on_transcription(request.request_id, Finished(text="hello"))
    events, _ = d.take()
    # one delta, the whole transcript, as the API sends for a model that does not stream it
    assert d.types(events) == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert events[0]["delta"] == events[1]["transcript"] == "hello"
    err = d.error({"type": "response.create", "event_id": "r"})
    assert (err["code"], err["event_id"]) == (Code.UNSUPPORTED, "r")


# --- truncation ---------------------------------------------------------------------------


def items(n: int, chars: int = 400) -> list[Item]:
    return [Item(f"item_{i}", "user", [Part("input_text", text="x" * chars)]) for i in range(n)]


def test_auto_truncation_drops_the_oldest_items_until_the_rest_fits() -> None:
    conversation = items(10)  # ~104 tokens each
    kept = fit_context(conversation, "", "auto", max_context_tokens=1000, max_output_tokens=200)
    assert [it.id for it in kept] == [f"item_{i}" for i in range(3, 10)]  # 7 x 104 <= 800
    assert fit_context(conversation, "", "disabled", 1000, 200) == conversation
    assert fit_context(conversation, "", "auto", None, None) == conversation  # unknown context: all of it


def test_retention_ratio_cuts_deeper_and_honours_post_instruction_limits() -> None:
    conversation = items(10)
    ratio = {"type": "retention_ratio", "retention_ratio": 0.5}
    kept = fit_context(conversation, "", ratio, max_context_tokens=1000, max_output_tokens=200)
    assert len(kept) == 3  # at most half of the 800-token budget
    limited = {**ratio, "retention_ratio": 1.0, "token_limits": {"post_instructions": 300}}
    assert len(fit_context(conversation, "", limited, None, None)) == 2


def test_truncation_never_keeps_a_call_output_without_its_call() -> None:
    call = Item("c", "assistant", [], type="function_call", call_id="call_1", name="f", arguments="{}" * 200)
    output = Item("o", "user", [], type="function_call_output", call_id="call_1", output="ok")
    kept = fit_context([call, output, *items(2)], "", "auto", max_context_tokens=400, max_output_tokens=100)
    assert [it.id for it in kept] == ["item_0", "item_1"]


def test_the_session_sends_the_engine_only_what_fits() -> None:
    info = replace(PassthroughEngine().info, max_context_tokens=1000)
    d = Driver(engine=info, max_output_tokens=200)
    for i in range(10):
        d.user_text("x" * 400, item_id=f"u{i}")
    _, effects = d.send({"type": "response.create"})
    request = next(e for e in effects if isinstance(e, StartResponse)).request
    assert len(request.messages) == 7
    assert len(d.session.conversation) == 11  # the conversation keeps every item (and the answer)
    assert any(isinstance(e, EndInput) for e in effects)


# --- out-of-band responses ----------------------------------------------------------------


def test_an_out_of_band_response_runs_beside_the_conversations_and_stays_out_of_it() -> None:
    d = Driver(output_modalities=("text",))
    d.user_text("hello")
    main = d.respond()
    oob = d.respond(conversation="none", metadata={"topic": "summary"})
    assert d.session.active_response_id == main
    d.output(oob, TextDelta("short summary"))
    d.output(main, TextDelta("the answer"))
    events = d.output(oob, Finished())
    done = events[-2] if events[-1]["type"] == "rate_limits.updated" else events[-1]
    assert done["response"]["id"] == oob and done["response"]["conversation_id"] is None
    assert done["response"]["metadata"] == {"topic": "summary"}
    assert d.session.active_response_id == main  # still running
    events = d.output(main, Finished())
    assert [e["response"]["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    texts = [p.content_text for it in d.session.conversation for p in it.content]
    assert texts == ["hello", "the answer"]  # the out-of-band answer is not in the conversation


def test_out_of_band_responses_are_bounded_and_cancelled_by_id() -> None:
    d = Driver(output_modalities=("text",))
    ids = [d.respond(conversation="none") for _ in range(d.session.limits.max_out_of_band)]
    err = d.error({"type": "response.create", "event_id": "x", "response": {"conversation": "none"}})
    assert (err["code"], err["event_id"]) == (Code.RESPONSE_ACTIVE, "x")
    events, effects = d.send({"type": "response.cancel", "response_id": ids[1]})
    assert any(isinstance(e, Cancel) and e.request_id == ids[1] for e in effects)  # the engine request aborted
    done = next(e for e in events if e["type"] == "response.done")
    assert (done["response"]["id"], done["response"]["status"]) == (ids[1], "cancelled")
    assert d.respond(conversation="none")  # room again
    d.respond()  # and the conversation's own response is independent of them


def test_a_takeover_ends_and_reissues_out_of_band_responses_too() -> None:
    from gateway.session import snapshot
    from gateway.session.session import RealtimeSession

    d = Driver(output_modalities=("text",))
    oob = d.respond(conversation="none")
    d.output(oob, TextDelta("part"))
    state = snapshot.loads(snapshot.dumps(d.session.snapshot_state()))
    other = RealtimeSession.restore(state, engine=d.session.engine, vad_factory=None)
    other.recover("replica_lost")
    events, effects = other.take()
    done = next(e for e in events if e["type"] == "response.done")
    assert (done["response"]["id"], done["response"]["status"]) == (oob, "incomplete")
    assert done["response"]["status_details"] == {"type": "incomplete", "gateway_reason": "replica_lost"}
    again = next(e for e in effects if isinstance(e, StartResponse)).request
    assert again.request_id != oob and other.active_response_id is None  # re-issued out of band


# --- session.update as the API answers it -------------------------------------------------


def refusal(d: Driver, event: dict[str, Any]) -> dict[str, Any]:
    """The error a bad event gets, whether the decoder (as the transport calls it) or the
    session refuses it."""
    try:
        return d.error(event)
    except ProtocolError as err:
        return {"code": err.code, "param": err.param, "message": err.message}


def test_a_ga_session_update_without_its_type_is_refused_as_the_api_refuses_it() -> None:
    d = Driver()
    err = d.error({"type": "session.update", "event_id": "u1", "session": {"instructions": "Be brief."}})
    assert (err["code"], err["param"], err["event_id"]) == ("missing_required_parameter", "session.type", "u1")
    assert err["message"] == "Missing required parameter: 'session.type'."
    assert d.session.config.instructions == ""  # nothing applied
    # the beta's session objects have no type
    beta = Driver(beta=True)
    events, _ = beta.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    assert beta.types(events) == ["session.updated"]


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 4097}},
         "session.max_output_tokens"),
        ({"type": "response.create", "response": {"max_output_tokens": 8192}}, "response.max_output_tokens"),
    ],
)  # fmt: skip
def test_max_output_tokens_over_the_apis_bound_is_refused(event: dict[str, Any], param: str) -> None:
    d = Driver()
    err = refusal(d, event)
    assert (err["code"], err["param"]) == (Code.INTEGER_ABOVE_MAX, param)
    assert "4096" in err["message"] and "inf" in err["message"]
    d.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 4096}})
    assert d.session.config.max_output_tokens == 4096


def test_ga_output_modalities_are_one_of_audio_or_text_the_betas_may_be_both() -> None:
    d = Driver()
    err = d.error({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio", "text"]}})
    assert (err["code"], err["param"]) == (Code.INVALID_VALUE, "session.output_modalities")
    err = refusal(d, {"type": "response.create", "response": {"output_modalities": ["audio", "text"]}})
    assert (err["code"], err["param"]) == (Code.INVALID_VALUE, "response.output_modalities")
    beta = Driver(beta=True)
    events, _ = beta.send({"type": "session.update", "session": {"modalities": ["audio", "text"]}})
    assert events[0]["session"]["modalities"] == ["audio", "text"]


def test_the_voice_is_fixed_once_the_conversation_holds_assistant_audio() -> None:
    d = Driver()
    voice = {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "ash"}}}}
    d.send(voice)  # before any audio: applied
    assert d.session.config.voice == "ash"
    d.completed_audio_response()
    again = d.send(voice)[0]  # the same voice again (the Agents SDK re-sends its settings): fine
    assert d.types(again) == ["session.updated"]
    err = d.error({**voice, "event_id": "v", "session": {"type": "realtime", "audio": {"output": {"voice": "coral"}}}})
    assert (err["code"], err["param"], err["event_id"]) == (
        Code.CANNOT_UPDATE_VOICE, "session.audio.output.voice", "v",
    )  # fmt: skip
    assert err["message"] == "Cannot update a conversation's voice if assistant audio is present."
    assert d.session.config.voice == "ash"


def test_instructions_an_engine_cannot_follow_are_warned_of() -> None:
    d = Driver(gateway_events=True)  # the passthrough engine has no model to follow them
    events, _ = d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
    warning = next(e for e in events if e["type"] == "session.warning")
    assert (warning["code"], warning["param"]) == ("unsupported_field", "session.instructions")
    assert "does not follow" in warning["message"]


# --- the beta's transcription sessions ---------------------------------------------------


def test_a_beta_transcription_session_update_makes_a_transcription_session() -> None:
    d = Driver(beta=True, vad_factory=EnergyVad)
    events, _ = d.send({"type": "transcription_session.update", "event_id": "t", "session": {
        "input_audio_format": "pcm16",
        "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
    }})  # fmt: skip
    assert d.types(events) == ["transcription_session.updated"]
    session = events[0]["session"]
    # The SDK's TranscriptionSession requires a client_secret: an empty one, never a usable key
    assert session["client_secret"] == {"value": "", "expires_at": 0}
    typed = BetaTranscriptionSessionUpdated.model_validate(events[0], strict=True)
    assert typed.session.client_secret.value == ""
    assert session["input_audio_transcription"]["model"] == "gpt-4o-transcribe"
    assert session["turn_detection"]["silence_duration_ms"] == 300 and session["modalities"] == ["text"]
    assert d.session.config.type == "transcription"
    events, _ = d.send({"type": "input_audio_buffer.append", "audio": b64(TONE * 20 + bytes(800 * MS))})
    assert "input_audio_buffer.committed" in d.types(events) and "response.created" not in d.types(events)
    err = d.error({"type": "transcription_session.update", "session": {"modalities": ["audio", "text"]}})
    assert (err["code"], err["param"]) == (Code.INVALID_VALUE, "session.modalities")
    # GA clients make one with session.update: the beta's event is unknown there, with the way to it
    err = Driver().error({"type": "transcription_session.update", "session": {}})
    assert (err["code"], err["param"]) == (Code.UNKNOWN_EVENT, "type")
    assert "session.type" in err["message"]
