"""GPT-Live's session configuration: parsed strictly, rendered as the API does (pure).

The shapes are openai-python's ``openai.types.live`` (revision 3.63.0): the
``SessionConfig`` a primary WebSocket's ``session.start`` carries, the
``MediaSessionConfigParam`` of ``POST /v1/live/sessions`` (WebRTC: no
``audio.format``, plus ``idle_timeout_s`` and ``wake_policy``), the
``SessionUpdateConfig`` of ``session.update`` (``delegation`` and ``triggers``
only) and the ``SessionResource`` every ``session.started``/``.updated``/
``.closed`` carries back.

As the API does, a configuration is strict: an unknown field anywhere is
refused (``unknown_parameter``, naming it), and nothing is applied. What this
gateway cannot do is refused with a coded error, never silently dropped:
Decisions (``delegation.type: decisions``, non-empty ``triggers``) run on
OpenAI's Decisions API, which a self-hosted model has no counterpart of
(``decisions_unsupported``).

``LiveSettings`` is what the Live dialect keeps beyond the engine-facing
``SessionConfig`` (``gateway/protocol/session_config.py``), which ``to_session``
derives: the voice as given, the audio format, the delegation, the initial
input, the data-channel allow-lists.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat, Codec
from gateway.protocol import session_fields as f
from gateway.protocol.bounds import MAX_INSTRUCTIONS_BYTES
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import SessionConfig, Transcription, TurnDetection, engine_voice

DEFAULT_VOICE = "marin"  # the API's default
DEFAULT_FORMAT = AudioFormat("pcm16", 24000)  # the API's default: raw mono PCM16 at 24 kHz
BUILT_IN_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "beacon",
    "bossa",
    "cedar",
    "cinder",
    "coral",
    "delta",
    "echo",
    "gleam",
    "marin",
    "meridian",
    "quartz",
    "ripple",
    "sage",
    "shida",
    "shimmer",
    "stone",
    "tempo",
    "verse",
    "vesper",
    "willow",
)  # fmt: skip  (openai.types.live.BuiltInVoice)
MAX_INITIAL_ITEMS = 128  # the API's bound on ``input``: more is invalid_value
MAX_APPEND_CHARS = 4000  # instructions/thinking/commentary appends (the API: 500 tokens; ~8 characters each)
MIN_IDLE_TIMEOUT_S, MAX_IDLE_TIMEOUT_S = 1, 3600
WAKE_VAD_THRESHOLD = 0.5  # wake_policy.vad_threshold's default (the API's)

DECISIONS_UNSUPPORTED = "decisions_unsupported"
_DECISIONS_MESSAGE = (
    "Decisions run on OpenAI's Decisions API, which this gateway does not serve; delegate to 'client' "
    "(your application) or 'responses' (an OpenAI-compatible Responses backend) instead."
)

_START_KEYS = frozenset(
    {"model", "audio", "client", "delegation", "input", "instructions", "safety_identifier", "store", "triggers"}
)
_MEDIA_KEYS = _START_KEYS | {"idle_timeout_s", "wake_policy"}
_UPDATE_KEYS = frozenset({"delegation", "triggers"})
_FORMATS = {"audio/pcm": (16000, 24000), "audio/pcmu": (8000,), "audio/pcma": (8000,)}
_CODECS: dict[str, Codec] = {"audio/pcm": "pcm16", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
_RESPONSES_KEYS = frozenset(
    {"model", "instructions", "max_output_tokens", "parallel_tool_calls", "reasoning", "service_tier", "text",
     "tool_choice", "tools"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Delegation:
    """Who handles the tasks the Live model delegates: ``client`` (the application, through
    ``session.delegation.created`` and appends that name it) or ``responses`` (the gateway
    runs them on the configured Responses backend)."""

    type: Literal["client", "responses"] = "client"
    acknowledgement_delay_ms: int | None = None
    responses: dict[str, Any] | None = None  # the Responses settings (model, instructions, tools, ...)

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.acknowledgement_delay_ms is not None:
            out["acknowledgement_delay_ms"] = self.acknowledgement_delay_ms
        if self.responses is not None:
            out["responses"] = copy.deepcopy(self.responses)
        return out


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """A Live session's settings (see the module docstring)."""

    model: str
    instructions: str | None = None
    voice: str | dict[str, str] = DEFAULT_VOICE  # as given: a built-in name or {"id": ...}
    audio_format: AudioFormat = DEFAULT_FORMAT
    delegation: Delegation | None = None  # None: the application (as {"type": "client"})
    input: tuple[dict[str, Any], ...] = ()  # the initial text history, as given (validated)
    store: bool = False
    safety_identifier: str | None = None
    data_channel: dict[str, Any] | None = None  # client.data_channel: the allow-lists, as given (validated)
    idle_timeout_s: int | None = None  # WebRTC and SIP: inference pauses after this long idle
    wake_policy: dict[str, Any] | None = None  # WebRTC and SIP: {"type": "speech", "vad_threshold"?}
    media: bool = False  # negotiated by a media transport (WebRTC, SIP): no audio.format

    @property
    def delegation_type(self) -> Literal["client", "responses"]:
        return self.delegation.type if self.delegation is not None else "client"

    def to_session(self, base: SessionConfig, engine_voices: tuple[str, ...], default_voice: str | None,
                   *, vad: bool) -> SessionConfig:  # fmt: skip
        """The engine-facing configuration: the Live model runs its own turns (server VAD commits
        and answers, speech over an answer interrupts it), transcribes what it hears, speaks in
        the session's format and voice."""
        name = self.voice["id"] if isinstance(self.voice, dict) else self.voice
        return replace(
            base,
            model=self.model,
            instructions=self.instructions or "",
            input_format=self.audio_format,
            output_format=self.audio_format,
            voice=engine_voice(name, engine_voices, default_voice) or name,
            transcription=Transcription(),
            turn_detection=TurnDetection(create_response=True, interrupt_response=True) if vad else None,
            output_modalities=("audio",),
        )


