"""The duplex dialect, Sans-I/O: its decoder and encoder, its session object, and
the ``DuplexSession`` driven directly (client events in, events out, engine
outputs fed back), as ``test_session.py`` drives the GA session."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import orjson
import pytest
from support import upstream_docs as doc

from gateway.audio.vad import FRAME_MS
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.dialects import DUPLEX
from gateway.protocol.duplex_config import DuplexConfig, apply_duplex_update, default_session_config
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import ConfigLimits, TurnDetection
from gateway.session.duplex import DuplexSession
from gateway.session.effects import Cancel, CloseSocket, StartResponse
from gateway.session.events import STATE_EVENTS
from gateway.session.turns import FRAME_MS as TURN_FRAME_MS
from orchestrator.engine import AudioDelta, Finished, TextDelta
from orchestrator.engines.passthrough import PassthroughEngine

INFO = PassthroughEngine().info
TONE = PassthroughEngine()._chunk  # 20 ms of 24 kHz PCM16


def loud(ms: int) -> bytes:
    t = np.arange(16 * ms)
    return (np.sign(np.sin(2 * np.pi * 200 * t / 16000)) * 3000).astype("<i2").tobytes()


def wire(event: dict[str, Any]) -> dict[str, Any]:
    """The event as the client reads it (the dialect's encoder)."""
    decoded: dict[str, Any] = orjson.loads(de.encode(event))
    return decoded


class EnergyVad:
    """A speech detector by energy (silero's place in the VadStream protocol): one
    probability per 32 ms frame of 16 kHz PCM16."""

    def __init__(self) -> None:
        self.tail = b""

    def process(self, pcm: bytes) -> list[float]:
        data, out = self.tail + pcm, []
        while len(data) >= 1024:
            frame = np.frombuffer(data[:1024], dtype="<i2").astype(np.float32) / 32768
            out.append(1.0 if float(np.sqrt(np.mean(frame * frame))) > 0.02 else 0.0)
            data = data[1024:]
        self.tail = data
        return out

    def reset(self) -> None:
        self.tail = b""


class Driver:
    def __init__(self, *, vad: bool = False, **duplex: Any) -> None:
        config = default_session_config("m")
        if vad:
            config = replace(config, turn_detection=TurnDetection(silence_duration_ms=200))
        self.now = 1000.0  # the wall clock of the playback ledgers (s)
        self.session = DuplexSession(
            session_id="sess_d",
            config=config,
            engine=INFO,
            duplex=DuplexConfig(**duplex),
            vad_factory=EnergyVad if vad else None,
            wall_clock=lambda: self.now,
        )
        self.events: list[dict[str, Any]] = []
        self.effects: list[Any] = []
        self.words = 0  # words of the running answer
        self.session.start(resume_token="rt_x")
        self.take()

    @classmethod
    def around(cls, session: DuplexSession) -> Driver:
        """A driver of a session made elsewhere (restored from a snapshot)."""
        driver = cls.__new__(cls)
        driver.now, driver.session, driver.events, driver.effects, driver.words = 1000.0, session, [], [], 0
        return driver

    def take(self) -> list[dict[str, Any]]:
        events, effects = self.session.take()
        self.events += events
        self.effects += effects
        return events

    def send(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self.session.handle(de.decode(orjson.dumps(event)))
        return self.take()

    def append(self, pcm: bytes, **hints: Any) -> list[dict[str, Any]]:
        import base64

        return self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode(), **hints})

    def answer(self, words: int, *, finish: bool = False) -> str:
        """Produce ``words`` passthrough-like outputs (a word, then 20 ms) on the running answer."""
        resp = self.session.responses.current
        assert resp is not None
        if not resp.part.transcript:
            self.words = 0
        for _ in range(words):
            self.session.on_response(resp.id, TextDelta(f"w{self.words} "))
            self.session.on_response(resp.id, AudioDelta(TONE))
            self.words += 1
        if finish:
            self.session.on_response(resp.id, Finished())
        self.take()
        return resp.id

    def types(self, events: list[dict[str, Any]]) -> list[str]:
        return [e["type"] for e in events]


# --- the decoder and the encoder -----------------------------------------------------------


@pytest.mark.parametrize(("alias", "canonical"), sorted(de.ALIASES.items()))
def test_every_alias_decodes_as_its_canonical_event(alias: str, canonical: str) -> None:
    payload = {"audio": "AAAA", "text": "hi", "event": "barge_in", "played_ms": 5, "final": True}
    assert type(de.decode(orjson.dumps({"type": alias, **payload}))) is type(
        de.decode(orjson.dumps({"type": canonical, **payload}))
    )


