"""Client events of ``/v1/realtime/video`` (vLLM-Omni's streaming video protocol).

Decoding is pure: one text frame in, a typed event out, or ``ProtocolError``
with a stable code. Field names and defaults follow vLLM-Omni so its clients
work unchanged: ``format`` ``m4s`` (the default) is fragmented MP4, ``jpeg`` a
JPEG per frame; an interaction is ``{event_id?, event: {prompt?,
multi_modal_data?: {camera: {mode, data: {translation, rotation}}}},
transition_chunks?}``.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.errors import Code, ProtocolError, json_object

MAX_CONTROL_BYTES = 128 * 1024  # a video control message larger than this is refused (message_too_large)
_FORMATS = {"m4s": "mp4", "mp4": "mp4", "fmp4": "mp4", "jpeg": "jpeg", "jpg": "jpeg"}
# session.start fields the gateway maps onto the request; any other field is kept
# as a sampling parameter for engines that use it (the CPU engine reports it ignored).
_START_FIELDS = {
    "type",
    "model",
    "prompt",
    "width",
    "height",
    "fps",
    "num_frames",
    "seed",
    "format",
    "negative_prompt",
    "sampling_params",
    "extra_params",
    "frames_per_chunk",
    "event_id",
    "size",
    "seconds",
    "video_params",
}
_SIZE = re.compile(r"^(\d+)x(\d+)$")  # upstream's SizeStr: WIDTHxHEIGHT
_SECONDS = re.compile(r"^[1-9]\d*$")  # upstream's SecondStr


@dataclass(frozen=True, slots=True)
class Start:
    prompt: str
    format: str  # "mp4" | "jpeg"
    requested_format: str  # as the client spelled it, echoed in video.start
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    frames_per_chunk: int | None = None
    seed: int | None = None
    negative_prompt: str | None = None
    model: str | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    seconds: int | None = None  # clip length; num_frames = seconds x fps when num_frames is not given
    echo: dict[str, Any] = field(default_factory=dict)  # size / seconds / video_params as sent, for video.start


@dataclass(frozen=True, slots=True)
class CameraSpec:
    """``multi_modal_data.camera`` as the client sent it, validated: ``mode`` target or
    velocity, ``translation`` (x, y, z), ``rotation`` (yaw, pitch, roll) degrees or a
    unit quaternion (x, y, z, w). The session makes the engine's camera move of it."""

    mode: str
    translation: tuple[float, float, float]
    rotation: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class InteractionSpec:
    """One validated interaction (from the socket, the HTTP endpoint or another replica)."""

    event_id: str
    prompt: str | None
    camera: CameraSpec | None
    transition_chunks: int | None  # None: the client gave none (the engine's default applies)


@dataclass(frozen=True, slots=True)
class InteractionEvent:
    interaction: InteractionSpec


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Playback:
    """``session.playback`` (vLLM-Omni's example client): the client's playhead. Accepted and
    validated; generation here is paced to real time instead (``video_lead_chunks``)."""

    position_seconds: float


VideoClientEvent = Start | InteractionEvent | Ping | Stop | Playback


