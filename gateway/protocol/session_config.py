"""The session configuration: parsed from GA or beta ``session.update`` shapes,
rendered back in the shape the client speaks. Pure: no I/O.

An update is validated whole before anything is applied, so a bad field leaves
the previous configuration untouched. Every field of the GA session is
accepted (``openai.types.realtime``: a valid GA ``session.update`` is never
refused); a field the engine cannot honour is kept, echoed and reported once
per session (``session.warning``, to clients that opted in), never an error.
Field validators live in ``session_fields``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat
from gateway.protocol import session_fields as f
from gateway.protocol.bounds import MAX_INSTRUCTIONS_BYTES
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_fields import OPENAI_VOICES

__all__ = [
    "OPENAI_VOICES", "PCM", "PCMA", "PCMU", "ConfigLimits", "SessionConfig", "Transcription", "TurnDetection",
    "apply_update", "beta_format", "engine_voice", "ga_format", "parse_beta_format", "parse_ga_format", "render",
]  # fmt: skip

PCM = AudioFormat("pcm16", 24000)
PCMU = AudioFormat("pcmu", 8000)
PCMA = AudioFormat("pcma", 8000)
_GA_FORMATS = {"audio/pcm": PCM, "audio/pcmu": PCMU, "audio/pcma": PCMA}
_BETA_FORMATS = {"pcm16": PCM, "g711_ulaw": PCMU, "g711_alaw": PCMA}


@dataclass(frozen=True, slots=True)
class TurnDetection:
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None  # server_vad: see gateway/session/turns.py
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"  # semantic_vad: see gateway/session/turns.py


@dataclass(frozen=True, slots=True)
class Transcription:
    model: str = "whisper-1"  # any name: it selects the engine's speech-to-text (a route may map it)
    language: str | None = None
    prompt: str | None = None
    languages: tuple[str, ...] | None = None
    keywords: tuple[str, ...] | None = None
    delay: str | None = None


@dataclass(frozen=True, slots=True)
class SessionConfig:
    model: str
    type: Literal["realtime", "transcription"] = "realtime"
    instructions: str = ""
    output_modalities: tuple[Literal["text", "audio"], ...] = ("audio",)
    input_format: AudioFormat = PCM
    output_format: AudioFormat = PCM
    voice: str = "alloy"
    custom_voice: bool = False  # voice came as {"id": ...}: the GA session echoes it as that object
    speed: float = 1.0
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    noise_reduction: dict[str, Any] | None = None  # validated {type, strength?}
    temperature: float = 0.8
    max_output_tokens: int | None = None  # None renders as "inf"
    tools: tuple[dict[str, Any], ...] = ()  # validated tool objects, rendered back as given
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    truncation: str | dict[str, Any] = "auto"
    include: tuple[str, ...] = ()
    # Accepted and echoed; no engine here acts on them (reported once).
    tracing: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
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
    ignored_fields: tuple[str, ...] = ()  # keys of WARN_PATHS the engine ignores


# Fields no engine of this gateway acts on: kept, echoed and reported.
GATEWAY_IGNORED = ("tracing", "prompt", "reasoning", "noise_reduction", "transcription.delay")

# Warning key -> (GA param, beta param), below ``session``.
WARN_PATHS: dict[str, tuple[str, str]] = {
    "instructions": ("instructions", "instructions"),
    "temperature": ("temperature", "temperature"),
    "voice": ("audio.output.voice", "voice"),
    "speed": ("audio.output.speed", "speed"),
    "tools": ("tools", "tools"),
    "tool_choice": ("tool_choice", "tool_choice"),
    "parallel_tool_calls": ("parallel_tool_calls", "parallel_tool_calls"),
    "max_output_tokens": ("max_output_tokens", "max_response_output_tokens"),
    "truncation": ("truncation", "truncation"),
    "include": ("include", "include"),
    "tracing": ("tracing", "tracing"),
    "prompt": ("prompt", "prompt"),
    "reasoning": ("reasoning", "reasoning"),
    "noise_reduction": ("audio.input.noise_reduction", "input_audio_noise_reduction"),
    "transcription.language": ("audio.input.transcription.language", "input_audio_transcription.language"),
    "transcription.prompt": ("audio.input.transcription.prompt", "input_audio_transcription.prompt"),
    "transcription.languages": ("audio.input.transcription.languages", "input_audio_transcription.languages"),
    "transcription.keywords": ("audio.input.transcription.keywords", "input_audio_transcription.keywords"),
    "transcription.delay": ("audio.input.transcription.delay", "input_audio_transcription.delay"),
}
_WHY = {
    "instructions": "'instructions' are kept, but this engine's model does not follow them (see /v1/models).",
    "tracing": "'tracing' is kept; the gateway writes no OpenAI traces (see /metrics and the logs).",
    "prompt": "'prompt' is kept; stored prompts live at OpenAI and are not available here.",
    "noise_reduction": "'noise_reduction' is kept; no noise reduction is applied to the input audio here.",
}


def _active(cfg: SessionConfig, key: str) -> bool:
    """Whether ``key`` asks the engine for something (a non-default value)."""
    if key.startswith("transcription."):
        tr = cfg.transcription
        return tr is not None and getattr(tr, key.split(".", 1)[1]) not in (None, ())
    value = getattr(cfg, key)
    default = getattr(SessionConfig(model=cfg.model), key)
    return bool(value != default and value not in (None, (), "auto"))


def warnings_for(
    old: SessionConfig, new: SessionConfig, limits: ConfigLimits, *, beta: bool, param: str = "session"
) -> list[tuple[str, str]]:
    """``(param, message)`` for each ignored field the update turned on or changed (one per param)."""
    out: dict[str, str] = {}
    for key in dict.fromkeys((*GATEWAY_IGNORED, *limits.ignored_fields)):
        if key not in WARN_PATHS or not _active(new, key):
            continue
        if _active(old, key) and _value(old, key) == _value(new, key):
            continue
        path = f"{param}.{WARN_PATHS[key][1 if beta else 0]}"
        name = path.rsplit(".", 1)[-1]
        out.setdefault(path, _WHY.get(key, f"'{name}' is accepted but not used by this engine."))
    return list(out.items())


def _value(cfg: SessionConfig, key: str) -> Any:
    if key.startswith("transcription."):
        return getattr(cfg.transcription, key.split(".", 1)[1], None)
    return getattr(cfg, key)


# --- parsing ----------------------------------------------------------------

_GA_TOP = {
    "type", "object", "id", "model", "output_modalities", "instructions", "audio", "tools", "tool_choice",
    "parallel_tool_calls", "max_output_tokens", "tracing", "truncation", "prompt", "include", "reasoning",
    "expires_at", "temperature", "reissue_interrupted_responses", "gateway_events",
}  # fmt: skip
_BETA_TOP = {
    "object", "id", "model", "modalities", "instructions", "voice", "input_audio_format",
    "output_audio_format", "input_audio_transcription", "turn_detection", "tools",
    "tool_choice", "temperature", "max_response_output_tokens", "speed", "tracing",
    "input_audio_noise_reduction", "expires_at", "include", "client_secret", "reissue_interrupted_responses",
    "gateway_events", "parallel_tool_calls",
}  # fmt: skip
_TD_KEYS = {
    "type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response",
    "idle_timeout_ms", "eagerness",
}  # fmt: skip


def parse_ga_format(value: Any, param: str) -> AudioFormat:
    fmt = f.obj(value, param)
    kind = fmt.get("type")
    if not isinstance(kind, str) or kind not in _GA_FORMATS:
        raise f.err(
            f"Unsupported audio format {kind!r}; use audio/pcm (24 kHz), audio/pcmu or audio/pcma.",
            f"{param}.type",
            Code.UNSUPPORTED_FORMAT,
        )
    result = _GA_FORMATS[kind]
    rate = fmt.get("rate", result.rate)
    if rate != result.rate:
        raise f.err(
            f"{kind} is only supported at {result.rate} Hz, got {rate}.", f"{param}.rate", Code.UNSUPPORTED_FORMAT
        )
    return result


def parse_beta_format(value: Any, param: str) -> AudioFormat:
    if not isinstance(value, str) or value not in _BETA_FORMATS:
        raise f.err(
            f"Unsupported audio format {value!r}; use pcm16, g711_ulaw or g711_alaw.", param, Code.UNSUPPORTED_FORMAT
        )
    return _BETA_FORMATS[value]


def _turn_detection(value: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    if value is None:
        return None
    td = f.obj(value, param)
    f.check_keys(td, _TD_KEYS, param)
    base = current or TurnDetection()
    kind = f.choice(td.get("type", base.type), f"{param}.type", ("server_vad", "semantic_vad"))
    idle = td.get("idle_timeout_ms", base.idle_timeout_ms if kind == base.type else None)
    return TurnDetection(
        type=kind,  # type: ignore[arg-type]
        threshold=f.num(td.get("threshold", base.threshold), f"{param}.threshold", 0.0, 1.0),
        prefix_padding_ms=f.integer(
            td.get("prefix_padding_ms", base.prefix_padding_ms), f"{param}.prefix_padding_ms", 0, 5000
        ),
        silence_duration_ms=f.integer(
            td.get("silence_duration_ms", base.silence_duration_ms), f"{param}.silence_duration_ms", 0, 10_000
        ),
        create_response=f.boolean(td.get("create_response", base.create_response), f"{param}.create_response"),
        interrupt_response=f.boolean(
            td.get("interrupt_response", base.interrupt_response), f"{param}.interrupt_response"
        ),
        idle_timeout_ms=None if idle is None else f.integer(idle, f"{param}.idle_timeout_ms", 5000, 30_000),
        eagerness=f.choice(td.get("eagerness", base.eagerness), f"{param}.eagerness", f.EAGERNESS),  # type: ignore[arg-type]
    )


def _transcription(value: Any, param: str) -> Transcription | None:
    if value is None:
        return None
    tr = f.obj(value, param)
    f.check_keys(tr, {"model", "language", "prompt", "languages", "keywords", "delay"}, param)
    model = tr.get("model")
    return Transcription(
        model="whisper-1" if model is None else f.string(model, f"{param}.model"),
        language=f.opt_string(tr.get("language"), f"{param}.language"),
        prompt=f.opt_string(tr.get("prompt"), f"{param}.prompt"),
        languages=None if tr.get("languages") is None else f.strings(tr["languages"], f"{param}.languages"),
        keywords=None if tr.get("keywords") is None else f.strings(tr["keywords"], f"{param}.keywords"),
        delay=None if tr.get("delay") is None else f.choice(tr["delay"], f"{param}.delay", f.TRANSCRIPTION_DELAYS),
    )


def apply_update(
    current: SessionConfig, update: Any, *, beta: bool, limits: ConfigLimits, param: str = "session"
) -> tuple[SessionConfig, list[tuple[str, str]]]:
    """Validate ``update`` whole and return the new config and the warnings.

    Raises ``ProtocolError`` (nothing applied) on the first invalid field.
    Warnings are ``(param, message)`` for fields the engine ignores.
    """
    upd = f.obj(update, param)
    changes: dict[str, Any] = {}
    if beta:
        f.check_keys(upd, _BETA_TOP, param)
        if "modalities" in upd:
            changes["output_modalities"] = f.modalities(upd["modalities"], f"{param}.modalities")
        if "voice" in upd:
            changes["voice"], changes["custom_voice"] = f.voice(upd["voice"], f"{param}.voice", limits.voices)
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
            changes["max_output_tokens"] = f.max_tokens(
                upd["max_response_output_tokens"], f"{param}.max_response_output_tokens"
            )
        if "speed" in upd:
            changes["speed"] = f.num(upd["speed"], f"{param}.speed", 0.25, 1.5)
        if "input_audio_noise_reduction" in upd:
            changes["noise_reduction"] = f.noise_reduction(
                upd["input_audio_noise_reduction"], f"{param}.input_audio_noise_reduction"
            )
    else:
        f.check_keys(upd, _GA_TOP, param)
        if "type" not in upd:  # as the API answers a GA session object without its type
            raise ProtocolError(
                Code.MISSING_FIELD, f"Missing required parameter: '{param}.type'.", param=f"{param}.type"
            )
        changes["type"] = f.choice(upd["type"], f"{param}.type", ("realtime", "transcription"))
        if "output_modalities" in upd:
            changes["output_modalities"] = f.modalities(upd["output_modalities"], f"{param}.output_modalities", ga=True)
        if "max_output_tokens" in upd:
            changes["max_output_tokens"] = f.max_tokens(upd["max_output_tokens"], f"{param}.max_output_tokens")
        if "audio" in upd:
            changes.update(_ga_audio(upd["audio"], f"{param}.audio", current, limits))
        if "reasoning" in upd:
            changes["reasoning"] = f.reasoning(upd["reasoning"], f"{param}.reasoning")
        if "truncation" in upd:
            changes["truncation"] = f.truncation(upd["truncation"], f"{param}.truncation")
        if "prompt" in upd:
            changes["prompt"] = f.prompt(upd["prompt"], f"{param}.prompt")
    if "instructions" in upd:
        changes["instructions"] = _instructions(upd["instructions"], f"{param}.instructions")
    if "temperature" in upd:
        changes["temperature"] = f.num(upd["temperature"], f"{param}.temperature", 0.0, 2.0)
    if "tools" in upd:
        changes["tools"] = f.tools(upd["tools"], f"{param}.tools", mcp=not beta)
    if "tool_choice" in upd:
        raw_choice = upd["tool_choice"]
        if beta and isinstance(raw_choice, str) and raw_choice not in ("auto", "none", "required"):
            raw_choice = {"type": "function", "name": raw_choice}  # beta: a function by its name
        changes["tool_choice"] = f.tool_choice(raw_choice, f"{param}.tool_choice")
    if "parallel_tool_calls" in upd:
        changes["parallel_tool_calls"] = f.boolean(upd["parallel_tool_calls"], f"{param}.parallel_tool_calls")
    if "include" in upd:
        changes["include"] = f.include(upd["include"], f"{param}.include")
    if "tracing" in upd:
        changes["tracing"] = f.tracing(upd["tracing"], f"{param}.tracing")
    if "reissue_interrupted_responses" in upd:
        changes["reissue_interrupted_responses"] = f.boolean(
            upd["reissue_interrupted_responses"], f"{param}.reissue_interrupted_responses"
        )
    if "gateway_events" in upd:
        changes["gateway_events"] = f.boolean(upd["gateway_events"], f"{param}.gateway_events")
    if "model" in upd and upd["model"] != current.model:
        raise f.err("The model of a session cannot change; open a new session.", f"{param}.model")

    new = replace(current, **changes)
    f.check_tool_choice_names(new.tool_choice, new.tools, f"{param}.tool_choice")
    return new, warnings_for(current, new, limits, beta=beta, param=param)


# The beta's transcription session (``transcription_session.update``): its keys.
_BETA_TRANSCRIPTION_TOP = {
    "modalities", "input_audio_format", "input_audio_transcription", "turn_detection",
    "input_audio_noise_reduction", "include", "client_secret",
}  # fmt: skip


def apply_transcription_update(
    current: SessionConfig, update: Any, *, limits: ConfigLimits
) -> tuple[SessionConfig, list[tuple[str, str]]]:
    """The beta's ``transcription_session.update``: the session becomes (or stays) a
    transcription session with these input settings. Raises ``ProtocolError`` as
    ``apply_update`` does; ``modalities`` may only be ``["text"]``, ``client_secret`` is
    the REST call's and ignored here."""
    upd = f.obj(update, "session")
    f.check_keys(upd, _BETA_TRANSCRIPTION_TOP, "session")
    if "modalities" in upd and upd["modalities"] != ["text"]:
        raise f.err("'session.modalities' of a transcription session can only be [\"text\"].", "session.modalities")
    settings = {k: v for k, v in upd.items() if k not in ("modalities", "client_secret")}
    new, warnings = apply_update(current, settings, beta=True, limits=limits)
    return replace(new, type="transcription"), warnings