def test_an_ack_takes_either_spelling_and_a_bad_one_is_an_ack_error() -> None:
    assert de.decode(b'{"type": "session.event_ack", "server_event_seq": 7}') == ce.EventAck(None, 7)
    assert ce.decode(b'{"type": "session.event_ack", "last_received_server_event_seq": 7}') == ce.EventAck(None, 7)
    with pytest.raises(ce.AckError):
        ce.decode(b'{"type": "session.event_ack", "server_event_seq": -1}')


def test_a_resume_without_a_seq_resumes_from_zero_as_upstream_does() -> None:
    event = de.decode(b'{"type": "session.resume", "session_id": "s", "resume_token": "t"}')
    assert isinstance(event, ce.SessionResume) and event.last_received_server_event_seq == 0


@pytest.mark.parametrize("kind", doc.DUPLEX_NOT_ACCEPTED)
def test_the_pre_realtime_append_aliases_are_refused_by_name(kind: str) -> None:
    """ "Event catalogue": push_chunk and input.audio.append "are **not** accepted on this route"."""
    with pytest.raises(ProtocolError) as refused:
        de.decode(orjson.dumps({"type": kind, "event_id": "e1", "audio": "AAAA"}))
    assert (refused.value.code, refused.value.param, refused.value.event_id) == (Code.UNKNOWN_EVENT, "type", "e1")
    assert kind in refused.value.message and "input_audio_buffer.append" in refused.value.message


def test_the_aliases_are_the_documents() -> None:
    assert de.ALIASES == {**doc.DUPLEX_ALIASES, "input.commit": "input_audio_buffer.commit"}


def test_the_encoder_keeps_the_documents_audio_names_and_maps_error_codes() -> None:
    # "Event catalogue" > "Server to client": response.output_audio.delta, base64 in "delta"
    delta = orjson.loads(de.encode({"type": "response.output_audio.delta", "delta": b"\x01\x02"}))
    assert delta == {"type": "response.output_audio.delta", "delta": "AQI="}
    for kind in ("response.output_audio.done", "response.output_audio_transcript.delta"):
        assert orjson.loads(de.encode({"type": kind}))["type"] == kind
    done = orjson.loads(de.encode({"type": "response.done", "response": {"id": "resp_1"}}))
    assert done["response_id"] == "resp_1"
    err = orjson.loads(de.encode({"type": "error", "error": {"code": Code.BUFFER_TOO_SMALL, "message": "m"}}))
    assert err["error"]["code"] == "input_audio_buffer_empty"
    assert "server_event_seq" not in orjson.loads(de.heartbeat_ack("s"))


# --- the session object --------------------------------------------------------------------------


def test_the_session_object_takes_the_beta_fields_the_ga_audio_object_and_the_duplex_keys() -> None:
    config, duplex, warnings = apply_duplex_update(
        default_session_config("m"),
        DuplexConfig(),
        {
            "modalities": ["text"],
            "input_audio_format": "pcm16",
            "sample_rate_hz": 8000,
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}},
            "overlap_policy": "barge_in_on_speech",
            "extra_body": {"auto_response": False, "playback_commit_policy": "ack_only"},
            "state": "open",
            "some_new_key": 1,
        },
        limits=ConfigLimits(),
    )
    assert config.output_modalities == ("text",)
    assert (config.input_format.rate, config.output_format.rate) == (8000, 16000)
    assert duplex.overlap_policy == "barge_in_on_speech" and duplex.playback_commit_policy == "ack_only"
    assert duplex.auto_response is False
    assert warnings == [
        ("session.some_new_key", "'some_new_key' is not a field of the duplex session object; ignored.")
    ]


@pytest.mark.parametrize("encoding", [f for f in doc.DUPLEX_INPUT_FORMATS if f != "pcm_f32le"])
def test_every_input_format_of_the_document_but_float_pcm_is_spoken(encoding: str) -> None:
    config, _, _ = apply_duplex_update(
        default_session_config("m"), DuplexConfig(), {"input_audio_format": encoding}, limits=ConfigLimits()
    )
    assert config.input_format.codec == {"g711_ulaw": "pcmu", "g711_alaw": "pcma"}.get(encoding, "pcm16")