def error_event(
    code: str, message: str, *, event_id: str | None = None, param: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    """An error in vLLM-Omni's flat shape, with our stable code."""
    return {
        "type": "error",
        "code": code,
        "message": message,
        "param": param,
        "event_id": event_id,
        "request_id": request_id,
    }


def _err(code: str, message: str, param: str | None = None, event_id: str | None = None) -> ProtocolError:
    return ProtocolError(code, message, param=param, event_id=event_id)


def _int(d: dict[str, Any], key: str, prefix: str = "") -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise _err(Code.INVALID_TYPE, f"'{prefix}{key}' must be an integer.", prefix + key)
    return int(value)


def decode(raw: str | bytes) -> VideoClientEvent:
    if len(raw) > MAX_CONTROL_BYTES:
        raise _err(Code.MESSAGE_TOO_LARGE, f"A control message may be at most {MAX_CONTROL_BYTES} bytes.")
    data = json_object(raw, "A message")
    kind = data.get("type")
    if kind == "session.start":
        return _start(data)
    if kind == "session.interaction":
        return _interaction(data.get("interaction"))
    if kind == "session.ping":
        return Ping()
    if kind == "session.stop":
        return Stop()
    if kind == "session.playback":
        position = data.get("position_seconds")
        if isinstance(position, bool) or not isinstance(position, int | float) or not math.isfinite(position):
            raise _err(Code.INVALID_VALUE, "'position_seconds' must be a finite number.", "position_seconds")
        if position < 0:
            raise _err(Code.INVALID_VALUE, "'position_seconds' must be >= 0.", "position_seconds")
        return Playback(float(position))
    raise _err(
        Code.UNKNOWN_EVENT,
        f"Unknown message type {kind!r}; use session.start, session.interaction, session.ping or session.stop.",
        "type",
    )


def _start(d: dict[str, Any]) -> Start:
    prompt = d.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _err(Code.INVALID_VALUE, "session.start needs a non-empty 'prompt'.", "prompt")
    raw_format = d.get("format", "m4s")
    if raw_format not in _FORMATS:
        raise _err(
            Code.UNSUPPORTED_VIDEO_FORMAT,
            f"Unsupported format {raw_format!r}; use m4s (fragmented MP4) or jpeg.",
            "format",
        )
    negative = d.get("negative_prompt")
    if negative is not None and not isinstance(negative, str):
        raise _err(Code.INVALID_TYPE, "'negative_prompt' must be a string.", "negative_prompt")
    sampling: dict[str, Any] = {}
    for key in ("sampling_params", "extra_params"):
        value = d.get(key)
        if value is not None:
            if not isinstance(value, dict):
                raise _err(Code.INVALID_TYPE, f"'{key}' must be an object.", key)
            sampling.update(value)
    sampling.update({k: v for k, v in d.items() if k not in _START_FIELDS})
    model = d.get("model")
    if model is not None and not isinstance(model, str):
        raise _err(Code.INVALID_TYPE, "'model' must be a string (the served model's name), or left out.", "model")
    width, height, fps, num_frames, seconds, echo = _video_params(d)
    return Start(
        prompt=prompt,
        format=_FORMATS[raw_format],
        requested_format=raw_format,
        width=width,
        height=height,
        fps=fps,
        num_frames=num_frames,
        frames_per_chunk=_int(d, "frames_per_chunk"),
        seed=_int(d, "seed"),
        negative_prompt=negative,
        model=model,
        sampling_params=sampling,
        seconds=seconds,
        echo=echo,
    )


def _video_params(
    d: dict[str, Any],
) -> tuple[int | None, int | None, int | None, int | None, int | None, dict[str, Any]]:
    """Size, rate and length as upstream resolves them (``VideoGenerationRequest.resolve_video_params``):
    the top-level ``width``/``height``/``fps``/``num_frames`` first, ``video_params`` for what they
    leave out, ``size`` (``WIDTHxHEIGHT``) over both, and ``seconds`` x fps frames when
    ``num_frames`` is not given (the fps default is the engine's: ``VideoSession``)."""
    echo: dict[str, Any] = {}
    top = {key: _positive(d, key) for key in ("width", "height", "fps", "num_frames")}
    vp = d.get("video_params")
    if vp is not None:
        if not isinstance(vp, dict):
            raise _err(Code.INVALID_TYPE, "'video_params' must be an object.", "video_params")
        # Echoed as upstream's VideoParams model dumps it (exclude_none): its null fields left out.
        echo["video_params"] = {k: v for k, v in vp.items() if v is not None}
        for key in top:
            if top[key] is None:
                top[key] = _positive(vp, key, "video_params.")
    size = d.get("size")
    if size is not None:
        match = _SIZE.match(size) if isinstance(size, str) else None
        if match is None or not int(match[1]) or not int(match[2]):
            raise _err(Code.INVALID_VALUE, f"'size' must be WIDTHxHEIGHT (e.g. '1280x720'), got {size!r}.", "size")
        echo["size"] = size
        top["width"], top["height"] = int(match[1]), int(match[2])
    seconds = d.get("seconds")
    if seconds is not None:
        # Upstream takes a string of digits (OpenAI's shape); a positive integer is taken too.
        ok = (isinstance(seconds, str) and _SECONDS.match(seconds)) or (
            isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 1
        )
        if not ok:
            raise _err(Code.INVALID_VALUE, f"'seconds' must be a positive whole number (e.g. \"4\"), got {seconds!r}.",
                       "seconds")  # fmt: skip
        echo["seconds"] = seconds
        seconds = int(seconds)
    return top["width"], top["height"], top["fps"], top["num_frames"], seconds, echo


def _positive(d: dict[str, Any], key: str, prefix: str = "") -> int | None:
    value = _int(d, key, prefix)
    if value is not None and value < 1:
        raise _err(Code.INVALID_VALUE, f"'{prefix}{key}' must be >= 1, got {value}.", prefix + key)
    return value


MAX_EVENT_ID_CHARS = 256  # an interaction's event_id (the stream remembers recent ones); longer:
#   string_above_max_length, the interaction is refused


def decode_interaction(payload: Any) -> InteractionSpec:
    """An ``interaction`` object (from the socket, the HTTP endpoint or another replica)."""
    return _interaction(payload).interaction


def _interaction(payload: Any) -> InteractionEvent:
    if not isinstance(payload, dict):
        raise _err(Code.MISSING_FIELD, "session.interaction needs an 'interaction' object.", "interaction")
    event_id = payload.get("event_id")
    if event_id is None:
        event_id = "evt_" + uuid.uuid4().hex[:16]
    elif not isinstance(event_id, str) or not event_id:
        raise _err(Code.INVALID_VALUE, "'interaction.event_id' must be a non-empty string.", "interaction.event_id")
    elif len(event_id) > MAX_EVENT_ID_CHARS:
        raise _err(Code.STRING_TOO_LONG, f"'interaction.event_id' may be at most {MAX_EVENT_ID_CHARS} characters.",
                   "interaction.event_id")  # fmt: skip
    event = payload.get("event")
    if not isinstance(event, dict):
        raise _err(
            Code.MISSING_FIELD,
            "session.interaction needs an 'interaction.event' object.",
            "interaction.event",
            event_id,
        )
    if event.get("negative_prompt") is not None:
        raise _err(
            Code.UNSUPPORTED_FIELD,
            "negative_prompt cannot change during a stream; set it in session.start.",
            "interaction.event.negative_prompt",
            event_id,
        )
    prompt = event.get("prompt")
    if "prompt" in event and (not isinstance(prompt, str) or not prompt.strip()):
        raise _err(
            Code.INVALID_VALUE,
            "'interaction.event.prompt' must be a non-empty string.",
            "interaction.event.prompt",
            event_id,
        )
    camera = _camera(event.get("multi_modal_data"), event_id)
    if prompt is None and camera is None:
        raise _err(
            Code.MISSING_FIELD,
            "An interaction needs event.prompt or event.multi_modal_data.camera.",
            "interaction.event",
            event_id,
        )
    raw_k = payload.get("transition_chunks")
    k: int | None = None
    if raw_k is not None:
        if (
            isinstance(raw_k, bool)
            or not isinstance(raw_k, int | float)
            or (isinstance(raw_k, float) and not raw_k.is_integer())
        ):
            raise _err(
                Code.INVALID_TYPE,
                "'interaction.transition_chunks' must be an integer.",
                "interaction.transition_chunks",
                event_id,
            )
        k = int(raw_k)
        if k < 0:
            raise _err(
                Code.INVALID_VALUE,
                "'interaction.transition_chunks' must be >= 0 (0 is a hard cut).",
                "interaction.transition_chunks",
                event_id,
            )
    return InteractionEvent(InteractionSpec(event_id, prompt=prompt, camera=camera, transition_chunks=k))


def _camera(mm: Any, event_id: str) -> CameraSpec | None:
    if mm is None:
        return None
    param = "interaction.event.multi_modal_data.camera"
    cam = mm.get("camera") if isinstance(mm, dict) else None
    if not isinstance(cam, dict):
        raise _err(Code.INVALID_VALUE, "multi_modal_data needs a 'camera' object.", param, event_id)
    mode = cam.get("mode", "target")
    if mode not in ("target", "velocity"):
        raise _err(Code.INVALID_VALUE, "camera.mode must be 'target' or 'velocity'.", f"{param}.mode", event_id)
    data = cam.get("data", {})
    if not isinstance(data, dict):
        raise _err(Code.INVALID_TYPE, "camera.data must be an object.", f"{param}.data", event_id)

    def vector(name: str, sizes: tuple[int, ...]) -> tuple[float, ...]:
        value = data.get(name, [0.0] * sizes[0])
        ok = (
            isinstance(value, list)
            and len(value) in sizes
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        )
        if not ok:
            raise _err(
                Code.INVALID_VALUE,
                f"camera.data.{name} must be {' or '.join(map(str, sizes))} numbers.",
                f"{param}.data.{name}",
                event_id,
            )
        return tuple(float(v) for v in value)

    translation = vector("translation", (3,))
    rotation = vector("rotation", (3, 4))  # (yaw, pitch, roll) degrees, or a unit quaternion [x, y, z, w]
    return CameraSpec(mode, (translation[0], translation[1], translation[2]), rotation)
