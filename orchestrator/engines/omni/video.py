"""``OmniVideoEngine``: the ``VideoEngine`` on an in-process ``AsyncOmni`` (see the package docstring)."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from orchestrator.engine import EngineError
from orchestrator.engines.interactions import hold_event_id, interaction_payload
from orchestrator.engines.omni.client import OmniClient, OmniClientUser, RequestState, aclose_quietly
from orchestrator.video_engine import Interaction, VideoChunk, VideoEngineInfo, VideoRequest, validate_request

log = logging.getLogger("omni.engines.omni")


def frames_to_planes(video: Any) -> Any:
    """Frames of one video (PIL images, or an array/tensor [F,H,W,C], [F,C,H,W],
    [C,F,H,W] or with a leading batch of 1; uint8, or float in [0,1] or [-1,1])
    -> float RGB planes [n,3,H,W] in [0,1] (torch), cropped to even sizes."""
    import torch

    if isinstance(video, list | tuple):
        arr = np.stack([np.asarray(f.convert("RGB") if hasattr(f, "convert") else f) for f in video])
    elif hasattr(video, "detach"):
        arr = video.detach().float().cpu().numpy()
    else:
        arr = np.asarray(video)
    if arr.ndim == 5:
        arr = arr[0]
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4:
        raise EngineError("generation_failed", f"unexpected video frames of shape {arr.shape}")
    if arr.shape[-1] in (1, 3, 4):  # F,H,W,C
        arr = arr[..., :3].transpose(0, 3, 1, 2)
    elif arr.shape[0] in (1, 3, 4) and arr.shape[1] not in (1, 3, 4):  # C,F,H,W
        arr = arr[:3].transpose(1, 0, 2, 3)
    else:  # F,C,H,W
        arr = arr[:, :3]
    if arr.shape[1] == 1:
        arr = np.repeat(arr, 3, axis=1)
    if arr.dtype == np.uint8:
        planes = arr.astype(np.float32) / 255.0
    else:
        planes = arr.astype(np.float32)
        if planes.size and planes.min() < -1e-3:
            planes = (planes + 1.0) / 2.0
    h, w = planes.shape[2] // 2 * 2, planes.shape[3] // 2 * 2
    return torch.from_numpy(np.ascontiguousarray(np.clip(planes[:, :, :h, :w], 0.0, 1.0)))


def extract_videos(out: Any) -> list[Any]:
    """The videos of one streaming output (``images`` or ``multimodal_output["video"]``)."""
    images = getattr(out, "images", None)
    videos: Any = images if images else None
    mm = getattr(out, "multimodal_output", None)
    if videos is None and isinstance(mm, dict):
        videos = mm.get("video")
    if videos is None:
        return []
    if isinstance(videos, list | tuple):
        if not videos:
            return []
        head = videos[0]
        if hasattr(head, "convert"):  # one video as a list of PIL images
            return [list(videos)]
        if isinstance(head, list | tuple):
            return list(videos)
        if getattr(head, "ndim", 0) == 3:  # a list of HWC frames
            return [list(videos)]
        return list(videos)
    if getattr(videos, "ndim", 0) == 5 and videos.shape[0] > 1:
        return [videos[i] for i in range(videos.shape[0])]
    return [videos]


def stream_metadata(out: Any) -> dict[str, Any]:
    mm = getattr(out, "multimodal_output", None)
    meta = mm.get("metadata") if isinstance(mm, dict) else None
    stream = meta.get("stream") if isinstance(meta, dict) else None
    return dict(stream) if isinstance(stream, dict) else {}


class _Encoder:
    """encode.py's encoder for one request, built on the first frames (their real size)."""

    def __init__(self, request: VideoRequest) -> None:
        self.request = request
        self.encoder: Any = None
        self.index = 0

    def encode(self, planes: Any, meta: dict[str, Any]) -> VideoChunk:
        from orchestrator.engines.video.encode import Fmp4Encoder, JpegEncoder, flush_chunk_media

        req = self.request
        n = int(planes.shape[0])
        if self.encoder is None:
            h, w = int(planes.shape[2]), int(planes.shape[3])
            if req.format == "jpeg":
                self.encoder = JpegEncoder(w, h, req.fps)
            else:
                self.encoder = Fmp4Encoder(w, h, req.fps, max(n, req.chunk_frames))
        enc = self.encoder
        enc.encode(planes)
        index = meta.get("generation_chunk_index")
        index = int(index) if isinstance(index, int) and not isinstance(index, bool) else self.index
        ids = {k: tuple(str(x) for x in meta.get(f"{k}_event_ids", []) or []) for k in
               ("started", "active", "completed", "superseded")}  # fmt: skip
        data, init, frames = flush_chunk_media(enc, first=self.index == 0)
        self.index += 1
        return VideoChunk(
            kind=req.format,
            generation_chunk_index=index,
            num_frames=n,
            data=data,
            mime_type=enc.mime_type,
            init_segment=init,
            frames=frames,
            started_event_ids=ids["started"],
            active_event_ids=ids["active"],
            completed_event_ids=ids["completed"],
            superseded_event_ids=ids["superseded"],
        )

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
            self.encoder = None


