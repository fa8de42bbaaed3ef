"""vLLM-Omni's ``AsyncOmni``, in-process, behind both engine protocols.

``OmniEngine`` is the voice ``Engine``; ``OmniEngine.video_engine()`` gives an
``OmniVideoEngine`` (the ``VideoEngine``) that shares the same ``AsyncOmni``
(one object cannot be both: each protocol has its own ``info``). ``AsyncOmni``
is imported on ``start()`` only, so this module loads anywhere; vLLM-Omni
itself runs on a GPU (it has no CPU platform).

respond
    ``generate(prompt, request_id, sampling_params_list, output_modalities)``.
    The conversation is rendered with the model's chat template (ChatML when
    the tokenizer has none). When the request's inputs are still streaming
    (a user turn whose transcript has not arrived), the prompt is vLLM's
    streaming input: the first ``StreamingInput`` is the conversation up to
    the open user turn, each ``TextChunk`` extends it, the closing of the turn
    and the assistant header come last, and the iterator's end is the final
    marker. Cancellation ends the iterator with no final marker (AsyncOmni
    aborts its engine request) and ``abort`` is called. Outputs: text deltas
    of the thinker (``final_output_type == "text"``) -> ``TextDelta``; audio
    (``multimodal_output["audio"]``, float32 at ``multimodal_output["sr"]``;
    cumulative waveforms and growing chunk lists are reduced to increments)
    -> PCM16 ``AudioDelta`` at ``info.output_sample_rate``, the model's
    native rate, which the gateway resamples for clients (a different rate
    in an output is resampled here with soxr); the end -> ``Finished`` with
    usage (prompt tokens, text tokens, 100 ms of audio = one audio token).
transcribe
    Only with ``transcription_prompt`` (an omni model that follows a
    "transcribe this" instruction, e.g. Qwen2.5-Omni): the audio is collected
    until the final marker and sent as ``multi_modal_data["audio"]``; text
    deltas stream back. Without it: ``EngineError("unsupported")``.
video
    ``generate`` on a diffusion stage with streaming output: each output's
    frames (``images`` or ``multimodal_output["video"]``) become one chunk,
    encoded by ``orchestrator.engines.video.encode`` (fMP4 or JPEG), with the
    interaction ids of ``multimodal_output["metadata"]["stream"]``.
    ``submit_interaction`` -> ``submit_interaction_async(request_id,
    interaction={"event_id", "event": {"prompt", "multi_modal_data":
    {"camera": ...}}, "transition_chunks"})``.
control
    ``pause``/``resume`` -> ``pause_generation``/``resume_generation``;
    ``sleep(level)``/``wake_up`` -> ``sleep``/``wake_up`` (and
    ``resume_generation`` unless paused: AsyncOmni holds admission after an
    AR stage slept). ``healthy()`` is False while asleep and once the engine
    is dead (``EngineDeadError`` -> fatal ``EngineError("engine_dead")``).
"""

from __future__ import annotations

from orchestrator.engines.interactions import interaction_payload
from orchestrator.engines.omni.client import OmniClient
from orchestrator.engines.omni.video import OmniVideoEngine, frames_to_planes
from orchestrator.engines.omni.voice import OmniEngine, chatml, pcm16

__all__ = ["OmniClient", "OmniEngine", "OmniVideoEngine", "chatml", "frames_to_planes", "interaction_payload", "pcm16"]