def test_float_pcm_is_refused_by_name() -> None:
    with pytest.raises(ProtocolError) as refused:
        apply_duplex_update(
            default_session_config("m"), DuplexConfig(), {"input_audio_format": "pcm_f32le"}, limits=ConfigLimits()
        )
    assert "pcm_f32le" in refused.value.message and "s16le" in refused.value.message


@pytest.mark.parametrize(
    ("update", "param", "code"),
    [
        ({"sample_rate_hz": 96000}, "session.input_audio_format", Code.UNSUPPORTED_FORMAT),
        ({"input_audio_format": "pcm_f32le"}, "session.input_audio_format", Code.UNSUPPORTED_FORMAT),
        ({"input_audio_format": "opus"}, "session.input_audio_format", Code.UNSUPPORTED_FORMAT),
        ({"idle_timeout_s": 0}, "session.idle_timeout_s", Code.INVALID_VALUE),
        ({"overlap_barge_in_ms": -1}, "session.overlap_barge_in_ms", Code.INVALID_VALUE),
        ({"playback_commit_policy": "always"}, "session.playback_commit_policy", Code.INVALID_VALUE),
        ({"extra_body": {"auto_response": "yes"}}, "session.extra_body.auto_response", Code.INVALID_TYPE),
        ({"temperature": 9}, "session.temperature", Code.INVALID_VALUE),
    ],
)
def test_a_bad_value_of_a_known_key_is_refused_with_its_param(update: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        apply_duplex_update(default_session_config("m"), DuplexConfig(), update, limits=ConfigLimits())
    assert (refused.value.param, refused.value.code) == (param, code)


# --- the session ----------------------------------------------------------------------------------


def test_session_created_carries_the_duplex_identity_and_capabilities() -> None:
    d = Driver()
    created = d.events[0]
    # "Session lifecycle": S→C session.created (no incarnation: the session id is never reused)
    assert doc.gaps(doc.SESSION_CREATED, created) == [] and "incarnation" not in created
    assert (created["type"], created["attachment_generation"]) == ("session.created", 1)
    assert created["session"]["capabilities"]["supports_session_resume"] is True
    # "chunk_period_ms": an integer, as the document has it (a client sizes appends and
    # aligns decisions to it): the server VAD's frame, the period this gateway decides at
    period = created["session"]["capabilities"]["chunk_period_ms"]
    assert type(period) is type(doc.SESSION_CREATED["session"]["capabilities"]["chunk_period_ms"]) is int
    assert period == FRAME_MS == int(TURN_FRAME_MS)


def test_a_commit_answers_unless_auto_response_is_off() -> None:
    d = Driver()
    d.append(loud(200))
    events = d.send({"type": "input_audio_buffer.commit"})
    assert "response.created" in d.types(events)
    quiet = Driver(extra_body={"auto_response": False})
    quiet.append(loud(200))
    assert "response.created" not in quiet.types(quiet.send({"type": "input.commit"}))
    quiet.append(loud(200))
    assert "response.created" in quiet.types(quiet.send({"type": "input.commit", "response_create": True}))


def transcribed(d: Driver, item_id: str, text: str) -> list[dict[str, Any]]:
    """The recognizer finishes the item's transcript."""
    d.session.on_transcription(f"input_{item_id}", Finished(text=text))
    return d.take()


def test_a_manual_turn_fans_out_as_the_document_shows_it() -> None:
    """ "Input": speech_started at the first append that is speech, speech_stopped before the
    commit, then the commit fan-out "in this order": added, created, committed, completed, done
    (done, with the transcript, once the recognizer has it; the answer does not wait)."""
    d = Driver()
    assert d.types(d.append(bytes(3200))) == []  # silence (RMS under overlap_silence_rms): no onset
    started = d.append(loud(200))
    assert d.types(started) == ["input_audio_buffer.speech_started"]
    item_id = started[0]["item_id"]
    assert doc.gaps(doc.SPEECH_STARTED, started[0]) == [] and started[0]["audio_start_ms"] == 100
    assert d.types(d.append(loud(100), is_speech=True)) == []  # said once per turn
    events = d.send(doc.COMMIT)
    assert d.types(events)[:4] == [
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "conversation.item.created",
        "input_audio_buffer.committed",
    ]
    stopped, added, created, committed = events[:4]
    assert doc.gaps(doc.SPEECH_STOPPED, stopped) == [] and (stopped["item_id"], stopped["audio_end_ms"]) == (
        item_id,
        400,
    )
    for example, sent in ((doc.USER_ITEM_ADDED, added), (doc.USER_ITEM_CREATED, created), (doc.COMMITTED, committed)):
        assert doc.gaps(example, sent) == [], example["type"]
    assert committed["item_id"] == item_id and committed["event"]["message"] == doc.COMMITTED["event"]["message"]
    assert (committed["event"]["turn_id"], committed["event"]["history_len"]) == (1, 1)
    assert "conversation.item.done" not in d.types(events) and "response.created" in d.types(events)
    rest = transcribed(d, item_id, "what is the weather today")
    assert d.types(rest) == ["conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    assert rest[0] == {**rest[0], **doc.TRANSCRIPTION_COMPLETED, "item_id": item_id}
    assert (
        rest[1]["item"]["id"] == item_id and rest[1]["item"]["content"][0]["transcript"] == "what is the weather today"
    )
    names_it = [e for e in d.events if item_id in (e.get("item_id"), e.get("item", {}).get("id"))]
    fan_out = [e["type"] for e in names_it if e["type"] in doc.COMMIT_FAN_OUT]
    assert fan_out == list(doc.COMMIT_FAN_OUT)
    assert not any(e["type"].endswith("input_audio_transcription.delta") for e in d.events)


def test_a_failed_transcript_is_an_error_and_the_fan_out_still_ends() -> None:
    d = Driver()
    item_id = d.append(loud(200))[0]["item_id"]
    d.send(doc.COMMIT)
    d.session.on_transcription_failed(f"input_{item_id}", "stt_failed", "no recognizer")
    events = d.take()
    assert d.types(events) == ["error", "conversation.item.done"]
    assert events[0]["error"]["code"] == "stt_failed" and item_id in events[0]["error"]["message"]


def test_a_held_fan_out_survives_a_takeover_and_ends_on_the_new_replica() -> None:
    d = Driver()
    item_id = d.append(loud(200))[0]["item_id"]
    d.send({**doc.COMMIT, "response_create": False})
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None)
    assert again.snapshot_state()["held_done"] == [item_id]
    again.recover("replica_lost")  # the transcription died with the old replica
    kinds = [e["type"] for e in again.events]
    assert kinds[:2] == ["error", "conversation.item.done"] and again.events[1]["item"]["id"] == item_id


def test_an_answer_opens_speaks_and_pairs_each_audio_delta_with_one_transcript_delta_as_documented() -> None:
    """ "Response lifecycle": created, the assistant item added and created, output item,
    content part, speak; then each audio delta and "exactly one" transcript delta per audio
    delta; then the closing events in the document's order."""
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    mark = next(i for i, e in enumerate(d.events) if e["type"] == "response.created")
    d.answer(3, finish=True)
    answer = d.events[mark:]
    kinds = [k for k in d.types(answer) if not k.endswith(".delta")]
    assert kinds == [k for k in doc.ANSWER if not k.endswith(".delta") and k != "rate_limits.updated"]  # (no limits)
    first = d.types(answer).index("response.output_audio.delta")
    assert d.types(answer)[first - 1] == "response.speak" and d.types(answer).count("response.speak") == 1
    deltas = [e for e in answer if e["type"].endswith(".delta")]
    assert d.types(deltas) == ["response.output_audio.delta", "response.output_audio_transcript.delta"] * 3
    assert [e["delta"] for e in deltas[1::2]] == ["w0 ", "w1 ", "w2 "]
    for example in (doc.RESPONSE_CREATED, doc.ASSISTANT_ITEM_ADDED, doc.OUTPUT_ITEM_ADDED, doc.RESPONSE_SPEAK,
                    doc.AUDIO_DELTA, doc.TRANSCRIPT_DELTA, doc.AUDIO_DONE, doc.TRANSCRIPT_DONE,
                    doc.OUTPUT_ITEM_DONE, doc.RESPONSE_DONE):  # fmt: skip
        sent = next(e for e in answer if e["type"] == example["type"])
        assert doc.gaps(example, wire(sent)) == [], example["type"]
    audio = [e for e in answer if e["type"] == "response.output_audio.delta"]
    assert [e["metadata"]["audio_duration_ms"] for e in audio] == [20, 40, 60]
    assert audio[-1]["sample_rate_hz"] == 24000 and audio[-1]["format"] == "pcm16"
    transcript = "".join(e["delta"] for e in deltas[1::2])
    assert next(e for e in answer if e["type"] == "response.output_audio_transcript.done")["transcript"] == transcript


def test_an_answers_item_is_item_underscore_its_response_id_and_a_client_may_build_it() -> None:
    """ "Endpoint and transport": "response_id (item id item_<response_id>) names one assistant
    utterance". A client that builds the id from response.created's response_id acknowledges
    playback, retrieves and truncates with it, before a snapshot and after it (another replica),
    and the answers made after the restore follow the rule too."""
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    rid = d.answer(30)
    built = f"item_{rid}"
    answer = [e for e in d.events if e.get("response_id") == rid or (e.get("item") or {}).get("role") == "assistant"]
    named = {e.get("item_id") or (e.get("item") or {}).get("id") for e in answer} - {None}
    assert named == {built}  # every event that names the answer's item names it so
    events = d.send({"type": "playback.ack", "response_id": rid, "item_id": built, "played_ms": 300})
    assert d.types(events) == ["playback.acknowledged"] and events[0]["event"]["item_id"] == built
    d.answer(0, finish=True)
    events = d.send({"type": "conversation.item.retrieve", "item_id": built})
    assert d.types(events) == ["conversation.item.retrieved"] and events[0]["item"]["id"] == built
    events = d.send({"type": "conversation.item.truncate", "item_id": built, "content_index": 0, "audio_end_ms": 250})
    assert d.types(events) == ["conversation.item.truncated"] and events[0]["item_id"] == built

    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None, wall_clock=lambda: d.now)
    r = Driver.around(again)
    events = r.send({"type": "conversation.item.retrieve", "item_id": built})
    assert r.types(events) == ["conversation.item.retrieved"] and events[0]["item"]["id"] == built
    events = r.send({"type": "playback.ack", "response_id": rid, "item_id": built, "played_ms": 100})
    assert r.types(events) == ["playback.acknowledged"]
    events = r.send({"type": "conversation.item.truncate", "item_id": built, "content_index": 0, "audio_end_ms": 90})
    assert r.types(events) == ["conversation.item.truncated"]
    r.append(loud(200))
    r.send({"type": "input_audio_buffer.commit"})
    rid2 = r.answer(5, finish=True)
    assert rid2 != rid and r.session.ledgers[rid2].item_id == f"item_{rid2}"
    events = r.send({"type": "conversation.item.retrieve", "item_id": f"item_{rid2}"})
    assert r.types(events) == ["conversation.item.retrieved"]