def parse_start(value: Any, *, media: bool = False, param: str = "session") -> LiveSettings:
    """``session.start``'s ``session`` (``media``: a WebRTC or SIP session's, as ``POST
    /v1/live/sessions`` and ``accept`` take it). Raises ProtocolError, naming the field."""
    cfg = f.obj(value, param)
    f.check_keys(cfg, _MEDIA_KEYS if media else _START_KEYS, param)
    model = cfg.get("model")
    if model is None:
        raise ProtocolError(Code.MISSING_FIELD, f"Missing required parameter: '{param}.model'.", param=f"{param}.model")
    settings = LiveSettings(model=_nonblank(model, f"{param}.model"), media=media)
    changes: dict[str, Any] = {}
    if cfg.get("instructions") is not None:
        changes["instructions"] = _bounded(cfg["instructions"], f"{param}.instructions", MAX_INSTRUCTIONS_BYTES)
    if "audio" in cfg:
        changes.update(_audio(cfg["audio"], f"{param}.audio", media=media))
    if "client" in cfg:
        changes["data_channel"] = _client(cfg["client"], f"{param}.client")
    if "delegation" in cfg:
        changes["delegation"] = _delegation(cfg["delegation"], f"{param}.delegation")
    if "input" in cfg:
        changes["input"] = _initial_items(cfg["input"], f"{param}.input")
    if "store" in cfg:
        changes["store"] = f.boolean(cfg["store"], f"{param}.store")
    if cfg.get("safety_identifier") is not None:
        changes["safety_identifier"] = _bounded(cfg["safety_identifier"], f"{param}.safety_identifier", 512)
    if "triggers" in cfg:
        _triggers(cfg["triggers"], f"{param}.triggers")
    if "idle_timeout_s" in cfg:
        changes["idle_timeout_s"] = f.integer(
            cfg["idle_timeout_s"], f"{param}.idle_timeout_s", MIN_IDLE_TIMEOUT_S, MAX_IDLE_TIMEOUT_S
        )
    if "wake_policy" in cfg:
        changes["wake_policy"] = _wake_policy(cfg["wake_policy"], f"{param}.wake_policy")
    if changes.get("idle_timeout_s") is not None and changes.get("wake_policy") is None:
        raise ProtocolError(Code.INVALID_VALUE, f"'{param}.idle_timeout_s' pauses a session with a speech wake "
                            f"policy (only speech wakes it): set '{param}.wake_policy' too.",
                            param=f"{param}.idle_timeout_s")  # fmt: skip
    return replace(settings, **changes)