class OmniVideoEngine(OmniClientUser):
    """A streaming diffusion video model (``--diffusion-streaming-output``) in
    the shared ``AsyncOmni``. Requests the model cannot take fail with the
    codes of ``orchestrator.video_engine.ERROR_CODES``, plus
    ``interaction_unsupported`` (the model takes no interactions)."""

    def __init__(
        self,
        shared: OmniClient,
        *,
        info: VideoEngineInfo | None = None,
        max_active_requests: int = 8,
    ) -> None:
        super().__init__(shared)
        self.info = info or VideoEngineInfo(
            name="omni",
            description=f"vLLM-Omni AsyncOmni in-process: {shared.model or 'a diffusion video model'}, "
            "streaming output, interactions applied by the model.",
            model=shared.model,
        )
        self.max_active_requests = max_active_requests

    async def start(self) -> None:
        await self.shared.start()

    def _params(self, client: Any, request: VideoRequest) -> list[Any]:
        defaults = list(getattr(client, "default_sampling_params_list", None) or [])
        index = next(
            (i for i, p in enumerate(defaults) if "Diffusion" in type(p).__name__ or hasattr(p, "num_inference_steps")),
            None,
        )
        if index is None:
            from vllm_omni.inputs.data import OmniDiffusionSamplingParams

            defaults, index = [*defaults, OmniDiffusionSamplingParams()], len(defaults)
        params = copy.deepcopy(defaults[index])
        values: dict[str, Any] = {"width": request.width, "height": request.height, "fps": request.fps,
                                  "frame_rate": float(request.fps)}  # fmt: skip
        if request.num_frames is not None:
            values["num_frames"] = request.num_frames
        if request.seed is not None:
            values["seed"] = request.seed
        extra = dict(request.sampling_params)
        if request.frames_per_chunk is not None:
            extra.setdefault("frames_per_chunk", request.frames_per_chunk)
        extra_args = getattr(params, "extra_args", None)
        for key, value in {**values, **extra}.items():
            if hasattr(params, key):
                setattr(params, key, value)
            elif isinstance(extra_args, dict):
                extra_args[key] = value
        defaults[index] = params
        return defaults

    async def generate_video(self, request: VideoRequest) -> AsyncIterator[VideoChunk]:
        validate_request(request)
        if self._closed:
            raise EngineError("engine_not_started", "the omni video engine is closed")
        client = self.shared.get()
        if request.request_id in self._active:
            raise EngineError("request_id_conflict", f"request {request.request_id!r} is running")
        if len(self._active) >= self.max_active_requests:
            raise EngineError("capacity_exceeded", f"{self.max_active_requests} video requests are running")
        entry = RequestState(started=True)
        self._active[request.request_id] = entry
        prompt: dict[str, Any] = {"prompt": request.prompt}
        if request.negative_prompt:
            prompt["negative_prompt"] = request.negative_prompt
        encoder = _Encoder(request)
        stream: Any = None
        try:
            params = self._params(client, request)
            stream = client.generate(prompt, request_id=request.request_id, sampling_params_list=params)
            async for out in stream:
                if entry.aborted:
                    return
                error = getattr(out, "error", None)
                if error:
                    raise EngineError("generation_failed", f"the model failed: {error}")
                meta = stream_metadata(out)
                for video in extract_videos(out):
                    planes = frames_to_planes(video)
                    chunk = await asyncio.to_thread(encoder.encode, planes, meta)
                    if entry.aborted:
                        return
                    yield chunk
        except (EngineError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if entry.aborted:
                return
            failure = self.shared.failure(exc)
            if failure.code == "engine_error":
                failure = EngineError("generation_failed", failure.message)
            raise failure from exc
        finally:
            if self._active.get(request.request_id) is entry:
                del self._active[request.request_id]
            if stream is not None:
                await aclose_quietly(stream)
            encoder.close()

    async def submit_interaction(self, request_id: str, interaction: Interaction) -> None:
        entry = hold_event_id(request_id, self._active.get(request_id), interaction)
        try:
            await self.shared.get().submit_interaction_async(request_id, interaction=interaction_payload(interaction))
        except EngineError:
            entry.event_ids.discard(interaction.event_id)
            raise
        except Exception as exc:
            entry.event_ids.discard(interaction.event_id)  # refused: the id may be used again
            raise _interaction_error(exc, self.shared) from exc


def _interaction_error(exc: Exception, shared: OmniClient) -> EngineError:
    """AsyncOmni's ``submit_interaction_async`` refusals, as our codes."""
    text = str(exc)
    if isinstance(exc, ValueError):
        if "No active request" in text or "exactly one active request" in text:
            return EngineError("no_active_request", text)
        if "requires" in text:  # single-stage diffusion / a diffusion stage
            return EngineError("interaction_unsupported", text)
        return EngineError("invalid_interaction", text)
    return shared.failure(exc)