def test_the_openai_dialects_keep_their_own_item_ids() -> None:
    """The identity rule is the duplex document's: a GA answer's item is a fresh item_ id."""
    from support.session_driver import Driver as GaDriver

    g = GaDriver()
    events, _ = g.send({"type": "response.create"})
    created = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]["id"]
    assert added.startswith("item_") and added != f"item_{created}"


def test_text_after_the_last_audio_goes_out_with_an_empty_audio_delta_and_no_audio_no_text() -> None:
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    resp = d.session.responses.current
    assert resp is not None
    mark = len(d.events)
    d.session.on_response(resp.id, AudioDelta(TONE))  # audio with no text yet: its transcript delta is ""
    d.session.on_response(resp.id, TextDelta("a "))
    d.session.on_response(resp.id, TextDelta("b "))  # two texts before the next audio: one delta
    d.session.on_response(resp.id, AudioDelta(TONE))
    d.session.on_response(resp.id, TextDelta("c."))  # no audio follows
    d.session.on_response(resp.id, Finished())
    d.take()
    deltas = [e for e in d.events[mark:] if e["type"].endswith(".delta")]
    assert d.types(deltas) == ["response.output_audio.delta", "response.output_audio_transcript.delta"] * 3
    assert [e["delta"] for e in deltas[1::2]] == ["", "a b ", "c."]
    assert wire(deltas[4])["delta"] == "" and deltas[4]["metadata"]["audio_duration_ms"] == 40
    done = next(e for e in d.events[mark:] if e["type"] == "response.output_audio_transcript.done")
    assert done["transcript"] == "a b c."


