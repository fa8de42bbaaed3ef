"""``session.start`` as vLLM-Omni resolves it, ``video.start`` as it answers, and the fMP4
trailer (pure)."""

from __future__ import annotations

import struct

import orjson
import pytest

from gateway.protocol import fmp4
from gateway.protocol import video_events as ve
from gateway.protocol.errors import Code, ProtocolError
from gateway.session.video_session import CloseVideo, StartVideo, VideoSession
from orchestrator.video_engine import VideoEngineInfo


def start(**fields: object) -> ve.Start:
    event = ve.decode(orjson.dumps({"type": "session.start", "prompt": "p", **fields}))
    assert isinstance(event, ve.Start)
    return event


def test_top_level_fields_win_over_video_params_and_size_wins_over_both() -> None:
    s = start(width=10, video_params={"width": 20, "height": 30, "fps": 8, "num_frames": 4})
    assert (s.width, s.height, s.fps, s.num_frames) == (10, 30, 8, 4)
    s = start(width=10, height=10, size="640x384", video_params={"width": 20})
    assert (s.width, s.height) == (640, 384)
    assert start(seconds="4").seconds == 4 and start(seconds=4).seconds == 4
    assert start(size="64x48", seconds="2").echo == {"size": "64x48", "seconds": "2"}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"size": "640*384"}, "size", Code.INVALID_VALUE),
        ({"size": "0x384"}, "size", Code.INVALID_VALUE),
        ({"size": 640}, "size", Code.INVALID_VALUE),
        ({"seconds": "0"}, "seconds", Code.INVALID_VALUE),
        ({"seconds": "4.5"}, "seconds", Code.INVALID_VALUE),
        ({"seconds": True}, "seconds", Code.INVALID_VALUE),
        ({"video_params": [1]}, "video_params", Code.INVALID_TYPE),
        ({"video_params": {"fps": "fast"}}, "video_params.fps", Code.INVALID_TYPE),
        ({"video_params": {"num_frames": 0}}, "video_params.num_frames", Code.INVALID_VALUE),
        ({"width": 0}, "width", Code.INVALID_VALUE),
    ],
)
def test_a_bad_size_seconds_or_video_params_is_refused_with_its_param(
    fields: dict[str, object], param: str, code: str
) -> None:
    with pytest.raises(ProtocolError) as refused:
        start(**fields)
    assert (refused.value.param, refused.value.code) == (param, code)


def session(model: str | None) -> VideoSession:
    return VideoSession(session_id="vsess_test", info=VideoEngineInfo(name="test", description="", model=model))


def test_a_start_naming_another_model_than_the_routes_is_refused_and_the_socket_closes() -> None:
    # Upstream (serving_video_output_stream.py, _receive_start): a model that is given, when the
    # server has one, must be the server's; else "Model mismatch: ..." and the handler returns.
    s = session("org/served")
    s.handle(start(model="org/other"))
    events, effects = s.take()
    (error,) = events
    assert error == {
        "type": "error",
        "code": Code.MODEL_NOT_FOUND,
        "message": "Model mismatch: request specifies 'org/other' but server is running 'org/served'. "
        "Leave 'model' out or send 'org/served'.",
        "param": "model",
        "event_id": None,
        "request_id": None,
    }
    assert effects == [CloseVideo(1000, "session.start refused")] and s.state == "done"
    for accepted, model in ((session("org/served"), "org/served"), (session("org/served"), None),
                            (session(None), "anything")):  # fmt: skip  # None: the route's model is not known
        accepted.handle(start() if model is None else start(model=model))
        events, effects = accepted.take()
        assert [e["type"] for e in events] == ["video.start"] and isinstance(effects[0], StartVideo)


def test_a_model_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ProtocolError) as refused:
        start(model=["org/served"])
    assert (refused.value.code, refused.value.param) == (Code.INVALID_TYPE, "model")


def test_video_start_config_leaves_null_fields_out() -> None:
    # Upstream: "config": request.model_dump(exclude_none=True), VideoParams nested in it.
    s = session(None)
    s.handle(start(seed=None, negative_prompt=None, guidance_scale=None, video_params={"width": 32, "fps": None}))
    (video_start,), _ = s.take()
    config = video_start["config"]
    assert None not in config.values()
    assert not {"model", "seed", "negative_prompt", "guidance_scale", "num_frames"} & config.keys()
    assert config["video_params"] == {"width": 32} and config["width"] == 32


def test_session_done_leaves_chunks_to_the_transport() -> None:
    """What the client received is known only where it is delivered (drops, the trailer)."""
    s = session(None)
    s.handle(start())
    s.take()
    s.on_done()
    (done,), _ = s.take()
    assert done == {"type": "session.done", "request_id": s.request_id, "stopped": False}


def test_session_playback_is_validated() -> None:
    assert ve.decode(b'{"type": "session.playback", "position_seconds": 1.25}') == ve.Playback(1.25)
    with pytest.raises(ProtocolError):
        ve.decode(b'{"type": "session.playback", "position_seconds": -1}')


def box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", 8 + len(body)) + kind + body


def test_the_trailer_indexes_fragments_by_time_and_offset() -> None:
    tfhd = box(b"tfhd", b"\x00\x02\x00\x00" + struct.pack(">I", 7))
    tfdt = box(b"tfdt", b"\x01\x00\x00\x00" + struct.pack(">Q", 9000))
    frag = box(b"moof", box(b"mfhd", bytes(8)) + box(b"traf", tfhd + tfdt)) + box(b"mdat", b"xx")
    assert fmp4.fragment_info(frag) == (0, 7, 9000)
    assert fmp4.fragment_info(box(b"ftyp", b"isom") + frag) == (12, 7, 9000)
    assert fmp4.fragment_info(box(b"mdat", b"")) is None
    mfra = fmp4.mfra(7, [(0, 100), (9000, 400)])
    assert mfra[4:8] == b"mfra" and int.from_bytes(mfra[:4], "big") == len(mfra)
    assert mfra[-8:-4] == bytes(4) and int.from_bytes(mfra[-4:], "big") == len(mfra)  # mfro
    assert int.from_bytes(mfra[20:24], "big") == 7 and int.from_bytes(mfra[28:32], "big") == 2


def test_a_stream_remembers_a_bounded_number_of_interaction_ids_and_takes_a_bounded_rate() -> None:
    """Issue 33, finding 9 (the pure session): ids are remembered up to ``remembered_ids``
    (a reuse of an older one is taken), interactions up to ``per_s`` in a clock second."""
    from gateway.session.video_session import InteractionLimits

    now = [100.0]
    session = VideoSession(session_id="vsess_t", info=VideoEngineInfo(name="cpu", description="", model=None),
                           limits=InteractionLimits(per_s=5, remembered_ids=8), clock=lambda: now[0])  # fmt: skip
    session.state, session.request_id = "streaming", "vreq_1"

    def interact(event_id: str) -> str | None:
        try:
            session.interact(ve.InteractionSpec(event_id, prompt="p", camera=None, transition_chunks=None))
        except ProtocolError as err:
            return err.code
        return None

    assert [interact(f"e{i}") for i in range(6)] == [None] * 5 + [Code.RATE_LIMIT_EXCEEDED]
    now[0] += 1.0
    assert interact("e5") is None  # (the refused one was not remembered) and the next second takes it
    assert interact("e4") == Code.EVENT_ID_CONFLICT
    for i in range(6, 30):
        now[0] += 0.25
        assert interact(f"e{i}") is None
    assert len(session._event_ids) == 8  # bounded, the newest kept
    assert interact("e0") is None and interact("e29") == Code.EVENT_ID_CONFLICT
