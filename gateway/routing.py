"""Model routing: the ``model`` a client asks for picks an engine.

Routes come from the ``models`` setting: a JSON document, inline or in a
file, listing ``{"name", "engine", ...engine options}``::

    {"models": [
        {"name": "omni-cascade", "engine": "cascade"},
        {"name": "tiny-llama", "engine": "vllm", "model": "/models/tiny", "dtype": "float32"},
        {"name": "qwen-omni", "engine": "remote", "upstreams": ["ws://gpu-1:8091"]},
        {"name": "*", "engine": "cascade"}
    ]}

A route named ``*`` catches every other name, and a name ending in ``*`` every
name it begins (``"gpt-realtime*"``); an exact name wins over a prefix, a longer
prefix over a shorter one. A session that asks for a model no route matches is
refused at connect (``model_not_found``, close 4004), as vLLM and OpenAI refuse
an unknown model: a misspelt name fails loudly instead of reaching some engine.

Without the ``models`` setting the gateway serves ``model`` → ``engine``, and
OpenAI's realtime model names (``OPENAI_NAMES``: what OpenAI's SDKs and the agent
frameworks send when the user names none, e.g. ``gpt-realtime-2.1``, ``gpt-live-1``)
as aliases of it, so that those clients work unchanged; any other name is refused.
A deployment that wants every name served adds ``{"name": "*", ...}``.

Routes with the same engine and options share one engine instance (and its
orchestrator: its admission bounds are the engine's).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import Settings
from orchestrator.engine import Engine

CATCH_ALL = "*"
# OpenAI's realtime model families (GA, preview and GPT-Live): the defaults of OpenAI's SDKs
# and of openai-agents, pipecat and livekit-agents. The default route answers to them.
OPENAI_NAMES = ("gpt-realtime*", "gpt-4o-realtime*", "gpt-4o-mini-realtime*", "gpt-live*")


def is_pattern(name: str) -> bool:
    """A catch-all or a prefix route: not a name a client can list."""
    return name.endswith(CATCH_ALL)


@dataclass(frozen=True, slots=True)
class RouteSpec:
    name: str
    engine: str
    options: dict[str, Any]

    @property
    def key(self) -> str:
        """Routes with equal keys share an engine."""
        return json.dumps([self.engine, self.options], sort_keys=True)


class RoutingError(ValueError):
    pass


def default_engine_options(settings: Settings) -> dict[str, Any]:
    """Engine options of the default route, from the flat settings."""
    if settings.engine == "remote":
        options: dict[str, Any] = {"upstreams": list(settings.upstreams)}
        if settings.upstream_api_key:
            options["api_key"] = settings.upstream_api_key
        return options
    if settings.engine in ("omni", "vllm"):
        return {"model": settings.engine_model or settings.model}
    if settings.engine == "cascade" and settings.thinker == "vllm":
        return {"thinker": "vllm", "thinker_model": settings.engine_model or settings.model}
    return {}


def parse_routes(document: str | None, settings: Settings) -> list[RouteSpec]:
    """The routes of ``document`` (inline JSON or a file path), or the default route and its OpenAI aliases."""
    if not document:
        options = default_engine_options(settings)
        aliases = [RouteSpec(name, settings.engine, options) for name in OPENAI_NAMES if name != settings.model]
        return [RouteSpec(settings.model, settings.engine, options), *aliases]
    text = document if document.lstrip()[:1] in ("{", "[") else Path(document).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RoutingError(f"models: not valid JSON: {exc}") from None
    entries = data.get("models") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise RoutingError('models: expected {"models": [{"name": ..., "engine": ...}, ...]}')
    routes: list[RouteSpec] = []
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("engine"), str)
        ):
            raise RoutingError(f"models[{i}]: needs string 'name' and 'engine'")
        options = {k: v for k, v in entry.items() if k not in ("name", "engine")}
        routes.append(RouteSpec(entry["name"], entry["engine"], options))
    names = [r.name for r in routes]
    if len(names) != len(set(names)):
        raise RoutingError("models: duplicate model names")
    return routes


class Router:
    """Resolves a model name to its engine, building each distinct engine once."""

    def __init__(self, specs: list[RouteSpec], build: Callable[[RouteSpec], Engine]) -> None:
        self.specs = specs
        self.engines: dict[str, Engine] = {}  # by RouteSpec.key
        self._by_name: dict[str, RouteSpec] = {}
        self._prefixes: list[tuple[str, RouteSpec]] = []  # longest first; "*" (the catch-all) is ""
        for spec in specs:
            if spec.key not in self.engines:
                self.engines[spec.key] = build(spec)
            if is_pattern(spec.name):
                self._prefixes.append((spec.name[:-1], spec))
            else:
                self._by_name[spec.name] = spec
        self._prefixes.sort(key=lambda prefix: -len(prefix[0]))

    def resolve(self, model: str) -> tuple[RouteSpec, Engine] | None:
        spec = self._by_name.get(model) or next((s for p, s in self._prefixes if model.startswith(p)), None)
        if spec is None:
            return None
        return spec, self.engines[spec.key]

    def named(self) -> list[RouteSpec]:
        """The routes a client can name (patterns, the catch-all among them, are not listed)."""
        return [s for s in self.specs if not is_pattern(s.name)]