def test_a_text_only_answer_never_says_response_speak() -> None:
    """ "response.speak ... before the first audio delta": a text answer has none."""
    d = Driver()
    d.send({**doc.ITEM_CREATE})
    mark = len(d.events)
    d.send({"type": "response.create", "response": {"modalities": ["text"]}})
    d.answer(3, finish=True)
    kinds = d.types(d.events[mark:])
    assert "response.speak" not in kinds and kinds.count("response.output_text.delta") == 3


def test_response_created_and_done_carry_the_duplex_event_under_metadata() -> None:
    """ "Tier 2": the raw duplex event under response.metadata; done's says committed and the ledger."""
    d = Driver()
    d.send(doc.ITEM_CREATE)
    created = next(e for e in d.send(doc.RESPONSE_CREATE) if e["type"] == "response.created")
    rid = created["response"]["id"]
    assert created["response"]["metadata"]["trace"] == "turn-3"  # the request's own metadata stays
    event = created["response"]["metadata"]["duplex_event"]
    assert event == {"type": "response.created", "session_id": "sess_d", "response_id": rid, "epoch": 0, "turn_id": 0}
    d.answer(10, finish=True)
    done = next(e for e in d.events if e["type"] == "response.done")
    meta = done["response"]["metadata"]
    assert doc.gaps(doc.RESPONSE_DONE, wire(done)) == [] and meta["trace"] == "turn-3"
    assert (meta["type"], meta["response_id"], meta["epoch"], meta["committed"]) == ("response.done", rid, 0, True)
    assert meta["playback"] == {"generated_ms": 200, "sent_ms": 200, "played_ms": 0, "committed_ms": 0}
    acked = Driver(playback_commit_policy="ack_only")
    rid = spoken(acked, 10)
    done = next(e for e in acked.events if e["type"] == "response.done")
    assert done["response"]["metadata"]["committed"] is False  # ack_only: nothing acknowledged yet
    d.send(doc.RESPONSE_CREATE)
    d.answer(2)
    before = d.session.epoch
    cancelled = next(e for e in d.send({"type": "response.cancel"}) if e["type"] == "response.done")
    # response.cancel advanced the fence before the answer's last events
    assert (
        cancelled["response"]["metadata"]["epoch"] == before + 1 and not cancelled["response"]["metadata"]["committed"]
    )