def parse_update(current: LiveSettings, value: Any, param: str = "session") -> LiveSettings:
    """``session.update``: ``delegation`` (its type cannot change; omitted settings keep their
    values) and ``triggers``; every other field is immutable once the session started."""
    upd = f.obj(value, param)
    for key in upd:
        if key not in _UPDATE_KEYS:
            why = (
                f"'{param}.{key}' cannot change once the session started (session.update takes "
                "'delegation' and 'triggers' only)."
                if key in _MEDIA_KEYS
                else f"Unknown parameter: '{param}.{key}'."
            )
            raise ProtocolError(Code.UNKNOWN_PARAMETER, why, param=f"{param}.{key}")
    if "triggers" in upd:
        _triggers(upd["triggers"], f"{param}.triggers")
    if "delegation" not in upd:
        return current
    raw = upd["delegation"]
    p = f"{param}.delegation"
    if raw is None:
        if current.delegation_type != "client":
            raise ProtocolError(Code.INVALID_VALUE, "The delegation type cannot change; open a new session.", param=p)
        return current
    d = f.obj(raw, p)
    kind = d.get("type")
    if kind == "decisions":
        raise ProtocolError(DECISIONS_UNSUPPORTED, _DECISIONS_MESSAGE, param=f"{p}.type")
    if kind != current.delegation_type:
        raise ProtocolError(
            Code.INVALID_VALUE,
            f"The delegation type cannot change ({current.delegation_type!r} to {kind!r}); open a new session.",
            param=f"{p}.type",
        )
    f.check_keys(d, {"type", "acknowledgement_delay_ms", "responses"} if kind == "responses" else
                 {"type", "acknowledgement_delay_ms"}, p)  # fmt: skip
    old = current.delegation or Delegation()
    delay = old.acknowledgement_delay_ms
    if "acknowledgement_delay_ms" in d:
        delay = f.integer(d["acknowledgement_delay_ms"], f"{p}.acknowledgement_delay_ms", 0, 60_000)
    responses = old.responses
    if d.get("responses") is not None:
        update = _responses(d["responses"], f"{p}.responses", partial=True)
        responses = {**(responses or {}), **update}
    return replace(current, delegation=Delegation(old.type, delay, responses))


def parse_fork(current: LiveSettings, value: Any, *, media: bool, param: str = "session") -> LiveSettings:
    """A fork's ``session`` (``ForkSessionConfig``; WebRTC: ``MediaSessionForkConfigParam``): the
    stored session's settings, with ``audio.format`` (WebSocket forks), ``client`` (WebRTC forks),
    the Responses backend's settings (a session that delegates to it already) and ``store``."""
    cfg = f.obj(value, param)
    f.check_keys(cfg, {"client", "delegation", "store"} if media else {"audio", "delegation", "store"}, param)
    changes: dict[str, Any] = {"media": media}
    if cfg.get("audio") is not None:
        audio = f.obj(cfg["audio"], f"{param}.audio")
        f.check_keys(audio, {"format"}, f"{param}.audio")
        changes.update(_audio(audio, f"{param}.audio", media=False))
    if cfg.get("client") is not None:
        changes["data_channel"] = _client(cfg["client"], f"{param}.client")
    if "store" in cfg:
        changes["store"] = f.boolean(cfg["store"], f"{param}.store")
    forked = replace(current, **changes)
    if cfg.get("delegation") is not None:
        if current.delegation_type != "responses":
            raise ProtocolError(Code.INVALID_VALUE, "Only a stored session that delegates to Responses takes "
                                "delegation overrides in a fork.", param=f"{param}.delegation")  # fmt: skip
        forked = parse_update(forked, {"delegation": cfg["delegation"]}, param)
    return forked


