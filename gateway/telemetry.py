"""OpenTelemetry traces: where a session's time goes, and where a turn's goes.

Off by default. With ``otel_traces_endpoint`` set (and the ``otel`` extra
installed), every session hosted here is a trace, exported over OTLP/HTTP in
batches by the SDK's background thread:

- ``session``: the session on this replica, from its start (or its takeover:
  ``omni.restored``) to its end here (``omni.end_reason``);
- ``engine.transcription`` / ``engine.response``: one per engine request,
  submit to end (``omni.status`` completed|failed|cancelled, ``omni.outputs``,
  an event at the first output), children of the session;
- ``turn``: a server-VAD turn, from the moment the audio that ended the user's
  speech arrived to the moment the answer's first audio delta was written to the
  socket, a child of the session, itself split into five contiguous children
  whose durations add up to it exactly:

  ``turn.vad``           end of speech arrived -> ``speech_stopped`` (the VAD's silence wait)
  ``turn.transcription`` ``speech_stopped`` -> the transcript handed to the response
  ``turn.first_token``   -> the response's first output (text or audio)
  ``turn.synthesis``     -> its first audio
  ``turn.socket``        -> that audio written to the socket (session, journal,
                            write-ahead hold, outbound queue)

  A boundary an engine crosses early (an answer that starts before the
  transcript is in) makes its phase zero long rather than negative.
  ``omni.outcome``: ``audio`` (delivered), ``no_audio`` (the answer had none),
  ``cancelled`` (the answer failed or was cancelled, or the session ended here,
  before its audio was written), ``superseded`` (the next turn began first);
  the phase under way then ends with the turn.

Every span carries ``omni.session_id`` and ``omni.principal`` (the caller as
logs name it: ``key:<12 hex of sha256>``, never a key). ``otel_sample_ratio``
samples whole sessions by trace id; a session not sampled gets no
``SessionTrace`` at all, so it costs what tracing off costs: one ``is None``
test per flush of the session (per client event and per engine output;
measured in bench/trace_cost.py). Spans of a turn are made when it ends, with
the times recorded as it ran (a few integers per turn).

The SDK's batch processor keeps at most 2048 finished spans waiting for
export; past that it drops spans (and logs it) rather than grow or block.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.session.effects import EndInput, StartResponse
from orchestrator.engine import AudioDelta, EngineOutput, Finished

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

    from gateway.settings import Settings

ARRIVALS = 512  # appends remembered per session to date the end of speech (10 s of 20 ms chunks)
SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
# An audio delta as JSON, in each dialect (GA; beta and duplex), near the start of its text.
_AUDIO_TYPES = ('"type":"response.output_audio.delta"', '"type":"response.audio.delta"')
AUDIO_FRAME_KIND = 2  # the binary fast path's output audio frame (gateway/protocol/server_events.py)
PHASES = ("turn.vad", "turn.transcription", "turn.first_token", "turn.synthesis", "turn.socket")

Send = Callable[[dict[str, Any]], Awaitable[None]]


class TelemetryUnavailable(RuntimeError):
    pass


def problems(settings: Settings) -> list[str]:
    """What stops tracing as configured (``serve`` refuses to start)."""
    if not settings.otel_traces_endpoint:
        return []
    out = []
    if not 0.0 <= settings.otel_sample_ratio <= 1.0:
        out.append(f"otel_sample_ratio must be from 0 to 1, not {settings.otel_sample_ratio}")
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        out.append(f"--otel-traces-endpoint needs OpenTelemetry ({exc}): pip install 'omni-realtime-gateway[otel]'")
    return out


class Telemetry:
    """The tracer of one gateway process; ``session`` starts a session's trace."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("omni-gateway")

    @classmethod
    def from_settings(cls, settings: Settings, replica_id: str) -> Telemetry | None:
        """None when tracing is off (no endpoint): then nothing of OpenTelemetry is imported."""
        if not settings.otel_traces_endpoint:
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise TelemetryUnavailable(
                f"otel_traces_endpoint is set but OpenTelemetry is not installed ({exc}); "
                "pip install 'omni-realtime-gateway[otel]'"
            ) from None
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otel_traces_endpoint))
        return cls.with_processor(processor, settings.otel_service_name, replica_id, settings.otel_sample_ratio)

    @classmethod
    def with_processor(
        cls, processor: SpanProcessor, service_name: str, replica_id: str, sample_ratio: float = 1.0
    ) -> Telemetry:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        provider = TracerProvider(
            resource=Resource.create({"service.name": service_name, "service.instance.id": replica_id}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        provider.add_span_processor(processor)
        return cls(provider)

    def session(
        self, *, session_id: str, principal: str, replica_id: str, model: str, engine: str, restored: bool
    ) -> SessionTrace | None:
        """The trace of one session hosted here, or None when it is not sampled."""
        from opentelemetry.context import Context

        attributes = {"omni.session_id": session_id, "omni.principal": principal}
        span = self.tracer.start_span(
            "session",
            context=Context(),  # a root: one trace per session
            attributes={**attributes, "omni.replica_id": replica_id, "omni.model": model, "omni.engine": engine,
                        "omni.restored": restored},
        )  # fmt: skip
        if not span.is_recording():
            return None
        return SessionTrace(self.tracer, span, attributes, engine)

    def socket_sends(self, send: Send, trace_of: Callable[[], SessionTrace | None]) -> Send:
        """``send`` (ASGI) that also tells the trace of the socket's session (``trace_of()``)
        what reached the socket; only connections of a traced process are wrapped."""

        async def traced(message: dict[str, Any]) -> None:
            await send(message)
            trace = trace_of()
            if trace is not None and trace.awaiting_socket:
                trace.sent(message)

        return traced

    def shutdown(self) -> None:
        """Export what is pending, then stop (the process is closing)."""
        self.provider.shutdown()


@dataclass(slots=True)
class _Turn:
    """The times (ns since the epoch) of one turn, recorded as it runs."""

    speech_end: int  # the append that carried the end of speech arrived
    stopped: int  # speech_stopped: the VAD decided
    response_id: str
    estimated: bool  # the end of speech was older than the arrivals remembered
    input_done: int | None = None  # the transcript was handed to the response
    first_output: int | None = None
    first_audio: int | None = None


class SessionTrace:
    """The spans of one session on this replica. The host calls it (only when the
    session is traced) with what each flush produced and what its requests output."""

    def __init__(self, tracer: Tracer, span: Span, attributes: dict[str, Any], engine: str) -> None:
        from opentelemetry.trace import set_span_in_context

        self._tracer = tracer
        self.span = span
        self._context = set_span_in_context(span)
        self._attributes = attributes
        self._engine = engine
        self._requests: dict[str, _Request] = {}
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=ARRIVALS)  # (audio_ms after an append, when)
        self._audio_ms = 0.0
        self._turn: _Turn | None = None
        self.ended = False

    # --- what the session produced ------------------------------------------------

    def flushed(self, audio_ms: float, events: list[dict[str, Any]], effects: list[Any]) -> None:
        now = time.time_ns()
        if audio_ms > self._audio_ms:
            self._audio_ms = audio_ms
            self._arrivals.append((audio_ms, now))
        for effect in effects:
            if isinstance(effect, StartResponse) and effect.turn_started_at is not None:
                # Server VAD ended a turn in this flush: its speech_stopped is among the events.
                stopped = next((e for e in events if e["type"] == SPEECH_STOPPED), None)
                if stopped is None:
                    continue
                if self._turn is not None:
                    self._finish_turn(now, "superseded")
                speech_end, estimated = self._arrival_of(float(stopped.get("audio_end_ms", audio_ms)), now)
                self._turn = _Turn(speech_end, now, effect.request.request_id, estimated)
            elif isinstance(effect, EndInput):
                turn = self._turn
                if turn is not None and effect.request_id == turn.response_id and turn.input_done is None:
                    turn.input_done = now

    def _arrival_of(self, audio_end_ms: float, now: int) -> tuple[int, bool]:
        """When the append holding audio position ``audio_end_ms`` arrived."""
        for ms, when in self._arrivals:
            if ms >= audio_end_ms:
                return when, False
        return (self._arrivals[0][1], True) if self._arrivals else (now, True)

    # --- engine requests ---------------------------------------------------------------

    def request(
        self,
        kind: str,
        request_id: str,
        on_output: Callable[[EngineOutput], None],
        on_error: Callable[[str, str], None],
    ) -> tuple[Callable[[EngineOutput], None], Callable[[str, str], None]]:
        """Start a request's span; the callbacks to give the orchestrator instead."""
        span = self._tracer.start_span(
            f"engine.{kind}",
            context=self._context,
            attributes={**self._attributes, "omni.request_id": request_id, "omni.kind": kind,
                        "omni.engine": self._engine},
        )  # fmt: skip
        req = self._requests[request_id] = _Request(span)

        def traced_output(output: EngineOutput) -> None:
            now = time.time_ns()
            req.outputs += 1
            if req.outputs == 1:
                span.add_event("first_output", timestamp=now)
            turn = self._turn
            if turn is not None and turn.response_id == request_id:
                if turn.first_output is None and not isinstance(output, Finished):
                    turn.first_output = now
                if turn.first_audio is None and isinstance(output, AudioDelta):
                    turn.first_audio = now
            on_output(output)
            if isinstance(output, Finished):
                self.request_ended(request_id, "completed")

        def traced_error(code: str, message: str) -> None:
            self.request_ended(request_id, "failed", code)
            on_error(code, message)

        return traced_output, traced_error

    def request_ended(self, request_id: str, status: str, code: str | None = None) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        req.end(status, code)
        turn = self._turn
        if turn is not None and turn.response_id == request_id:
            if status != "completed":
                self._finish_turn(time.time_ns(), "cancelled")
            elif turn.first_audio is None:
                self._finish_turn(time.time_ns(), "no_audio")
            # else its first audio is on its way to the socket: the turn ends when it is written

    # --- the socket ----------------------------------------------------------------------

    @property
    def awaiting_socket(self) -> bool:
        turn = self._turn
        return turn is not None and turn.first_audio is not None

    def sent(self, message: dict[str, Any]) -> None:
        """A message written to the socket; the turn ends with its first audio delta."""
        data = message.get("bytes")
        if data is not None:
            audio = bool(data) and data[0] == AUDIO_FRAME_KIND
        else:
            head = (message.get("text") or "")[:96]
            audio = any(name in head for name in _AUDIO_TYPES)
        if audio:
            self._finish_turn(time.time_ns(), "audio")

    def played(self) -> None:
        """The turn's first audio went out on a call's track (WebRTC: the gateway plays it)."""
        self._finish_turn(time.time_ns(), "audio")

    def _finish_turn(self, end: int, outcome: str) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        span = self._tracer.start_span(
            "turn",
            context=self._context,
            start_time=turn.speech_end,
            attributes={**self._attributes, "omni.response_id": turn.response_id, "omni.outcome": outcome,
                        "omni.vad_start_estimated": turn.estimated},
        )  # fmt: skip
        from opentelemetry.trace import set_span_in_context

        context = set_span_in_context(span)
        # Contiguous phases: each starts where the one before ended, so they add up to the
        # turn. A boundary not crossed before a later one is a zero-length phase; the phase
        # under way when the turn ended ends with it.
        marks = [turn.stopped, turn.input_done, turn.first_output, turn.first_audio]
        reached = max(i for i, mark in enumerate(marks) if mark is not None)  # stopped: always
        start = turn.speech_end
        for i, name in enumerate(PHASES[: reached + 2]):
            mark = end if i > reached else (marks[i] or start)
            stop = min(max(start, mark), end)
            self._tracer.start_span(name, context=context, start_time=start).end(end_time=stop)
            start = stop
        span.end(end_time=end)

    # --- the end -------------------------------------------------------------------------

    def end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        for request_id in list(self._requests):
            self.request_ended(request_id, "cancelled")
        self._finish_turn(time.time_ns(), "cancelled")
        self.span.set_attribute("omni.end_reason", reason)
        self.span.end()


class _Request:
    __slots__ = ("outputs", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.outputs = 0

    def end(self, status: str, code: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("omni.status", status)
        self.span.set_attribute("omni.outputs", self.outputs)
        if code is not None:
            self.span.set_attribute("omni.error_code", code)
            self.span.set_status(Status(StatusCode.ERROR, code))
        self.span.end()


__all__ = ["PHASES", "SessionTrace", "Telemetry", "TelemetryUnavailable"]