def test_a_barge_in_cuts_the_item_to_the_acknowledged_millisecond() -> None:
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    rid = d.answer(30)
    d.send({"type": "playback.ack", "response_id": rid, "played_ms": 437})
    events = d.send({"type": "barge_in"})
    assert Cancel(rid) in d.effects
    item = d.session.conversation.get(d.session.ledgers[rid].item_id)
    assert item is not None
    part = item.content[0]
    assert part.audio_ms == 437.0  # to the millisecond
    assert part.transcript == "".join(f"w{i} " for i in range(22))  # w21 started at 420 ms, w22 at 440
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status_details"]["reason"] == "barge_in"
    assert d.session.epoch == 1 and d.types(events)[-1] == "turn.event"


def test_without_any_ack_a_barge_in_keeps_what_was_generated() -> None:
    """commit_all_on_done and no playback.ack: the client never said what it played."""
    d = Driver()
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    rid = d.answer(10)
    d.send({"type": "barge_in"})
    item = d.session.conversation.get(d.session.ledgers[rid].item_id)
    assert item is not None and item.content[0].audio_ms == 200.0


def test_server_vad_speech_over_an_answer_barges_in_by_default_and_listens_when_told() -> None:
    d = Driver(vad=True)
    d.append(loud(400))
    d.append(bytes(32 * 400))  # silence: the turn ends, the answer starts
    assert any(isinstance(e, StartResponse) for e in d.effects)
    d.answer(5)
    events = d.append(loud(300))
    decision = next(e for e in events if e["type"] == "overlap.decision")
    assert (decision["policy"], decision["action"]) == ("barge_in_on_speech", "barge_in")
    assert any(e["type"] == "response.done" for e in events)

    listen = Driver(vad=True, overlap_policy="listen_only")
    listen.append(loud(400))
    listen.append(bytes(32 * 400))
    first = listen.answer(5)
    events = listen.append(loud(300))
    assert next(e for e in events if e["type"] == "overlap.decision")["action"] == "listen"
    events = listen.append(bytes(32 * 400))  # the overlapping turn ends: committed, its answer deferred
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["event"]["response_create_deferred"] is True
    assert listen.session.active_response_id == first
    listen.answer(1, finish=True)
    assert listen.session.active_response_id not in (None, first)  # the deferred answer started


def test_a_silence_commit_is_answered_with_response_listen() -> None:
    d = Driver()
    d.append(loud(200))
    events = d.send({"type": "input_audio_buffer.commit", "is_speech": False})
    assert d.types(events) == ["response.listen"]
    assert not d.session.input_audio.is_open