def render(settings: LiveSettings, *, session_id: str, expires_at: int) -> dict[str, Any]:
    """The ``SessionResource``: the resolved configuration, server defaults included."""
    audio: dict[str, Any] = {"output": {"voice": copy.deepcopy(settings.voice)}}
    if not settings.media:
        fmt = settings.audio_format
        audio["format"] = {"type": _format_name(fmt), "rate": fmt.rate}
    out: dict[str, Any] = {
        "id": session_id,
        "expires_at": expires_at,
        "model": settings.model,
        "status": "active",
        "audio": audio,
        "delegation": (settings.delegation or Delegation()).render(),
        "input": [copy.deepcopy(item) for item in settings.input],
        "store": settings.store,
    }
    if settings.instructions is not None:
        out["instructions"] = settings.instructions
    if settings.safety_identifier is not None:
        out["safety_identifier"] = settings.safety_identifier
    if settings.data_channel is not None:
        out["client"] = {"data_channel": copy.deepcopy(settings.data_channel)}
    return out


def to_dict(settings: LiveSettings) -> dict[str, Any]:
    """For the snapshot (``from_dict`` reads it back on any replica)."""
    d = settings.delegation
    return {
        "model": settings.model,
        "instructions": settings.instructions,
        "voice": settings.voice,
        "format": [settings.audio_format.codec, settings.audio_format.rate],
        "delegation": None if d is None else [d.type, d.acknowledgement_delay_ms, d.responses],
        "input": list(settings.input),
        "store": settings.store,
        "safety_identifier": settings.safety_identifier,
        "data_channel": settings.data_channel,
        "idle_timeout_s": settings.idle_timeout_s,
        "wake_policy": settings.wake_policy,
        "media": settings.media,
    }


def from_dict(d: dict[str, Any]) -> LiveSettings:
    delegation = d["delegation"]
    return LiveSettings(
        model=d["model"],
        instructions=d["instructions"],
        voice=d["voice"],
        audio_format=AudioFormat(_codec(d["format"][0]), d["format"][1]),
        delegation=None if delegation is None else Delegation(delegation[0], delegation[1], delegation[2]),
        input=tuple(d["input"]),
        store=d["store"],
        safety_identifier=d["safety_identifier"],
        data_channel=d["data_channel"],
        idle_timeout_s=d["idle_timeout_s"],
        wake_policy=d["wake_policy"],
        media=d["media"],
    )


# --- fields ------------------------------------------------------------------------------


def _nonblank(value: Any, param: str) -> str:
    text = f.string(value, param)
    if not text.strip():
        raise ProtocolError(Code.INVALID_VALUE, f"'{param}' must not be blank.", param=param)
    return text


def _bounded(value: Any, param: str, limit: int) -> str:
    text = f.string(value, param)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ProtocolError(
            Code.STRING_TOO_LONG,
            f"Invalid '{param}': string too long. Expected at most {limit} bytes (UTF-8), but got {size}.",
            param=param,
        )
    return text


def _codec(name: str) -> Codec:
    return next(codec for codec in _CODECS.values() if codec == name)


def _format_name(fmt: AudioFormat) -> str:
    return next(name for name, codec in _CODECS.items() if codec == fmt.codec)


def _audio(value: Any, param: str, *, media: bool) -> dict[str, Any]:
    audio = f.obj(value, param)
    f.check_keys(audio, {"output"} if media else {"format", "output"}, param)
    out: dict[str, Any] = {}
    if audio.get("format") is not None:
        fmt = f.obj(audio["format"], f"{param}.format")
        f.check_keys(fmt, {"type", "rate"}, f"{param}.format")
        kind = f.choice(fmt.get("type"), f"{param}.format.type", tuple(_FORMATS))
        rates = _FORMATS[kind]
        rate = fmt.get("rate", rates[-1])
        if isinstance(rate, bool) or rate not in rates:
            allowed = " or ".join(str(r) for r in rates)
            raise ProtocolError(
                Code.INVALID_VALUE, f"'{param}.format.rate' must be {allowed} for {kind}.", param=f"{param}.format.rate"
            )
        out["audio_format"] = AudioFormat(_CODECS[kind], int(rate))
    if audio.get("output") is not None:
        output = f.obj(audio["output"], f"{param}.output")
        f.check_keys(output, {"voice"}, f"{param}.output")
        if output.get("voice") is not None:
            out["voice"] = _voice(output["voice"], f"{param}.output.voice")
    return out