# The beta's ``transcription_session.updated`` carries a ``client_secret``: the SDK's
# ``TranscriptionSession`` requires one ({value, expires_at}, not nullable), and its typed
# clients refuse the event without it. No key goes out over a socket (or into the journal, whose
# events a resume replays): it is this empty one, which opens nothing and expired at the epoch.
# (OpenAI's beta sent ``null`` there, which the SDK's model refuses; its docs: "not present when
# a session is updated via the WebSocket API".)
EMPTY_CLIENT_SECRET: dict[str, Any] = {"value": "", "expires_at": 0}


def render_beta_transcription(cfg: SessionConfig) -> dict[str, Any]:
    """The session of the beta's ``transcription_session.updated``, in the SDK's
    ``TranscriptionSession`` shape (``client_secret``: ``EMPTY_CLIENT_SECRET``)."""
    td = cfg.turn_detection
    turn_detection: dict[str, Any] | None = None
    if td is not None:
        turn_detection = {"type": td.type}
        if td.type == "server_vad":
            turn_detection |= {
                "threshold": td.threshold,
                "prefix_padding_ms": td.prefix_padding_ms,
                "silence_duration_ms": td.silence_duration_ms,
            }
    return {
        "client_secret": dict(EMPTY_CLIENT_SECRET),
        "modalities": ["text"],
        "input_audio_format": beta_format(cfg.input_format),
        "input_audio_transcription": _tr_dict(cfg.transcription, beta=True),
        "turn_detection": turn_detection,
    }


