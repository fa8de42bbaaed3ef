"""The ASGI application: ``create_app(settings)``."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Mount, WebSocketRoute
from starlette.staticfiles import StaticFiles

from gateway import logs
from gateway.http import HttpApi, token_refused
from gateway.jwt_auth import TokenRefused
from gateway.protocol.dialects import DUPLEX, LIVE
from gateway.protocol.telephony import EXOTEL, PLIVO, TELNYX, TWILIO, VONAGE
from gateway.runtime import Runtime
from gateway.session.session import VadStream
from gateway.settings import Settings
from gateway.telemetry import Telemetry
from gateway.transport.realtime import RealtimeEndpoint
from gateway.transport.sip.rest import SipCallsEndpoint
from gateway.transport.telephony.endpoint import TelephonyEndpoint
from gateway.transport.video import VideoEndpoint
from gateway.transport.webrtc.live_signaling import LiveSessionsEndpoint
from gateway.transport.webrtc.signaling import CallsEndpoint
from orchestrator.engine import Engine

WEB_DEMO = Path(__file__).resolve().parent.parent / "web_demo"
GC_THRESHOLDS = (700, 10, 100)  # the collector's generation thresholds once started (see lifespan)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    vad_factory: Callable[[], VadStream] | bool | None = True,
    telemetry: Telemetry | None = None,
) -> Starlette:
    settings = settings or Settings()
    logs.install()
    for secret in (
        *settings.api_keys,
        settings.upstream_api_key,
        settings.jwt_secret,
        settings.live_responses_api_key,
        settings.twilio_auth_token,
        settings.vonage_websocket_authorization,
        settings.exotel_basic_auth,
        settings.call_webhook_secret,
    ):
        logs.register_secret(secret)
    for entry in settings.sip_trunk_credentials:  # user:password: the password never reaches a log
        logs.register_secret(entry.partition(":")[2] or None)
    rt = Runtime(settings, engine, vad_factory=vad_factory, telemetry=telemetry)
    for spec in rt.router.specs:  # a route's own upstream key
        logs.register_secret(spec.options.get("api_key"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await rt.start()
        # Everything loaded so far (engines, torch, models) lives as long as the
        # process: move it out of the collector's sight, so a full collection
        # walks only per-session objects (measured: 110-170 ms pauses -> 7 ms).
        gc.collect()
        gc.freeze()
        # Sessions keep growing the heap (conversation items, journal entries), and with
        # the default thresholds each 25 % of growth costs a full collection, a pause
        # that stops every session (400 streaming sessions: up to 82 ms, several in 5 s;
        # see bench/README.md). Young collections stay as they are (a larger gen-0 threshold only
        # made each pause longer: 7-22 ms at 50 000); full ones wait for 100 gen-1
        # collections, so cycles that reached the oldest generation live longer.
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            yield
        finally:
            await rt.close()

    app = Starlette(
        routes=[
            *HttpApi(rt).routes(),
            *CallsEndpoint(rt).routes(),
            *LiveSessionsEndpoint(rt).routes(),  # POST /v1/live/sessions: GPT-Live over WebRTC
            *SipCallsEndpoint(rt).routes(),
            WebSocketRoute("/v1/realtime", RealtimeEndpoint(rt)),
            WebSocketRoute("/v1/duplex", RealtimeEndpoint(rt, dialect=DUPLEX)),  # vLLM-Omni's alias of ?duplex=1
            WebSocketRoute("/v1/live/sessions", RealtimeEndpoint(rt, dialect=LIVE)),  # OpenAI's GPT-Live
            WebSocketRoute("/v1/live/sessions/{session_id}/fork", RealtimeEndpoint(rt, dialect=LIVE, forks=True)),
            # GPT-Live's sideband: a server beside a WebRTC session (POST /v1/live/sessions), on any replica.
            WebSocketRoute("/v1/live/sessions/{session_id}/attach", RealtimeEndpoint(rt, dialect=LIVE, attach=True)),
            WebSocketRoute("/v1/realtime/video", VideoEndpoint(rt)),
            WebSocketRoute(
                "/v1/telephony/twilio", TelephonyEndpoint(rt, TWILIO, signing_key=settings.twilio_auth_token)
            ),
            WebSocketRoute("/v1/telephony/telnyx", TelephonyEndpoint(rt, TELNYX)),  # Telnyx Media Streaming
            WebSocketRoute("/v1/telephony/plivo", TelephonyEndpoint(rt, PLIVO)),  # Plivo Audio Streams
            WebSocketRoute(  # Vonage Voice API WebSockets (binary L16)
                "/v1/telephony/vonage",
                TelephonyEndpoint(rt, VONAGE, signing_key=settings.vonage_websocket_authorization),
            ),
            WebSocketRoute(  # Exotel's Voicebot applet
                "/v1/telephony/exotel", TelephonyEndpoint(rt, EXOTEL, signing_key=settings.exotel_basic_auth)
            ),
            # The browser demo and SDK, last so that it never shadows the API.
            Mount("/", StaticFiles(directory=WEB_DEMO, html=True, check_dir=False), name="web_demo"),
        ],
        lifespan=lifespan,
        exception_handlers={TokenRefused: token_refused},  # raised where an HTTP endpoint authenticates
    )
    app.state.runtime = rt
    return app