def _voice(value: Any, param: str) -> str | dict[str, str]:
    if isinstance(value, dict):
        f.check_keys(value, {"id"}, param)
        return {"id": _nonblank(value.get("id"), f"{param}.id")}
    name = f.string(value, param)
    if name not in BUILT_IN_VOICES:
        raise ProtocolError(
            Code.INVALID_VALUE,
            f"Unknown voice {name!r}; choose one of: {', '.join(BUILT_IN_VOICES)} (or a custom voice as "
            '{"id": ...}).',
            param=param,
        )
    return name


def _client(value: Any, param: str) -> dict[str, Any]:
    client = f.obj(value, param)
    f.check_keys(client, {"data_channel"}, param)
    dc = f.obj(client.get("data_channel"), f"{param}.data_channel")
    p = f"{param}.data_channel"
    f.check_keys(dc, {"allowed_client_events", "allowed_server_events"}, p)
    out: dict[str, Any] = {}
    if dc.get("allowed_client_events") is not None:
        events = dc["allowed_client_events"]
        out["allowed_client_events"] = (
            "all" if events == "all" else list(f.strings(events, f"{p}.allowed_client_events"))
        )
    if dc.get("allowed_server_events") is not None:
        events = dc["allowed_server_events"]
        if events == "all":
            out["allowed_server_events"] = "all"
        else:
            if not isinstance(events, list):
                raise ProtocolError(Code.INVALID_TYPE, f"'{p}.allowed_server_events' must be 'all' or an array.",
                                    param=f"{p}.allowed_server_events")  # fmt: skip
            out["allowed_server_events"] = [
                _selector(s, f"{p}.allowed_server_events[{i}]") for i, s in enumerate(events)
            ]
    return out


def _selector(value: Any, param: str) -> dict[str, str]:
    """A server event selector: ``{"type": ...}``, and for ``response.event`` its ``response_event``."""
    sel = f.obj(value, param)
    f.check_keys(sel, {"type", "response_event"}, param)
    kind = _nonblank(sel.get("type"), f"{param}.type")
    out = {"type": kind}
    if kind == "response.event":
        out["response_event"] = _nonblank(sel.get("response_event"), f"{param}.response_event")
    elif "response_event" in sel:
        raise ProtocolError(Code.INVALID_VALUE, f"'{param}.response_event' is only for type 'response.event'.",
                            param=f"{param}.response_event")  # fmt: skip
    return out


def _delegation(value: Any, param: str) -> Delegation | None:
    if value is None:
        return None
    d = f.obj(value, param)
    kind = d.get("type")
    if kind == "decisions":
        raise ProtocolError(DECISIONS_UNSUPPORTED, _DECISIONS_MESSAGE, param=f"{param}.type")
    kind = f.choice(kind, f"{param}.type", ("client", "responses"))
    f.check_keys(d, {"type", "acknowledgement_delay_ms"} | ({"responses"} if kind == "responses" else set()), param)
    delay = None
    if d.get("acknowledgement_delay_ms") is not None:
        delay = f.integer(d["acknowledgement_delay_ms"], f"{param}.acknowledgement_delay_ms", 0, 60_000)
    if kind == "client":
        return Delegation("client", delay)
    if d.get("responses") is None:
        raise ProtocolError(Code.MISSING_FIELD, f"Missing required parameter: '{param}.responses'.",
                            param=f"{param}.responses")  # fmt: skip
    return Delegation("responses", delay, _responses(d["responses"], f"{param}.responses", partial=False))


def _responses(value: Any, param: str, *, partial: bool) -> dict[str, Any]:
    """The Responses backend's settings, kept as given (they go into each delegated request)."""
    r = f.obj(value, param)
    f.check_keys(r, _RESPONSES_KEYS, param)
    if not partial or "model" in r:
        _nonblank(r.get("model"), f"{param}.model")
    if r.get("instructions") is not None:
        _bounded(r["instructions"], f"{param}.instructions", MAX_INSTRUCTIONS_BYTES)
    if r.get("max_output_tokens") is not None:
        f.integer(r["max_output_tokens"], f"{param}.max_output_tokens", 1, 1 << 20)
    if r.get("parallel_tool_calls") is not None:
        f.boolean(r["parallel_tool_calls"], f"{param}.parallel_tool_calls")
    if r.get("tools") is not None:
        tools = r["tools"]
        if not isinstance(tools, list) or len(tools) > f.MAX_TOOLS:
            raise ProtocolError(Code.INVALID_VALUE, f"'{param}.tools' must be an array of at most {f.MAX_TOOLS} "
                                "tools.", param=f"{param}.tools")  # fmt: skip
        for i, tool in enumerate(tools):
            t = f.obj(tool, f"{param}.tools[{i}]")
            if t.get("type") != "function":
                raise ProtocolError(
                    Code.UNSUPPORTED,
                    f"Tools of type {t.get('type')!r} run at OpenAI; this gateway's Responses delegation offers "
                    "function tools (their calls come back to your application as response.event).",
                    param=f"{param}.tools[{i}].type",
                )
            f.check_keys(t, {"type", "name", "description", "parameters", "strict"}, f"{param}.tools[{i}]")
            _nonblank(t.get("name"), f"{param}.tools[{i}].name")
    return {k: copy.deepcopy(v) for k, v in r.items() if v is not None}


