"""The session configuration: parsed from GA or beta ``session.update`` shapes,
rendered back in the shape the client speaks. Pure: no I/O.

An update is validated whole before anything is applied, so a bad field leaves
the previous configuration untouched. Known fields the engine cannot honour
are accepted, kept, and reported as warnings (never an error, never a crash).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat
from gateway.protocol.errors import Code, ProtocolError

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip

PCM = AudioFormat("pcm16", 24000)
PCMU = AudioFormat("pcmu", 8000)
PCMA = AudioFormat("pcma", 8000)
_GA_FORMATS = {"audio/pcm": PCM, "audio/pcmu": PCMU, "audio/pcma": PCMA}
_BETA_FORMATS = {"pcm16": PCM, "g711_ulaw": PCMU, "g711_alaw": PCMA}


@dataclass(frozen=True, slots=True)
class TurnDetection:
    type: Literal["server_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Transcription:
    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class SessionConfig:
    model: str
    instructions: str = ""
    output_modalities: tuple[Literal["text", "audio"], ...] = ("audio",)
    input_format: AudioFormat = PCM
    output_format: AudioFormat = PCM
    voice: str = "alloy"
    speed: float = 1.0
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    temperature: float = 0.8
    max_output_tokens: int | None = None  # None renders as "inf"
    # Accepted and echoed, not acted on (the engine reports which it ignores).
    tools: tuple[Any, ...] = ()
    tool_choice: Any = "auto"
    noise_reduction: Any = None
    tracing: Any = None
    truncation: Any = "auto"
    prompt: Any = None
    include: Any = None
    # Gateway extension: after a replica is lost mid-response, create the
    # response again on the replica that resumes the session.
    reissue_interrupted_responses: bool = True
    # Gateway extension: send this session the gateway's own events that the
    # OpenAI SDKs have no type for (session.warning, session.replaced). Off by
    # default: typed clients (openai-agents) fail on an event they cannot parse.
    gateway_events: bool = False


@dataclass(slots=True)
class ConfigLimits:
    """What the engine can do; used to validate and to report ignored fields."""

    voices: tuple[str, ...] = ()  # engine voice names usable directly
    ignored_fields: tuple[str, ...] = ()


# --- parsing ----------------------------------------------------------------

_GA_TOP = {
    "type", "object", "id", "model", "output_modalities", "instructions", "audio", "tools",
    "tool_choice", "max_output_tokens", "tracing", "truncation", "prompt", "include",
    "expires_at", "temperature", "reissue_interrupted_responses", "gateway_events",
}  # fmt: skip
_BETA_TOP = {
    "object", "id", "model", "modalities", "instructions", "voice", "input_audio_format",
    "output_audio_format", "input_audio_transcription", "turn_detection", "tools",
    "tool_choice", "temperature", "max_response_output_tokens", "speed", "tracing",
    "input_audio_noise_reduction", "expires_at", "include", "client_secret", "reissue_interrupted_responses",
    "gateway_events",
}  # fmt: skip


def _err(message: str, param: str, code: str = Code.INVALID_VALUE) -> ProtocolError:
    return ProtocolError(code, message, param=param)


def _check_keys(obj: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _err(f"Unknown parameter: '{prefix}.{key}'.", f"{prefix}.{key}", Code.UNKNOWN_PARAMETER)


def _obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _err(f"'{param}' must be an object.", param, Code.INVALID_TYPE)
    return value


def _num(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _err(f"'{param}' must be a number.", param, Code.INVALID_TYPE)
    if not lo <= value <= hi:
        raise _err(f"'{param}' must be between {lo} and {hi}, got {value}.", param)
    return float(value)


def _int(value: Any, param: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(f"'{param}' must be an integer.", param, Code.INVALID_TYPE)
    if not lo <= value <= hi:
        raise _err(f"'{param}' must be between {lo} and {hi}, got {value}.", param)
    return value


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _err(f"'{param}' must be true or false.", param, Code.INVALID_TYPE)
    return value


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _err(f"'{param}' must be a string.", param, Code.INVALID_TYPE)
    return value


def _modalities(value: Any, param: str) -> tuple[Literal["text", "audio"], ...]:
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise _err(f'\'{param}\' must be ["audio"] or ["text"].', param)
    # ["audio"] and ["audio", "text"] both mean audio with its transcript.
    return ("audio",) if "audio" in value else ("text",)


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    return _int(value, param, 1, 1_000_000)


def parse_ga_format(value: Any, param: str) -> AudioFormat:
    fmt = _obj(value, param)
    kind = fmt.get("type")
    if not isinstance(kind, str) or kind not in _GA_FORMATS:
        raise _err(
            f"Unsupported audio format {kind!r}; use audio/pcm (24 kHz), audio/pcmu or audio/pcma.",
            f"{param}.type",
            Code.UNSUPPORTED_FORMAT,
        )
    result = _GA_FORMATS[kind]
    rate = fmt.get("rate", result.rate)
    if rate != result.rate:
        raise _err(
            f"{kind} is only supported at {result.rate} Hz, got {rate}.",
            f"{param}.rate",
            Code.UNSUPPORTED_FORMAT,
        )
    return result


def parse_beta_format(value: Any, param: str) -> AudioFormat:
    if not isinstance(value, str) or value not in _BETA_FORMATS:
        raise _err(
            f"Unsupported audio format {value!r}; use pcm16, g711_ulaw or g711_alaw.",
            param,
            Code.UNSUPPORTED_FORMAT,
        )
    return _BETA_FORMATS[value]


def _turn_detection(value: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    if value is None:
        return None
    td = _obj(value, param)
    _check_keys(
        td,
        {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
         "interrupt_response", "idle_timeout_ms", "eagerness"},
        param,
    )  # fmt: skip
    kind = td.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise _err(f"'{param}.type' must be server_vad or semantic_vad.", f"{param}.type")
    base = current or TurnDetection()
    result = TurnDetection(
        threshold=_num(td.get("threshold", base.threshold), f"{param}.threshold", 0.0, 1.0),
        prefix_padding_ms=_int(
            td.get("prefix_padding_ms", base.prefix_padding_ms), f"{param}.prefix_padding_ms", 0, 5000
        ),
        silence_duration_ms=_int(
            td.get("silence_duration_ms", base.silence_duration_ms),
            f"{param}.silence_duration_ms",
            0,
            10_000,
        ),
        create_response=_bool(td.get("create_response", base.create_response), f"{param}.create_response"),
        interrupt_response=_bool(td.get("interrupt_response", base.interrupt_response), f"{param}.interrupt_response"),
        idle_timeout_ms=(
            None
            if td.get("idle_timeout_ms") is None
            else _int(td["idle_timeout_ms"], f"{param}.idle_timeout_ms", 5000, 30_000)
        ),
    )
    return result


def _transcription(value: Any, param: str) -> Transcription | None:
    if value is None:
        return None
    tr = _obj(value, param)
    _check_keys(tr, {"model", "language", "prompt"}, param)
    model = _str(tr.get("model", "whisper-1"), f"{param}.model")
    language = tr.get("language")
    prompt = tr.get("prompt")
    return Transcription(
        model=model,
        language=None if language is None else _str(language, f"{param}.language"),
        prompt=None if prompt is None else _str(prompt, f"{param}.prompt"),
    )


def _voice(value: Any, param: str, limits: ConfigLimits) -> str:
    voice = _str(value, param)
    if voice not in OPENAI_VOICES and voice not in limits.voices:
        names = ", ".join(OPENAI_VOICES + limits.voices)
        raise _err(f"Unknown voice {voice!r}; choose one of: {names}.", param)
    return voice


def apply_update(
    current: SessionConfig, update: Any, *, beta: bool, limits: ConfigLimits, param: str = "session"
) -> tuple[SessionConfig, list[tuple[str, str]]]:
    """Validate ``update`` whole and return the new config and the warnings.

    Raises ``ProtocolError`` (nothing applied) on the first invalid field.
    Warnings are ``(param, message)`` pairs for fields the engine ignores.
    """
    upd = _obj(update, param)
    changes: dict[str, Any] = {}
    if beta:
        _check_keys(upd, _BETA_TOP, param)
        if "modalities" in upd:
            changes["output_modalities"] = _modalities(upd["modalities"], f"{param}.modalities")
        if "voice" in upd:
            changes["voice"] = _voice(upd["voice"], f"{param}.voice", limits)
        if "input_audio_format" in upd:
            changes["input_format"] = parse_beta_format(upd["input_audio_format"], f"{param}.input_audio_format")
        if "output_audio_format" in upd:
            changes["output_format"] = parse_beta_format(upd["output_audio_format"], f"{param}.output_audio_format")
        if "input_audio_transcription" in upd:
            changes["transcription"] = _transcription(
                upd["input_audio_transcription"], f"{param}.input_audio_transcription"
            )
        if "turn_detection" in upd:
            changes["turn_detection"] = _turn_detection(
                upd["turn_detection"], f"{param}.turn_detection", current.turn_detection
            )
        if "max_response_output_tokens" in upd:
            changes["max_output_tokens"] = _max_tokens(
                upd["max_response_output_tokens"], f"{param}.max_response_output_tokens"
            )
        if "speed" in upd:
            changes["speed"] = _num(upd["speed"], f"{param}.speed", 0.25, 1.5)
        if "input_audio_noise_reduction" in upd:
            changes["noise_reduction"] = upd["input_audio_noise_reduction"]
    else:
        _check_keys(upd, _GA_TOP, param)
        if upd.get("type", "realtime") != "realtime":
            raise _err(
                "Only realtime sessions are supported here ('session.type' must be 'realtime').",
                f"{param}.type",
            )
        if "output_modalities" in upd:
            changes["output_modalities"] = _modalities(upd["output_modalities"], f"{param}.output_modalities")
        if "max_output_tokens" in upd:
            changes["max_output_tokens"] = _max_tokens(upd["max_output_tokens"], f"{param}.max_output_tokens")
        if "audio" in upd:
            changes.update(_ga_audio(upd["audio"], f"{param}.audio", current, limits))
    if "instructions" in upd:
        changes["instructions"] = _str(upd["instructions"], f"{param}.instructions")
    if "temperature" in upd:
        changes["temperature"] = _num(upd["temperature"], f"{param}.temperature", 0.0, 2.0)
    if "tools" in upd:
        if not isinstance(upd["tools"], list):
            raise _err(f"'{param}.tools' must be an array.", f"{param}.tools", Code.INVALID_TYPE)
        changes["tools"] = tuple(upd["tools"])
    if "reissue_interrupted_responses" in upd:
        changes["reissue_interrupted_responses"] = _bool(
            upd["reissue_interrupted_responses"], f"{param}.reissue_interrupted_responses"
        )
    if "gateway_events" in upd:
        changes["gateway_events"] = _bool(upd["gateway_events"], f"{param}.gateway_events")
    for key in ("tool_choice", "tracing", "truncation", "prompt", "include"):
        if key in upd:
            changes[key] = copy.deepcopy(upd[key])
    if "model" in upd and upd["model"] != current.model:
        raise _err("The model of a session cannot change; open a new session.", f"{param}.model")

    new = replace(current, **changes)
    warnings = [
        (f"{param}.{name}", f"'{name}' is accepted but not used by this engine.")
        for name in limits.ignored_fields
        if name in changes and changes[name] not in ((), None, "auto")
    ]
    return new, warnings


def _ga_audio(value: Any, param: str, current: SessionConfig, limits: ConfigLimits) -> dict[str, Any]:
    audio = _obj(value, param)
    _check_keys(audio, {"input", "output"}, param)
    changes: dict[str, Any] = {}
    if "input" in audio:
        inp = _obj(audio["input"], f"{param}.input")
        _check_keys(inp, {"format", "transcription", "turn_detection", "noise_reduction"}, f"{param}.input")
        if "format" in inp:
            changes["input_format"] = parse_ga_format(inp["format"], f"{param}.input.format")
        if "transcription" in inp:
            changes["transcription"] = _transcription(inp["transcription"], f"{param}.input.transcription")
        if "turn_detection" in inp:
            changes["turn_detection"] = _turn_detection(
                inp["turn_detection"], f"{param}.input.turn_detection", current.turn_detection
            )
        if "noise_reduction" in inp:
            changes["noise_reduction"] = copy.deepcopy(inp["noise_reduction"])
    if "output" in audio:
        out = _obj(audio["output"], f"{param}.output")
        _check_keys(out, {"format", "voice", "speed"}, f"{param}.output")
        if "format" in out:
            changes["output_format"] = parse_ga_format(out["format"], f"{param}.output.format")
        if "voice" in out:
            changes["voice"] = _voice(out["voice"], f"{param}.output.voice", limits)
        if "speed" in out:
            changes["speed"] = _num(out["speed"], f"{param}.output.speed", 0.25, 1.5)
    return changes


# --- rendering --------------------------------------------------------------


def ga_format(fmt: AudioFormat) -> dict[str, Any]:
    if fmt.codec == "pcm16":
        return {"type": "audio/pcm", "rate": fmt.rate}
    return {"type": "audio/pcmu" if fmt.codec == "pcmu" else "audio/pcma"}


def beta_format(fmt: AudioFormat) -> str:
    return {"pcm16": "pcm16", "pcmu": "g711_ulaw", "pcma": "g711_alaw"}[fmt.codec]


def _td_dict(td: TurnDetection | None, beta: bool = False) -> dict[str, Any] | None:
    if td is None:
        return None
    if beta:  # the beta API has no idle_timeout_ms
        return {k: v for k, v in (_td_dict(td) or {}).items() if k != "idle_timeout_ms"}
    return {
        "type": td.type,
        "threshold": td.threshold,
        "prefix_padding_ms": td.prefix_padding_ms,
        "silence_duration_ms": td.silence_duration_ms,
        "create_response": td.create_response,
        "interrupt_response": td.interrupt_response,
        "idle_timeout_ms": td.idle_timeout_ms,
    }


def _tr_dict(tr: Transcription | None) -> dict[str, Any] | None:
    if tr is None:
        return None
    return {"model": tr.model, "language": tr.language, "prompt": tr.prompt}


def render(cfg: SessionConfig, *, session_id: str, expires_at: int, beta: bool) -> dict[str, Any]:
    max_tokens: int | str = "inf" if cfg.max_output_tokens is None else cfg.max_output_tokens
    if beta:
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": cfg.model,
            "expires_at": expires_at,
            "modalities": ["audio", "text"] if "audio" in cfg.output_modalities else ["text"],
            "instructions": cfg.instructions,
            "voice": cfg.voice,
            "speed": cfg.speed,
            "input_audio_format": beta_format(cfg.input_format),
            "output_audio_format": beta_format(cfg.output_format),
            "input_audio_transcription": _tr_dict(cfg.transcription),
            "input_audio_noise_reduction": cfg.noise_reduction,
            "turn_detection": _td_dict(cfg.turn_detection, beta=True),
            "tools": list(cfg.tools),
            "tool_choice": cfg.tool_choice,
            "temperature": cfg.temperature,
            "max_response_output_tokens": max_tokens,
            "tracing": cfg.tracing,
            "reissue_interrupted_responses": cfg.reissue_interrupted_responses,
            "gateway_events": cfg.gateway_events,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": cfg.model,
        "expires_at": expires_at,
        "output_modalities": list(cfg.output_modalities),
        "instructions": cfg.instructions,
        "audio": {
            "input": {
                "format": ga_format(cfg.input_format),
                "transcription": _tr_dict(cfg.transcription),
                "noise_reduction": cfg.noise_reduction,
                "turn_detection": _td_dict(cfg.turn_detection),
            },
            "output": {"format": ga_format(cfg.output_format), "voice": cfg.voice, "speed": cfg.speed},
        },
        "tools": list(cfg.tools),
        "tool_choice": cfg.tool_choice,
        "max_output_tokens": max_tokens,
        "tracing": cfg.tracing,
        "truncation": cfg.truncation,
        "prompt": cfg.prompt,
        "include": cfg.include,
        "reissue_interrupted_responses": cfg.reissue_interrupted_responses,
        "gateway_events": cfg.gateway_events,
    }


def engine_voice(voice: str, engine_voices: tuple[str, ...], default: str | None) -> str | None:
    """Map an OpenAI voice name onto one of the engine's voices, stably."""
    if voice in engine_voices:
        return voice
    if voice in OPENAI_VOICES and engine_voices:
        return engine_voices[OPENAI_VOICES.index(voice) % len(engine_voices)]
    return default
