"""``/v1/realtime/video`` end to end over real sockets, with the CPU video engine.

What a vLLM-Omni streaming-video client relies on, proved on the decoded
pixels and on the wire: the stream decodes (PyAV) to the requested size and
frame count; every chunk is ``video.chunk_metadata`` followed by exactly one
binary frame of ``byte_length`` bytes; an interaction blends over exactly
``transition_chunks`` chunks (measured on the frames against reference
renders of the old and new prompt) and its event id moves started → active →
completed in the metadata; camera moves change the view as the renderer
says; every refusal has its code and the stream goes on; stop and disconnect
leave no engine request behind; ``POST /v1/realtime/video/{id}/interactions``
reaches the socket, with its auth.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import av
import httpx
import numpy as np
import orjson
import pytest
import websockets
from support import upstream_docs as doc
from support.gateway import RunningGateway, run_gateway

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.engines.video.render import RenderState, render_chunk
from orchestrator.video_engine import CameraMove, Interaction

pytestmark = pytest.mark.timeout(90)

OLD, NEW = "A red fox in snow", "A blue whale at night"
W, H, FPS, F = 128, 96, 24, 4  # small frames, short chunks: 1/6 s of video each
K1 = "sk-video-k1-4f1e9a"
K2 = "sk-video-k2-0c7b3d"


# --- a client that pairs each chunk's metadata with its binary frame ------------------


@dataclass
class Chunk:
    meta: dict[str, Any]
    payload: bytes

    @property
    def index(self) -> int:
        return int(self.meta["generation_chunk_index"])


class VideoClient:
    """Reads the socket strictly: a binary frame must follow each ``video.chunk_metadata``
    (and carry ``byte_length`` bytes); a binary frame anywhere else fails the test."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.chunks: list[Chunk] = []  # media chunks
        self.trailers: list[Chunk] = []  # the trailer chunk of a completed fMP4 stream

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, str | bytes) else orjson.dumps(event).decode())

    async def start(self, **fields: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", **fields})
        return await self.wait_for("video.start")

    async def interact(self, event_id: str, event: dict[str, Any], k: Any = None) -> None:
        interaction: dict[str, Any] = {"event_id": event_id, "event": event}
        if k is not None:
            interaction["transition_chunks"] = k
        await self.send({"type": "session.interaction", "interaction": interaction})

    async def recv(self, timeout: float = 20.0) -> dict[str, Any]:
        message = await asyncio.wait_for(self.ws.recv(), timeout)
        assert isinstance(message, str), f"a binary frame ({len(message)} B) arrived without its metadata"
        event: dict[str, Any] = orjson.loads(message)
        self.events.append(event)
        if event["type"] == "video.chunk_metadata":
            payload = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(payload, bytes), f"metadata followed by a text frame: {payload[:200]!r}"
            assert len(payload) == event["byte_length"]
            (self.trailers if event["kind"] == "trailer" else self.chunks).append(Chunk(event, payload))
        return event

    async def wait_for(self, match: str | Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        test = (lambda e: e["type"] == match) if isinstance(match, str) else match
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {match}; last events: {self.types()[-20:]}")
            event = await self.recv(left)
            if test(event):
                return event

    async def next_chunk(self, timeout: float = 30.0) -> Chunk:
        await self.wait_for("video.chunk_metadata", timeout)
        return self.chunks[-1]

    async def error(self, code: str, timeout: float = 30.0) -> dict[str, Any]:
        event = await self.wait_for(lambda e: e["type"] == "error", timeout)
        assert event["code"] == code, event
        assert event["message"]
        return event

    async def until_closed(self, timeout: float = 30.0) -> int | None:
        """Read everything left; the close code the server sent."""
        with pytest.raises(websockets.ConnectionClosed):
            async with asyncio.timeout(timeout):
                while True:
                    await self.recv(timeout)
        code: int | None = self.ws.close_code
        return code

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


# --- helpers ---------------------------------------------------------------------------


def settings(**kwargs: Any) -> Settings:
    kwargs.setdefault("detach_grace_s", 0.2)
    kwargs.setdefault("drain_window_s", 0.5)
    return Settings(engine="passthrough", **kwargs)


@asynccontextmanager
async def gateway(**kwargs: Any) -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(**kwargs), engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        assert isinstance(gw.runtime.video_engine, CpuVideoEngine)
        yield gw


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with gateway() as gw:
        yield gw


@asynccontextmanager
async def video(gw: RunningGateway, key: str | None = None) -> AsyncIterator[VideoClient]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with websockets.connect(
        gw.url + "/video", additional_headers=headers, max_size=None, compression=None, open_timeout=10
    ) as ws:
        yield VideoClient(ws)


def start_fields(**overrides: Any) -> dict[str, Any]:
    return {"prompt": OLD, "width": W, "height": H, "fps": FPS, "frames_per_chunk": F, **overrides}


def decode_mp4(payloads: Sequence[bytes]) -> np.ndarray:
    """Every frame of an fMP4 byte stream (init segment + fragments): float RGB [n,H,W,3]."""
    with av.open(io.BytesIO(b"".join(payloads)), mode="r", format="mp4") as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames).astype(np.float32)


def decode_jpeg(jpeg: bytes) -> np.ndarray:
    with av.open(io.BytesIO(jpeg), mode="r", format="mjpeg") as container:
        (frame,) = list(container.decode(video=0))
    return frame.to_ndarray(format="rgb24")


def reference(prompt: str, n_frames: int, plan: dict[int, list[Interaction]] | None = None) -> np.ndarray:
    """What the renderer draws for ``prompt`` (float RGB), with the interactions of
    ``plan`` applied at the start of their chunk: the engine's own recipe, re-run here."""
    state = RenderState(prompt, W, H, FPS, F, 0)
    out: list[np.ndarray] = []
    chunk = 0
    while sum(len(c) for c in out) < n_frames:
        state.apply((plan or {}).get(chunk, []))
        out.append(render_chunk(state, F).numpy())
        chunk += 1
    return np.concatenate(out)[:n_frames].astype(np.float32)


def blend_alpha(frame: np.ndarray, old: np.ndarray, new: np.ndarray) -> float:
    """Least-squares weight a of ``frame`` ≈ (1-a)·old + a·new."""
    d = (new - old).ravel()
    return float(np.dot((frame - old).ravel(), d) / np.dot(d, d))


def alphas_per_chunk(frames: np.ndarray) -> np.ndarray:
    """The weight of NEW in each decoded frame, one row per chunk."""
    old, new = reference(OLD, len(frames)), reference(NEW, len(frames))
    return np.array([blend_alpha(frames[i], old[i], new[i]) for i in range(len(frames))]).reshape(-1, F)


def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean absolute difference per frame, in 8-bit levels (H.264 noise here: about 3)."""
    result: np.ndarray = np.abs(a - b).mean(axis=(1, 2, 3))
    return result


def chunks_with(chunks: Sequence[Chunk], key: str, event_id: str) -> list[int]:
    return [c.index for c in chunks if event_id in c.meta[key]]


def is_chunk(pred: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == "video.chunk_metadata" and pred(e)


def is_queued(event_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == "session.interaction.queued" and e["event_id"] == event_id


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def idle(gw: RunningGateway) -> bool:
    """No video session, no orchestrator request and no engine request left."""
    rt = gw.runtime
    engine = rt.video_engine
    assert isinstance(engine, CpuVideoEngine)
    return rt.orchestrator.pending == 0 and engine.active_request_ids == () and not rt.video_sockets


def leak_report(gw: RunningGateway) -> str:
    rt = gw.runtime
    engine = rt.video_engine
    assert isinstance(engine, CpuVideoEngine)
    return f"pending={rt.orchestrator.pending} engine={engine.active_request_ids} sessions={list(rt.video_sockets)}"


# --- 1. the stream decodes to what was asked for -----------------------------------------


async def test_start_streams_fmp4_that_decodes_to_the_requested_size_and_frame_count(gw: RunningGateway) -> None:
    num_frames = 22  # 5 chunks of 4 and a last one of 2
    async with video(gw) as c:
        start = await c.start(**start_fields(width=160, num_frames=num_frames, seed=7))
        done = await c.wait_for("session.done")
        code = await c.until_closed()

    rid = start["request_id"]
    assert isinstance(rid, str) and rid
    assert start["format"] == "m4s"  # the protocol's default, echoed although the client sent none
    assert start["session_id"].startswith("vsess_")
    asked = {"prompt": OLD, "width": 160, "height": H, "fps": FPS, "num_frames": num_frames, "frames_per_chunk": F,
             "seed": 7}  # fmt: skip
    assert start["config"] | asked == start["config"]
    # six media chunks and the trailer: upstream counts every chunk it sent, the trailer among them
    assert done == {"type": "session.done", "request_id": rid, "chunks": 7, "stopped": False}
    assert code == 1000

    chunks = c.chunks
    # six media chunks, then the trailer (the stream's mfra index), then session.done
    assert c.types() == ["video.start"] + ["video.chunk_metadata"] * 7 + ["session.done"]
    (trailer,) = c.trailers
    assert trailer.meta["transport_chunk_index"] == 6 and trailer.meta["generation_chunk_index"] is None
    assert trailer.meta["num_frames"] == 0 and trailer.payload[4:8] == b"mfra"
    assert [ch.meta["transport_chunk_index"] for ch in chunks] == list(range(6))
    assert [ch.index for ch in chunks] == list(range(6))
    assert [ch.meta["num_frames"] for ch in chunks] == [4, 4, 4, 4, 4, 2]
    for ch in chunks:
        assert ch.meta["request_id"] == rid
        assert ch.meta["kind"] == "media"
        assert ch.meta["mime_type"].startswith("video/mp4")
        assert ch.meta["dropped_chunks"] == 0 and ch.meta["dropped_generation_chunk_indexes"] == []
    assert chunks[0].payload[4:8] == b"ftyp"  # the init segment comes first ...
    assert all(ch.payload[4:8] == b"moof" for ch in chunks[1:])  # ... once: the rest are bare fragments

    frames = decode_mp4([ch.payload for ch in chunks])
    assert frames.shape == (num_frames, H, 160, 3)


async def test_format_is_echoed_as_the_client_spelled_it(gw: RunningGateway) -> None:
    async with video(gw) as c:
        start = await c.start(**start_fields(num_frames=F, format="fmp4"))
        await c.wait_for("session.done")
    assert start["format"] == "fmp4"
    assert decode_mp4([ch.payload for ch in c.chunks]).shape == (F, H, W, 3)


@pytest.mark.parametrize(
    ("first", "code"),
    [
        ({"type": "session.start", "format": "webm"}, Code.UNSUPPORTED_VIDEO_FORMAT),
        ({"type": "session.start", "width": 127}, Code.INVALID_VALUE),  # H.264 needs even sizes
        ({"type": "session.start", "fps": "fast"}, Code.INVALID_TYPE),
        ({"type": "session.start", "prompt": " "}, Code.INVALID_VALUE),
        ({"type": "session.start", "size": "wide"}, Code.INVALID_VALUE),
        ({"type": "session.start", "seconds": "0"}, Code.INVALID_VALUE),
        ({"type": "session.ping"}, Code.START_EXPECTED),
        ({"type": "session.interaction", "interaction": {"event_id": "early", "event": {"prompt": "x"}}},
         Code.NO_ACTIVE_REQUEST),
        ("{not json", Code.INVALID_JSON),
        ({"type": "session.start", "model": "BestWishYsh/Helios-Distilled"}, Code.MODEL_NOT_FOUND),  # not the route's
        ({"type": "session.start", "model": 7}, Code.INVALID_TYPE),
    ],
)  # fmt: skip
async def test_a_refused_first_message_is_reported_then_the_socket_closes(
    gw: RunningGateway, first: dict[str, Any] | str, code: str
) -> None:
    """As upstream's handler does: a bad session.start (or anything else first) gets its error,
    then the socket closes; a new socket can start a stream."""
    async with video(gw) as c:
        if isinstance(first, dict) and first["type"] == "session.start":
            first = {**start_fields(), **first}  # a valid start but for the one field under test
        await c.send(first)
        error = await c.error(code)
        assert await c.until_closed() == 1000
        assert c.types() == ["error"] and error["code"] == code
    async with video(gw) as c:
        await c.start(**start_fields(num_frames=F))
        done = await c.wait_for("session.done")
    assert done["chunks"] == 2 and done["stopped"] is False  # one media chunk and the trailer


async def test_video_start_reports_the_fields_the_cpu_engine_ignores(gw: RunningGateway) -> None:
    async with video(gw) as c:
        start = await c.start(**start_fields(num_frames=F, negative_prompt="blurry", guidance_scale=5.0,
                                             num_inference_steps=4))  # fmt: skip
        await c.wait_for("session.done")
    assert start["config"]["guidance_scale"] == 5.0  # kept and echoed ...
    assert {"negative_prompt", "guidance_scale", "num_inference_steps"} <= set(start["ignored_fields"])  # ... ignored


async def test_jpeg_format_sends_concatenated_jpegs_split_by_frame_byte_lengths(gw: RunningGateway) -> None:
    num_frames = 7
    async with video(gw) as c:
        start = await c.start(**start_fields(format="jpeg", num_frames=num_frames, frames_per_chunk=3))
        done = await c.wait_for("session.done")
    assert start["format"] == "jpeg"
    assert done["chunks"] == 3 and done["stopped"] is False
    decoded = 0
    for ch in c.chunks:
        lengths = ch.meta["frame_byte_lengths"]
        assert ch.meta["mime_type"] == "image/jpeg"
        assert len(lengths) == ch.meta["num_frames"] and sum(lengths) == len(ch.payload)
        offset = 0
        for n in lengths:
            jpeg = ch.payload[offset : offset + n]
            offset += n
            assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
            assert decode_jpeg(jpeg).shape == (H, W, 3)
            decoded += 1
    assert decoded == num_frames


# --- 2. interactions blend over exactly k chunks ---------------------------------------------


async def run_prompt_interaction(gw: RunningGateway, k: int) -> tuple[VideoClient, np.ndarray]:
    """An endless stream of OLD; after chunk 1 the prompt becomes NEW over k chunks;
    stop two chunks after the transition completes. The decoded frames."""
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.wait_for(is_chunk(lambda e: e["generation_chunk_index"] == 1))
        await c.interact("swap", {"prompt": NEW}, k)
        await c.wait_for(is_queued("swap"))
        await c.wait_for(is_chunk(lambda e: "swap" in e["completed_event_ids"]))
        await c.next_chunk()
        await c.next_chunk()
        await c.send({"type": "session.stop"})
        done = await c.wait_for("session.done")
        assert done["stopped"] is True
    assert all(ch.meta["dropped_chunks"] == 0 for ch in c.chunks)  # a reading client: every chunk
    frames = decode_mp4([ch.payload for ch in c.chunks])
    assert len(frames) == sum(ch.meta["num_frames"] for ch in c.chunks)
    return c, frames


@pytest.mark.parametrize("k", [2, 3])
async def test_prompt_interaction_blends_over_exactly_k_chunks(gw: RunningGateway, k: int) -> None:
    c, frames = await run_prompt_interaction(gw, k)
    chunks = c.chunks
    (s,) = chunks_with(chunks, "started_event_ids", "swap")
    assert s >= 2  # submitted after chunk 1 arrived: it lands on a later boundary
    assert chunks_with(chunks, "active_event_ids", "swap") == list(range(s, s + k))
    assert chunks_with(chunks, "completed_event_ids", "swap") == [s + k - 1]
    assert not any(ch.meta["superseded_event_ids"] for ch in chunks)

    alphas = alphas_per_chunk(frames)
    assert np.all(np.abs(alphas[:s]) < 0.07), alphas[:s]  # the old prompt, untouched, until the boundary
    fade = np.arange(1, k * F + 1) / (k * F)  # linear per frame, reaching 1 on the last frame of chunk s+k-1
    assert alphas[s : s + k].ravel() == pytest.approx(fade, abs=0.07)
    assert alphas[s + k - 1, 0] < 0.95  # still fading in the k-th chunk
    assert np.all(np.abs(alphas[s + k :] - 1.0) < 0.07), alphas[s + k :]  # then the new prompt, settled


async def test_transition_chunks_zero_cuts_at_the_next_chunk(gw: RunningGateway) -> None:
    c, frames = await run_prompt_interaction(gw, 0)
    chunks = c.chunks
    (s,) = chunks_with(chunks, "started_event_ids", "swap")
    assert chunks_with(chunks, "active_event_ids", "swap") == [s]
    assert chunks_with(chunks, "completed_event_ids", "swap") == [s]

    alphas = alphas_per_chunk(frames)
    assert np.all(np.abs(alphas[:s]) < 0.07)
    assert np.all(np.abs(alphas[s:] - 1.0) < 0.07)  # the very first frame of the cut chunk is the new prompt


async def test_an_interaction_without_transition_chunks_blends_over_the_engine_default(gw: RunningGateway) -> None:
    default_k = gw.runtime.video_engine.info.default_transition_chunks if gw.runtime.video_engine else 0
    assert default_k == 3
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.next_chunk()
        await c.interact("plain", {"prompt": NEW})
        await c.wait_for(is_queued("plain"))
        await c.wait_for(is_chunk(lambda e: "plain" in e["completed_event_ids"]))
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
    (s,) = chunks_with(c.chunks, "started_event_ids", "plain")
    assert chunks_with(c.chunks, "active_event_ids", "plain") == list(range(s, s + default_k))
    assert chunks_with(c.chunks, "completed_event_ids", "plain") == [s + default_k - 1]


async def test_camera_moves_in_both_rotation_forms_are_accepted_and_change_the_view(gw: RunningGateway) -> None:
    half = math.radians(2.0) / 2  # a roll of 2 degrees per frame, as a unit quaternion [x, y, z, w]
    target = {"mode": "target", "data": {"translation": [0.4, 0.2, 0.5], "rotation": [0.0, 0.0, 15.0]}}
    quaternion = [0.0, 0.0, math.sin(half), math.cos(half)]
    velocity = {"mode": "velocity", "data": {"translation": [0.02, 0.0, 0.0], "rotation": quaternion}}

    async with video(gw) as c:
        await c.start(**start_fields())
        await c.wait_for(is_chunk(lambda e: e["generation_chunk_index"] == 1))
        await c.interact("pose", {"multi_modal_data": {"camera": target}}, 1)
        await c.wait_for(is_queued("pose"))
        await c.wait_for(is_chunk(lambda e: "pose" in e["completed_event_ids"]))
        await c.interact("spin", {"multi_modal_data": {"camera": velocity}}, 1)
        await c.wait_for(is_queued("spin"))
        await c.wait_for(is_chunk(lambda e: "spin" in e["completed_event_ids"]))
        for _ in range(3):
            await c.next_chunk()
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")

    chunks = c.chunks
    assert not any(ch.meta["dropped_chunks"] for ch in chunks)
    (s1,) = chunks_with(chunks, "started_event_ids", "pose")
    (s2,) = chunks_with(chunks, "started_event_ids", "spin")
    assert chunks_with(chunks, "completed_event_ids", "pose") == [s1]  # k = 1: one chunk
    assert chunks_with(chunks, "completed_event_ids", "spin") == [s2]
    frames = decode_mp4([ch.payload for ch in chunks])
    n = len(frames)

    # The quaternion is checked against its Euler form: a pure roll of 2 degrees.
    pose = Interaction("pose", camera=CameraMove("target", (0.4, 0.2, 0.5), (0.0, 0.0, 15.0)), transition_chunks=1)
    spin = Interaction("spin", camera=CameraMove("velocity", (0.02, 0.0, 0.0), (0.0, 0.0, 2.0)), transition_chunks=1)
    expected = reference(OLD, n, {s1: [pose], s2: [spin]})
    still = reference(OLD, n)
    posed_only = reference(OLD, n, {s1: [pose]})

    assert np.all(distance(frames, expected) < 8), distance(frames, expected)  # the view the moves describe
    assert np.all(distance(frames[: s1 * F], still[: s1 * F]) < 8)  # no move before the first boundary
    assert np.all(distance(frames[(s1 + 1) * F :], still[(s1 + 1) * F :]) > 12)  # moved away from the still view
    drift = distance(frames[s2 * F :], posed_only[s2 * F :])  # the velocity move, on top of the pose
    per_chunk = drift[: len(drift) // F * F].reshape(-1, F).mean(axis=1)
    assert np.all(np.diff(per_chunk) > 0), per_chunk  # the view keeps moving, chunk after chunk
    assert drift[-1] > 20, drift


# --- 3. refusals, each with its code, while the stream goes on -----------------------------


def interaction(event_id: str, event: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": event_id, "event": event, **extra}}


async def test_every_refusal_has_its_code_and_the_stream_goes_on(gw: RunningGateway) -> None:
    async with video(gw) as c:
        start = await c.start(**start_fields())
        rid = start["request_id"]
        await c.next_chunk()

        async def refused(message: dict[str, Any] | str | bytes, code: str, event_id: str | None = None) -> None:
            await c.send(message)
            error = await c.error(code)
            assert error["request_id"] == rid, error
            if event_id is not None:
                assert error["event_id"] == event_id, error

        await refused(interaction("e1", {"prompt": ""}), Code.INVALID_VALUE, "e1")
        await refused(interaction("e2", {"prompt": "   "}), Code.INVALID_VALUE, "e2")
        await refused(interaction("e3", {"prompt": NEW}, transition_chunks=-1), Code.INVALID_VALUE, "e3")
        await refused(interaction("e4", {"prompt": NEW}, transition_chunks=1.5), Code.INVALID_TYPE, "e4")
        await refused(interaction("e5", {"prompt": NEW}, transition_chunks="2"), Code.INVALID_TYPE, "e5")
        await refused(interaction("e6", {"prompt": NEW, "negative_prompt": "blurry"}), Code.UNSUPPORTED_FIELD, "e6")
        await c.send(interaction("dup", {"prompt": NEW}, transition_chunks=1))
        await c.wait_for(is_queued("dup"))
        await refused(interaction("dup", {"prompt": "A green forest"}), Code.EVENT_ID_CONFLICT, "dup")
        await refused({"type": "session.start", "prompt": NEW}, Code.ALREADY_STARTED)
        await refused({"type": "session.dance"}, Code.UNKNOWN_EVENT)
        await refused("{not json", Code.INVALID_JSON)
        await refused(b"\x00\x01", Code.INVALID_VALUE)  # binary frames are not client messages here

        seen = len(c.chunks)
        await c.next_chunk()
        await c.next_chunk()  # the stream went on through every refusal
        assert len(c.chunks) >= seen + 2
        assert all(ch.meta["request_id"] == rid for ch in c.chunks)
        assert chunks_with(c.chunks, "completed_event_ids", "dup")  # the accepted one still took effect
        assert [ch.meta["transport_chunk_index"] for ch in c.chunks] == list(range(len(c.chunks)))
        assert "session.done" not in c.types()


async def test_an_interaction_after_the_stream_ended_is_refused_then_the_socket_closes(gw: RunningGateway) -> None:
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.next_chunk()
        # Both frames leave together, so the server reads the interaction after the stop
        # and before it closes the socket.
        await c.send({"type": "session.stop"})
        await c.interact("late", {"prompt": NEW}, 1)
        done = await c.wait_for("session.done")
        assert done["stopped"] is True
        late = await c.error(Code.NO_ACTIVE_REQUEST)
        assert late["event_id"] == "late"
        assert await c.until_closed() == 1000
    assert "session.interaction.queued" not in c.types()


# --- 4. stop and disconnect leave nothing running ----------------------------------------------


async def test_stop_mid_stream_reports_stopped_and_leaves_no_engine_request(gw: RunningGateway) -> None:
    async with video(gw) as c:
        start = await c.start(**start_fields())
        await c.next_chunk()
        await c.next_chunk()
        assert start["session_id"] in gw.runtime.video_sockets
        await c.send({"type": "session.stop"})
        done = await c.wait_for("session.done")
        assert done["request_id"] == start["request_id"]
        assert done["stopped"] is True
        assert done["chunks"] >= 2
        assert await c.until_closed() == 1000
    assert await eventually(lambda: idle(gw)), leak_report(gw)


async def test_a_client_that_disconnects_mid_stream_leaves_no_engine_request(gw: RunningGateway) -> None:
    before = gw.runtime.metrics.sessions._value.get()
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.next_chunk()
        await c.next_chunk()
        assert gw.runtime.orchestrator.pending == 1
    # The websockets client closed the socket: the server sees a disconnect mid-stream.
    assert await eventually(lambda: idle(gw)), leak_report(gw)
    assert gw.runtime.metrics.sessions._value.get() == before


async def test_a_client_that_drops_the_tcp_connection_leaves_no_engine_request(gw: RunningGateway) -> None:
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.next_chunk()
        c.ws.transport.abort()  # no close frame: the connection is just gone
    assert await eventually(lambda: idle(gw)), leak_report(gw)


# --- 5. ping -----------------------------------------------------------------------------------


async def test_ping_gets_pong_during_a_stream(gw: RunningGateway) -> None:
    async with video(gw) as c:
        await c.start(**start_fields())
        await c.next_chunk()
        await c.send({"type": "session.ping"})
        await c.wait_for("session.pong")
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")


# --- 6. interactions over HTTP ----------------------------------------------------------------


@pytest.fixture
async def keyed_gw() -> AsyncIterator[RunningGateway]:
    async with gateway(api_keys=(K1, K2)) as gw:
        yield gw


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def body(**fields: Any) -> bytes:
    return orjson.dumps({"interaction": fields})


async def test_http_interaction_reaches_the_socket_and_its_transition_shows(keyed_gw: RunningGateway) -> None:
    gw = keyed_gw
    async with video(gw, K1) as c, httpx.AsyncClient(base_url=gw.http, timeout=10) as http:
        start = await c.start(**start_fields())
        sid = start["session_id"]
        url = f"/v1/realtime/video/{sid}/interactions"
        await c.next_chunk()

        payload = {"interaction": {"event_id": "web", "event": {"prompt": NEW}, "transition_chunks": 2}}
        r = await http.post(url, json=payload, headers=bearer(K1))
        assert r.status_code == 202, r.text
        assert r.json() | {"queued": True, "session_id": sid, "event_id": "web"} == r.json()
        await c.wait_for(is_queued("web"))
        started = await c.wait_for(is_chunk(lambda e: "web" in e["started_event_ids"]))
        completed = await c.wait_for(is_chunk(lambda e: "web" in e["completed_event_ids"]))
        assert completed["generation_chunk_index"] == started["generation_chunk_index"] + 1  # k = 2

        # An id from the server when the client gives none; the socket hears of it too.
        r = await http.post(url, content=body(event={"prompt": OLD}, transition_chunks=0), headers=bearer(K1))
        assert r.status_code == 202, r.text
        minted = r.json()["event_id"]
        assert minted
        await c.wait_for(is_queued(minted))

        async def refused(status: int, code: str, content: bytes, headers: dict[str, str], target: str = url) -> None:
            r = await http.post(target, content=content, headers={**headers, "Content-Type": "application/json"})
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code, r.text

        good = body(event={"prompt": NEW})
        k1 = bearer(K1)
        await refused(401, Code.UNAUTHORIZED, good, {})
        await refused(401, Code.UNAUTHORIZED, good, bearer("sk-wrong"))
        # A valid key of another principal: answered exactly as a session that does not exist.
        await refused(404, Code.SESSION_NOT_FOUND, good, bearer(K2))
        await refused(404, Code.SESSION_NOT_FOUND, good, k1, "/v1/realtime/video/vsess_0000000000/interactions")
        await refused(400, Code.INVALID_VALUE, body(event={"prompt": ""}), k1)
        await refused(400, Code.INVALID_VALUE, body(event={"prompt": NEW}, transition_chunks=-2), k1)
        await refused(400, Code.INVALID_TYPE, body(event={"prompt": NEW}, transition_chunks=0.5), k1)
        await refused(400, Code.UNSUPPORTED_FIELD, body(event={"prompt": NEW, "negative_prompt": "x"}), k1)
        await refused(400, Code.INVALID_JSON, b"{oops", k1)
        await refused(409, Code.EVENT_ID_CONFLICT, body(event_id="web", event={"prompt": NEW}), k1)

        await c.next_chunk()  # the stream went on
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
        await c.until_closed()

        # The stream is over and its socket closed: the session is gone.
        assert await eventually(lambda: sid not in gw.runtime.video_sockets)
        await refused(404, Code.SESSION_NOT_FOUND, good, k1)


async def test_the_video_socket_refuses_a_wrong_key_at_the_upgrade(keyed_gw: RunningGateway) -> None:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with video(keyed_gw, "sk-wrong"):
            raise AssertionError("the upgrade was accepted")
    assert info.value.response.status_code == 401
    assert orjson.loads(info.value.response.body)["error"]["code"] == Code.UNAUTHORIZED


# --- 7. what vLLM-Omni's documents name (support.upstream_docs) ---------------------------------


@pytest.mark.parametrize(
    ("fields", "size", "frames"),
    [
        ({"size": "64x48", "seconds": "1"}, (64, 48), FPS),  # seconds x fps frames
        ({"size": "64x48", "width": 200, "height": 200, "num_frames": 5}, (64, 48), 5),  # size wins
        ({"video_params": {"width": 64, "height": 48, "num_frames": 6}, "width": 96, "height": None}, (96, 48), 6),
        ({"video_params": {"fps": 12}, "fps": None, "seconds": 1, "width": 64, "height": 48}, (64, 48), 12),
    ],
)
async def test_size_seconds_and_video_params_resolve_as_upstream_resolves_them(
    gw: RunningGateway, fields: dict[str, Any], size: tuple[int, int], frames: int
) -> None:
    start_msg = {k: v for k, v in {**start_fields(), **fields}.items() if v is not None}
    async with video(gw) as c:
        start = await c.start(**start_msg)
        await c.wait_for("session.done")
    config = start["config"]
    assert (config["width"], config["height"], config["num_frames"]) == (*size, frames)
    for key in ("size", "seconds", "video_params"):  # echoed as the client sent them
        if key in fields:
            assert config[key] == fields[key]
    assert decode_mp4([ch.payload for ch in c.chunks]).shape == (frames, size[1], size[0], 3)


async def test_the_trailer_indexes_every_fragment_delivered_and_only_a_completed_stream_has_one(
    gw: RunningGateway,
) -> None:
    async with video(gw) as c:
        await c.start(**start_fields(num_frames=5 * F))
        await c.wait_for("session.done")
    (trailer,) = c.trailers
    stream = b"".join(ch.payload for ch in c.chunks)
    mfra = trailer.payload
    assert mfra[4:8] == b"mfra" and int.from_bytes(mfra[-4:], "big") == len(mfra)  # mfro: the mfra's size
    count = int.from_bytes(mfra[8 + 8 + 12 : 8 + 8 + 16], "big")
    entries = [mfra[32 + 19 * i : 32 + 19 * (i + 1)] for i in range(count)]
    offsets = [int.from_bytes(e[8:16], "big") for e in entries]
    times = [int.from_bytes(e[:8], "big") for e in entries]
    assert count == 5 and times == sorted(times) and len(set(times)) == 5
    assert all(stream[o + 4 : o + 8] == b"moof" for o in offsets)  # each points at a fragment it got
    assert decode_mp4([stream, mfra]).shape[0] == 5 * F  # the whole file still decodes
    async with video(gw) as c:  # stopped: no trailer
        await c.start(**start_fields())
        await c.next_chunk()
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
    assert c.trailers == []
    async with video(gw) as c:  # JPEG has none
        await c.start(**start_fields(format="jpeg", num_frames=F))
        await c.wait_for("session.done")
    assert c.trailers == []


async def test_an_interaction_the_engine_refuses_is_interaction_failed_and_the_stream_goes_on(
    gw: RunningGateway,
) -> None:
    async with video(gw) as c:
        start = await c.start(**start_fields())
        await c.next_chunk()
        far = {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1e9, 0, 0]}}}}
        await c.interact("too-far", far, 1)
        error = await c.error(Code.INTERACTION_FAILED)
        assert (error["event_id"], error["request_id"], error["reason"]) == ("too-far", start["request_id"],
                                                                           "invalid_interaction")  # fmt: skip
        await c.send({"type": "session.playback", "position_seconds": 0.5})  # accepted, no reply
        await c.interact("too-far", {"prompt": NEW}, 1)  # the refused id may be used again
        await c.wait_for(is_queued("too-far"))
        await c.next_chunk()
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
    assert "error" not in c.types()[c.types().index("session.interaction.queued") :]


async def test_a_socket_that_sends_no_start_in_time_is_told_and_closed() -> None:
    async with gateway(video_start_timeout_s=0.3) as gw, video(gw) as c:
        error = await c.error(Code.START_TIMEOUT, timeout=5)
        assert "session.start" in error["message"]
        assert await c.until_closed() == 1000


# Upstream (vllm-project/vllm-omni @ 4ebf4479, vllm_omni/entrypoints/openai/serving_video_output_stream.py):
# ``session.done``'s ``chunks`` is the count of chunks it sent, the encoder's trailer among them;
# ``video.start``'s ``config`` is ``request.model_dump(exclude_none=True)``; a ``model`` other than
# the served one is refused ("Model mismatch: ...") and the handler returns (the socket closes).


async def test_session_done_counts_every_chunk_received_the_trailer_among_them(gw: RunningGateway) -> None:
    async with video(gw) as c:  # completed: its media chunks and the trailer
        await c.start(**start_fields(num_frames=3 * F))
        done = await c.wait_for("session.done")
    (trailer,) = c.trailers
    # VIDEO_INTERACTION "Video Chunk Metadata": the trailer is a chunk with its own transport index ...
    assert doc.VIDEO_TRAILER_METADATA.keys() <= trailer.meta.keys()
    assert trailer.meta["transport_chunk_index"] == len(c.chunks) == 3
    # ... and, as upstream counts them (its chunks_sent), session.done counts it
    assert done["chunks"] == trailer.meta["transport_chunk_index"] + 1 == 4
    async with video(gw) as c:  # stopped: no trailer, the chunks received
        await c.start(**start_fields())
        await c.next_chunk()
        await c.send({"type": "session.stop"})
        done = await c.wait_for("session.done")
    assert c.trailers == [] and done["stopped"] is True
    assert done["chunks"] == len(c.chunks) == c.chunks[-1].meta["transport_chunk_index"] + 1
    async with video(gw) as c:  # JPEG: no trailer
        await c.start(**start_fields(format="jpeg", num_frames=2 * F))
        done = await c.wait_for("session.done")
    assert c.trailers == [] and done["chunks"] == len(c.chunks) == 2


def nulls(value: Any, path: str = "") -> list[str]:
    """Where ``value`` holds a null, at any depth."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nulls(v, f"{path}[{i}]")]
    return [path] if value is None else []


async def test_video_start_leaves_null_fields_out_as_upstream_does(gw: RunningGateway) -> None:
    # VIDEO "Protocol": the minimal session.start, for this route's model, sized for the CPU engine;
    # with no num_frames (it streams until stopped), and nulls where a client may send them.
    start_msg = {**doc.VIDEO_START, "model": "cpu-video", "width": W, "height": H, "num_frames": None,
                 "seed": None, "negative_prompt": None, "guidance_scale": None,
                 "video_params": {"fps": None, "num_frames": 9}}  # fmt: skip
    async with video(gw) as c:
        start = await c.start(**start_msg)
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
    assert nulls(start) == []
    config = start["config"]
    assert config["video_params"] == {"num_frames": 9}  # a nested null left out too, as VideoParams dumps it
    assert config["num_frames"] == 9  # from video_params, as upstream resolves it
    assert not {"seed", "negative_prompt", "guidance_scale"} & config.keys()
    assert (config["model"], config["prompt"], config["fps"]) == ("cpu-video", doc.VIDEO_START["prompt"], 16)
    async with video(gw) as c:  # no num_frames anywhere: the stream is unbounded, and config says nothing of it
        start = await c.start(**start_fields())
        await c.send({"type": "session.stop"})
        await c.wait_for("session.done")
    assert nulls(start) == [] and "num_frames" not in start["config"] and "model" not in start["config"]


async def test_a_start_naming_another_model_is_refused_as_upstream_refuses_it(gw: RunningGateway) -> None:
    async with video(gw) as c:
        await c.send({**doc.VIDEO_START, "width": W, "height": H, "num_frames": F})  # names Helios-Distilled
        error = await c.error(Code.MODEL_NOT_FOUND)
        assert await c.until_closed() == 1000
    assert c.types() == ["error"]  # no video.start: nothing was generated
    assert error["message"].startswith(
        "Model mismatch: request specifies 'BestWishYsh/Helios-Distilled' but server is running 'cpu-video'."
    )
    assert (error["param"], error["event_id"], error["request_id"]) == ("model", None, None)
    async with video(gw) as c:  # the route's own model, by name, is served
        start = await c.start(**start_fields(model="cpu-video", num_frames=F))
        await c.wait_for("session.done")
    assert start["config"]["model"] == "cpu-video"


async def test_video_model_names_the_route_so_the_upstream_documents_start_is_served() -> None:
    async with gateway(video_model="BestWishYsh/Helios-Distilled") as gw:
        async with video(gw) as c:
            start = await c.start(**{**doc.VIDEO_START, "width": W, "height": H, "num_frames": F})
            done = await c.wait_for("session.done")
        assert start["config"]["model"] == doc.VIDEO_START["model"] and done["stopped"] is False
        async with video(gw) as c:
            await c.send({"type": "session.start", **start_fields(model="cpu-video")})
            error = await c.error(Code.MODEL_NOT_FOUND)
        assert "server is running 'BestWishYsh/Helios-Distilled'" in error["message"]


async def test_interactions_are_bounded_in_id_length_and_rate() -> None:
    """Issue 33, finding 9: an event_id of any length was kept for the stream's life, and
    nothing bounded how many interactions came (200 POSTs of 1 MiB ids: 340 -> 535 MiB)."""
    from gateway.protocol.video_events import MAX_EVENT_ID_CHARS

    async with (
        gateway(api_keys=(K1,), video_interactions_per_s=3) as gw,
        video(gw, K1) as c,
        httpx.AsyncClient(base_url=gw.http, timeout=10) as http,
    ):
        sid = (await c.start(**start_fields()))["session_id"]
        url = f"/v1/realtime/video/{sid}/interactions"
        r = await http.post(url, content=body(event_id="x" * (MAX_EVENT_ID_CHARS + 1), event={"prompt": NEW}),
                            headers=bearer(K1))  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["code"] == Code.STRING_TOO_LONG, r.text
        statuses = []
        for i in range(20):  # (past 3 in one second: dropped; 20 never take 6 s, however busy the machine)
            r = await http.post(url, content=body(event_id=f"i{i}", event={"prompt": NEW}), headers=bearer(K1))
            statuses.append(r.status_code)
        assert 429 in statuses and statuses.count(202) < 20
        await c.wait_for(lambda e: e.get("type") == "error" and e.get("code") == Code.RATE_LIMIT_EXCEEDED)
        await c.next_chunk()  # the stream goes on