def _ga_audio(value: Any, param: str, current: SessionConfig, limits: ConfigLimits) -> dict[str, Any]:
    audio = f.obj(value, param)
    f.check_keys(audio, {"input", "output"}, param)
    changes: dict[str, Any] = {}
    if "input" in audio:
        inp = f.obj(audio["input"], f"{param}.input")
        f.check_keys(inp, {"format", "transcription", "turn_detection", "noise_reduction"}, f"{param}.input")
        if "format" in inp:
            changes["input_format"] = parse_ga_format(inp["format"], f"{param}.input.format")
        if "transcription" in inp:
            changes["transcription"] = _transcription(inp["transcription"], f"{param}.input.transcription")
        if "turn_detection" in inp:
            changes["turn_detection"] = _turn_detection(
                inp["turn_detection"], f"{param}.input.turn_detection", current.turn_detection
            )
        if "noise_reduction" in inp:
            changes["noise_reduction"] = f.noise_reduction(inp["noise_reduction"], f"{param}.input.noise_reduction")
    if "output" in audio:
        out = f.obj(audio["output"], f"{param}.output")
        f.check_keys(out, {"format", "voice", "speed"}, f"{param}.output")
        if "format" in out:
            changes["output_format"] = parse_ga_format(out["format"], f"{param}.output.format")
        if "voice" in out:
            changes["voice"], changes["custom_voice"] = f.voice(out["voice"], f"{param}.output.voice", limits.voices)
        if "speed" in out:
            changes["speed"] = f.num(out["speed"], f"{param}.output.speed", 0.25, 1.5)
    return changes


