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
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.protocol.errors import Code, ProtocolError
from orchestrator.video_engine import CameraMove, Interaction

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
}


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


@dataclass(frozen=True, slots=True)
class InteractionEvent:
    interaction: Interaction
    explicit_transition: bool  # the client gave transition_chunks (else the engine default applies)


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


VideoClientEvent = Start | InteractionEvent | Ping | Stop


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


def _int(d: dict[str, Any], key: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise _err(Code.INVALID_TYPE, f"'{key}' must be an integer.", key)
    return int(value)


def decode(raw: str | bytes) -> VideoClientEvent:
    if len(raw) > MAX_CONTROL_BYTES:
        raise _err(Code.MESSAGE_TOO_LARGE, f"A control message may be at most {MAX_CONTROL_BYTES} bytes.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _err(Code.INVALID_JSON, f"The message is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise _err(Code.INVALID_JSON, "A message must be a JSON object.")
    kind = data.get("type")
    if kind == "session.start":
        return _start(data)
    if kind == "session.interaction":
        return _interaction(data.get("interaction"))
    if kind == "session.ping":
        return Ping()
    if kind == "session.stop":
        return Stop()
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
    return Start(
        prompt=prompt,
        format=_FORMATS[raw_format],
        requested_format=raw_format,
        width=_int(d, "width"),
        height=_int(d, "height"),
        fps=_int(d, "fps"),
        num_frames=_int(d, "num_frames"),
        frames_per_chunk=_int(d, "frames_per_chunk"),
        seed=_int(d, "seed"),
        negative_prompt=negative,
        model=model if isinstance(model, str) else None,
        sampling_params=sampling,
    )


def decode_interaction(payload: Any, default_transition_chunks: int = 3) -> InteractionEvent:
    """An ``interaction`` object (from the socket or the HTTP endpoint)."""
    return _interaction(payload, default_transition_chunks)


def _interaction(payload: Any, default_transition_chunks: int = 3) -> InteractionEvent:
    if not isinstance(payload, dict):
        raise _err(Code.MISSING_FIELD, "session.interaction needs an 'interaction' object.", "interaction")
    event_id = payload.get("event_id")
    if event_id is None:
        event_id = "evt_" + uuid.uuid4().hex[:16]
    elif not isinstance(event_id, str) or not event_id:
        raise _err(Code.INVALID_VALUE, "'interaction.event_id' must be a non-empty string.", "interaction.event_id")
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
    explicit = raw_k is not None
    k = default_transition_chunks
    if explicit:
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
    return InteractionEvent(Interaction(event_id, prompt=prompt, camera=camera, transition_chunks=k), explicit)


def _camera(mm: Any, event_id: str) -> CameraMove | None:
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
    t3 = (translation[0], translation[1], translation[2])
    if len(rotation) == 4:
        return CameraMove.from_quaternion(mode, t3, (rotation[0], rotation[1], rotation[2], rotation[3]))
    return CameraMove(mode, t3, (rotation[0], rotation[1], rotation[2]))
