"""The streaming video session state machine (Sans-I/O).

One connection streams one video: ``session.start`` starts it, interactions
change it while it renders, ``session.stop`` or the last frame ends it.
The session validates everything a client sends (each refusal is a coded
``error`` and the stream goes on), tracks the event ids used in the stream,
and turns engine chunks into ``video.chunk_metadata`` events. Delivery (the
binary frames, backpressure, dropped chunks, and so the ``chunks`` that
``session.done`` reports) is the shell's.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.protocol import video_events as ve
from gateway.protocol.errors import Code, ProtocolError
from orchestrator.engine import EngineError
from orchestrator.video_engine import (
    CameraMove,
    Interaction,
    VideoChunk,
    VideoEngineInfo,
    VideoRequest,
    validate_request,
)


@dataclass(frozen=True, slots=True)
class StartVideo:
    request: VideoRequest


@dataclass(frozen=True, slots=True)
class Interact:
    request_id: str
    interaction: Interaction


@dataclass(frozen=True, slots=True)
class StopVideo:
    request_id: str


@dataclass(frozen=True, slots=True)
class CloseVideo:
    """Close the socket once what is queued is sent (a refused start, a timeout, a stall)."""

    code: int
    reason: str


VideoEffect = StartVideo | Interact | StopVideo | CloseVideo

INTERACTION_FAILED = Code.INTERACTION_FAILED


@dataclass(frozen=True, slots=True)
class InteractionLimits:
    """What a stream takes of interactions (the settings of the same names)."""

    per_s: int = 20  # interactions (socket and HTTP together) in one second; more: rate_limit_exceeded
    remembered_ids: int = 1_024  # event ids remembered for event_id_conflict; older ones are forgotten


class VideoSession:
    def __init__(
        self,
        *,
        session_id: str,
        info: VideoEngineInfo,
        limits: InteractionLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = session_id
        self.info = info
        self.state = "idle"  # idle -> streaming -> done
        self.request_id: str | None = None
        self.events: list[dict[str, Any]] = []  # what the client is to be told, in order (take())
        self.effects: list[VideoEffect] = []
        self.limits = limits or InteractionLimits()
        self._clock = clock
        self._event_ids: dict[str, None] = {}  # the stream's recent ids, oldest first (bounded)
        self._window = (0, 0)  # (the clock's second, interactions taken in it)

    def take(self) -> tuple[list[dict[str, Any]], list[VideoEffect]]:
        out, eff = self.events, self.effects
        self.events, self.effects = [], []
        return out, eff

    def error(self, err: ProtocolError) -> None:
        self.events.append(
            ve.error_event(err.code, err.message, event_id=err.event_id, param=err.param, request_id=self.request_id)
        )

    def handle(self, event: ve.VideoClientEvent) -> None:
        try:
            if self.state == "idle" and not isinstance(event, ve.Start | ve.InteractionEvent):
                name = {ve.Ping: "session.ping", ve.Stop: "session.stop", ve.Playback: "session.playback"}
                raise ProtocolError(Code.START_EXPECTED, f"Expected session.start, got {name[type(event)]}: "
                                    "a stream starts with session.start.", param="type")  # fmt: skip
            match event:
                case ve.Start():
                    self._start(event)
                case ve.InteractionEvent():
                    self.interact(event.interaction)
                case ve.Ping():
                    self.events.append({"type": "session.pong"})
                case ve.Stop():
                    self.stop()
                case ve.Playback():
                    pass  # accepted: generation is paced to real time here
        except ProtocolError as err:
            self.refuse(err)

    def refuse(self, err: ProtocolError) -> None:
        """A refused client message: an error; before a stream started, the socket then closes
        (upstream closes on any bad first message). During a stream, the stream goes on."""
        self.error(err)
        if self.state == "idle":
            self.state = "done"
            self.effects.append(CloseVideo(1000, "session.start refused"))

    def start_timed_out(self, timeout_s: float) -> None:
        """No ``session.start`` within ``timeout_s`` of the connect."""
        if self.state == "idle":
            self.refuse(ProtocolError(Code.START_TIMEOUT, f"Timeout waiting for session.start ({timeout_s:g} s)."))

    def stalled(self, timeout_s: float) -> None:
        """No generation progress and no ``session.ping`` for ``timeout_s``: the stream is stopped."""
        if self.state != "streaming":
            return
        self.error(ProtocolError(Code.STALL_TIMEOUT, f"Stall timeout: no generation progress for {timeout_s:g} s."))
        self.stop()
        self.effects.append(CloseVideo(1000, "stalled"))

    def _start(self, start: ve.Start) -> None:
        if self.state != "idle":
            raise ProtocolError(Code.ALREADY_STARTED, "This connection already streams a video; open another.")
        info = self.info
        if start.model is not None and info.model is not None and start.model != info.model:
            # As upstream's handler refuses it (then the socket closes, as for any refused start).
            raise ProtocolError(
                Code.MODEL_NOT_FOUND,
                f"Model mismatch: request specifies {start.model!r} but server is running {info.model!r}. "
                f"Leave 'model' out or send {info.model!r}.",
                param="model",
            )
        if start.format not in info.formats:
            raise ProtocolError(
                Code.UNSUPPORTED_VIDEO_FORMAT, f"This engine streams {', '.join(info.formats)}.", param="format"
            )
        fps = start.fps or info.default_fps
        num_frames = start.num_frames
        if num_frames is None and start.seconds is not None:
            num_frames = start.seconds * fps  # upstream's resolution: seconds x fps
        request = VideoRequest(
            request_id=f"video_stream-{secrets.token_hex(12)}",
            prompt=start.prompt,
            width=start.width or info.default_width,
            height=start.height or info.default_height,
            fps=fps,
            num_frames=num_frames,
            frames_per_chunk=start.frames_per_chunk,
            seed=start.seed,
            format="jpeg" if start.format == "jpeg" else "mp4",
            negative_prompt=start.negative_prompt,
            sampling_params=start.sampling_params,
        )
        try:
            validate_request(request)
        except EngineError as exc:
            raise ProtocolError(Code.INVALID_VALUE, exc.message) from None
        self.state = "streaming"
        self.request_id = request.request_id
        ignored = sorted(start.sampling_params) if "sampling_params" in info.ignored_fields else []
        ignored += sorted(k for k in start.sampling_params if k in info.ignored_fields and k not in ignored)
        if start.negative_prompt is not None and "negative_prompt" in info.ignored_fields:
            ignored.append("negative_prompt")
        config = {
            "model": start.model,
            "prompt": request.prompt,
            "width": request.width,
            "height": request.height,
            "fps": request.fps,
            "num_frames": request.num_frames,
            "frames_per_chunk": request.chunk_frames,
            "seed": request.seed,
            "negative_prompt": request.negative_prompt,
            **start.echo,
            **start.sampling_params,
        }
        self.events.append(
            {
                "type": "video.start",
                "request_id": request.request_id,
                "session_id": self.id,
                "format": start.requested_format,
                # Null fields left out, as upstream's model_dump(exclude_none=True) leaves them out.
                "config": {key: value for key, value in config.items() if value is not None},
                "ignored_fields": ignored,
            }
        )
        self.effects.append(StartVideo(request))

    def interact(self, spec: ve.InteractionSpec) -> Interaction:
        """Validate and queue; the engine's answer comes back via on_interaction_*."""
        interaction = self._interaction(spec)
        if self.state != "streaming" or self.request_id is None:
            raise ProtocolError(
                Code.NO_ACTIVE_REQUEST,
                "No video is streaming; send session.start first.",
                event_id=interaction.event_id,
            )
        if interaction.event_id in self._event_ids:
            raise ProtocolError(
                Code.EVENT_ID_CONFLICT,
                f"event_id {interaction.event_id!r} was already used in this stream.",
                param="interaction.event_id",
                event_id=interaction.event_id,
            )
        self._take_one(interaction.event_id)
        self._event_ids[interaction.event_id] = None
        while len(self._event_ids) > self.limits.remembered_ids:
            del self._event_ids[next(iter(self._event_ids))]  # (the oldest: a reuse of it is not caught)
        self.effects.append(Interact(self.request_id, interaction))
        return interaction

    def _take_one(self, event_id: str) -> None:
        """One interaction of this second's ``limits.per_s``; past them, rate_limit_exceeded."""
        limit = self.limits.per_s
        if not limit:
            return
        now = self._clock()
        second, taken = self._window
        if int(now) != second:
            second, taken = int(now), 0
        if taken >= limit:
            raise ProtocolError(
                Code.RATE_LIMIT_EXCEEDED,
                f"More than {limit} interactions in one second on this stream: this one was dropped "
                f"(the count starts again in {second + 1 - now:.1f} s).",
                param="interaction",
                event_id=event_id,
            )
        self._window = (second, taken + 1)

    def _interaction(self, spec: ve.InteractionSpec) -> Interaction:
        """What the engine is given: the engine's transition length unless the client set one."""
        k = self.info.default_transition_chunks if spec.transition_chunks is None else spec.transition_chunks
        camera = None
        if spec.camera is not None:
            mode: Any = spec.camera.mode  # "target" | "velocity" (validated by the decoder)
            r = spec.camera.rotation
            if len(r) == 4:
                camera = CameraMove.from_quaternion(mode, spec.camera.translation, (r[0], r[1], r[2], r[3]))
            else:
                camera = CameraMove(mode, spec.camera.translation, (r[0], r[1], r[2]))
        return Interaction(spec.event_id, prompt=spec.prompt, camera=camera, transition_chunks=k)

    def on_interaction_queued(self, event_id: str) -> None:
        self.events.append({"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id})

    def on_interaction_failed(self, event_id: str, code: str, message: str) -> None:
        """The engine refused an interaction it was given: upstream's ``interaction_failed``, with
        the engine's own code as ``reason``."""
        self._event_ids.pop(event_id, None)  # refused: the id may be used again
        error = ve.error_event(INTERACTION_FAILED, message, event_id=event_id, request_id=self.request_id)
        self.events.append({**error, "reason": code})

    def stop(self) -> None:
        if self.state == "streaming" and self.request_id is not None:
            self.effects.append(StopVideo(self.request_id))
        if self.state != "done":
            self.state = "done"
            self.events.append({"type": "session.done", "request_id": self.request_id, "stopped": True})

    def on_chunk(self, chunk: VideoChunk) -> dict[str, Any] | None:
        """The metadata of a chunk to deliver (the shell adds transport fields)."""
        if self.state != "streaming":
            return None
        return {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": "media",
            "generation_chunk_index": chunk.generation_chunk_index,
            "num_frames": chunk.num_frames,
            "mime_type": chunk.mime_type,
            "started_event_ids": list(chunk.started_event_ids),
            "active_event_ids": list(chunk.active_event_ids),
            "completed_event_ids": list(chunk.completed_event_ids),
            "superseded_event_ids": list(chunk.superseded_event_ids),
        }

    def on_done(self) -> None:
        if self.state == "streaming":
            self.state = "done"
            self.events.append({"type": "session.done", "request_id": self.request_id, "stopped": False})

    def on_failed(self, code: str, message: str) -> None:
        if self.state == "streaming":
            self.events.append(ve.error_event(code, message, request_id=self.request_id))
            self.state = "done"
            self.events.append({"type": "session.done", "request_id": self.request_id, "stopped": True})