def test_every_state_event_of_the_dialect_marks_a_snapshot_that_restores_it() -> None:
    d = Driver(playback_commit_policy="ack_only")
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    rid = d.answer(10, finish=True)
    d.session.dirty = False
    events = d.send({"type": "playback.ack", "response_id": rid, "played_ms": 120})
    assert d.session.dirty and d.types(events) == ["playback.acknowledged"]
    d.session.attachment_generation = 3
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None)
    assert again.dialect is DUPLEX and again.duplex == d.session.duplex and again.attachment_generation == 3
    assert again.ledgers[rid].committed_ms == 120 and again.turn_id == d.session.turn_id
    item = again.conversation.get(again.ledgers[rid].item_id)
    assert item is not None and item.content[0].transcript == "w0 w1 w2 w3 w4 w5 "  # ack_only: what was heard
    # A later ack on the new replica grows the history from the kept transcript.
    again.handle(de.decode(orjson.dumps({"type": "playback.ack", "response_id": rid, "played_ms": 200})))
    assert item.content[0].transcript == "".join(f"w{i} " for i in range(10))
    assert STATE_EVENTS  # (the GA set; the dialect's events are non-deltas: each marks the snapshot)


def test_idle_and_lifetime_expiry_say_session_expired_and_close_4008() -> None:
    d = Driver()
    d.session.expire_idle()
    events = d.take()
    assert events[-1]["type"] == "session.expired" and events[-1]["reason"] == "idle_ttl_expired"
    assert CloseSocket(4008, "session expired") in d.effects
    e = Driver()
    e.session.expire()
    assert e.take()[-1]["reason"] == "lifetime_expired"


# --- epoch, overlap decisions, and barge-in over an answer that still plays -------------------


def spoken(d: Driver, words: int = 30) -> str:
    """A committed turn and its answer, finished: ``words`` words, 20 ms of audio each."""
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    return d.answer(words, finish=True)


def test_the_epoch_advances_on_every_cancel_clear_and_barge_in() -> None:
    """ "Endpoint and transport": epoch "advances on every cancel, clear, or barge-in"."""
    d = Driver()
    for event in ({"type": "barge_in"}, doc.TURN_SIGNAL, doc.CLEAR, doc.INPUT_CANCEL, doc.OUTPUT_AUDIO_CLEAR):
        before = d.session.epoch
        d.send(event)  # nothing runs, nothing plays: the fence advances all the same
        assert d.session.epoch == before + 1, event
    d.append(loud(200))
    d.send({"type": "input_audio_buffer.commit"})
    rid = d.answer(10)
    before = d.session.epoch
    d.send({"type": "playback.ack", "response_id": rid, "played_ms": 100, "truncate": True})
    assert d.session.epoch == before + 1 and d.session.active_response_id is None  # the truncating ack cancelled it
    before = d.session.epoch
    d.send(doc.RESPONSE_CREATE)
    d.send({"type": "response.cancel"})
    assert d.session.epoch == before + 1
    refused = d.send({"type": "response.cancel"})  # nothing to cancel: refused, no fence
    assert refused[-1]["error"]["code"] == Code.RESPONSE_NOT_ACTIVE and d.session.epoch == before + 1


def test_overlap_decisions_carry_their_details_under_metadata() -> None:
    """ "Overlap and barge-in": listen with metadata {overlap_ms, buffer_audio, ...}; barge_in without."""
    listen = Driver(overlap_policy="listen_only")
    listen.append(loud(200))
    listen.send({"type": "input_audio_buffer.commit"})
    listen.answer(3)
    events = listen.append(loud(800), is_speech=True)
    decision = next(e for e in events if e["type"] == "overlap.decision")
    assert doc.gaps(doc.OVERLAP_LISTEN, decision) == []
    assert decision["metadata"] == {**doc.OVERLAP_LISTEN["metadata"], "overlap_ms": 800}
    assert "overlap_ms" not in decision and "buffer_audio" not in decision
    barge = Driver(overlap_policy="barge_in_on_speech")
    barge.append(loud(200))
    barge.send({"type": "input_audio_buffer.commit"})
    barge.answer(3)
    events = barge.append(loud(1200), is_speech=True)
    decision = next(e for e in events if e["type"] == "overlap.decision")
    assert set(decision) - {"event_id", "server_event_seq"} == set(doc.OVERLAP_BARGE_IN)
    assert (decision["policy"], decision["action"]) == ("barge_in_on_speech", "barge_in")