def _initial_items(value: Any, param: str) -> tuple[dict[str, Any], ...]:
    """Text-only history: developer, user and assistant messages, one text part each."""
    if not isinstance(value, list):
        raise ProtocolError(Code.INVALID_TYPE, f"'{param}' must be an array.", param=param)
    if len(value) > MAX_INITIAL_ITEMS:
        raise ProtocolError(Code.INVALID_VALUE, f"'{param}' may hold at most {MAX_INITIAL_ITEMS} messages.",
                            param=param)  # fmt: skip
    items = []
    for i, raw in enumerate(value):
        p = f"{param}[{i}]"
        item = f.obj(raw, p)
        role = f.choice(item.get("role"), f"{p}.role", ("developer", "user", "assistant"))
        f.check_keys(item, {"role", "content", "id", "status", "type"}, p)
        if item.get("type") not in (None, "message"):
            raise ProtocolError(Code.INVALID_VALUE, f"'{p}.type' must be 'message'.", param=f"{p}.type")
        if item.get("status") not in (None, "incomplete", "completed"):
            raise ProtocolError(Code.INVALID_VALUE, f"'{p}.status' must be 'incomplete' or 'completed'.",
                                param=f"{p}.status")  # fmt: skip
        if item.get("id") is not None:
            f.string(item["id"], f"{p}.id")
        content = item.get("content")
        if not isinstance(content, list) or len(content) != 1:
            raise ProtocolError(Code.INVALID_VALUE, f"'{p}.content' must hold exactly one text part.",
                                param=f"{p}.content")  # fmt: skip
        part = f.obj(content[0], f"{p}.content[0]")
        f.check_keys(part, {"text", "type"}, f"{p}.content[0]")
        kinds = ("text", "output_text") if role == "assistant" else ("input_text",)
        if part.get("type") is not None and part["type"] not in kinds:
            raise ProtocolError(Code.INVALID_VALUE, f"'{p}.content[0].type' must be one of {', '.join(kinds)}.",
                                param=f"{p}.content[0].type")  # fmt: skip
        _bounded(part.get("text"), f"{p}.content[0].text", MAX_INSTRUCTIONS_BYTES)
        items.append(copy.deepcopy(item))
    return tuple(items)


def _triggers(value: Any, param: str) -> None:
    """Decisions triggers: an empty list (none) is all this gateway takes."""
    if value is None:
        return
    if not isinstance(value, list):
        raise ProtocolError(Code.INVALID_TYPE, f"'{param}' must be an array.", param=param)
    if value:
        raise ProtocolError(DECISIONS_UNSUPPORTED, _DECISIONS_MESSAGE, param=param)


def _wake_policy(value: Any, param: str) -> dict[str, Any]:
    w = f.obj(value, param)
    f.check_keys(w, {"type", "vad_threshold"}, param)
    f.choice(w.get("type"), f"{param}.type", ("speech",))
    out: dict[str, Any] = {"type": "speech"}
    if w.get("vad_threshold") is not None:
        out["vad_threshold"] = f.num(w["vad_threshold"], f"{param}.vad_threshold", 0.0, 1.0)
    return out


def initial_text(item: dict[str, Any]) -> tuple[str, str]:
    """(role, text) of an initial history message (``developer`` becomes the engine's ``system``)."""
    role = item["role"]
    return ("system" if role == "developer" else role), str(item["content"][0]["text"])