# --- rendering --------------------------------------------------------------


def ga_format(fmt: AudioFormat) -> dict[str, Any]:
    if fmt.codec == "pcm16":
        return {"type": "audio/pcm", "rate": fmt.rate}
    return {"type": "audio/pcmu" if fmt.codec == "pcmu" else "audio/pcma"}


def beta_format(fmt: AudioFormat) -> str:
    return {"pcm16": "pcm16", "pcmu": "g711_ulaw", "pcma": "g711_alaw"}[fmt.codec]


def _td_dict(td: TurnDetection | None, *, beta: bool = False) -> dict[str, Any] | None:
    if td is None:
        return None
    common = {"type": td.type, "create_response": td.create_response, "interrupt_response": td.interrupt_response}
    if td.type == "semantic_vad":
        return {**common, "eagerness": td.eagerness}
    out: dict[str, Any] = {
        **common,
        "threshold": td.threshold,
        "prefix_padding_ms": td.prefix_padding_ms,
        "silence_duration_ms": td.silence_duration_ms,
    }
    if not beta:  # the beta API has no idle_timeout_ms
        out["idle_timeout_ms"] = td.idle_timeout_ms
    return out


def _tr_dict(tr: Transcription | None, *, beta: bool = False) -> dict[str, Any] | None:
    if tr is None:
        return None
    out: dict[str, Any] = {"model": tr.model, "language": tr.language, "prompt": tr.prompt}
    if not beta:  # GA only: the beta API had none of these
        for key in ("languages", "keywords"):
            if getattr(tr, key) is not None:
                out[key] = list(getattr(tr, key))
        if tr.delay is not None:
            out["delay"] = tr.delay
    return out