def test_a_barge_in_stops_an_answer_that_ended_but_still_plays_and_cuts_it_to_what_was_heard() -> None:
    d = Driver()
    rid = spoken(d, 30)  # 600 ms of audio, all sent at once: it plays until now + 0.6 s
    item_id = d.session.ledgers[rid].item_id
    d.send({"type": "playback.ack", "response_id": rid, "played_ms": 210})
    d.now += 0.3
    before = d.session.epoch
    events = d.send({"type": "barge_in"})
    assert d.types(events) == ["output_audio_buffer.cleared", "conversation.item.truncated", "turn.event"]
    assert events[0]["response_id"] == rid and events[1]["audio_end_ms"] == 210 and events[1]["item_id"] == item_id
    assert d.session.epoch == before + 1 and events[-1]["epoch"] == before + 1
    item = d.session.conversation.get(item_id)
    assert item is not None and item.content[0].audio_ms == 210.0
    assert item.content[0].transcript == "".join(f"w{i} " for i in range(11))  # w10 began at 200 ms
    assert d.types(d.send({"type": "barge_in"})) == ["turn.event"]  # stopped already: nothing to stop


def test_an_answer_plays_until_its_audio_and_the_margin_have_run_out_or_it_was_all_acked() -> None:
    late = Driver()
    spoken(late, 30)
    late.now += 0.6 + 0.5 + 0.01  # 600 ms of audio, then PLAYBACK_MARGIN_MS
    assert late.types(late.send({"type": "barge_in"})) == ["turn.event"]
    heard = Driver()
    rid = spoken(heard, 30)
    heard.send({"type": "playback.ack", "response_id": rid, "played_ms": 600})
    assert heard.types(heard.send({"type": "barge_in"})) == ["turn.event"]
    silent = Driver()  # never acked: it plays until its schedule says so, and keeps what was generated
    rid = spoken(silent, 30)
    events = silent.send({"type": "barge_in"})
    assert silent.types(events) == ["output_audio_buffer.cleared", "turn.event"]
    item = silent.session.conversation.get(silent.session.ledgers[rid].item_id)
    assert item is not None and item.content[0].audio_ms == 600.0


def test_speech_over_an_answer_that_still_plays_barges_in_by_its_policy() -> None:
    d = Driver(vad=True)
    d.append(loud(400))
    d.append(bytes(32 * 400))  # the turn ends and is answered
    rid = d.answer(30, finish=True)
    events = d.append(loud(300))
    decision = next(e for e in events if e["type"] == "overlap.decision")
    assert (decision["action"], decision["reason"]) == ("barge_in", "server_vad_utterance_active")
    assert next(e for e in events if e["type"] == "output_audio_buffer.cleared")["response_id"] == rid
    manual = Driver(overlap_policy="barge_in_on_speech", overlap_barge_in_ms=400)
    rid = spoken(manual, 30)
    events = manual.append(loud(400), is_speech=True)
    assert [e["action"] for e in events if e["type"] == "overlap.decision"] == ["barge_in"]
    assert next(e for e in events if e["type"] == "output_audio_buffer.cleared")["response_id"] == rid


def test_the_playout_schedule_survives_a_snapshot() -> None:
    d = Driver()
    rid = spoken(d, 30)
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = DuplexSession.restore(state, engine=INFO, vad_factory=None, wall_clock=lambda: d.now + 0.2)
    assert again.ledgers[rid].play_end_at == d.session.ledgers[rid].play_end_at
    again.handle(de.decode(orjson.dumps({"type": "barge_in"})))
    assert [e["type"] for e in again.events] == ["output_audio_buffer.cleared", "turn.event"]


def test_session_warnings_are_opt_in_and_the_handshake_error_is_flat() -> None:
    quiet = DuplexSession(session_id="s", config=default_session_config("m"), engine=INFO, vad_factory=None)
    quiet.start(configured=True, warnings=quiet.configure({"volume": 11}))
    assert [e["type"] for e in quiet.events] == ["session.created", "session.updated"]
    told = DuplexSession(session_id="s", config=default_session_config("m"), engine=INFO, vad_factory=None)
    told.start(configured=True, warnings=told.configure({"volume": 11, "gateway_events": True}))
    assert [e["type"] for e in told.events][-1] == "session.warning" and told.events[-1]["param"] == "session.volume"
    # "Errors": handshake-stage errors use the flat native shape
    flat = orjson.loads(de.handshake_error(ProtocolError(Code.SESSION_NOT_FOUND, "Unknown session 's'.")))
    assert set(flat) - {"event_id"} == set(doc.HANDSHAKE_ERROR) and flat["code"] == "session_resume_expired"
