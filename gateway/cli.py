"""``omni-gateway serve``: run the gateway under uvicorn.

Settings come from defaults, then ``OMNI_GATEWAY_*`` environment variables,
then these flags. uvicorn runs with uvloop, httptools and the Sans-I/O
``websockets-sansio`` WebSocket implementation (the fastest measured here),
extended with a fast path for whole data frames
(``gateway.transport.ws_server``), without permessage-deflate (it costs CPU on
audio and gains nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Protocol

import uvicorn

from gateway import telemetry, workers
from gateway.jwt_auth import jwks_url_problem
from gateway.routing import CATCH_ALL, RoutingError, is_pattern, parse_routes
from gateway.settings import (
    DEFAULT_MODEL,
    ENGINES,
    ENV_PREFIX,
    Settings,
    SettingsError,
    from_env,
    is_loopback,
    with_checkpoint_model,
)
from gateway.store.redis_url import redis_url_problem
from gateway.tenants import KeysFile, TenantConfigError, TenantLimits
from gateway.transport.webrtc.sdp import PeerNetworks

if TYPE_CHECKING:
    from gateway.runtime import Runtime


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-gateway", description="A realtime streaming gateway for omni-modal models (omni-gateway serve)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="bind address (env OMNI_GATEWAY_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (env OMNI_GATEWAY_PORT, default 8000)")
    serve.add_argument(
        "--engine",
        choices=ENGINES,
        help="engine of the default model (env OMNI_GATEWAY_ENGINE, default cascade): cascade (embedded CPU voice), "
        "passthrough (no model), vllm (vLLM AsyncLLM, --engine-model), omni (vLLM-Omni, GPU), remote (--upstream)",
    )
    serve.add_argument(
        "--model",
        help="the default model: sessions that name none get it (env OMNI_GATEWAY_MODEL; default omni-cascade, "
        "or the checkpoint given to --engine-model for --engine vllm/omni, as vllm serve names it)",
    )
    serve.add_argument("--models", help="model routes: a JSON file or inline JSON (env OMNI_GATEWAY_MODELS)")
    serve.add_argument(
        "--redis-url", help="Redis URL for shared state (env OMNI_GATEWAY_REDIS_URL; default: in-process memory)"
    )
    serve.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        help="accepted API key; repeat for several (env OMNI_GATEWAY_API_KEYS, comma separated)",
    )
    serve.add_argument(
        "--keys-file", help="tenants: a JSON keys file of key hashes, limits and models (env OMNI_GATEWAY_KEYS_FILE)"
    )
    serve.add_argument(
        "--upstream",
        action="append",
        dest="upstreams",
        help="upstream for --engine remote; repeat (env OMNI_GATEWAY_UPSTREAMS, comma separated)",
    )
    serve.add_argument(
        "--thinker",
        choices=["echo", "vllm"],
        help="the cascade's thinker; vllm loads --model/--engine-model (env OMNI_GATEWAY_THINKER)",
    )
    serve.add_argument("--engine-model", help="checkpoint for --engine omni/vllm (env OMNI_GATEWAY_ENGINE_MODEL)")
    serve.add_argument(
        "--video-engine",
        choices=["cpu", "remote", "omni", "none"],
        help="video engine (env OMNI_GATEWAY_VIDEO_ENGINE, default cpu)",
    )
    serve.add_argument(
        "--workers",
        type=count_or_auto,
        help="gateway processes on this port (env OMNI_GATEWAY_WORKERS; default auto: one per core with "
        "--redis-url and no in-process model, else 1); more than 1 needs --redis-url",
    )
    serve.add_argument(
        "--otel-traces-endpoint",
        help="OpenTelemetry traces over OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces (env "
        "OMNI_GATEWAY_OTEL_TRACES_ENDPOINT; default: off); needs the otel extra",
    )
    serve.add_argument("--log-level", help="debug, info, warning (env OMNI_GATEWAY_LOG_LEVEL)")
    return parser


def count_or_auto(raw: str) -> int | str:
    return "auto" if raw == "auto" else int(raw)


def settings_from_args(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    args = _parser().parse_args(argv)
    environ = os.environ if environ is None else environ
    settings = from_env(environ)
    changes = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    if changes.get("workers") == "auto":
        changes["workers"] = None  # given on the command line, "auto" wins over the environment too
    for name in ("api_keys", "upstreams"):
        if name in changes:
            changes[name] = tuple(changes[name])
    settings = replace(settings, **changes)
    if "model" not in changes and ENV_PREFIX + "MODEL" not in environ:
        settings = with_checkpoint_model(settings)
    return settings


def problems(settings: Settings) -> list[str]:
    """What makes these settings unable to serve, said before anything starts."""
    out = []
    if not is_loopback(settings.host) and not settings.has_credentials:
        out.append(
            f"refusing to bind {settings.host} without credentials: set OMNI_GATEWAY_API_KEYS "
            "or --api-key, --keys-file, or a token issuer (OMNI_GATEWAY_JWT_SECRET / _JWT_JWKS); "
            "auth is required beyond loopback"
        )
    if settings.auth_required is False and (settings.has_credentials or not is_loopback(settings.host)):
        # Auth off with keys set (or beyond loopback) would let anyone act as the operator: every
        # anonymous caller gets the operator's grant. Refused rather than warned: a log line is
        # read after the damage.
        out.append(
            "refusing to start with OMNI_GATEWAY_AUTH_REQUIRED=false "
            + ("while credentials are configured (they would be ignored: anyone could act as the operator)"
               if settings.has_credentials else f"on {settings.host} (anyone who reaches it could act as the operator)")
            + "; unset OMNI_GATEWAY_AUTH_REQUIRED (auth then follows the bind address and the credentials), or "
            "serve on 127.0.0.1 with no credentials configured"
        )  # fmt: skip
    try:
        PeerNetworks.parse(settings.webrtc_peer_networks)
    except ValueError as err:
        out.append(f"OMNI_GATEWAY_WEBRTC_PEER_NETWORKS: {err}")
    if settings.jwt_jwks:
        jwks = jwks_url_problem(settings.jwt_jwks, allow_http=settings.jwt_jwks_allow_http)
        if jwks is not None:
            out.append(jwks)
    if settings.keys_file:
        try:
            KeysFile.parse(settings.keys_file, TenantLimits())
        except TenantConfigError as err:
            out.append(f"the keys file cannot be used: {err}")
    if not settings.models:  # with routes, each route carries its own options
        if settings.engine == "remote" and not settings.upstreams:
            out.append("--engine remote needs at least one --upstream ws://host:port (env OMNI_GATEWAY_UPSTREAMS)")
    if (redis := redis_url_problem(settings.redis_url)) is not None:
        out.append(redis)
    if settings.video_engine == "remote" and not settings.upstreams:
        out.append("--video-engine remote needs at least one --upstream (env OMNI_GATEWAY_UPSTREAMS)")
    if settings.video_engine == "omni" and not settings.video_model:
        out.append("--video-engine omni needs a video checkpoint (env OMNI_GATEWAY_VIDEO_MODEL)")
    return out + engine_problems(settings) + workers.problems(settings) + telemetry.problems(settings)


# What each engine imports that an extra brings, and how a user gets it: checked before
# anything loads (find_spec imports nothing), so a missing one is one line, not a traceback.
ENGINE_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "cascade": (("pocketsphinx", "espeakng_loader"), "pip install 'omni-realtime-gateway[cpu]'"),
    "vllm": (
        ("vllm",),
        "pip install 'omni-realtime-gateway[vllm]' on a GPU host; on a CPU, bash scripts/install_vllm_cpu.sh "
        "(from a clone of the repository)",
    ),
    "omni": (("vllm_omni",), "install vllm-omni on a GPU host"),
}
ENGINE_NAMES = {"cascade": "the embedded CPU voice cascade", "vllm": "vLLM", "omni": "vLLM-Omni"}


def engine_problems(settings: Settings) -> list[str]:
    """Engines whose packages are not installed, and in-process engines given no checkpoint."""
    out = []
    flat = not settings.models
    if flat and settings.model == DEFAULT_MODEL and not settings.engine_model:
        if settings.engine in ("vllm", "omni"):  # it would look for a checkpoint named "omni-cascade"
            out.append(f"--engine {settings.engine} loads a model: pass --engine-model PATH (a checkpoint folder "
                       "or a hub id; env OMNI_GATEWAY_ENGINE_MODEL)")  # fmt: skip
        elif settings.engine == "cascade" and settings.thinker == "vllm":
            out.append("--thinker vllm loads a model: pass --engine-model PATH (a checkpoint folder or a hub id; "
                       "env OMNI_GATEWAY_ENGINE_MODEL)")  # fmt: skip
    try:
        specs = parse_routes(settings.models, settings)
    except (RoutingError, OSError):
        return out  # the runtime says what is wrong with the document when it starts
    used = {s.engine for s in specs} | {"vllm" for s in specs if s.options.get("thinker") == "vllm"}
    for engine in sorted(used & ENGINE_PACKAGES.keys()):
        modules, install = ENGINE_PACKAGES[engine]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            flag = f"the {engine} engine"
            if flat:
                flag = f"--engine {engine}" if engine == settings.engine else f"--thinker {engine}"
            out.append(f"{flag} needs {ENGINE_NAMES[engine]}, which is not installed (no module "
                       f"{', '.join(missing)}): {install}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings = settings_from_args(argv)
    except SettingsError as err:  # e.g. OMNI_GATEWAY_AUTH_REQUIRED=enforce: refused, never read as off
        print(f"omni-gateway: {err}", file=sys.stderr)
        return 2
    worker = workers.current_worker()  # set when a supervisor started this process
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s{f' w{worker.slot}' if worker else ''} %(levelname)s %(name)s %(message)s",
    )
    refused = problems(settings)
    if refused:
        for line in refused:
            print(f"omni-gateway: {line}", file=sys.stderr)
        return 2
    if worker is None and (count := workers.worker_count(settings)) > 1:
        return workers.supervise(argv, settings, count)
    listening: list[socket.socket] = []
    if worker is None:  # bound before the engines load: a port in use stops here, in one line
        try:
            listening = workers.bind_sockets(settings.host, settings.port, 1, inheritable=False)
        except OSError as exc:
            print(f"omni-gateway: {workers.cannot_listen(settings.host, settings.port, exc)}", file=sys.stderr)
            return 2
    from gateway.app import create_app
    from gateway.transport.http_server import http_protocol, limits_of
    from gateway.transport.ws_server import server_protocol

    if worker is not None:
        settings = worker.settings(settings)
    try:
        app = create_app(settings)
    except Exception:  # a route file, an engine's options: the settings cannot serve
        logging.getLogger("omni.cli").exception("cannot start")
        for sock in listening:
            sock.close()
        return workers.STARTUP_FAILURE
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=http_protocol(limits_of(settings)),  # head timeout and size, a cap on sockets not yet upgraded
        ws=server_protocol(),  # the fast protocol, or uvicorn's stock one if the start-up check fails
        ws_max_size=settings.max_frame_bytes,
        ws_per_message_deflate=False,
        log_level=settings.log_level,
        lifespan="on",
    )
    runtime = app.state.runtime
    says = next_steps(runtime) if worker is None or worker.slot == 0 else []  # one worker speaks for the port
    if worker is None:
        server = DrainingServer(config, runtime, next_steps=says)
        server.run(sockets=listening)
    else:  # one of several on this port: the supervisor's socket, every worker's metrics
        aggregate = workers.WorkerMetrics(worker, runtime.metrics.registry)
        runtime.metrics_exposition = aggregate.scrape
        server = DrainingServer(config, runtime, services=(aggregate,), next_steps=says)
        server.run(sockets=[socket.socket(fileno=worker.fd)])
    if not server.started:  # the app failed to start (the log says why: an engine, the store)
        return 3
    return 0


# What the embedded default answers, said plainly: it is not a model.
ECHO_SAYS = (
    "an echo, not a language model: it transcribes what it hears (pocketsphinx, English, often wrong) "
    'and says back "You said: " and the transcript (eSpeak NG)'
)


def next_steps(runtime: Runtime) -> list[str]:
    """What ``serve`` prints once it listens: where the demo is, the models served and what
    each engine really does (the default is an echo), where the protocols are."""
    settings = runtime.settings
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    http, ws = f"http://{host}:{settings.port}", f"ws://{host}:{settings.port}"
    lines = [
        f"omni-gateway is serving on {http}",
        f"  open {http}/ for the voice and video demos (the microphone needs localhost or https: "
        "from another machine, an SSH tunnel or TLS in front)",
        f"  OpenAI Realtime API: {ws}/v1/realtime (vLLM-Omni's duplex dialect: ?duplex=1; "
        f"WebRTC calls: POST {http}/v1/realtime/calls); GPT-Live: {ws}/v1/live/sessions",
    ]
    said: dict[str, str] = {}  # engine key -> the model it was first said for
    prefixes: dict[str, list[str]] = {}  # engine key -> its prefix routes (one line for them all)
    for spec in runtime.router.specs:
        if is_pattern(spec.name) and spec.name != CATCH_ALL:
            prefixes.setdefault(spec.key, []).append(spec.name)
            continue
        name = "any other model name" if spec.name == CATCH_ALL else f"model {spec.name}"
        if spec.key in said:
            lines.append(f"  {name}: the same engine as {said[spec.key]}")
            continue
        said[spec.key] = spec.name
        info = runtime.router.engines[spec.key].info
        does = ECHO_SAYS if info.name == "cascade" and "EchoThinker" in info.description else info.description
        lines.append(f"  {name}: the {info.name} engine, {does[:1].lower()}{does[1:]}")
    for key, names in prefixes.items():
        engine = said.get(key) or f"the {runtime.router.engines[key].info.name} engine"
        lines.append(f"  model names {', '.join(names)}: the same engine as {engine}")
    if all(spec.name != CATCH_ALL for spec in runtime.router.specs):
        lines.append("  any other model name: refused (model_not_found; GET /v1/models lists the models)")
    if runtime.video_engine is not None:
        video = runtime.video_engine.info
        lines.append(f"  video: {ws}/v1/realtime/video, model {runtime.video_model or 'any'}: {video.description}")
    lines.append("  examples: examples/ in the repository; stop: Ctrl-C (sessions drain first)")
    return lines


class Service(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM/SIGINT drains before exiting.

    Draining: /readyz turns 503 at once, new sessions are refused, running
    answers get ``drain_window_s`` to finish, then every socket closes with
    1012 and uvicorn shuts down. A second signal exits at once.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        runtime: Runtime,
        services: Sequence[Service] = (),
        next_steps: Sequence[str] = (),
    ) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.services = services  # started once the server serves, closed when it shuts down
        self.next_steps = next_steps  # printed once it listens
        self.draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets and not self.services:  # (uvicorn names the address only of ports it bound)
            host, port = sockets[0].getsockname()[:2]
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", f"[{host}]" if ":" in host else host, port
            )
        for service in self.services:
            await service.start()
        if self.started and not self.should_exit and self.next_steps:  # listening (not a port in use)
            print("\n".join(self.next_steps), file=sys.stderr, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for service in self.services:
            await service.close()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.draining or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.draining = True
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(lambda: self._tasks.add(loop.create_task(self._drain())))

    async def _drain(self) -> None:
        try:
            await self.runtime.drain()
        finally:
            self.should_exit = True
