"""The duplex dialect's session object (pure): parsed from its ``session.update``,
rendered in ``session.created`` / ``session.updated``.

vLLM-Omni's duplex ``session`` mixes the beta's flat fields
(``modalities``, ``input_audio_format``...), the GA's ``audio`` object and its
own keys (``sample_rate_hz``, ``overlap_policy``, ``playback_commit_policy``,
``idle_timeout_s``, ``ref_audio``, ``extra_body``...). The OpenAI fields go
through the same parser as the beta dialect's (``session_config.apply_update``),
so they are validated alike; the duplex keys land in ``DuplexConfig``. Keys a
client echoes back from ``session.created`` (``state``, ``epoch``,
``capabilities``...) are ignored; any other unknown key is kept out and named
in a ``session.warning`` to a client that opted in with ``gateway_events``
(upstream ignores such keys silently; a bad value of a known key is an error,
as in every dialect).

Limits (each refused with ``invalid_value`` / ``unsupported_audio_format``
and the ``param``): ``sample_rate_hz`` of PCM16 (``pcm16``, ``pcm_s16le``,
``s16le``) in 8000..48000 (G.711 is 8000 only; ``pcm_f32le`` is refused by name); ``idle_timeout_s`` in 1..86400;
``overlap_*_ms`` in 0..60000; ``overlap_silence_rms`` in 0..1.

The input clock (``extra_body.clock: "input"``, session/input_clock.py) and its two
timeouts are the session's from its creation: a timeout must be a positive number of
seconds or null (else ``invalid_duplex_runtime_config``); a later ``session.update``
that changes any of them is refused (``input_clock_update_unsupported``), and one whose
``extra_body`` leaves them out keeps them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import (
    ConfigLimits,
    SessionConfig,
    _td_dict,
    _tr_dict,
    apply_update,
    beta_format,
    ga_format,
)
from gateway.protocol.session_fields import public_tool

OverlapPolicy = Literal["listen_only", "barge_in_on_speech"]
CommitPolicy = Literal["commit_all_on_done", "ack_only"]

DEFAULT_INPUT = AudioFormat("pcm16", 16000)  # upstream's duplex default input: 16 kHz PCM16
DEFAULT_OUTPUT = AudioFormat("pcm16", 24000)
MIN_RATE, MAX_RATE = 8000, 48000

# The gateway's decision period, upstream's ``chunk_period_ms`` ("the model unit that
# response.listen decisions and camera frames align to"): server VAD decides on silero's
# 32 ms frames (gateway/audio/vad.py FRAME_MS). Appends may be of any length; a committed turn
# is answered whole, so an input-clocked session's unit is a turn (session/input_clock.py).
CHUNK_PERIOD_MS = 32

# The input clock's keys of extra_body (fixed when the session is created) and the defaults
# of its timeouts (the document's; validated and echoed: no unit is settled by them here).
CLOCK_KEYS = ("clock", "input_clock_unit_timeout_s", "input_clock_unit_max_s")
CLOCK_DEFAULTS_S = {"input_clock_unit_timeout_s": 15.0, "input_clock_unit_max_s": 60.0}

# What this gateway can do, in upstream's capability vocabulary (``session.created``).
CAPABILITIES: dict[str, Any] = {
    "implementation_level": "serving_session_adapter",  # the engine is not a model-native duplex model
    "supports_input_append": True,  # audio streams into the engine as it arrives
    "supports_barge_in": True,
    "supports_playback_ack": True,
    "supports_session_resume": True,  # across replicas and replica death
    "supports_session_lease": True,
    "supports_multi_session": True,
    "supports_audio_truncate": True,
    "supports_external_turn_signal": True,
    "supports_client_commit": True,
    "chunk_period_ms": CHUNK_PERIOD_MS,  # an integer, as the document's (appends may be of any length)
    "input_modes": ["append_audio_chunk"],
    "signal_sources": ["client_event", "server_policy"],
    "target_barge_in_latency_ms": None,
}


def default_session_config(model: str) -> SessionConfig:
    """A duplex session before any update: upstream's defaults (16 kHz PCM16 in, 24 kHz out,
    turns committed by the client)."""
    return SessionConfig(model=model, input_format=DEFAULT_INPUT, output_format=DEFAULT_OUTPUT, turn_detection=None)


@dataclass(frozen=True, slots=True)
class DuplexConfig:
    """The duplex keys of the session object (OpenAI's live in ``SessionConfig``)."""

    overlap_policy: OverlapPolicy | None = None  # None: barge_in_on_speech under server VAD, else listen_only
    overlap_short_ack_ms: int = 700  # overlapping speech shorter than this is a remark: dropped
    overlap_barge_in_ms: int = 1200  # barge_in_on_speech: overlapping speech this long cancels the answer
    overlap_silence_rms: float = 0.003  # an append without is_speech is speech above this RMS (0..1)
    playback_commit_policy: CommitPolicy = "commit_all_on_done"
    idle_timeout_s: float = 300.0  # no client event for this long: session.expired (idle_ttl_expired)
    ref_audio: str | None = None  # accepted, echoed, not used (no voice cloning here)
    response_format: str = "pcm16"
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def input_clocked(self) -> bool:
        """``extra_body.clock == "input"`` (any other value: the wall clock, as upstream reads it)."""
        return self.extra_body.get("clock") == "input"

    def clock_settings(self) -> tuple[Any, ...]:
        """What a later update may not change: the clock, and its timeouts when it is on."""
        if not self.input_clocked:
            return (False,)
        return (True, *(self.extra_body.get(k) or CLOCK_DEFAULTS_S[k] for k in CLOCK_KEYS[1:]))

    @property
    def auto_response(self) -> bool:
        """Whether a commit creates a response (``extra_body.auto_response``, default true)."""
        return self.extra_body.get("auto_response", True) is not False

    def policy(self, config: SessionConfig) -> OverlapPolicy:
        if self.overlap_policy is not None:
            return self.overlap_policy
        td = config.turn_detection
        return "barge_in_on_speech" if td is not None and td.interrupt_response else "listen_only"


_OPENAI_KEYS = {  # parsed as the beta dialect parses them (after the renames below)
    "modalities",
    "instructions",
    "voice",
    "input_audio_transcription",
    "turn_detection",
    "tools",
    "tool_choice",
    "temperature",
    "max_response_output_tokens",
    "speed",
    "tracing",
    "input_audio_noise_reduction",
    "reissue_interrupted_responses",
    "gateway_events",  # the gateway's own events (session.warning), as in every dialect
}
_DUPLEX_KEYS = {
    "overlap_policy",
    "overlap_short_ack_ms",
    "overlap_barge_in_ms",
    "overlap_silence_rms",
    "playback_commit_policy",
    "idle_timeout_s",
    "ref_audio",
    "response_format",
    "extra_body",
}
_FORMAT_KEYS = {"input_audio_format", "output_audio_format", "sample_rate_hz", "audio"}
_ECHOED = {  # what a client may send back from session.created: ignored
    "model",
    "session_id",
    "id",
    "object",
    "type",
    "output_modalities",
    "max_tokens",
    "use_tts_template",
    "expires_at",
    "state",
    "turn_state",
    "epoch",
    "turn_id",
    "active_request_id",
    "active_response_id",
    "active_response_turn_id",
    "playback",
    "capabilities",
}
# The document's input formats ("Event catalogue"), pcm_f32le aside (refused by name), and "pcm".
CODECS = {
    "pcm16": "pcm16",
    "pcm": "pcm16",
    "pcm_s16le": "pcm16",
    "s16le": "pcm16",
    "g711_ulaw": "pcmu",
    "g711_alaw": "pcma",
}


def _err(message: str, param: str, code: str = Code.INVALID_VALUE) -> ProtocolError:
    return ProtocolError(code, message, param=param)


def _number(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _err(f"'{param}' must be a number from {lo:g} to {hi:g}, got {value!r}.", param)
    return float(value)


def _rate(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_RATE <= value <= MAX_RATE:
        raise _err(
            f"'{param}' must be a sample rate from {MIN_RATE} to {MAX_RATE} Hz, got {value!r}.",
            param,
            Code.UNSUPPORTED_FORMAT,
        )
    return value


def _format(encoding: Any, rate: Any, param: str, current: AudioFormat) -> AudioFormat:
    codec: str
    if encoding is None:
        codec = current.codec
    elif isinstance(encoding, dict):  # the GA object {type: audio/pcm, rate}
        kind = encoding.get("type")
        codec = {"audio/pcm": "pcm16", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}.get(str(kind), "")
        if not codec:
            raise _err(
                f"Unsupported audio format {kind!r}; use audio/pcm, audio/pcmu or audio/pcma.",
                f"{param}.type",
                Code.UNSUPPORTED_FORMAT,
            )
        rate = encoding.get("rate", rate)
    elif isinstance(encoding, str) and encoding in CODECS:
        codec = CODECS[encoding]
    elif encoding == "pcm_f32le":
        raise _err(
            "pcm_f32le (32-bit float PCM) is not spoken here; use pcm16 (also pcm_s16le, s16le), "
            "g711_ulaw or g711_alaw.",
            param,
            Code.UNSUPPORTED_FORMAT,
        )
    else:
        raise _err(
            f"Unsupported audio format {encoding!r}; use pcm16 (also pcm_s16le, s16le), g711_ulaw or g711_alaw.",
            param,
            Code.UNSUPPORTED_FORMAT,
        )
    if codec != "pcm16":
        if rate not in (None, 8000):
            raise _err(f"G.711 is 8000 Hz only, got {rate}.", param, Code.UNSUPPORTED_FORMAT)
        return AudioFormat("pcmu" if codec == "pcmu" else "pcma", 8000)
    if rate is None:
        rate = current.rate if current.codec == "pcm16" else DEFAULT_INPUT.rate
    return AudioFormat("pcm16", _rate(rate, param))


def _audio_formats(upd: dict[str, Any], config: SessionConfig, param: str) -> tuple[AudioFormat, AudioFormat]:
    audio = upd.get("audio") or {}
    if not isinstance(audio, dict):
        raise _err(f"'{param}.audio' must be an object.", f"{param}.audio", Code.INVALID_TYPE)
    a_in = audio.get("input") or {}
    a_out = audio.get("output") or {}
    if not isinstance(a_in, dict) or not isinstance(a_out, dict):
        raise _err(f"'{param}.audio.input' and '.output' must be objects.", f"{param}.audio", Code.INVALID_TYPE)
    in_rate = a_in.get("sample_rate_hz", upd.get("sample_rate_hz"))
    in_enc = upd.get("input_audio_format", a_in.get("format"))
    out_enc = upd.get("output_audio_format", a_out.get("format"))
    inp = config.input_format
    out = config.output_format
    if in_enc is not None or in_rate is not None:
        inp = _format(in_enc, in_rate, f"{param}.input_audio_format", config.input_format)
    if out_enc is not None or a_out.get("sample_rate_hz") is not None:
        out = _format(out_enc, a_out.get("sample_rate_hz"), f"{param}.output_audio_format", config.output_format)
    return inp, out


def apply_duplex_update(
    config: SessionConfig, duplex: DuplexConfig, update: Any, *, limits: ConfigLimits, param: str = "session"
) -> tuple[SessionConfig, DuplexConfig, list[tuple[str, str]]]:
    """Validate ``update`` whole; return the new configs and the warnings (nothing applied on error)."""
    if not isinstance(update, dict):
        raise _err(f"'{param}' must be an object.", param, Code.INVALID_TYPE)
    warnings: list[tuple[str, str]] = []
    openai: dict[str, Any] = {k: v for k, v in update.items() if k in _OPENAI_KEYS}
    if "modalities" not in openai and "output_modalities" in update:
        openai["modalities"] = update["output_modalities"]
    if "max_response_output_tokens" not in openai and update.get("max_tokens") is not None:
        openai["max_response_output_tokens"] = update["max_tokens"]
    for key in update:
        if key not in _OPENAI_KEYS | _DUPLEX_KEYS | _FORMAT_KEYS | _ECHOED:
            warnings.append((f"{param}.{key}", f"'{key}' is not a field of the duplex session object; ignored."))
    new, more = apply_update(config, openai, beta=True, limits=limits, param=param)
    warnings += more
    inp, out = _audio_formats(update, new, param)
    new = replace(new, input_format=inp, output_format=out)
    return new, _duplex_fields(duplex, update, param, warnings), warnings


def _duplex_fields(d: DuplexConfig, upd: dict[str, Any], param: str, warnings: list[tuple[str, str]]) -> DuplexConfig:
    extra = upd.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise _err(f"'{param}.extra_body' must be an object.", f"{param}.extra_body", Code.INVALID_TYPE)
    # Upstream reads the overlap and playback keys from extra_body too; the top level wins.
    src = {**(extra or {}), **upd}
    changes: dict[str, Any] = {}
    if extra is not None:
        kept = {k: d.extra_body[k] for k in CLOCK_KEYS if k in d.extra_body and k not in extra}
        changes["extra_body"] = {**copy.deepcopy(extra), **kept}  # (the clock's keys are fixed: kept)
        if changes["extra_body"].get("clock") == "input":
            for key in CLOCK_KEYS[1:]:
                value = changes["extra_body"].get(key)
                if value is not None and not _positive_seconds(value):
                    raise _err(
                        f"'{param}.extra_body.{key}' must be a positive number of seconds (or null for "
                        f"{CLOCK_DEFAULTS_S[key]:g}), got {value!r}.",
                        f"{param}.extra_body.{key}",
                        Code.INVALID_DUPLEX_RUNTIME_CONFIG,
                    )
        auto = extra.get("auto_response")
        if auto is not None and not isinstance(auto, bool):
            raise _err(
                f"'{param}.extra_body.auto_response' must be true or false.",
                f"{param}.extra_body.auto_response",
                Code.INVALID_TYPE,
            )
    if src.get("overlap_policy") is not None:
        policy = src["overlap_policy"]
        if policy not in ("listen_only", "barge_in_on_speech"):
            raise _err(
                f"'{param}.overlap_policy' must be listen_only or barge_in_on_speech, got {policy!r}.",
                f"{param}.overlap_policy",
            )
        changes["overlap_policy"] = policy
    for key in ("overlap_short_ack_ms", "overlap_barge_in_ms"):
        if src.get(key) is not None:
            changes[key] = int(_number(src[key], f"{param}.{key}", 0, 60_000))
    if src.get("overlap_silence_rms") is not None:
        changes["overlap_silence_rms"] = _number(src["overlap_silence_rms"], f"{param}.overlap_silence_rms", 0, 1)
    if src.get("playback_commit_policy") is not None:
        policy = src["playback_commit_policy"]
        if policy not in ("commit_all_on_done", "ack_only"):
            raise _err(
                f"'{param}.playback_commit_policy' must be commit_all_on_done or ack_only, got {policy!r}.",
                f"{param}.playback_commit_policy",
            )
        changes["playback_commit_policy"] = policy
    if upd.get("idle_timeout_s") is not None:
        changes["idle_timeout_s"] = _number(upd["idle_timeout_s"], f"{param}.idle_timeout_s", 1, 86_400)
    if "ref_audio" in upd:
        ref = upd["ref_audio"]
        if ref is not None and not isinstance(ref, str):
            raise _err(f"'{param}.ref_audio' must be a data URL string.", f"{param}.ref_audio", Code.INVALID_TYPE)
        changes["ref_audio"] = ref
        if ref:
            warnings.append(
                (f"{param}.ref_audio", "'ref_audio' is accepted but not used: this engine has its own voices.")
            )
    if upd.get("response_format") is not None:
        if upd["response_format"] not in CODECS:
            raise _err(f"'{param}.response_format' must be pcm16.", f"{param}.response_format", Code.UNSUPPORTED_FORMAT)
        changes["response_format"] = upd["response_format"]
    return replace(d, **changes)


def _positive_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def render_session(
    config: SessionConfig, duplex: DuplexConfig, *, session_id: str, expires_at: int, state: dict[str, Any]
) -> dict[str, Any]:
    """The duplex ``session`` object: both spellings of what OpenAI spells twice, the
    duplex keys, the session's live ``state`` (turn_state, epoch, turn_id, playback...)
    and the capabilities."""
    modalities = ["audio", "text"] if "audio" in config.output_modalities else ["text"]
    inp, out = config.input_format, config.output_format
    max_tokens = None if config.max_output_tokens is None else config.max_output_tokens
    return {
        "object": "realtime.session",
        "type": "realtime",
        "id": session_id,
        "model": config.model,
        "expires_at": expires_at,
        "state": "open",
        **state,
        "modalities": modalities,
        "output_modalities": modalities,
        "instructions": config.instructions,
        "voice": config.voice,
        "response_format": duplex.response_format,
        "input_audio_format": beta_format(inp),
        "output_audio_format": beta_format(out),
        "audio": {
            "input": {"format": {**ga_format(inp), "rate": inp.rate}, "sample_rate_hz": inp.rate},
            "output": {"format": {**ga_format(out), "rate": out.rate}, "sample_rate_hz": out.rate},
        },
        "temperature": config.temperature,
        "max_tokens": max_tokens,
        "max_response_output_tokens": "inf" if max_tokens is None else max_tokens,
        "speed": config.speed,
        "idle_timeout_s": duplex.idle_timeout_s,
        "overlap_policy": duplex.policy(config),
        "overlap_short_ack_ms": duplex.overlap_short_ack_ms,
        "overlap_barge_in_ms": duplex.overlap_barge_in_ms,
        "overlap_silence_rms": duplex.overlap_silence_rms,
        "playback_commit_policy": duplex.playback_commit_policy,
        "turn_detection": _td_dict(config.turn_detection),
        "input_audio_transcription": _tr_dict(config.transcription),
        "input_audio_noise_reduction": config.noise_reduction,
        "tools": [public_tool(t) for t in config.tools],
        "tool_choice": config.tool_choice,
        "tracing": config.tracing,
        "ref_audio": duplex.ref_audio,
        "extra_body": duplex.extra_body,
        "reissue_interrupted_responses": config.reissue_interrupted_responses,
        "gateway_events": config.gateway_events,
        "capabilities": dict(CAPABILITIES),
    }


def duplex_to_dict(d: DuplexConfig) -> dict[str, Any]:
    return {
        "overlap_policy": d.overlap_policy,
        "overlap_short_ack_ms": d.overlap_short_ack_ms,
        "overlap_barge_in_ms": d.overlap_barge_in_ms,
        "overlap_silence_rms": d.overlap_silence_rms,
        "playback_commit_policy": d.playback_commit_policy,
        "idle_timeout_s": d.idle_timeout_s,
        "ref_audio": d.ref_audio,
        "response_format": d.response_format,
        "extra_body": d.extra_body,
    }


def duplex_from_dict(data: dict[str, Any]) -> DuplexConfig:
    return DuplexConfig(**data)
