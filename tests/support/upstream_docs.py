"""Event sequences copied from vLLM-Omni's own documents (test data, not code).

Sources, in the vllm-project/vllm-omni repository:

- ``docs/serving/realtime_duplex_api.md`` (DUPLEX): ``/v1/realtime?duplex=1``,
  section "API Reference" > "Message examples" unless noted;
- ``docs/serving/realtime_api.md`` (TURN): the turn-based ``/v1/realtime``,
  section "Protocol";
- ``docs/serving/streaming_video_output_api.md`` (VIDEO) and
  ``docs/design/realtime_video_prompt_interaction.md`` (VIDEO_INTERACTION):
  ``/v1/realtime/video``.

Every constant names its section. The documents shorten base64 payloads and
ids to ``"…"``; ``fill`` puts real values in their place (the only change made
to an example), so that a server can act on them.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

ELLIPSIS = "…"

# --- DUPLEX: client to server ------------------------------------------------------------------

# "Session lifecycle": C→S session.update (first one = open handshake)
SESSION_UPDATE = {
    "type": "session.update",
    "event_id": "evt_0001",
    "session": {
        "model": "openbmb/MiniCPM-o-4_5",
        "session_id": "sess_demo_01",
        "modalities": ["audio", "text"],
        "instructions": "You are a concise voice assistant.",
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "ref_audio": "data:audio/wav;base64,…",
        "turn_detection": None,
        "overlap_policy": "listen_only",
        "playback_commit_policy": "ack_only",
        "temperature": 0.7,
        "idle_timeout_s": 300,
        "extra_body": {"auto_response": True, "native_duplex": True, "force_listen_count": 0},
    },
}
# "Session lifecycle": heartbeat, event ack, close, resume
HEARTBEAT = {"type": "session.heartbeat"}
EVENT_ACK = {"type": "session.event_ack", "server_event_seq": 48}
CLOSE = {"type": "session.close"}
RESUME = {
    "type": "session.resume",
    "session_id": "sess_demo_01",
    "incarnation": 0,
    "resume_token": "rt_3f9c…",
    "last_received_server_event_seq": 40,
}
# "Input": C→S input_audio_buffer.append (200 ms of 16 kHz PCM16 = 6400 bytes)
APPEND = {
    "type": "input_audio_buffer.append",
    "event_id": "evt_0042",
    "audio": "…",
    "input_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "duration_ms": 200,
    "audio_end_ms": 1200,
    "is_speech": True,
}
# "Input": with camera frames (omni video)
APPEND_WITH_FRAMES = {
    "type": "input_audio_buffer.append",
    "audio": "…",
    "input_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "duration_ms": 200,
    "audio_end_ms": 1200,
    "video_frames": ["/9j/4AAQSkZJRg…", "/9j/4AAQSkZJRg…"],
}
# "Input": commit, its alias, the silence declaration
COMMIT = {"type": "input_audio_buffer.commit", "event_id": "evt_0060", "final": True}
COMMIT_ALIAS = {"type": "input.commit", "final": True}
SILENCE_COMMIT = {"type": "input_audio_buffer.commit", "final": True, "is_speech": False}
# "Input": clear, cancel, text append, item create (text turn, tool result), delete, retrieve, truncate
CLEAR = {"type": "input_audio_buffer.clear"}
INPUT_CANCEL = {"type": "input.cancel"}
TEXT_APPEND = {"type": "input.text.append", "text": "and tomorrow?"}
ITEM_CREATE = {
    "type": "conversation.item.create",
    "previous_item_id": None,
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summarise what I said."}]},
}
ITEM_CREATE_TOOL_RESULT = {
    "type": "conversation.item.create",
    "item": {"type": "function_call_output", "call_id": "call_7d1f", "output": '{"temperature_c": 24}'},
}
ITEM_DELETE = {"type": "conversation.item.delete", "item_id": "item_9b2d…"}
ITEM_RETRIEVE = {"type": "conversation.item.retrieve", "item_id": "item_resp_01"}
ITEM_TRUNCATE = {
    "type": "conversation.item.truncate",
    "item_id": "item_resp_01",
    "content_index": 0,
    "audio_end_ms": 1850,
}
# "Response lifecycle": response.create, response.cancel, output_audio_buffer.clear, barge_in, turn.signal
RESPONSE_CREATE = {
    "type": "response.create",
    "event_id": "evt_0070",
    "response": {
        "modalities": ["audio", "text"],
        "instructions": "Answer in one sentence.",
        "output_audio_format": "pcm16",
        "temperature": 0.6,
        "max_output_tokens": 256,
        "metadata": {"trace": "turn-3"},
    },
}
RESPONSE_CANCEL = {"type": "response.cancel", "response_id": "resp_01"}
OUTPUT_AUDIO_CLEAR = {"type": "output_audio_buffer.clear"}
BARGE_IN = {"type": "barge_in"}
TURN_SIGNAL = {"type": "turn.signal", "event": "barge_in", "payload": {"source": "client_vad"}}
# "Playback": C→S playback.ack, and the truncating ack after an interruption
PLAYBACK_ACK = {
    "type": "playback.ack",
    "response_id": "resp_01",
    "item_id": "item_resp_01",
    "played_ms": 1000,
    "committed_ms": 1000,
}
PLAYBACK_ACK_TRUNCATE = {
    "type": "playback.ack",
    "response_id": "resp_01",
    "played_ms": 1850,
    "committed_ms": 1850,
    "truncate": True,
}
# "Overlap and barge-in": a server-VAD session (session.update fragment)
SERVER_VAD_UPDATE = {
    "type": "session.update",
    "session": {
        "turn_detection": {
            "type": "server_vad",
            "threshold": 0.5,
            "prefix_padding_ms": 300,
            "silence_duration_ms": 500,
        },
        "overlap_policy": "barge_in_on_speech",
    },
}

# "Event catalogue" > "Client to server": every type (aliases in "Coverage").
DUPLEX_CLIENT_TYPES = (
    "session.update",
    "session.heartbeat",
    "session.event_ack",
    "session.close",
    "session.resume",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input.commit",
    "input_audio_buffer.clear",
    "input.cancel",
    "input.text.append",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.delete",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
    "barge_in",
    "turn.signal",
    "playback.ack",
)
DUPLEX_ALIASES = (
    "push_chunk",
    "input.audio.append",
    "input_text.append",
    "push_text",
    "signal_turn",
    "audio.playback_ack",
    "close_session",
    "close",
    "session_close",
)
# "Event catalogue" > "Server to client": every type.
DUPLEX_SERVER_TYPES = (
    "session.created",
    "session.updated",
    "session.heartbeat_ack",
    "session.closed",
    "session.resumed",
    "session.replaced",
    "session.expired",
    "session.resync_required",
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "input_audio_buffer.cleared",
    "conversation.item.added",
    "conversation.item.created",
    "conversation.item.done",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.deleted",
    "conversation.item.retrieved",
    "conversation.item.truncated",
    "response.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.audio.done",
    "response.audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
    "rate_limits.updated",
    "response.listen",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "duplex.function_call.done",
    "output_audio_buffer.cleared",
    "playback.acknowledged",
    "overlap.decision",
    "runtime.control",
    "error",
)

# --- DUPLEX: server to client (what the double sends, as the document shows it) -----------------

# "Session lifecycle": S→C session.created (session object abridged to what a client reads)
SESSION_CREATED = {
    "type": "session.created",
    "incarnation": 0,
    "attachment_generation": 1,
    "resume_token": "rt_3f9c…",
    "session": {
        "object": "realtime.session",
        "type": "realtime",
        "id": "sess_demo_01",
        "model": "openbmb/MiniCPM-o-4_5",
        "state": "open",
        "turn_state": "idle",
        "epoch": 0,
        "turn_id": 0,
        "modalities": ["audio", "text"],
        "output_modalities": ["audio", "text"],
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000}, "sample_rate_hz": 16000},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}},
        },
        "playback": {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
        "capabilities": {
            "implementation_level": "model_native_duplex",
            "supports_input_append": True,
            "supports_barge_in": True,
            "supports_session_resume": True,
            "chunk_period_ms": 1000,
        },
    },
}
HEARTBEAT_ACK = {"type": "session.heartbeat_ack", "session_id": "sess_demo_01"}
SESSION_CLOSED = {"type": "session.closed", "session_id": "sess_demo_01", "reason": "session_close"}
SESSION_RESUMED = {
    "type": "session.resumed",
    "session_id": "sess_demo_01",
    "incarnation": 0,
    "attachment_generation": 2,
    "resume_token": "rt_a71e…",
}
# "Input": S→C commit fan-out (in this order)
COMMIT_FAN_OUT = (
    "conversation.item.added",
    "conversation.item.created",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.done",
)
# "Response lifecycle": the events of one spoken answer, in order
ANSWER = (
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.audio.done",
    "response.audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
)
RESPONSE_LISTEN = {
    "type": "response.listen",
    "session_id": "sess_demo_01",
    "epoch": 0,
    "response": {
        "object": "realtime.response",
        "status": "listening",
        "metadata": {"type": "response.listen", "session_id": "sess_demo_01", "epoch": 0, "reason": "model_listen"},
    },
}
# "Errors": handshake-stage errors use the flat native shape
HANDSHAKE_ERROR = {
    "type": "error",
    "error": "Unknown or expired duplex session: sess_demo_01",
    "code": "session_resume_expired",
}

# --- TURN: the turn-based /v1/realtime ("Protocol") --------------------------------------------

# "A minimal client sends events in this order" (audio base64 PCM16, 16 kHz for Qwen3-Omni)
TURN_CLIENT_ORDER = (
    {"type": "session.update", "model": "Qwen/Qwen3-Omni-30B-A3B-Instruct"},
    {"type": "input_audio_buffer.commit", "final": False},
    {"type": "input_audio_buffer.append", "audio": "<base64-pcm16>"},
    {"type": "input_audio_buffer.commit", "final": True},
)
# The server's events (table "Protocol"; "Audio Handling": response.audio.delta carries
# base64 PCM16 in ``audio`` and its ``sample_rate_hz``)
TURN_SERVER_TYPES = (
    "session.created",
    "transcription.delta",
    "transcription.done",
    "response.audio.delta",
    "response.audio.done",
    "error",
)
TURN_INPUT_RATE = 16000

# --- VIDEO -----------------------------------------------------------------------------------

# VIDEO "Protocol": start a minimal session with
VIDEO_START = {
    "type": "session.start",
    "model": "BestWishYsh/Helios-Distilled",
    "prompt": "A serene lakeside sunrise",
    "format": "m4s",
    "width": 640,
    "height": 384,
    "fps": 16,
    "num_frames": 99,
}
# VIDEO "Mid-Generation Interaction": a prompt update, and a camera move
VIDEO_INTERACTION = {
    "type": "session.interaction",
    "interaction": {
        "event_id": "sunlight-update",
        "event": {"prompt": "Sunlight breaks through the mist"},
        "transition_chunks": 2,
    },
}
VIDEO_CAMERA = {
    "type": "session.interaction",
    "interaction": {
        "event_id": "forward-1",
        "event": {
            "multi_modal_data": {
                "camera": {
                    "mode": "velocity",
                    "data": {"translation": [0.0, 0.05, 0.0], "rotation": [0.0, 0.0, 0.0, 1.0]},
                }
            }
        },
    },
}
VIDEO_PING = {"type": "session.ping"}
VIDEO_STOP = {"type": "session.stop"}
# VIDEO "Protocol" table: every event, both directions
VIDEO_CLIENT_TYPES = ("session.start", "session.interaction", "session.ping", "session.stop")
VIDEO_SERVER_TYPES = (
    "video.start",
    "video.chunk_metadata",
    "session.interaction.queued",
    "session.pong",
    "session.done",
    "error",
)
# VIDEO: "The default start timeout is 10 seconds and the server reports a stall after about
# 60 seconds without generation progress or a session.ping."
VIDEO_START_TIMEOUT_S = 10.0
VIDEO_STALL_TIMEOUT_S = 60.0
# VIDEO_INTERACTION "Queue Acknowledgement": a later failure, correlated
VIDEO_INTERACTION_FAILED = {
    "type": "error",
    "request_id": "video_stream-...",
    "event_id": "ui-update-42",
    "code": "interaction_failed",
    "message": "The active model does not support prompt updates",
}
# VIDEO_INTERACTION "Video Chunk Metadata": a media chunk and the encoder trailer
VIDEO_MEDIA_METADATA = {
    "type": "video.chunk_metadata",
    "request_id": "video_stream-...",
    "kind": "media",
    "transport_chunk_index": 7,
    "generation_chunk_index": 6,
    "num_frames": 9,
    "byte_length": 184320,
    "started_event_ids": ["ui-update-42"],
    "active_event_ids": ["ui-update-42"],
    "completed_event_ids": [],
}
VIDEO_TRAILER_METADATA = {
    "type": "video.chunk_metadata",
    "request_id": "video_stream-...",
    "kind": "trailer",
    "transport_chunk_index": 8,
    "generation_chunk_index": None,
    "num_frames": 0,
    "byte_length": 824,
    "started_event_ids": [],
    "active_event_ids": [],
    "completed_event_ids": [],
}


def pcm16(ms: int, rate: int = 16000, amplitude: int = 3000) -> bytes:
    """``ms`` of a square wave (loud enough to be speech for an RMS detector)."""
    n = rate * ms // 1000
    period = max(2, rate // 200)
    return b"".join(
        (amplitude if (i // (period // 2)) % 2 else -amplitude).to_bytes(2, "little", signed=True) for i in range(n)
    )


def fill(example: dict[str, Any], **values: Any) -> dict[str, Any]:
    """A copy of ``example`` with ``"…"`` placeholders replaced: ``audio`` by real base64
    PCM16 of the example's ``duration_ms`` (silence unless ``audio=`` bytes are given), ids
    and tokens by the ``values`` given for their keys."""
    out = copy.deepcopy(example)
    audio = values.pop("audio", None)
    if out.get("audio") == ELLIPSIS or audio is not None:
        if audio is None:
            audio = bytes(2 * 16 * int(out.get("duration_ms", 200)))
        out["audio"] = base64.b64encode(audio).decode()
    if "video_frames" in out:
        out["video_frames"] = [base64.b64encode(b"\xff\xd8\xff\xd9").decode() for _ in out["video_frames"]]
    for key, value in values.items():
        out[key] = value
    return out
