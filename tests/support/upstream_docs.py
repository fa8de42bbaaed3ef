"""Event sequences copied from vLLM-Omni's own documents (test data, not code).

Sources, in the vllm-project/vllm-omni repository:

- ``docs/serving/realtime_duplex_api.md`` (DUPLEX) at revision
  ``DUPLEX_DOC_REVISION``: ``/v1/realtime?duplex=1``, section "API Reference" >
  "Message examples" unless noted (the examples there omit
  ``server_event_seq``, which every server event carries on the wire);
- ``docs/serving/realtime_api.md`` (TURN): the turn-based ``/v1/realtime``,
  section "Protocol";
- ``docs/serving/streaming_video_output_api.md`` (VIDEO) and
  ``docs/design/realtime_video_prompt_interaction.md`` (VIDEO_INTERACTION):
  ``/v1/realtime/video``.

Every constant names its section. The documents shorten base64 payloads and
ids to ``"…"``; ``fill`` puts real values in their place (the only change made
to an example), so that a server can act on them; ``gaps`` compares what a
server sent with an example's shape.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

ELLIPSIS = "…"

DUPLEX_DOC_REVISION = "2e9bf1cb9d486861caf029c2306c95df0fadc90d"  # docs/serving/realtime_duplex_api.md
DUPLEX_CLIENT_REVISION = "09c32f18141eaddc377c14410746a00b6cdb30a6"  # vllm_omni/clients/duplex.py

# --- DUPLEX: client to server ------------------------------------------------------------------

# "Session lifecycle": C→S session.update (first one = open handshake)
SESSION_UPDATE = {
    "type": "session.update",
    "event_id": "evt_0001",
    "session": {
        "model": "openbmb/MiniCPM-o-4_5",
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
        "extra_body": {"auto_response": True, "force_listen_count": 0},
    },
}
# "Session lifecycle": heartbeat, event ack, close, resume (on a new socket, ?duplex=1&autostart=0)
HEARTBEAT = {"type": "session.heartbeat"}
EVENT_ACK = {"type": "session.event_ack", "server_event_seq": 48}
CLOSE = {"type": "session.close"}
RESUME = {
    "type": "session.resume",
    "session_id": "duplex-5f2a…",
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

# "Event catalogue" > "Client to server": every type (21).
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
# "Event catalogue": the aliases (they share their canonical event's payload), and the two
# pre-Realtime WAV-append aliases that "are **not** accepted on this route".
DUPLEX_ALIASES = {
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "signal_turn": "turn.signal",
    "audio.playback_ack": "playback.ack",
    "close_session": "session.close",
    "close": "session.close",
}
DUPLEX_NOT_ACCEPTED = ("push_chunk", "input.audio.append")
# "Event catalogue": the supported input formats of input_audio_buffer.append.
DUPLEX_INPUT_FORMATS = ("pcm16", "pcm_s16le", "s16le", "pcm_f32le", "g711_ulaw", "g711_alaw")
# "Event catalogue" > "Server to client": every type (42).
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
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
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
    "turn.event",
    "error",
)

# --- DUPLEX: server to client, as the document shows them ------------------------------------

# "Session lifecycle": S→C session.created
SESSION_CREATED = {
    "type": "session.created",
    "attachment_generation": 1,
    "resume_token": "rt_3f9c…",
    "session": {
        "object": "realtime.session",
        "type": "realtime",
        "id": "duplex-5f2a…",
        "model": "openbmb/MiniCPM-o-4_5",
        "state": "open",
        "turn_state": "idle",
        "epoch": 0,
        "turn_id": 0,
        "active_request_id": None,
        "active_response_id": None,
        "active_response_turn_id": None,
        "modalities": ["audio", "text"],
        "output_modalities": ["audio", "text"],
        "instructions": "You are a concise voice assistant.",
        "voice": None,
        "response_format": "pcm16",
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000}, "sample_rate_hz": 16000},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}},
        },
        "temperature": 0.7,
        "max_tokens": None,
        "speed": None,
        "idle_timeout_s": 300.0,
        "overlap_policy": "listen_only",
        "overlap_short_ack_ms": 700,
        "overlap_barge_in_ms": 1200,
        "overlap_silence_rms": 0.003,
        "playback_commit_policy": "ack_only",
        "turn_detection": None,
        "input_audio_transcription": None,
        "tracing": None,
        "playback": {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
        "capabilities": {
            "implementation_level": "model_native_duplex",
            "supports_input_append": True,
            "supports_barge_in": True,
            "supports_session_resume": True,
            "supports_session_lease": True,
            "supports_multi_session": True,
            "chunk_period_ms": 1000,
            "input_modes": ["append_audio_chunk"],
            "signal_sources": ["model_native", "client_event", "server_policy"],
            "target_barge_in_latency_ms": None,
        },
    },
}
SESSION_UPDATED = {"type": "session.updated", "session": {"object": "realtime.session", "id": "duplex-5f2a…", "…": "…"}}
HEARTBEAT_ACK = {"type": "session.heartbeat_ack", "session_id": "duplex-5f2a…"}
SESSION_CLOSED = {
    "type": "session.closed",
    "session_id": "duplex-5f2a…",
    "epoch": 3,
    "reason": "client_close",
    "event": {"type": "session.closed", "reason": "client_close"},
}
SESSION_RESUMED = {
    "type": "session.resumed",
    "session_id": "duplex-5f2a…",
    "session": {
        "id": "duplex-5f2a…",
        "state": "open",
        "epoch": 3,
        "turn_id": 2,
        "...": "the engine's current session object",
    },
    "attachment_generation": 2,
    "resume_token": "rt_a71e…",
}
SESSION_REPLACED = {"type": "session.replaced", "session_id": "duplex-5f2a…", "attachment_generation": 1}
SESSION_EXPIRED = {"type": "session.expired", "session_id": "duplex-5f2a…", "reason": "disconnect_grace_expired"}
SESSION_RESYNC_REQUIRED = {"type": "session.resync_required", "session_id": "duplex-5f2a…", "reason": "journal_gap"}
# "Input": speech_started / speech_stopped
SPEECH_STARTED = {"type": "input_audio_buffer.speech_started", "audio_start_ms": 1040, "item_id": "item_9b2d…"}
SPEECH_STOPPED = {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2860, "item_id": "item_9b2d…"}
# "Input": S→C commit fan-out (in this order)
USER_ITEM_ADDED = {
    "type": "conversation.item.added",
    "previous_item_id": None,
    "item": {
        "id": "item_9b2d…",
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": "what is the weather today"}],
    },
}
USER_ITEM_CREATED = {
    "type": "conversation.item.created",
    "previous_item_id": None,
    "item": {"id": "item_9b2d…", "…": "…"},
}
COMMITTED = {
    "type": "input_audio_buffer.committed",
    "previous_item_id": None,
    "item_id": "item_9b2d…",
    "event": {
        "type": "input.committed",
        "session_id": "duplex-5f2a…",
        "turn_id": 1,
        "epoch": 0,
        "history_len": 1,
        "message": {
            "role": "user",
            "content": [{"type": "audio_url", "audio_url": {"url": "native-duplex:input-audio"}}],
        },
        "realtime_item_id": "item_9b2d…",
    },
}
TRANSCRIPTION_COMPLETED = {
    "type": "conversation.item.input_audio_transcription.completed",
    "item_id": "item_9b2d…",
    "content_index": 0,
    "transcript": "what is the weather today",
}
USER_ITEM_DONE = {
    "type": "conversation.item.done",
    "previous_item_id": None,
    "item": {"id": "item_9b2d…", "status": "completed", "…": "…"},
}
COMMIT_FAN_OUT = (
    "conversation.item.added",
    "conversation.item.created",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.done",
)
# "Input": deferred commit during an active response
COMMITTED_DEFERRED = {
    "type": "input_audio_buffer.committed",
    "previous_item_id": "item_9b2d…",
    "item_id": "item_c044…",
    "event": {
        "type": "input.committed",
        "session_id": "duplex-5f2a…",
        "turn_id": 2,
        "epoch": 0,
        "history_len": 3,
        "response_create_deferred": True,
        "message": {"…": "…"},
    },
}
CLEARED = {"type": "input_audio_buffer.cleared"}
ITEM_DELETED = {
    "type": "conversation.item.deleted",
    "item_id": "item_9b2d…",
    "event": {"type": "conversation.item.deleted", "item_id": "item_9b2d…"},
}
ITEM_RETRIEVED = {
    "type": "conversation.item.retrieved",
    "item": {
        "id": "item_resp_01",
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_audio", "transcript": "It is sunny, 24 degrees."}],
    },
}
ITEM_TRUNCATED = {
    "type": "conversation.item.truncated",
    "item_id": "item_resp_01",
    "content_index": 0,
    "audio_end_ms": 1850,
    "event": {"…": "…"},
}
# "Response lifecycle": one spoken answer
RESPONSE_CREATED = {
    "type": "response.created",
    "response_id": "resp_01",
    "response": {
        "id": "resp_01",
        "object": "realtime.response",
        "status": "in_progress",
        "status_details": None,
        "output": [],
        "modalities": ["audio", "text"],
        "metadata": {
            "duplex_event": {
                "type": "response.created",
                "session_id": "duplex-5f2a…",
                "response_id": "resp_01",
                "epoch": 0,
                "turn_id": 1,
            }
        },
    },
}
_ASSISTANT_OPEN = {
    "id": "item_resp_01",
    "object": "realtime.item",
    "type": "message",
    "role": "assistant",
    "status": "in_progress",
    "content": [],
}
ASSISTANT_ITEM_ADDED = {"type": "conversation.item.added", "previous_item_id": "item_9b2d…", "item": _ASSISTANT_OPEN}
OUTPUT_ITEM_ADDED = {
    "type": "response.output_item.added",
    "response_id": "resp_01",
    "output_index": 0,
    "item": _ASSISTANT_OPEN,
}
_WHERE = {"response_id": "resp_01", "item_id": "item_resp_01", "output_index": 0, "content_index": 0}
CONTENT_PART_ADDED = {"type": "response.content_part.added", **_WHERE, "part": {"type": "audio", "transcript": ""}}
RESPONSE_SPEAK = {
    "type": "response.speak",
    **_WHERE,
    "metadata": {"session_id": "duplex-5f2a…", "epoch": 0, "model_speak": True},
}
AUDIO_DELTA = {
    "type": "response.output_audio.delta",
    **_WHERE,
    "delta": "…",
    "format": "pcm16",
    "sample_rate_hz": 24000,
    "metadata": {
        "session_id": "duplex-5f2a…",
        "epoch": 0,
        "model_speak": True,
        "end_of_turn": False,
        "audio_duration_ms": 1000,
        "audio_text_marks": [{"text_chars": 11, "audio_end_ms": 1000}],
        "playback": {"generated_ms": 1000, "sent_ms": 1000, "played_ms": 0, "committed_ms": 0},
    },
}
# "(exactly one per audio delta)"
TRANSCRIPT_DELTA = {"type": "response.output_audio_transcript.delta", **_WHERE, "delta": "It is sunny"}
TEXT_DELTA = {
    "type": "response.output_text.delta",
    "response_id": "resp_02",
    "item_id": "item_resp_02",
    "output_index": 0,
    "content_index": 0,
    "delta": "Tomorrow looks",
}
TEXT_DONE = {
    "type": "response.output_text.done",
    "response_id": "resp_02",
    "item_id": "item_resp_02",
    "output_index": 0,
    "content_index": 0,
    "text": "Tomorrow looks cloudy.",
}
AUDIO_DONE = {"type": "response.output_audio.done", **_WHERE}
TRANSCRIPT_DONE = {"type": "response.output_audio_transcript.done", **_WHERE, "transcript": "It is sunny, 24 degrees."}
CONTENT_PART_DONE = {
    "type": "response.content_part.done",
    **_WHERE,
    "part": {"type": "audio", "transcript": "It is sunny, 24 degrees."},
}
_ASSISTANT_DONE = {
    "id": "item_resp_01",
    "object": "realtime.item",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_audio", "transcript": "It is sunny, 24 degrees."}],
}
OUTPUT_ITEM_DONE = {
    "type": "response.output_item.done",
    "response_id": "resp_01",
    "output_index": 0,
    "item": _ASSISTANT_DONE,
}
ASSISTANT_ITEM_DONE = {
    "type": "conversation.item.done",
    "previous_item_id": "item_9b2d…",
    "item": {"id": "item_resp_01", "status": "completed", "…": "…"},
}
RESPONSE_DONE = {
    "type": "response.done",
    "response_id": "resp_01",
    "response": {
        "id": "resp_01",
        "object": "realtime.response",
        "status": "completed",
        "status_details": None,
        "output": [_ASSISTANT_DONE],
        "metadata": {
            "type": "response.done",
            "session_id": "duplex-5f2a…",
            "response_id": "resp_01",
            "epoch": 0,
            "committed": True,
            "playback": {"generated_ms": 2400, "sent_ms": 2400, "played_ms": 2400, "committed_ms": 2400},
        },
    },
}
RESPONSE_DONE_BARGE_IN = {
    "type": "response.done",
    "response_id": "resp_01",
    "response": {
        "id": "resp_01",
        "object": "realtime.response",
        "status": "cancelled",
        "status_details": {"type": "cancelled", "reason": "barge_in"},
        "output": [{"id": "item_resp_01", "status": "cancelled", "…": "…"}],
        "metadata": {"…": "…"},
    },
}
RATE_LIMITS_UPDATED = {"type": "rate_limits.updated", "rate_limits": []}
# The events of one spoken answer, in the document's order ("Response lifecycle"; the
# opening: created, the assistant item added and created, output item, content part, speak).
ANSWER = (
    "response.created",
    "conversation.item.added",
    "conversation.item.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
)
RESPONSE_LISTEN = {
    "type": "response.listen",
    "session_id": "duplex-5f2a…",
    "epoch": 0,
    "response": {
        "object": "realtime.response",
        "status": "listening",
        "metadata": {"type": "response.listen", "session_id": "duplex-5f2a…", "epoch": 0, "reason": "model_listen"},
    },
}
OUTPUT_AUDIO_CLEARED = {"type": "output_audio_buffer.cleared", "response_id": "resp_01"}
# "Playback": S→C playback.acknowledged
PLAYBACK_ACKNOWLEDGED = {
    "type": "playback.acknowledged",
    "event": {
        "type": "playback.acknowledged",
        "session_id": "duplex-5f2a…",
        "epoch": 0,
        "item_id": "item_resp_01",
        "played_ms": 1000,
        "committed_ms": 1000,
        "truncate": False,
        "playback": {"generated_ms": 2400, "sent_ms": 2400, "played_ms": 1000, "committed_ms": 1000},
        "history_committed": False,
    },
}
# "Overlap and barge-in": S→C overlap.decision (listen, then barge_in)
OVERLAP_LISTEN = {
    "type": "overlap.decision",
    "session_id": "duplex-5f2a…",
    "epoch": 0,
    "policy": "listen_only",
    "action": "listen",
    "reason": "long_overlap_speech",
    "metadata": {"overlap_ms": 1400, "buffer_audio": True, "defer_runtime_append": True, "force_listen": True},
}
OVERLAP_BARGE_IN = {
    "type": "overlap.decision",
    "session_id": "duplex-5f2a…",
    "epoch": 0,
    "policy": "barge_in_on_speech",
    "action": "barge_in",
    "reason": "server_vad_utterance_active",
}
# "Errors": the Realtime shape, and the flat native shape of handshake-stage errors
ERROR_BUFFER_EMPTY = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "code": "input_audio_buffer_empty",
        "message": "input_audio_buffer.commit requires a non-empty input audio buffer.",
        "event_id": "evt_0060",
    },
}
HANDSHAKE_ERROR = {
    "type": "error",
    "error": "Unknown or expired duplex session: duplex-5f2a…",
    "code": "session_resume_expired",
}
# The client's resume codes that end its session (DuplexClient, _FATAL_RESUME_CODES at
# DUPLEX_CLIENT_REVISION); any other error code on a resume is retried.
FATAL_RESUME_CODES = frozenset(
    {
        "invalid_session_resume",
        "session_resume_expired",
        "unsupported_session_resume",
        "invalid_resume_token",
        "session_resume_conflict",
    }
)

# --- DUPLEX, the newest sibling revision: input-clocked sessions -----------------------------
# The section "Input-clocked sessions" that vllm-project/vllm-omni#8485 (head eacc510a, branch
# duplex-input-clock of williamLyh/vllm-omni) adds to docs/serving/realtime_duplex_api.md, as
# carried onto main 61cae20d (the document's blob ed4f2846) by InteractionGym's vLLM-Omni patch.
INPUT_CLOCK_REVISION = "vllm-project/vllm-omni#8485@eacc510a"
# "Session options that control model time": the opening session.update's extra_body
INPUT_CLOCK = {"clock": "input"}
# "Input-clocked sessions": S→C input_audio_buffer.processed
INPUT_PROCESSED = {
    "type": "input_audio_buffer.processed",
    "event_id": "event_5c1e…",
    "audio_end_ms": 3200,
    "unit_end_ms": 3000,
    "input_index": 16,
    "trigger": "input_audio_buffer.append",
    "units": [{"end_ms": 3000, "decision": "speak"}],
}
# "Acknowledgement contract": what is acknowledged, and the settled units' decisions
INPUT_CLOCK_TRIGGERS = ("input_audio_buffer.append", "input_audio_buffer.commit", "response.create")
SETTLED_DECISIONS = frozenset({"dropped", "cancelled", "aborted", "timed_out"})
# "Fixed at creation" and "Timeouts": the errors
INPUT_CLOCK_ERRORS = ("input_clock_unsupported", "input_clock_update_unsupported", "invalid_duplex_runtime_config")

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


def gaps(example: dict[str, Any], actual: Any, path: str = "") -> list[str]:
    """Where ``actual`` lacks what ``example`` shows: the key paths of the example that are
    missing from it (or whose value is not an object where the example's is). Keys the
    document elides (``"…"``, ``"..."``) and their values are not compared; nor are
    values: a test asserts those it means."""
    if not isinstance(actual, dict):
        return [path or "."]
    missing: list[str] = []
    for key, value in example.items():
        if key in (ELLIPSIS, "..."):
            continue
        where = f"{path}.{key}" if path else key
        if key not in actual:
            missing.append(where)
        elif isinstance(value, dict):
            missing += gaps(value, actual[key], where)
    return missing