def _audio_input(cfg: SessionConfig) -> dict[str, Any]:
    return {
        "format": ga_format(cfg.input_format),
        "transcription": _tr_dict(cfg.transcription),
        "noise_reduction": cfg.noise_reduction,
        "turn_detection": _td_dict(cfg.turn_detection),
    }


def render(cfg: SessionConfig, *, session_id: str, expires_at: int, beta: bool, rest: bool = False) -> dict[str, Any]:
    """The session object, in the shape the SDK types it where it goes out. A custom voice
    is the object ``{"id": ...}`` in the GA session events (``RealtimeAudioConfigOutput``
    types it so); the beta's session, and the GA REST answer (``rest``: the session of
    ``client_secrets``, typed ``RealtimeSessionCreateResponse``), type a voice as a string."""
    max_tokens: int | str = "inf" if cfg.max_output_tokens is None else cfg.max_output_tokens
    tool_choice = cfg.tool_choice
    if beta:
        if isinstance(tool_choice, dict):  # the beta API names a forced function by its name
            tool_choice = str(tool_choice.get("name", "required"))
        nr = cfg.noise_reduction
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
            "input_audio_transcription": _tr_dict(cfg.transcription, beta=True),
            "input_audio_noise_reduction": None if nr is None else {"type": nr["type"]},
            "turn_detection": _td_dict(cfg.turn_detection, beta=True),
            "tools": [f.public_tool(t) for t in cfg.tools],
            "tool_choice": tool_choice,
            "temperature": cfg.temperature,
            "max_response_output_tokens": max_tokens,
            "tracing": cfg.tracing,
            "reissue_interrupted_responses": cfg.reissue_interrupted_responses,
            "gateway_events": cfg.gateway_events,
        }
    if cfg.type == "transcription":
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "expires_at": expires_at,
            "audio": {"input": _audio_input(cfg)},
            "include": list(cfg.include) or None,
            "gateway_events": cfg.gateway_events,
        }
    voice: str | dict[str, str] = {"id": cfg.voice} if cfg.custom_voice and not rest else cfg.voice
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": cfg.model,
        "expires_at": expires_at,
        "output_modalities": list(cfg.output_modalities),
        "instructions": cfg.instructions,
        "audio": {
            "input": _audio_input(cfg),
            "output": {"format": ga_format(cfg.output_format), "voice": voice, "speed": cfg.speed},
        },
        "tools": [f.public_tool(t) for t in cfg.tools],
        "tool_choice": tool_choice,
        "parallel_tool_calls": cfg.parallel_tool_calls,
        "max_output_tokens": max_tokens,
        "tracing": cfg.tracing,
        "truncation": cfg.truncation,
        "prompt": cfg.prompt,
        "reasoning": cfg.reasoning,
        "include": list(cfg.include) or None,
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


def _instructions(value: Any, param: str) -> str:
    text = f.string(value, param)
    size = len(text) if len(text) * 4 <= MAX_INSTRUCTIONS_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_INSTRUCTIONS_BYTES:
        raise f.err(
            f"Invalid '{param}': string too long. Expected at most {MAX_INSTRUCTIONS_BYTES} bytes (UTF-8), but "
            f"got {size}.",
            param,
            Code.STRING_TOO_LONG,
        )
    return text
