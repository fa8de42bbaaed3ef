"""The video engine protocol and its data types.

A video engine serves one kind of request, shaped like vLLM-Omni's streaming
video generation (``AsyncOmni.generate`` on a diffusion stage with streaming
output, plus ``submit_interaction_async``): a ``VideoRequest`` starts a
generation, chunks of encoded video come back as an async iterator, and while
it runs the caller may submit ``Interaction``s (a new prompt and/or a camera
move) that take effect at the next chunk boundary and blend in over
``transition_chunks`` chunks.

Chunk metadata follows the ``video.chunk_metadata`` event of vLLM-Omni's
``/v1/realtime/video`` protocol: each chunk names the interactions whose
transition *starts* in it, those *active* during it (the start chunk
included) and those *completed* with it.

Cancellation is first class, as for the voice ``Engine``: the caller cancels
the task that iterates the chunks and/or calls ``abort(request_id)``; the
engine releases everything it holds for that request in either case. Failures
a client should see are ``orchestrator.engine.EngineError`` with a stable
``code`` (listed in ``ERROR_CODES``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from orchestrator.engine import EngineError

VideoFormat = Literal["mp4", "jpeg"]
CameraMode = Literal["target", "velocity"]

# --- limits -------------------------------------------------------------------
# Each limit is checked by ``validate_request`` / ``validate_interaction``; a
# value outside it is refused with EngineError("invalid_request" or
# "invalid_interaction") before any work starts.

MIN_DIMENSION = 16  # px; below this the prompt caption cannot be drawn
MAX_DIMENSION = 1920  # px, per side
MAX_PIXELS = 1920 * 1088  # per frame; bounds render memory and CPU per frame
MAX_FPS = 60
MAX_FRAMES_PER_CHUNK = 120  # one chunk is rendered and encoded in one worker call
MAX_TRANSITION_CHUNKS = 1000  # a longer fade is indistinguishable from none
MAX_CAMERA_COMPONENT = 1.0e4  # |translation| and |rotation| components (units, degrees)

DEFAULT_WIDTH = 256
DEFAULT_HEIGHT = 256
DEFAULT_FPS = 12
DEFAULT_TRANSITION_CHUNKS = 3

# Stable error codes raised by video engines.
ERROR_CODES = (
    "invalid_request",  # a VideoRequest field is outside its documented limits
    "invalid_interaction",  # an Interaction field is malformed
    "no_active_request",  # interaction for an unknown or finished request
    "event_id_conflict",  # an event_id already used within this request
    "request_id_conflict",  # generate_video with the id of a running request
    "capacity_exceeded",  # the engine's max_active_requests is reached
    "too_many_pending_interactions",  # the per-request interaction queue is full
    "engine_not_started",  # generate_video before start() or after close()
    "generation_failed",  # rendering or encoding raised; the request is over
)


# --- inputs -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VideoRequest:
    """One streaming video generation.

    ``num_frames``: total frames to produce; ``None`` runs until aborted.
    ``frames_per_chunk``: frames per generation chunk (one fMP4 fragment, one
    keyframe); ``None`` picks ``default_frames_per_chunk(fps)``, half a second
    of video: short enough that an interaction is applied within 0.5 s of
    media, long enough that the per-chunk keyframe stays a small share of the
    bitrate. ``seed`` varies the look of a prompt (``None`` behaves as 0).
    ``sampling_params``: the protocol's other sampling fields
    (``guidance_scale``, ``num_inference_steps``, ``extra_params``, ...), kept
    for engines that use them; the CPU engine ignores them.
    """

    request_id: str
    prompt: str
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    fps: int = DEFAULT_FPS
    num_frames: int | None = None
    frames_per_chunk: int | None = None
    seed: int | None = None
    format: VideoFormat = "mp4"
    negative_prompt: str | None = None
    sampling_params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def chunk_frames(self) -> int:
        """Frames per chunk after the default is applied."""
        if self.frames_per_chunk is not None:
            return self.frames_per_chunk
        return default_frames_per_chunk(self.fps)


def default_frames_per_chunk(fps: int) -> int:
    """Half a second of frames (at least one)."""
    return max(1, fps // 2)


@dataclass(frozen=True, slots=True)
class CameraMove:
    """A camera pose (``target``) or per-frame motion (``velocity``).

    Axes follow vLLM-Omni's camera payloads (+X right, +Y up, +Z forward).
    ``translation``: (x, y, z) in scene units; one unit is half the frame's
    shorter side, and +1 on z doubles the magnification.
    ``rotation``: (yaw, pitch, roll) in degrees.
    ``target``: the absolute pose the camera reaches at the end of the
    transition. ``velocity``: the change applied once per frame (1/fps s),
    reached at the end of the transition and kept until another camera move
    replaces it.
    """

    mode: CameraMode = "target"
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def from_quaternion(
        cls,
        mode: CameraMode,
        translation: tuple[float, float, float],
        quaternion_xyzw: tuple[float, float, float, float],
    ) -> CameraMove:
        """Build a move from the protocol's structural SE3 form (unit quaternion
        ``[x, y, z, w]``, yaw about +Y, pitch about +X, roll about +Z)."""
        x, y, z, w = quaternion_xyzw
        norm = math.sqrt(x * x + y * y + z * z + w * w) or 1.0
        x, y, z, w = x / norm, y / norm, z / norm, w / norm
        # Y-X-Z (yaw, pitch, roll) Tait-Bryan angles of the rotation.
        sin_pitch = max(-1.0, min(1.0, 2.0 * (w * x - y * z)))
        pitch = math.asin(sin_pitch)
        yaw = math.atan2(2.0 * (w * y + x * z), 1.0 - 2.0 * (x * x + y * y))
        roll = math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (x * x + z * z))
        return cls(
            mode=mode,
            translation=translation,
            rotation=(math.degrees(yaw), math.degrees(pitch), math.degrees(roll)),
        )


@dataclass(frozen=True, slots=True)
class Interaction:
    """A mid-generation change, applied at the next chunk boundary.

    ``transition_chunks`` = k: the change blends in over exactly k chunks,
    reaching its target at the end of the k-th chunk; 0 is a hard cut at the
    next chunk. When several interactions touch the same track (prompt,
    camera) the last one wins: it starts from the state the older one reached
    at that boundary, and the older one is reported completed and superseded.
    """

    event_id: str
    prompt: str | None = None
    camera: CameraMove | None = None
    transition_chunks: int = DEFAULT_TRANSITION_CHUNKS


# --- outputs ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VideoChunk:
    """One generation chunk, encoded.

    ``kind="mp4"``: ``data`` is one fMP4 fragment (moof+mdat) that starts
    with a keyframe; on chunk 0 it is prefixed by the init segment
    (ftyp+moov), so appending every ``data`` in order to a Media Source
    ``SourceBuffer`` plays the stream. ``init_segment`` repeats the init
    segment on every chunk, for a client that joins or resumes mid-stream
    (send ``init_segment`` then this chunk's fragment: ``media``).

    ``kind="jpeg"``: ``frames`` holds one baseline JPEG per frame and ``data``
    their concatenation (each JPEG runs from SOI ``FFD8`` to EOI ``FFD9``).

    ``superseded_event_ids`` lists the completed events that were replaced
    (last write wins) before reaching their target; they also appear in
    ``completed_event_ids``.
    """

    kind: VideoFormat
    generation_chunk_index: int
    num_frames: int
    data: bytes
    mime_type: str  # e.g. 'video/mp4; codecs="avc1.42C00C"' or 'image/jpeg'
    init_segment: bytes = b""
    frames: tuple[bytes, ...] = ()
    started_event_ids: tuple[str, ...] = ()
    active_event_ids: tuple[str, ...] = ()
    completed_event_ids: tuple[str, ...] = ()
    superseded_event_ids: tuple[str, ...] = ()

    @property
    def media(self) -> bytes:
        """The fragment without the init segment (mp4), or ``data`` (jpeg)."""
        if self.init_segment and self.data.startswith(self.init_segment):
            return self.data[len(self.init_segment) :]
        return self.data


# --- the protocol -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VideoEngineInfo:
    name: str
    description: str  # what it really computes, shown in /v1/models
    formats: tuple[VideoFormat, ...] = ("mp4", "jpeg")
    default_width: int = DEFAULT_WIDTH
    default_height: int = DEFAULT_HEIGHT
    default_fps: int = DEFAULT_FPS
    default_transition_chunks: int = DEFAULT_TRANSITION_CHUNKS
    supports_camera: bool = True
    # Request fields the engine accepts and ignores; the session reports them.
    ignored_fields: tuple[str, ...] = ()
    # The model it serves, by name (vLLM-Omni's served model name): a session.start naming
    # another is refused. None: not known here (a remote upstream's), so not matched.
    model: str | None = None


@runtime_checkable
class VideoEngine(Protocol):
    info: VideoEngineInfo

    async def start(self) -> None:
        """Prepare workers; called once before the first request."""

    async def close(self) -> None:
        """Release everything; no request is running any more."""

    def healthy(self) -> bool:
        """False once the engine cannot serve (readiness reports it)."""

    def generate_video(self, request: VideoRequest) -> AsyncIterator[VideoChunk]:
        """Chunks until ``num_frames`` are produced (or forever if ``None``).

        The request is active (accepts interactions) from the first
        ``__anext__`` until the iterator ends. After ``abort`` it ends early,
        without an error.
        """
        ...

    async def submit_interaction(self, request_id: str, interaction: Interaction) -> None:
        """Queue an interaction for the next chunk boundary of a running request."""

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its resources; a no-op for unknown ids."""


# --- validation -----------------------------------------------------------------


def validate_request(request: VideoRequest) -> None:
    """Raise EngineError("invalid_request") unless every field is within limits."""

    def bad(message: str) -> EngineError:
        return EngineError("invalid_request", message)

    if not isinstance(request.request_id, str) or not request.request_id:
        raise bad("request_id must be a non-empty string")
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise bad("prompt must be a non-empty string")
    for name, value in (("width", request.width), ("height", request.height)):
        if not _is_int(value) or not MIN_DIMENSION <= value <= MAX_DIMENSION:
            raise bad(f"{name} must be an integer in [{MIN_DIMENSION}, {MAX_DIMENSION}]")
        if value % 2:  # H.264 4:2:0 needs even dimensions
            raise bad(f"{name} must be even")
    if request.width * request.height > MAX_PIXELS:
        raise bad(f"width*height must be at most {MAX_PIXELS}")
    if not _is_int(request.fps) or not 1 <= request.fps <= MAX_FPS:
        raise bad(f"fps must be an integer in [1, {MAX_FPS}]")
    if request.num_frames is not None and (not _is_int(request.num_frames) or request.num_frames < 1):
        raise bad("num_frames must be a positive integer or None")
    fpc = request.frames_per_chunk
    if fpc is not None and (not _is_int(fpc) or not 1 <= fpc <= MAX_FRAMES_PER_CHUNK):
        raise bad(f"frames_per_chunk must be an integer in [1, {MAX_FRAMES_PER_CHUNK}]")
    if request.seed is not None and not _is_int(request.seed):
        raise bad("seed must be an integer or None")
    if request.format not in ("mp4", "jpeg"):
        raise bad("format must be 'mp4' or 'jpeg'")


def validate_interaction(interaction: Interaction) -> None:
    """Raise EngineError("invalid_interaction") for a malformed interaction.

    As AsyncOmni: a prompt, when present, is a non-empty string (blank is
    refused too) and ``transition_chunks`` is >= 0. An interaction must carry
    a prompt or a camera move, or it would change nothing.
    """

    def bad(message: str) -> EngineError:
        return EngineError("invalid_interaction", message)

    if not isinstance(interaction.event_id, str) or not interaction.event_id:
        raise bad("event_id must be a non-empty string")
    if interaction.prompt is not None and (not isinstance(interaction.prompt, str) or not interaction.prompt.strip()):
        raise bad("prompt must be a non-empty string")
    k = interaction.transition_chunks
    if not _is_int(k) or k < 0:
        raise bad("transition_chunks must be an integer >= 0")
    if k > MAX_TRANSITION_CHUNKS:
        raise bad(f"transition_chunks must be at most {MAX_TRANSITION_CHUNKS}")
    if interaction.prompt is None and interaction.camera is None:
        raise bad("an interaction needs a prompt or a camera move")
    camera = interaction.camera
    if camera is not None:
        if camera.mode not in ("target", "velocity"):
            raise bad("camera.mode must be 'target' or 'velocity'")
        for name, vector in (("translation", camera.translation), ("rotation", camera.rotation)):
            if len(vector) != 3 or not all(
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and abs(v) <= MAX_CAMERA_COMPONENT
                for v in vector
            ):
                raise bad(f"camera.{name} must be 3 finite numbers within ±{MAX_CAMERA_COMPONENT}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
