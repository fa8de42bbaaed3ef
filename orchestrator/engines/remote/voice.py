"""``RemoteEngine``: the voice ``Engine`` served by upstream ``/v1/realtime`` sessions.

respond
    On an upstream session: ``session.update`` (``turn_detection: null``, no
    input transcription, ``output_modalities``, voice, speed), then one
    ``conversation.item.create`` per message with text. Streamed
    ``TextChunk`` inputs (transcripts of the user's last turn that arrive
    after the response started) become further user items as they come, so
    the upstream holds the conversation while the transcript finishes; once
    the input ends, ``response.create`` (instructions, modalities,
    ``max_output_tokens``, temperature). Function calling: ``tools``,
    ``tool_choice`` and ``parallel_tool_calls`` go in the ``session.update``
    (only when there are tools, or to clear those of an earlier request on a
    kept session; in the duplex dialect's session object as the beta API
    spelled them); a message's calls become ``function_call`` items and a
    call's result a ``function_call_output`` item; the upstream's
    ``function_call`` output items and ``response.function_call_arguments``
    deltas become ``ToolCallDelta``s. The Realtime API cannot extend a
    running response, so the answer starts at the final marker.
    ``response.output_audio.delta`` (base64, or binary frames on
    ``omni-binary.v1``) -> ``AudioDelta`` (PCM16 24 kHz, the Realtime API's
    rate: ``info.output_sample_rate`` = 24000); transcript / text deltas ->
    ``TextDelta``; ``response.done`` -> ``Finished`` with its usage
    (``incomplete`` for ``max_output_tokens`` -> ``reason="length"``;
    ``failed`` -> ``EngineError`` with the upstream's code).
transcribe
    On an upstream session with input transcription on: audio is streamed
    with ``input_audio_buffer.append`` as it comes, committed at the final
    marker (cleared when under 100 ms, the commit minimum);
    ``conversation.item.input_audio_transcription.delta`` / ``.completed`` ->
    ``TextDelta`` (with ``logprobs`` when asked) / ``Finished``, ``.failed`` ->
    ``transcription_failed``. The model name, language, prompt, keywords and
    languages go upstream (``transcription_models`` may map the names).
    An upstream whose ``session.updated`` shows no transcription (vLLM-Omni's
    realtime endpoint does not transcribe) -> ``EngineError("unsupported")``.

converse (route option ``turns: "upstream"``: ``info.takes_turns``)
    The upstream takes the turns: one upstream session for the whole
    conversation (a gateway session's), never lent to another request, with its
    own speech detection (``turn_detection`` ``server_vad``, answers created and
    interrupted by it; in the duplex dialect ``extra_body.auto_response: true`` and
    ``overlap_policy: barge_in_on_speech``),
    input transcription on, and the conversation so far as items. The caller's
    audio is appended as it comes and never committed by us; a ``TextChunk``
    (context appended meanwhile) becomes a system item. Its events become
    ``TurnOutput``s: ``input_audio_buffer.speech_started``/``.speech_stopped`` ->
    ``SpeechStarted``/``SpeechStopped`` (its ``audio_start_ms``/``audio_end_ms``),
    the input transcription's ``.delta``/``.completed`` -> ``Heard``,
    ``response.created`` -> ``AnswerStarted``, its audio and transcript deltas ->
    ``AudioDelta``/``TextDelta``, ``response.done`` -> ``Finished`` (whatever its
    status: an interrupted answer ends there). An upstream ``error`` about its
    own work is logged, and the conversation goes on; a lost socket ends it
    (``upstream_lost``, never retried: the upstream held what was said). At the
    inputs' end the upstream session is closed (``session.close`` in the duplex
    dialect). Without the option (the default) every request is its own, as
    above, and ``converse`` is refused.

Reuse: a session is kept per kind of request (respond, transcribe) and lent
to the next request of that kind. When a request ends, the pool makes its
session clean again in the background (see ``pool.Lease``): whatever it left
running is stopped (``response.cancel`` / ``input_audio_buffer.clear``, and
the upstream's confirmation awaited), the items it created are deleted, each
deletion acknowledged; then the session is idle. A session that cannot be
cleaned in ``cleanup_timeout_s``, or whose request failed, is closed. Events
carry ``event_id``s tagged per request, so a late ``error`` about an earlier
request is never taken for the current one's.

Upstream loss: a socket that closes mid-request (or an upstream silent for
``event_timeout_s`` while an answer is due) fails the request with
``EngineError("upstream_lost")`` (``upstream_timeout``), and the session
layer ends it as for any engine failure (``response.done`` ``failed`` with
that code; the session goes on). When nothing was output yet, the request is
retried once, on another up upstream when there is one, with the inputs
received so far replayed (``max_replay_bytes`` bounds what is kept for
that; past it a loss is not retried).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from orchestrator.engine import (
    AnswerStarted,
    AudioChunk,
    AudioDelta,
    ConversationRequest,
    EngineError,
    EngineInfo,
    EngineInput,
    EngineOutput,
    Finished,
    Heard,
    Message,
    ResponseRequest,
    SpeechStarted,
    SpeechStopped,
    TextChunk,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TranscriptionRequest,
    TurnOutput,
    Usage,
)
from orchestrator.engines.remote.pool import (
    REALTIME_PATH,
    Connection,
    Lease,
    PooledEngine,
    Upstream,
    UpstreamLost,
    UpstreamPool,
    UpstreamUnavailable,
    output_audio_frame,
)
from orchestrator.engines.remote.video import RemoteVideoEngine
from orchestrator.engines.streams import ReplayableInputs, failing

log = logging.getLogger("omni.engines.remote")

RATE = 24000  # the Realtime API's PCM: 24 kHz mono PCM16, in and out
MIN_COMMIT_BYTES = RATE * 2 // 10  # 100 ms: less cannot be committed
MAX_APPEND_BYTES = RATE * 2  # one second per append (the upstream may cap appends)
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")

_AUDIO_DELTAS = {"response.output_audio.delta", "response.audio.delta"}
_TEXT_DELTAS = {
    "response.output_audio_transcript.delta",
    "response.audio_transcript.delta",
    "response.output_text.delta",
    "response.text.delta",
}
_ITEM_ADDED = {"conversation.item.added", "conversation.item.created"}
_COMMIT_EMPTY = {"input_audio_buffer_commit_empty", "input_audio_buffer_empty"}  # ours, vLLM-Omni's


def upstream_error(event: dict[str, Any], default: str = "upstream_error") -> EngineError:
    """An upstream ``error`` event as our coded error (the upstream's code kept)."""
    nested = event.get("error")
    err: dict[str, Any] = nested if isinstance(nested, dict) else event
    code = err.get("code") if isinstance(err.get("code"), str) and err.get("code") else default
    message = err.get("message") or "the upstream refused the request"
    return EngineError(str(code), f"upstream: {message}")


def _logprobs(raw: Any) -> tuple[TokenLogprob, ...] | None:
    if not isinstance(raw, list):
        return None
    return tuple(
        TokenLogprob(str(lp.get("token", "")), float(lp.get("logprob", 0.0)), tuple(lp.get("bytes") or ()))
        for lp in raw
        if isinstance(lp, dict)
    )


def usage_of(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    inp = raw.get("input_token_details") or {}
    out = raw.get("output_token_details") or {}
    in_audio = int(inp.get("audio_tokens") or 0)
    in_image = int(inp.get("image_tokens") or 0)
    out_audio = int(out.get("audio_tokens") or 0)
    return Usage(
        input_text_tokens=int(
            inp.get("text_tokens", max(0, int(raw.get("input_tokens") or 0) - in_audio - in_image)) or 0
        ),
        input_audio_tokens=in_audio,
        input_image_tokens=in_image,
        output_text_tokens=int(out.get("text_tokens", max(0, int(raw.get("output_tokens") or 0) - out_audio)) or 0),
        output_audio_tokens=out_audio,
    )


class _Request:
    def __init__(self) -> None:
        self.aborted = False
        self.lease: Lease | None = None


_Inputs = ReplayableInputs[Any]  # a request's inputs, kept for a retry until output comes
Attempt = Callable[[Lease, _Inputs], AsyncIterator[EngineOutput]]


class RemoteEngine(PooledEngine):
    """The voice engine of upstream realtime servers (see the module docstring).

    ``upstreams``: URLs (``http(s)://`` or ``ws(s)://host:port``; a trailing
    ``/v1/realtime`` is accepted) or an ``UpstreamPool`` to share with a
    ``RemoteVideoEngine``; ``pool_options`` go to the pool (limits there).
    ``api_key``: sent as ``Authorization: Bearer``. ``model``: sent as
    ``?model=``. ``voices``: voice names the upstreams accept (the OpenAI
    names by default: every upstream maps them). ``binary``: offer
    ``omni-binary.v1`` (audio as binary frames when the upstream accepts).
    ``retries``: re-runs of a request lost before any output (1).
    ``transcription_models``: the speech-to-text names the upstreams know
    (the first is used for a client that names another), or a mapping from
    the names clients use to the upstream's (``"*"``: every other name; a
    name the mapping lacks goes upstream as it is).
    ``dialect``: "auto" (vLLM-Omni's duplex dialect where an upstream advertises it, else
    OpenAI's), "openai" or "duplex" (``pool``, "dialect"). ``probe_s``: how long a new
    connection waits for a session the upstream opens at connect (the sign of OpenAI's dialect).
    ``turns``: "request" (default: the gateway's speech detector takes the turns, each request
    its own upstream session) or "upstream" (the upstreams take them: ``converse``).
    """

    def __init__(
        self,
        upstreams: str | Sequence[str] | UpstreamPool,
        *,
        api_key: str | None = None,
        model: str | None = None,
        voices: Sequence[str] = OPENAI_VOICES,
        default_voice: str | None = "alloy",
        transcription_models: Sequence[str] | Mapping[str, str] = ("whisper-1",),
        binary: bool = True,
        retries: int = 1,
        event_timeout_s: float = 60.0,
        max_replay_bytes: int = 8 * 1024 * 1024,
        dialect: str = "auto",
        probe_s: float = 0.25,
        turns: str = "request",
        **pool_options: Any,
    ) -> None:
        if turns not in ("request", "upstream"):
            raise ValueError(f"turns must be 'request' or 'upstream', not {turns!r}")
        if isinstance(upstreams, UpstreamPool):
            self.pool = upstreams
        else:
            urls = [upstreams] if isinstance(upstreams, str) else list(upstreams)
            self.pool = UpstreamPool(urls, api_key=api_key, model=model, binary=binary, dialect=dialect,
                                     **pool_options)  # fmt: skip
        self.probe_s = probe_s
        names = ", ".join(u.name for u in self.pool.upstreams)
        self.info = EngineInfo(
            name="remote",
            description=f"Remote realtime upstreams over WebSocket (least-loaded): {names}.",
            input_sample_rate=RATE,
            output_sample_rate=RATE,
            voices=tuple(voices),
            default_voice=default_voice,
            transcription_models=tuple(transcription_models),  # a mapping: the names clients may use
            modalities=("text", "audio"),
            ignored_fields=(),  # everything is passed upstream, which reports what it ignores
            accepts_images=True,  # passed upstream as input_image parts; an upstream that takes none says so
            takes_turns=turns == "upstream",
        )
        self._stt_names: Mapping[str, str] | None = (
            dict(transcription_models) if isinstance(transcription_models, Mapping) else None
        )
        self.retries = retries
        self.event_timeout_s = event_timeout_s
        self.max_replay_bytes = max_replay_bytes
        self._requests: dict[str, _Request] = {}
        self._started = False

    def video_engine(self, **kwargs: Any) -> RemoteVideoEngine:
        """A ``RemoteVideoEngine`` on the same upstreams (and pool)."""
        return RemoteVideoEngine(self.pool, **kwargs)

    # --- lifecycle ------------------------------------------------------------

    def _running(self) -> list[str]:
        return list(self._requests)

    async def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is None:
            return
        req.aborted = True
        if req.lease is None:
            self._requests.pop(request_id, None)  # never started: nothing else will unregister it
        else:
            self.pool.spawn(req.lease.conn.close(req.lease.farewell))

    # --- requests ---------------------------------------------------------------

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]:
        return self._run("respond", request.request_id, inputs, lambda lease, kept: self._respond(lease, request, kept))

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        return self._run(
            "transcribe", request.request_id, inputs, lambda lease, kept: self._transcribe(lease, request, kept)
        )

    def converse(self, request: ConversationRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[TurnOutput]:
        """A conversation whose turns the upstream takes (see the module docstring)."""
        if not self.info.takes_turns:
            return failing(EngineError("unsupported", "this route's upstreams take no turns of their own here "
                                       "(route option turns: upstream)"))  # fmt: skip
        if not self._started:
            return failing(EngineError("engine_not_started", "the remote engine is not running"))
        if request.request_id in self._requests:
            return failing(EngineError("request_id_conflict", f"request {request.request_id!r} is already running"))
        req = _Request()
        self._requests[request.request_id] = req
        return self._held(request, inputs, req)

    async def _held(
        self, request: ConversationRequest, inputs: AsyncIterator[EngineInput], req: _Request
    ) -> AsyncIterator[TurnOutput]:
        try:
            if req.aborted:
                return
            lease = req.lease = await self.pool.lease("converse", REALTIME_PATH)
            lease.broken = True  # its upstream session is this conversation's: closed at its end, never lent
            try:
                async for out in self._conversation(lease, request, inputs):
                    yield out
            except UpstreamLost as exc:
                if not req.aborted:
                    self.pool.mark_down(lease.upstream, str(exc))
                raise
            finally:
                req.lease = None
                lease.release()
        finally:
            self._requests.pop(request.request_id, None)

    async def _conversation(
        self, lease: Lease, request: ConversationRequest, inputs: AsyncIterator[EngineInput]
    ) -> AsyncIterator[TurnOutput]:
        conn = lease.conn
        audio = "audio" in request.modalities
        transcription = {"model": self.transcription_model(None)}
        modalities = ["audio", "text"] if audio else ["text"]
        duplex = self._duplex_session(
            modalities=modalities, transcription=transcription, voice=request.voice, speed=request.speed
        )
        # The upstream's own speech detection takes the turns, and answers them (auto_response).
        duplex.update(turn_detection={"type": "server_vad"}, overlap_policy="barge_in_on_speech",
                      extra_body={"auto_response": True})  # fmt: skip
        output: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": RATE}}
        if request.voice:
            output["voice"] = request.voice
        if request.speed != 1.0:
            output["speed"] = request.speed
        vad = {"type": "server_vad", "create_response": True, "interrupt_response": True}
        ga: dict[str, Any] = {
            "output_modalities": ["audio"] if audio else ["text"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": vad,
                                "transcription": transcription}, "output": output},
        }  # fmt: skip
        if request.instructions:
            ga["instructions"] = duplex["instructions"] = request.instructions
        if request.temperature is not None:
            ga["temperature"] = duplex["temperature"] = request.temperature
        await self._open(lease, ga, duplex)
        if conn.duplex:
            lease.expect([{"type": "session.close"}])  # (sent as it closes: the session ends for good)
        for message in request.messages:
            await self._add_message(lease, message)
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._stream_inputs(lease, inputs))
        receiver: asyncio.Task[dict[str, Any] | bytes] | None = None
        text: list[str] = []
        try:
            while True:
                if receiver is None:
                    receiver = loop.create_task(conn.recv())
                waiting: set[asyncio.Task[Any]] = {receiver} if sender.done() else {receiver, sender}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if sender in done:
                    if sender.exception() is not None:
                        raise sender.exception()  # type: ignore[misc]
                    return  # the inputs ended: the session is over
                event, receiver = receiver.result(), None
                pcm = _answer_audio(event)
                if pcm is not None or isinstance(event, bytes):
                    if pcm:
                        yield AudioDelta(pcm)
                    continue
                kind = event.get("type")
                if kind in _TEXT_DELTAS:
                    if event.get("delta"):
                        text.append(event["delta"])
                        yield TextDelta(event["delta"])
                elif kind == "input_audio_buffer.speech_started":
                    yield SpeechStarted(_ms(event.get("audio_start_ms")))
                elif kind == "input_audio_buffer.speech_stopped":
                    yield SpeechStopped(_ms(event.get("audio_end_ms")))
                elif kind == "conversation.item.input_audio_transcription.delta":
                    if event.get("delta"):
                        yield Heard(event["delta"])
                elif kind == "conversation.item.input_audio_transcription.completed":
                    yield Heard(event.get("transcript") or "", final=True)
                elif kind == "response.created":
                    text = []
                    yield AnswerStarted()
                elif kind == "response.done":
                    response = event.get("response") or {}
                    incomplete = response.get("status") == "incomplete"
                    reason = (response.get("status_details") or {}).get("reason")
                    yield Finished(reason="length" if incomplete and reason == "max_output_tokens" else "stop",
                                   text="".join(text), usage=usage_of(response.get("usage")))  # fmt: skip
                elif kind == "error" and not conn.stale(event):
                    # About the upstream's own work (a transcript it could not make...): the
                    # conversation goes on; only a lost upstream ends it.
                    log.warning("upstream %s: %s", lease.upstream.name, event.get("error"))
        finally:
            for task in (sender, receiver):
                if task is not None and not task.done():
                    task.cancel()

    async def _stream_inputs(self, lease: Lease, inputs: AsyncIterator[EngineInput]) -> None:
        """The caller's audio, appended as it comes (the upstream's detector commits the turns);
        context (``TextChunk``) as system items."""
        async for chunk in inputs:
            if isinstance(chunk, AudioChunk) and chunk.pcm:
                await self._append(lease.conn, chunk.pcm)
            elif isinstance(chunk, TextChunk) and chunk.text:
                await self._add_item(lease, "system", chunk.text)

    def _run(
        self, kind: str, request_id: str, inputs: AsyncIterator[Any], attempt: Attempt
    ) -> AsyncIterator[EngineOutput]:
        # Registered now, so that an abort before the first iteration is not lost.
        if not self._started:
            return failing(EngineError("engine_not_started", "the remote engine is not running"))
        if request_id in self._requests:
            return failing(EngineError("request_id_conflict", f"request {request_id!r} is already running"))
        req = _Request()
        self._requests[request_id] = req
        return self._with_retry(kind, request_id, inputs, attempt, req)

    async def _with_retry(
        self, kind: str, request_id: str, inputs: AsyncIterator[Any], attempt: Attempt, req: _Request
    ) -> AsyncIterator[EngineOutput]:
        kept = ReplayableInputs(inputs, self.max_replay_bytes, UpstreamLost)
        tried: set[Upstream] = set()
        tries = 0
        lost: UpstreamLost | None = None
        try:
            while not req.aborted:
                try:
                    lease = await self.pool.lease(kind, REALTIME_PATH, tried)
                except UpstreamUnavailable:
                    if lost is not None:
                        raise lost from None  # no other upstream to retry on: the loss is the news
                    raise
                req.lease = lease
                produced = finished = False
                try:
                    async for out in attempt(lease, kept):
                        if isinstance(out, Finished):
                            finished = True
                        elif not produced:
                            produced = True
                            kept.commit()
                        yield out
                    return
                except UpstreamLost as exc:
                    lease.broken = True
                    if req.aborted or finished:
                        return
                    self.pool.mark_down(lease.upstream, str(exc))
                    if produced or tries >= self.retries or not kept.replayable:
                        raise
                    lost = exc
                    tries += 1
                    tried.add(lease.upstream)
                    log.warning(
                        "request %s lost upstream %s before any output; retrying", request_id, lease.upstream.name
                    )
                except Exception:
                    lease.broken = True  # an upstream refusal or a bug: the session state is unknown
                    raise
                finally:
                    req.lease = None
                    lease.release()
        finally:
            kept.stop()
            self._requests.pop(request_id, None)

    async def _expect(self, conn: Connection, kind: str) -> dict[str, Any]:
        while True:
            event = await conn.recv(self.event_timeout_s)
            if isinstance(event, bytes):
                continue
            if event.get("type") == kind:
                return event
            if event.get("type") == "error" and not conn.stale(event):
                raise upstream_error(event)

    async def _open(self, lease: Lease, ga: dict[str, Any], duplex: dict[str, Any]) -> dict[str, Any]:
        """Configure the upstream session for one request (``ga``: the OpenAI shape; ``duplex``:
        vLLM-Omni's duplex session object) and return its ``session.updated``. A new connection
        whose dialect is not known yet is probed (see ``pool``, "dialect")."""
        conn = lease.conn
        if conn.duplex is None:  # a new connection to an upstream not probed yet
            try:
                first = await conn.recv(self.probe_s)
            except UpstreamLost as exc:
                if exc.code != "upstream_timeout":
                    raise
                first = None  # nothing at connect: a duplex route waiting for our session.update
            if first is None:
                conn.duplex = True
            else:
                conn.pushback.append(first)  # type: ignore[arg-type]
                conn.duplex = False
        if conn.duplex:
            await conn.send({"type": "session.update", "session": duplex})
            if not lease.reused:
                created = await self._expect(conn, "session.created")
                lease.upstream.duplex = "capabilities" in (created.get("session") or {})
                if not lease.upstream.duplex:  # a late session.created: not a duplex route after all
                    conn.duplex = False
                    conn.begin()  # the refusal of the duplex update that follows is now stale
                    await conn.send({"type": "session.update", "session": {"type": "realtime", **ga}})
            return await self._expect(conn, "session.updated")
        if not lease.reused:
            created = await self._expect(conn, "session.created")
            if not isinstance(created.get("session"), dict):
                # vLLM-Omni's turn-based /v1/realtime (docs/serving/realtime_api.md): one generation
                # over one audio stream per connection, audio in and audio out; no conversation.
                why = (
                    f"upstream {lease.upstream.name} serves vLLM-Omni's turn-based /v1/realtime, which takes "
                    "no conversation; serve the model with session_mode: duplex (its ?duplex=1 route)"
                )
                raise EngineError("upstream_unsupported", why)
            lease.upstream.duplex = bool(lease.upstream.duplex)
        await conn.send({"type": "session.update", "session": {"type": "realtime", **ga}})
        return await self._expect(conn, "session.updated")

    def _duplex_session(self, *, modalities: list[str], transcription: dict[str, Any] | None,
                        voice: str | None = None, speed: float = 1.0) -> dict[str, Any]:  # fmt: skip
        """vLLM-Omni's duplex session object for a request: our PCM (24 kHz both ways), turns committed
        by us, and no answer unless asked for (``extra_body.auto_response: false``)."""
        session: dict[str, Any] = {
            "modalities": modalities, "input_audio_format": "pcm16", "output_audio_format": "pcm16",
            "sample_rate_hz": RATE, "audio": {"input": {"sample_rate_hz": RATE}, "output": {"sample_rate_hz": RATE}},
            "turn_detection": None, "input_audio_transcription": transcription, "extra_body": {"auto_response": False},
        }  # fmt: skip
        if self.pool.model:
            session["model"] = self.pool.model
        if voice:
            session["voice"] = voice
        if speed != 1.0:
            session["speed"] = speed
        return session

    # --- respond ------------------------------------------------------------------

    async def _add_item(self, lease: Lease, role: str, text: str) -> None:
        kind = "output_text" if role == "assistant" else "input_text"
        await self._create(lease, {"type": "message", "role": role, "content": [{"type": kind, "text": text}]})

    async def _create(self, lease: Lease, item: dict[str, Any]) -> None:
        item_id = f"item_rmt{secrets.token_hex(8)}"
        lease.add_item(item_id)  # known before it exists: a cancelled request still deletes it
        await lease.conn.send({"type": "conversation.item.create", "item": {"id": item_id, **item}})

    @staticmethod
    def _tool_fields(conn: Connection, request: ResponseRequest) -> dict[str, Any]:
        """The request's tools in the Realtime API's session shape. Sent only when there
        are tools, or to clear those an earlier request left on a reused session (an
        upstream without function calling is never sent the fields)."""
        if not request.tools and not conn.tools:
            return {}
        conn.tools = bool(request.tools)
        choice = request.tool_choice
        tool_choice: Any = {"type": "function", "name": choice.name} if choice.mode == "function" else choice.mode
        tools = [
            {"type": "function", "name": t.name, "description": t.description, "parameters": dict(t.parameters)}
            for t in request.tools
        ]
        return {"tools": tools, "tool_choice": tool_choice if tools else "auto",
                "parallel_tool_calls": request.parallel_tool_calls}  # fmt: skip

    async def _add_message(self, lease: Lease, message: Message) -> None:
        """A message as upstream items: its text, the calls it made, or a call's output."""
        if message.role == "tool":
            await self._create(lease, {"type": "function_call_output", "call_id": message.tool_call_id or "",
                                       "output": message.text})  # fmt: skip
            return
        if message.images:  # one user item: its text and its images, as the client sent them
            content: list[dict[str, Any]] = [{"type": "input_text", "text": message.text}] if message.text else []
            content += [
                {"type": "input_image", "image_url": image.data_url(), "detail": image.detail}
                for image in message.images
            ]
            await self._create(lease, {"type": "message", "role": "user", "content": content})
        elif message.text:
            await self._add_item(lease, message.role, message.text)
        for call in message.tool_calls:
            await self._create(lease, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                       "arguments": call.arguments})  # fmt: skip

    async def _respond(self, lease: Lease, request: ResponseRequest, inputs: _Inputs) -> AsyncIterator[EngineOutput]:
        conn = lease.conn
        audio = "audio" in request.modalities
        output: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": RATE}}
        if request.voice:
            output["voice"] = request.voice
        if request.speed != 1.0:
            output["speed"] = request.speed
        tools = self._tool_fields(lease.conn, request)
        duplex = self._duplex_session(modalities=["audio", "text"] if audio else ["text"], transcription=None,
                                      voice=request.voice, speed=request.speed)  # fmt: skip
        if tools:  # the duplex session object takes them as the beta API did: a forced function by its name
            choice = tools["tool_choice"]
            duplex.update(tools=tools["tools"], tool_choice=choice["name"] if isinstance(choice, dict) else choice)
        await self._open(lease, {
            "output_modalities": ["audio"] if audio else ["text"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None,
                                "transcription": None}, "output": output},
            **tools,
        }, duplex)  # fmt: skip
        for message in request.messages:
            await self._add_message(lease, message)
        appended = 0
        async for chunk in inputs.stream():
            if isinstance(chunk, TextChunk) and chunk.text:
                await self._add_item(lease, "user", chunk.text)
            elif isinstance(chunk, AudioChunk) and chunk.pcm:
                lease.expect([{"type": "input_audio_buffer.clear"}], "input_audio_buffer.cleared", "error")
                await self._append(conn, chunk.pcm)
                appended += len(chunk.pcm)
        if appended >= MIN_COMMIT_BYTES:
            await conn.send({"type": "input_audio_buffer.commit"})
        elif appended:
            await conn.send({"type": "input_audio_buffer.clear"})
        params: dict[str, Any] = {
            "max_output_tokens": request.max_output_tokens if request.max_output_tokens is not None else "inf",
        }
        if conn.duplex:  # the duplex catalogue's response.create spells modalities the beta way
            params["modalities"] = ["audio", "text"] if audio else ["text"]
        else:
            params["output_modalities"] = ["audio"] if audio else ["text"]
        if request.instructions:
            params["instructions"] = request.instructions
        if request.temperature is not None:
            params["temperature"] = request.temperature
        lease.expect([{"type": "response.cancel"}], "response.done", "error")
        await conn.send({"type": "response.create", "response": params})
        text: list[str] = []
        calls: dict[str, int] = {}  # upstream function_call item id -> our call index
        streamed: set[str] = set()  # calls whose arguments came as deltas
        while True:
            event = await conn.recv(self.event_timeout_s)
            pcm = _answer_audio(event)
            if pcm is not None or isinstance(event, bytes):
                if pcm:
                    yield AudioDelta(pcm)
                continue
            kind = event.get("type")
            if kind in _TEXT_DELTAS:
                delta = event.get("delta") or ""
                if delta:
                    text.append(delta)
                    yield TextDelta(delta)
            elif kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call":
                item = event["item"]
                calls[item.get("id")] = len(calls)
                yield ToolCallDelta(calls[item.get("id")], "", call_id=item.get("call_id"), name=item.get("name"))
            elif kind == "response.function_call_arguments.delta" and event.get("item_id") in calls:
                streamed.add(event["item_id"])
                yield ToolCallDelta(calls[event["item_id"]], event.get("delta") or "")
            elif kind == "response.function_call_arguments.done" and event.get("item_id") in calls:
                if event["item_id"] not in streamed:  # an upstream that sends the arguments whole
                    yield ToolCallDelta(calls[event["item_id"]], event.get("arguments") or "")
            elif kind in _ITEM_ADDED:
                lease.add_item((event.get("item") or {}).get("id"))
            elif kind == "input_audio_buffer.committed":
                lease.add_item(event.get("item_id"))
            elif kind == "response.done":
                response = event.get("response") or {}
                break
            elif kind == "error" and not conn.stale(event):
                raise upstream_error(event)
        lease.expect([])
        for item in response.get("output") or []:
            if isinstance(item, dict):
                lease.add_item(item.get("id"))
        status = response.get("status")
        details = response.get("status_details") or {}
        if status == "failed":
            raise upstream_error({"error": details.get("error") or {}}, default="upstream_error")
        if status == "cancelled":
            raise EngineError("upstream_cancelled", "the upstream cancelled the response")
        # A gateway upstream reports a lost replica in its extension field gateway_reason.
        reason = details.get("reason") or details.get("gateway_reason")
        if status == "incomplete" and reason != "max_output_tokens":
            if reason in ("replica_lost", "upstream_lost"):
                raise UpstreamLost(f"upstream {lease.upstream.name} lost the response ({reason})")
            raise EngineError("upstream_incomplete", f"the upstream ended the response early ({reason})")
        yield Finished(
            reason="length" if status == "incomplete" else "stop",
            text="".join(text),
            usage=usage_of(response.get("usage")),
        )

    async def _append(self, conn: Connection, pcm: bytes) -> None:
        for i in range(0, len(pcm), MAX_APPEND_BYTES):
            await conn.send_audio(pcm[i : i + MAX_APPEND_BYTES])

    # --- transcribe ----------------------------------------------------------------

    def transcription_model(self, name: str | None) -> str:
        """The upstream's name for the speech-to-text a client asked for."""
        if self._stt_names is not None:
            if name is None:
                return next(iter(self._stt_names.values()), "whisper-1")
            return self._stt_names.get(name, self._stt_names.get("*", name))
        known = self.info.transcription_models
        return name if name in known else known[0]

    async def _transcribe(
        self, lease: Lease, request: TranscriptionRequest, inputs: _Inputs
    ) -> AsyncIterator[EngineOutput]:
        conn = lease.conn
        transcription: dict[str, Any] = {"model": self.transcription_model(request.model)}
        if request.language:
            transcription["language"] = request.language
        if request.prompt:
            transcription["prompt"] = request.prompt
        if request.keywords:
            transcription["keywords"] = list(request.keywords)
        if request.languages:
            transcription["languages"] = list(request.languages)
        updated = await self._open(lease, {
            "output_modalities": ["text"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None,
                                "transcription": transcription}},
            **({"include": ["item.input_audio_transcription.logprobs"]} if request.logprobs else {}),
        }, self._duplex_session(modalities=["text"], transcription=transcription))  # fmt: skip
        if not _transcribes(updated):
            raise EngineError("unsupported", f"upstream {lease.upstream.name} does not transcribe input audio")
        lease.expect([{"type": "input_audio_buffer.clear"}], "input_audio_buffer.cleared", "error")
        sender = asyncio.get_running_loop().create_task(self._send_audio(lease, inputs))
        receiver: asyncio.Task[dict[str, Any] | bytes] | None = None
        final: str | None = None
        usage = Usage()
        try:
            while final is None:
                if receiver is None:
                    receiver = asyncio.get_running_loop().create_task(conn.recv())
                waiting: set[asyncio.Task[Any]] = {receiver} if sender.done() else {receiver, sender}
                timeout = self.event_timeout_s if sender.done() else None
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise UpstreamLost(f"upstream {lease.upstream.name} sent no transcript", code="upstream_timeout")
                if sender in done and sender.exception() is not None:
                    raise sender.exception()  # type: ignore[misc]
                if receiver not in done:
                    continue
                event, receiver = receiver.result(), None
                if isinstance(event, bytes):
                    continue
                kind = event.get("type")
                if kind == "conversation.item.input_audio_transcription.delta":
                    if event.get("delta"):
                        yield TextDelta(event["delta"], logprobs=_logprobs(event.get("logprobs")))
                elif kind == "conversation.item.input_audio_transcription.completed":
                    final, usage = event.get("transcript") or "", usage_of(event.get("usage"))
                elif kind == "conversation.item.input_audio_transcription.failed":
                    err = event.get("error") or {}
                    raise EngineError("transcription_failed", f"upstream: {err.get('message') or 'failed'}")
                elif kind == "input_audio_buffer.committed":
                    lease.add_item(event.get("item_id"))
                elif kind == "input_audio_buffer.cleared" and sender.done():
                    final = ""  # under 100 ms: nothing to transcribe
                elif kind == "error" and not conn.stale(event):
                    if (event.get("error") or {}).get("code") in _COMMIT_EMPTY:
                        final = ""
                    else:
                        raise upstream_error(event, default="transcription_failed")
        finally:
            for task in (sender, receiver):
                if task is not None and not task.done():
                    task.cancel()
        lease.expect([])
        yield Finished(text=final, usage=usage)

    async def _send_audio(self, lease: Lease, inputs: _Inputs) -> None:
        sent = 0
        async for chunk in inputs.stream():
            if isinstance(chunk, AudioChunk) and chunk.pcm:
                await self._append(lease.conn, chunk.pcm)
                sent += len(chunk.pcm)
        if sent >= MIN_COMMIT_BYTES:
            # From here a cancelled request lets the transcription finish, then deletes its item.
            lease.expect([], "conversation.item.input_audio_transcription.completed",
                         "conversation.item.input_audio_transcription.failed", "error")  # fmt: skip
            await lease.conn.send({"type": "input_audio_buffer.commit"})
        else:
            await lease.conn.send({"type": "input_audio_buffer.clear"})


def _answer_audio(event: dict[str, Any] | bytes) -> bytes | None:
    """The answer audio an upstream event carries, a binary frame's (omni-binary.v1) or an audio
    delta's (b"": one with none); None: an event of another kind."""
    if isinstance(event, bytes):
        return output_audio_frame(event) or b""
    if event.get("type") in _AUDIO_DELTAS:
        return base64.b64decode(event.get("delta") or "")
    return None


def _ms(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _transcribes(updated: dict[str, Any]) -> bool:
    """Whether the upstream kept input transcription on (False when it dropped it)."""
    session = updated.get("session")
    if not isinstance(session, dict):
        return True
    if "input_audio_transcription" in session:  # beta shape
        return bool(session["input_audio_transcription"])
    audio_in = (session.get("audio") or {}).get("input")
    if isinstance(audio_in, dict) and "transcription" in audio_in:
        return bool(audio_in["transcription"])
    return True
