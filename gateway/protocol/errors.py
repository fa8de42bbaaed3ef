"""Stable error codes and WebSocket close codes.

Every client-visible failure has one code here. Codes never change meaning;
new failures get new codes. docs/errors.md lists every code;
tests/docs/test_error_codes.py holds that table against every code the gateway sends.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import orjson


class Code:
    """``error.code`` values sent in ``error`` events."""

    INVALID_JSON = "invalid_json"
    UNKNOWN_EVENT = "unknown_event"
    UNKNOWN_PARAMETER = "unknown_parameter"
    MISSING_FIELD = "missing_required_parameter"
    INVALID_VALUE = "invalid_value"
    INTEGER_ABOVE_MAX = "integer_above_max_value"  # as the API names it (max_output_tokens over 4096)
    CANNOT_UPDATE_VOICE = "cannot_update_voice"  # a voice change once the conversation holds assistant audio
    INVALID_TYPE = "invalid_type"
    STRING_TOO_LONG = "string_above_max_length"  # as the API names it (instructions over their bound)
    INVALID_BASE64 = "invalid_base64"
    INVALID_AUDIO = "invalid_audio_format"  # bytes that cannot be the session's format
    UNSUPPORTED_FORMAT = "unsupported_audio_format"
    UNSUPPORTED_VIDEO_FORMAT = "unsupported_video_format"
    MESSAGE_TOO_LARGE = "message_too_large"
    BODY_TOO_LARGE = "request_body_too_large"  # an HTTP request body over max_http_body_bytes (413)
    HEADERS_TOO_LARGE = "request_header_fields_too_large"  # a request head over 64 KiB (431, closed)
    REQUEST_TIMEOUT = "request_timeout"  # a request head not in within header_timeout_s (408, closed)
    APPEND_TOO_LARGE = "audio_append_too_large"
    BUFFER_FULL = "input_audio_buffer_full"
    BUFFER_TOO_SMALL = "input_audio_buffer_commit_empty"
    RESPONSE_ACTIVE = "conversation_already_has_active_response"
    RESPONSE_NOT_ACTIVE = "response_cancel_not_active"
    ITEM_NOT_FOUND = "item_not_found"
    ITEM_EXISTS = "item_already_exists"
    INVALID_TRUNCATE = "invalid_truncate"
    SERVER_BUSY = "server_busy"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    TRANSCRIPTION_FAILED = "transcription_failed"
    SESSION_EXPIRED = "session_expired"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"  # an HTTP endpoint this credential may not use (admin)
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"  # a browser page whose Origin may not open sockets here
    MODEL_NOT_ALLOWED = "model_not_allowed"  # the credential may not use this model (then close 4003)
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # a tenant limit (sessions, starts, audio, events, mints)
    CLIENT_SECRET_WRONG_TYPE = "client_secret_wrong_type"  # a secret minted for realtime on the video
    #   socket, or one minted for video on a realtime socket (then close 4003)
    CLIENT_SECRET_TOO_LARGE = "client_secret_too_large"  # a mint whose session is over the tenant's
    #   max_secret_bytes (HTTP 400)
    SLOW_CONSUMER = "slow_consumer"
    INTERNAL = "internal_error"
    UNSUPPORTED = "unsupported"  # a valid request this session cannot serve (a response in a transcription
    #   session, a WebRTC-only event); the engines use the same code for what they cannot do
    # resume
    SESSION_NOT_FOUND = "session_not_found"  # unknown or expired session, or another principal's
    RESUME_TOKEN_INVALID = "resume_token_invalid"
    RESUME_SEQ_INVALID = "resume_seq_invalid"  # a seq the session never sent
    RESUME_NOT_FIRST = "resume_not_first"  # session.resume after other client events
    STORE_UNAVAILABLE = "store_unavailable"
    # video
    UNSUPPORTED_FIELD = "unsupported_field"  # a field that cannot be honoured where it was sent
    NO_ACTIVE_REQUEST = "no_active_request"  # an interaction with no video streaming
    EVENT_ID_CONFLICT = "event_id_conflict"  # an interaction event_id already used in this stream
    ALREADY_STARTED = "session_already_started"  # a second session.start on one connection
    START_EXPECTED = "session_start_expected"  # a first message other than session.start (then close)
    START_TIMEOUT = "session_start_timeout"  # no session.start in time after the connect (then close)
    STALL_TIMEOUT = "stall_timeout"  # no generation progress and no ping for too long (stopped, closed)
    INTERACTION_FAILED = "interaction_failed"  # the video engine refused an interaction (vLLM-Omni's code)
    NO_VIDEO_ENGINE = "no_video_engine"
    MODEL_NOT_FOUND = "model_not_found"  # no route for the model a client asked for
    # the duplex dialect's input clock (extra_body.clock "input"), upstream's codes
    INPUT_CLOCK_UPDATE_UNSUPPORTED = "input_clock_update_unsupported"  # a later session.update that
    #   changes clock or its timeouts (fixed when the session is created)
    INVALID_DUPLEX_RUNTIME_CONFIG = "invalid_duplex_runtime_config"  # a clock timeout that is not a
    #   positive number of seconds (nor null)
    # WebRTC calls
    SIGNATURE_INVALID = "signature_invalid"  # a carrier's stream whose request signature is missing or wrong (403)
    SIP_CALL_FAILED = "sip_call_failed"  # an outbound SIP call was not answered (the trunk's status, or no answer)
    SIP_UNAVAILABLE = "sip_unavailable"  # an outbound call asked of a gateway without SIP (sip_port off)
    CALL_TRANSFER_FAILED = "call_transfer_failed"  # a SIP trunk refused a REFER, or did not answer it
    CALL_NOT_FOUND = "call_id_not_found"  # a hangup or sideband for a call that does not exist (or another's)
    WEBRTC_UNAVAILABLE = "webrtc_unavailable"  # this gateway answers no WebRTC call (the extra, the setting)
    # MCP servers the gateway connects to (gateway/hosting/mcp.py)
    MCP_LIST_TOOLS_FAILED = "mcp_list_tools_failed"  # an MCP server's tools could not be listed (beside
    #   mcp_list_tools.failed: refused by the allow-list, unreachable, timed out, not MCP, MCP off here)


class CloseCode(IntEnum):
    """WebSocket close codes the gateway uses (documented in docs/errors.md)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    MESSAGE_TOO_BIG = 1009  # a frame over the hard transport limit (uvicorn closes)
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012  # drain: reconnect and resume on another replica
    TRY_AGAIN_LATER = 1013  # the replica is at its session limit
    UNAUTHORIZED = 4001  # missing, wrong, expired or already used credentials (a server without the
    #   websocket.http.response extension; uvicorn refuses these at the upgrade with HTTP 401)
    FORBIDDEN = 4003  # the credential may not use this model; an origin not allowed (as for 4001)
    UNKNOWN_MODEL = 4004  # no route for the requested model
    UNKNOWN_CALL = 4004  # (the same code) a sideband for a call that is not in progress, or another's
    SESSION_EXPIRED = 4008  # the session reached its maximum lifetime
    SESSION_REPLACED = 4009  # another connection resumed this session
    SLOW_CONSUMER = 4010  # the client read too slowly; the outbound queue overflowed
    RATE_LIMITED = 4029  # a tenant limit refused the session (concurrent sessions, starts per minute)


class ProtocolError(Exception):
    """A client mistake: reported as an ``error`` event; the session goes on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = type


def json_object(raw: str | bytes, what: str = "A client event") -> dict[str, Any]:
    """One text message parsed as the JSON object every dialect's messages are; ``what``
    names the message in the error (invalid_json) a person reads."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(Code.INVALID_JSON, f"The message is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise ProtocolError(Code.INVALID_JSON, f"{what} must be a JSON object.")
    return data
