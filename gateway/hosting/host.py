"""SessionHost: one realtime session running on this replica, with or without a connection.

The host owns what cannot live in a snapshot: the session's engine requests,
its journal writer and lease, and the doors (connections) attached to it. It
outlives its connection: when the client drops, the host keeps the session
(and any answer being generated, journaled as it goes) for ``detach_grace_s``
so the client can come back and resume, on this replica or any other.

Everything a connection hands in comes through ``receive`` / ``receive_audio``
/ ``refuse`` / ``ack`` (from its ``Door``): the host calls the session and
flushes, in this one place. Every server event goes to the journal (as the JSON
the client reads) and to every attached door, in the same order, as it is
produced.

A host knows a small ``HostContext`` (the store, metrics, this replica's id,
lease and grace settings, the registry of hosts) and its doors; never the
transport, the app or the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from gateway.audio.codecs import AudioFormat
from gateway.hosting import takeover
from gateway.hosting.context import HostContext
from gateway.hosting.delivery import Delivery
from gateway.hosting.mcp import McpFailure
from gateway.hosting.reflect import Reflector
from gateway.hosting.responses_backend import UNCONFIGURED, ResponsesFailure
from gateway.protocol.errors import Code, ProtocolError
from gateway.session import snapshot
from gateway.session.effects import (
    CallMcpTool,
    Cancel,
    CloseSocket,
    CutAudio,
    EndInput,
    Feed,
    ListMcpTools,
    RunResponses,
    SendDtmf,
    StartConversation,
    StartResponse,
    StartTranscription,
    Wake,
)
from gateway.session.events import STATE_EVENTS, MediaEvent
from gateway.session.session import RealtimeSession
from gateway.store.base import FencedError, StateQuota, StoreError
from gateway.store.health import THROTTLE
from gateway.store.writer import JournalWriter
from gateway.telemetry import SessionTrace
from orchestrator.engine import EngineOutput, Finished
from orchestrator.orchestrator import Kind, Orchestrator, RequestHandle

log = logging.getLogger("omni.host")

ACK_TRIM_INTERVAL_S = 2.0  # session.event_ack trims the journal at most this often per session
OUTPUT_LIMIT_CODE = "rate_limit_exceeded"  # a response stopped by its tenant's output audio limit


class OutputMeter(Protocol):
    """The output audio limit of the session's principal (``quotas.Seat``)."""

    def output_allowed(self) -> bool:
        """Whether a response may start making audio now."""

    def audio_out(self, ms: float) -> bool:
        """``ms`` of output audio were made; False: the limit is reached (stop)."""

    def output_refusal(self) -> str:
        """What to tell the client when the limit stops or refuses a response."""

    async def work(self) -> None:
        """Work done for the principal that no client message paid for (an MCP listing):
        charged as one client event, waiting for the budget."""


class Attached(Protocol):
    """A connection attached to a host (its ``Door``), as the host sees it."""

    @property
    def delivery(self) -> Delivery:
        """What the connection is sent, and when (holds, the commit gate)."""

    @property
    def seat(self) -> OutputMeter | None:
        """The connection's share of its principal's limits."""

    def replaced(self, session_id: str) -> None:
        """Another connection took the session."""

    def close(self, code: int, reason: str) -> None: ...


class SessionHost:
    def __init__(
        self,
        ctx: HostContext,
        session: RealtimeSession,
        *,
        orchestrator: Orchestrator,
        principal: str,
        token_hash: str,  # of the current resume token ("": none is valid until rotate_token)
        fence: int,
        quota: StateQuota | None = None,  # what the store may keep of the principal's sessions
        head: dict[str, Any] | None = None,  # a session restored without its conversation: its snapshot
    ) -> None:
        self.ctx = ctx
        # Until load_conversation: the snapshot the session was restored from (its snapshots
        # are this one, re-keyed, so that nothing of the conversation not yet read is lost).
        self._head = head
        self.quota = quota
        self.session = session
        self.orchestrator = orchestrator  # the one of the session's engine
        self.principal = principal
        self.token_hash = token_hash
        self.fence = fence
        # Who may take the session beside its principal's keys and tokens: the binding of the
        # client secret that opened it (``Minted.binding``; None: a key or token opened it, and
        # no client secret resumes it), and whether it is a WebRTC call's (only then may a
        # sideband join it). Both live in the snapshot, so every replica knows them.
        self.minted: str | None = head.get("minted") if head is not None else None
        self.call = bool(head.get("call")) if head is not None else False
        self.writer = self._new_writer(fence)
        self.doors: list[Attached] = []  # the connections attached: one (a resume replaces it), and sidebands
        self.sidebands: set[Attached] = set()  # of the doors, the ones that joined beside it
        self.links: Any = None  # relayed sidebands (calls.Links), made by the bus listener when one asks
        self._reflector: Reflector | None = None  # the input audio reflected to sidebands (made at the first)
        self.handles: dict[str, RequestHandle] = {}
        # MCP listings and calls under way (gateway/hosting/mcp.py), by the response they serve
        # ("" for listings): a cancel of the response cancels its calls, the end all of them.
        self.mcp_tasks: dict[str, set[asyncio.Task[None]]] = {}
        # Responses backend requests under way (gateway/hosting/responses_backend.py), by request id.
        self.backend_tasks: dict[str, asyncio.Task[None]] = {}
        self._listings: dict[str, asyncio.Task[None]] = {}  # by server label: the one listing wanted
        self._outstanding = 0  # listings running or waiting for a place
        self._flush_due = False  # a flush is scheduled for the end of this loop turn
        self._listing_slots: asyncio.Semaphore | None = None  # the session's share (mcp_max_listings_per_session)
        # A drain (runtime.drain) waits for the session's first idle moment: called then, once.
        self._when_idle: Callable[[SessionHost], None] | None = None
        self.drained = False  # handed over by a drain: its last snapshot says so (the resumer's reason)
        self.ended = False
        self._reacquiring = False
        self._acked: int | None = None  # the highest ack not yet trimmed
        self.meter: OutputMeter | None = None  # set by the connection that carries the session
        self._metered_ms = session.audio_out_ms  # output audio already charged to the meter
        loop = asyncio.get_running_loop()
        lifetime_left = session.created_at + session.limits.lifetime_s - time.time()
        self._expiry = loop.call_later(max(0.0, lifetime_left), self._expire)
        self._detach_timer: asyncio.TimerHandle | None = None
        # The session's spans; None when tracing is off or the session is not sampled.
        self.trace: SessionTrace | None = None
        if ctx.telemetry is not None:
            self.trace = ctx.telemetry.session(
                session_id=session.id, principal=principal, replica_id=ctx.replica_id, model=session.config.model,
                engine=orchestrator.engine.info.name, restored=session.seq > 0,
            )  # fmt: skip
        ctx.hosts[session.id] = self  # from now on the lease loop renews its lease

    @classmethod
    async def open(
        cls,
        ctx: HostContext,
        session: RealtimeSession,
        *,
        orchestrator: Orchestrator,
        principal: str,
        quota: StateQuota | None = None,
    ) -> SessionHost:
        """Host a new session: take its lease first (its resume token comes from ``rotate_token``).
        Raises StateLimitExceeded when ``quota`` has no room for another session."""
        fence = await ctx.store.acquire(session.id, ctx.replica_id, ctx.lease_ttl_ms, quota=quota, new=True)
        return cls(ctx, session, orchestrator=orchestrator, principal=principal, token_hash="", fence=fence,
                   quota=quota)  # fmt: skip

    @property
    def id(self) -> str:
        return self.session.id

    def _new_writer(self, fence: int) -> JournalWriter:
        return JournalWriter(
            self.ctx.store, self.session.id, fence, on_fenced=self._on_fenced, on_flushed=self._on_flushed,
            quota=self.quota,
        )  # fmt: skip

    def _on_flushed(self, seq: int, committed: bool) -> None:
        """The store took (or failed to take) the journal up to ``seq``: a peer that
        sends events only once committed may send them now. After a failure they go
        out anyway: the client must not wait on the store (a resume elsewhere then
        finds it ahead of the store and resyncs it)."""
        for door in self.doors:
            door.delivery.committed(seq)

    def ack(self, seq: int) -> None:
        """The client holds events up to ``seq``: trim the journal, at most once per
        ``ACK_TRIM_INTERVAL_S`` (a trim is a store round trip; acks come often)."""
        seq = min(seq, self.session.seq)  # never past what was sent
        first = self._acked is None
        self._acked = max(seq, self._acked or 0)
        if first:
            asyncio.get_running_loop().call_later(ACK_TRIM_INTERVAL_S, self._trim)

    def _trim(self) -> None:
        seq, self._acked = self._acked, None
        if seq is not None and not self.ended:
            self.ctx.spawn(self._trim_to(seq))

    async def _trim_to(self, seq: int) -> None:
        with contextlib.suppress(StoreError):
            await self.ctx.store.trim_events(self.id, seq, quota=self.quota)

    def rotate_token(self) -> str:
        token = takeover.new_resume_token()
        self.token_hash = takeover.token_hash(token)
        self.session.dirty = True
        return token

    def restore_token(self, token_hash: str) -> None:
        """A resume that rotated the token failed before the client learnt the new one: the
        one it holds is the session's again, here and (with the next flush, which replaces a
        snapshot still pending with the new one) in the store."""
        self.token_hash = token_hash
        if not self.ended:
            with contextlib.suppress(FencedError, RuntimeError):
                self.save_snapshot()

    # --- the connection ----------------------------------------------------------

    def attach(self, door: Attached, *, sideband: bool = False) -> None:
        """``door`` now carries the session; the connection attached before it is replaced.
        A ``sideband`` (a backend's socket beside a WebRTC call) joins: it replaces nothing
        and nothing replaces it but a takeover by another replica."""
        if self._detach_timer is not None:
            self._detach_timer.cancel()
            self._detach_timer = None
        door.delivery.committed(self.writer.committed_seq)
        if getattr(door, "media", None) is not None:
            self.call = True  # carried by a WebRTC call: its sideband may join
        if sideband:
            self.doors.append(door)
            self.sidebands.add(door)
            return
        old = [d for d in self.doors if d not in self.sidebands]
        self.doors = [door, *(d for d in self.doors if d in self.sidebands)]
        self.meter = door.seat
        for other in old:
            if other is not door:
                other.replaced(self.id)

    def detach(self, door: Attached) -> None:
        """The connection went away; keep the session resumable for a grace period."""
        if door not in self.doors or self.ended:
            return
        self.doors.remove(door)
        self.sidebands.discard(door)
        if not self.doors:
            self._detach_timer = asyncio.get_running_loop().call_later(self.ctx.detach_grace_s, self._grace_over)

    @property
    def attachment_generation(self) -> int:
        """How many connections the session has had (the duplex dialect reports it)."""
        return self.session.attachment_generation

    def reattached(self) -> int:
        """A resume brought the session a new connection: its generation (in the snapshot too)."""
        self.session.attachment_generation += 1
        self.session.dirty = True
        return self.session.attachment_generation

    def _grace_over(self) -> None:
        asyncio.get_running_loop().create_task(self.end(reason="client gone"))

    # --- what a connection hands in ------------------------------------------------

    def start(self, **start: Any) -> str:
        """The new session's ``session.created`` (its resume token, returned, in it);
        ``start``: what the dialect's opening adds (``configured``, ``warnings``)."""
        token = self.rotate_token()
        self.session.start(resume_token=token, **start)
        self.flush()
        return token

    def receive(self, event: Any) -> None:
        """One decoded client event of the session's dialect. After a drain handed the
        session over, none is handled: the client resumes elsewhere (docs/sessions.md, *Drain*)."""
        if self.drained:
            return
        try:
            self.session.handle(event)
        except ProtocolError as err:
            self.session.error(err)
        except Exception:  # a bug must cost one event, not the session
            log.exception("session %s: unexpected failure handling a client event", self.id)
            self._internal_error()
        self.flush()

    def receive_audio(self, audio: bytes, fmt: AudioFormat | None = None) -> None:
        """Input audio in the session's input format (a binary frame), or in ``fmt``, a media
        transport's own (a call's track, a phone's µ-law): the session converts it to the
        engine's format, once."""
        if self.drained:
            return
        if self.sidebands:
            self._reflect(audio, fmt or self.input_format)
        try:
            self.session.append_input(audio, fmt)
        except ProtocolError as err:
            self.session.error(err)
        except Exception:
            log.exception("session %s: unexpected failure handling input audio", self.id)
            self._internal_error()
        self.flush()

    def _reflect(self, audio: bytes, fmt: AudioFormat) -> None:
        """The call's input audio (its track: only a WebRTC session has sidebands), to the sidebands,
        where the dialect reflects it (``reflect.py``)."""
        encode = self.session.dialect.reflect
        if encode is None:
            return
        if self._reflector is None:
            self._reflector = Reflector(encode)
        with contextlib.suppress(ProtocolError, ValueError):  # (audio the session refuses: its error says why)
            self._reflector.reflect(audio, fmt, [d.delivery for d in self.sidebands])

    def refuse(self, err: ProtocolError) -> None:
        """A client message refused before it reached the session (it did not decode,
        was too large, is not allowed on this connection): a coded error in its stream."""
        self.session.error(err)
        self.flush()

    def _internal_error(self) -> None:
        self.session.error(ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error"))

    def configure(self, update: Any, *, media: bool = False) -> list[tuple[str, str]]:
        """The settings of the dialect's opening event, applied before the session starts
        (``Opening.with_config``; ``media``: a media transport's request, GPT-Live's ``POST
        /v1/live/sessions``): the warnings to report; raises ProtocolError."""
        return self.session.configure(update, media=media)

    def expire_idle(self) -> None:
        """No client event for the dialect's idle timeout (the door keeps the clock)."""
        self.session.expire_idle()
        self.flush()

    @property
    def idle_timeout_s(self) -> float | None:
        """The session's idle timeout (the duplex dialect's ``idle_timeout_s``); None: none."""
        return self.session.idle_timeout_s

    def playback(self, kind: str, response_id: str | None, item_id: str | None = None, audio_end_ms: int = 0) -> None:
        """What the connection played of the answers' audio (a WebRTC call plays it: the
        client does not): ``started``, ``stopped``, or ``cleared`` at ``audio_end_ms`` of
        ``item_id`` (a barge-in, a cancel, ``output_audio_buffer.clear``)."""
        try:
            self.session.playback(kind, response_id, item_id, audio_end_ms)
        except Exception:
            log.exception("session %s: unexpected failure recording playback", self.id)
        self.flush()

    def dtmf(self, digit: str) -> None:
        """A key the caller pressed (a phone call's carrier said so): the session says it."""
        try:
            self.session.dtmf(digit, int(time.time()))
        except Exception:
            log.exception("session %s: unexpected failure recording a key press", self.id)
        self.flush()

    @property
    def call_media(self) -> Any:
        """The connection that plays the session's audio (a WebRTC or phone call's ``Media``), if
        one carries it here: a sideband's ``output_audio_buffer.clear`` cuts it there."""
        for door in self.doors:
            media = getattr(door, "media", None)
            if media is not None and door not in self.sidebands:
                return media
        return None

    @property
    def holds_call(self) -> bool:
        """A connection that cannot reconnect (a carrier's phone call) carries the session:
        a drain lets the call finish, up to its window, rather than hand it over when idle."""
        for door in self.doors:
            media = getattr(door, "media", None)
            if media is not None and not media.reconnects:
                return True
        return False

    @property
    def interrupted_by_speech(self) -> bool:
        """Server VAD with ``interrupt_response``: speech over an answer interrupts it."""
        detection = self.session.config.turn_detection
        return detection is not None and detection.interrupt_response

    @property
    def input_format(self) -> AudioFormat:
        return self.session.config.input_format

    @property
    def output_format(self) -> AudioFormat:
        return self.session.config.output_format

    def input_ms(self, nbytes: int, fmt: AudioFormat | None = None) -> float:
        """How long ``nbytes`` of input audio last, in ``fmt`` (None: the session's input format):
        what the tenant's input limit counts."""
        return (fmt or self.session.config.input_format).duration_ms(nbytes)

    # --- events and effects --------------------------------------------------------

    def flush(self) -> None:
        """Journal and send what the session produced; run its effects.

        Write-ahead: when the events of a flush change session state (one of them
        is in ``STATE_EVENTS``), every door holds them all until the store has
        committed the batch that holds them and the snapshot with their state: one
        commit for the flush. A replica that takes the session over then knows
        everything the client saw begin. A flush of deltas waits for nothing: they
        are journaled in the writer's batches."""
        session = self.session
        if not (session.events or session.effects or session.dirty):
            return  # most engine outputs and appends produce nothing to send
        events, effects = session.take()
        if self.trace is not None:
            self.trace.flushed(session.audio_ms, events, effects)
        encode, doors, writer = session.dialect.encode, self.doors, self.writer
        journal = True
        held = bool(doors) and any(event["type"] in STATE_EVENTS and not isinstance(event, MediaEvent)
                                   for event in events)  # fmt: skip
        if held:
            for door in doors:
                door.delivery.hold()  # until the commit (below)
        try:
            for event in events:
                if isinstance(event, MediaEvent):  # (for the connections that play the audio, in order)
                    for door in doors:
                        if getattr(door, "media", None) is not None:
                            door.delivery.send(event, b"")
                    continue
                data = encode(event)
                if data is None:
                    continue  # the dialect never had it (beta: conversation.item.done); its seq is skipped
                if journal:
                    try:
                        writer.append(event["server_event_seq"], data)
                    except FencedError as exc:
                        # Not journaled (the store lost us or another replica has the
                        # session), but the client still gets every event, in order.
                        journal = False
                        self._on_fenced(exc)
                if event["type"] == "error":
                    self.ctx.metrics.errors.labels(event["error"]["code"]).inc()
                for door in doors:
                    door.delivery.send(event, data)
            if session.dirty and journal:
                self._snapshot_changes(writer)
        except FencedError as exc:
            self._on_fenced(exc)
        if held:
            self.ctx.spawn(self._release_when_committed(list(doors)))
        if self.ended:
            return
        made = session.audio_out_ms - self._metered_ms
        if made > 0 and self.meter is not None:
            self._metered_ms = session.audio_out_ms
            if not self.meter.audio_out(made) and session.active_response_id is not None:
                asyncio.get_running_loop().call_soon(self._stop_output, session.active_response_id)
        if effects:
            self._run_effects(effects)
        if self._when_idle is not None and self.idle():
            ready, self._when_idle = self._when_idle, None
            ready(self)

    # --- drain -----------------------------------------------------------------------

    def idle(self) -> bool:
        """Between answers and turns: handing the session over now cuts nothing (no
        response running or waiting to start, no output paced out after its answer, no
        user audio buffered, no transcription, MCP listing or Responses backend request
        under way), and the conversation of a restored session is read."""
        session = self.session
        responses = session.responses
        return self._head is None and not (
            responses.answering()
            or session.output_pending
            or responses.out_of_band
            or session.input_audio.is_open
            or self.mcp_tasks
            or self.backend_tasks
            or any(item.pending_transcription for item in session.conversation)
        )

    def when_idle(self, ready: Callable[[SessionHost], None] | None) -> None:
        """Call ``ready(self)`` at the session's first idle moment (now, if it is idle);
        None: no longer."""
        self._when_idle = ready
        if ready is not None and not self.ended and self.idle():
            self._when_idle = None
            ready(self)

    def hand_over(self, code: int, reason: str) -> asyncio.Task[Any]:
        """A drain: every connection closes with ``code`` (resume elsewhere) and the session
        ends here, its state in the store (the task returned: await it before exiting); a
        resume elsewhere knows it was drained."""
        self.drained = True
        self._when_idle = None
        for door in list(self.doors):
            door.close(code, reason)
        return self.ctx.spawn(self.end(reason="drained"))

    def _stop_output(self, response_id: str) -> None:
        """The tenant's output audio limit is reached: the response fails (and, if it runs, stops)."""
        if self.ended or self.session.active_response_id != response_id or self.meter is None:
            return
        handle = self.handles.pop(response_id, None)
        if handle is not None:
            handle.cancel()
        self.session.on_response_failed(response_id, OUTPUT_LIMIT_CODE, self.meter.output_refusal())
        self.flush()

    async def _release_when_committed(self, doors: list[Attached]) -> None:
        try:
            await self.writer.flush()
        except StoreError as exc:
            # The store is down (or another replica took the session): deliver anyway,
            # the client must not wait. A resume elsewhere then finds the client ahead
            # of the store and resyncs it (takeover.py), never a silent hole.
            THROTTLE.warning(log, "uncommitted", "session %s: journal commit failed (%s); delivering uncommitted",
                             self.id, exc)  # fmt: skip
        finally:
            for door in doors:
                door.delivery.release(0)

    def snapshot_bytes(self) -> bytes:
        """The snapshot's head: the items are records of their own (``_snapshot_changes``)."""
        if self._head is not None:
            # The conversation is not read yet: the store's snapshot stands, with what the
            # claim changed (the seq, the rotated token).
            state = {**self._head, "seq": self.session.seq}
            state.pop("ended_by", None)
        else:
            state = self.session.snapshot_state(with_items=False)
        state["principal"] = self.principal
        state["token_hash"] = self.token_hash
        if self.minted is not None:
            state["minted"] = self.minted
        if self.call:
            state["call"] = True
        if self.drained:
            state["ended_by"] = "drain"  # (a resume elsewhere ends what was cut as drained, not lost)
        return snapshot.dumps(state)

    def save_snapshot(self) -> None:
        """The snapshot (and the item records that changed) into the writer's next flush."""
        self._snapshot_changes(self.writer)

    async def load_conversation(self) -> None:
        """Read the conversation of a session restored without it (``head``): after the
        resume is answered, before anything else reaches the session (the connection's
        messages wait behind the resume). Raises StoreError (also when the store no longer
        holds the session)."""
        if self._head is None:
            return
        stored = await self.ctx.store.load_session(self.id)
        try:
            state = snapshot.assemble(*stored) if stored is not None else None
        except (ValueError, KeyError) as exc:
            raise StoreError(f"session {self.id}: its stored state is unreadable ({exc})") from exc
        if state is None:
            raise StoreError(f"session {self.id}: the store no longer holds it")
        if self.ended or self._head is None:
            return
        self.session.load_conversation(state)
        self._head = None

    def _snapshot_changes(self, writer: JournalWriter) -> None:
        """The snapshot without its items, and the records of the items that changed: a
        flush costs what changed, not the whole conversation (one record per item)."""
        session = self.session
        changed, dropped = session.take_item_changes()
        conversation = session.conversation
        items = {i: snapshot.item_bytes(item) for i in changed if (item := conversation.get(i)) is not None}
        writer.set_snapshot(self.snapshot_bytes(), items, dropped)
        session.dirty = False

    def _snapshot_whole(self, writer: JournalWriter) -> None:
        """Every item record again (the store lost them: Redis came back empty)."""
        session = self.session
        session.take_item_changes()
        items = {item.id: snapshot.item_bytes(item) for item in session.conversation}
        writer.set_snapshot(self.snapshot_bytes(), items)
        session.dirty = False

    def _run_effects(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Feed():
                    handle = self.handles.get(effect.request_id)
                    if handle is not None:
                        handle.feed(effect.chunk)
                case EndInput():
                    handle = self.handles.get(effect.request_id)
                    if handle is not None:
                        handle.end()
                case StartTranscription() | StartResponse():
                    if not self.ended:
                        self._start(effect)
                case StartConversation():
                    if not self.ended:
                        self._converse(effect)
                case ListMcpTools():
                    self._list_anew(effect)
                case CallMcpTool():
                    self._mcp_task(effect.response_id, self._call_mcp(effect))
                case RunResponses():
                    self._run_responses(effect)
                case Cancel():
                    handle = self.handles.pop(effect.request_id, None)
                    if handle is not None:
                        handle.cancel()
                    for task in self.mcp_tasks.pop(effect.request_id, ()):
                        task.cancel()
                    backend = self.backend_tasks.pop(effect.request_id, None)
                    if backend is not None:
                        backend.cancel()
                    if self.trace is not None:
                        self.trace.request_ended(effect.request_id, "cancelled")
                case Wake():
                    asyncio.get_running_loop().call_later(effect.after_s, self._wake, effect.key)
                case CutAudio():
                    for door in self.doors:
                        media = getattr(door, "media", None)  # (a WebRTC call's door: it plays the audio)
                        if media is not None:
                            media.clear_audio()
                case SendDtmf():
                    self._send_dtmf(effect)
                case CloseSocket():
                    self.ctx.metrics.closes.labels(str(effect.code)).inc()
                    for door in self.doors:
                        door.close(effect.code, effect.reason)
                    asyncio.get_running_loop().create_task(self.end(reason=effect.reason))

    def _send_dtmf(self, effect: SendDtmf) -> None:
        """A key for the call's far end: the connection that carries a SIP call sends it on its
        RTP (``send_dtmf``: None, then a call once it is sent; or why not); the session says
        what became of it."""
        sender = getattr(self.call_media, "send_dtmf", None)
        refused = "transport.dtmf.send is for a SIP call's sideband; this session has no SIP transport."
        if sender is not None:
            refused = sender(effect.digit, lambda: self._dtmf_done(effect, None))
        if refused is not None:
            asyncio.get_running_loop().call_soon(self._dtmf_done, effect, refused)  # (effects run inside a flush)

    def _dtmf_done(self, effect: SendDtmf, refused: str | None) -> None:
        if self.ended:
            return
        try:
            self.session.dtmf_sent(effect.digit, effect.event_id, refused)
        except Exception:
            log.exception("session %s: unexpected failure recording a key sent", self.id)
        self.flush()

    def transport_progress(self, kind: str, fields: dict[str, Any]) -> None:
        """An outbound call's progress (``ringing``, ``answered``, ``failed``): the session says it."""
        try:
            self.session.transport_progress(kind, fields)
        except Exception:
            log.exception("session %s: unexpected failure recording the call's progress", self.id)
        self.flush()

    def _wake(self, key: str) -> None:
        """A ``Wake`` the session asked for is due."""
        if self.ended or self.drained:
            return
        try:
            self.session.wake(key)
        except Exception:  # a bug must cost one event, not the session
            log.exception("session %s: unexpected failure on a timed event (%s)", self.id, key)
        self.flush()

    def _start(self, effect: StartTranscription | StartResponse) -> None:
        rid = effect.request.request_id
        transcription = isinstance(effect, StartTranscription)
        if isinstance(effect, StartResponse) and "audio" in effect.request.modalities:
            if self.meter is not None and not self.meter.output_allowed():
                asyncio.get_running_loop().call_soon(self._stop_output, rid)  # never sent to the engine
                return

        def on_output(output: EngineOutput) -> None:
            if isinstance(output, Finished):
                self.handles.pop(rid, None)
            if transcription:
                self.session.on_transcription(rid, output)
            else:
                self.session.on_response(rid, output)
            self.flush()

        def on_error(code: str, message: str) -> None:
            self.handles.pop(rid, None)
            if transcription:
                self.session.on_transcription_failed(rid, code, message)
            else:
                self.session.on_response_failed(rid, code, message)
            self.flush()

        kind: Kind = "transcription" if transcription else "response"
        callbacks: tuple[Callable[[EngineOutput], None], Callable[[str, str], None]] = (on_output, on_error)
        if self.trace is not None:  # the same callbacks, reported to the session's trace
            callbacks = self.trace.request(kind, rid, on_output, on_error)
        self.handles[rid] = self.orchestrator.submit(
            kind,
            effect.request,
            on_output=callbacks[0],
            on_error=callbacks[1],
            turn_started_at=None if isinstance(effect, StartTranscription) else effect.turn_started_at,
        )

    def _converse(self, effect: StartConversation) -> None:
        """A conversation with an engine that takes its own turns: held until the session
        cancels it (its end or its close); its outputs and its failure go to the session."""
        rid = effect.request.request_id

        def on_output(output: Any) -> None:
            self.session.on_turn(rid, output)
            self.flush()

        def on_error(code: str, message: str) -> None:
            self.handles.pop(rid, None)
            self.session.on_turns_failed(rid, code, message)
            self.flush()

        self.handles[rid] = self.orchestrator.submit("conversation", effect.request, on_output=on_output,
                                                     on_error=on_error)  # fmt: skip

    # --- MCP servers (the session's effects; gateway/hosting/mcp.py does the I/O) ---------

    def _mcp_task(self, key: str, work: Any) -> asyncio.Task[None] | None:
        if self.ended:
            work.close()
            return None
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        tasks = self.mcp_tasks.setdefault(key, set())
        tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            if not tasks and self.mcp_tasks.get(key) is tasks:
                del self.mcp_tasks[key]

        task.add_done_callback(done)
        return task

    def _list_anew(self, effect: ListMcpTools) -> None:
        """List a server; a label listed again (reached anew) cancels its listing under way.
        Past the listings a session may have outstanding, it fails at once."""
        label = str(effect.server.get("server_label", ""))
        superseded = self._listings.pop(label, None)
        if superseded is not None:
            superseded.cancel()
        mcp = self.ctx.mcp
        if mcp is not None and self._outstanding >= mcp.max_outstanding_per_session:
            limit = mcp.max_outstanding_per_session
            why = (f"this session has {limit} MCP servers being listed, its limit (four times "
                   "mcp_max_listings_per_session): list fewer at once")  # fmt: skip
            self.session.mcp_listed(effect.item_id, None, why)
            self._flush_soon()
            return
        task = self._mcp_task("", self._list_mcp(effect))
        if task is None:
            return
        self._listings[label] = task
        self._outstanding += 1

        def done(t: asyncio.Task[None]) -> None:
            self._outstanding -= 1
            if self._listings.get(label) is t:
                del self._listings[label]

        task.add_done_callback(done)

    def _flush_soon(self) -> None:
        """Flush at the end of this loop turn: what many listings end with at once goes out in
        one flush (one commit), not one each."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._due_flush)

    def _due_flush(self) -> None:
        self._flush_due = False
        if not self.ended:
            self.flush()

    async def _list_mcp(self, effect: ListMcpTools) -> None:
        tools: list[dict[str, Any]] | None = None
        failure: str | None = None
        try:
            mcp = self.ctx.mcp
            if mcp is None:
                raise McpFailure("MCP is off on this gateway")
            if self._listing_slots is None:
                self._listing_slots = asyncio.Semaphore(mcp.policy.max_listings_per_session)
            meter = self.meter
            tools = await mcp.list_tools(effect.server, session_slots=self._listing_slots,
                                         charge=meter.work if meter is not None else None)  # fmt: skip
        except McpFailure as exc:
            failure = str(exc)
        except Exception:
            log.exception("session %s: listing MCP server %s failed", self.id, effect.server.get("server_label"))
            failure = "the gateway failed while listing them"
        if self.ended:
            return
        log.info("session %s: MCP server %s listed: %s", self.id, effect.server.get("server_label"),
                 failure or f"{len(tools or ())} tools")  # fmt: skip
        self.session.mcp_listed(effect.item_id, tools, failure)
        self._flush_soon()

    async def _call_mcp(self, effect: CallMcpTool) -> None:
        output: str | None = None
        error: dict[str, Any] | None = None
        try:
            if self.ctx.mcp is None:
                raise McpFailure("MCP is off on this gateway")
            output = await self.ctx.mcp.call_tool(effect.server, effect.name, effect.arguments)
        except McpFailure as exc:
            error = exc.error
        except Exception:
            log.exception("session %s: MCP call of %s failed", self.id, effect.name)
            error = {"type": "tool_execution_error", "message": "The gateway failed while calling the tool."}
        if self.ended:
            return
        self.session.mcp_called(effect.item_id, output, error)
        self.flush()

    # --- the Responses backend (the session's effect; gateway/hosting/responses_backend.py) ---

    def _run_responses(self, effect: RunResponses) -> None:
        if self.ended:
            return
        rid = effect.request_id
        task = asyncio.get_running_loop().create_task(self._responses(effect))
        self.backend_tasks[rid] = task
        task.add_done_callback(
            lambda t: self.backend_tasks.pop(rid, None) if self.backend_tasks.get(rid) is t else None
        )

    async def _responses(self, effect: RunResponses) -> None:
        """Stream the request's events into the session, then its end (or why it failed)."""
        rid = effect.request_id
        failure: tuple[str, str] | None = None
        try:
            backend = self.ctx.responses
            if backend is None:
                raise ResponsesFailure(UNCONFIGURED, "This gateway has no Responses backend (live_responses_url).")
            async with contextlib.aclosing(backend.stream(effect.body)) as events:
                async for event in events:
                    if self.ended:
                        return
                    self._backend(rid, event, None)
        except ResponsesFailure as exc:
            failure = (exc.code, exc.message)
        except Exception:
            log.exception("session %s: the Responses request %s failed", self.id, rid)
            failure = (Code.INTERNAL, "The gateway failed while running the Responses request.")
        if not self.ended:
            self._backend(rid, None, failure)

    def _backend(self, rid: str, event: dict[str, Any] | None, failure: tuple[str, str] | None) -> None:
        """An event of request ``rid`` (None: its end, ``failure`` or not) into the session, then a
        flush (a bug costs that one event, not the session)."""
        try:
            if event is not None:
                self.session.backend_event(rid, event)
            else:
                self.session.backend_ended(rid, failure)
        except Exception:
            log.exception("session %s: unexpected failure on a Responses event", self.id)
        self.flush()

    def _expire(self) -> None:
        self.session.expire()
        self.flush()

    # --- ownership -------------------------------------------------------------------

    def _on_fenced(self, exc: FencedError) -> None:
        if self.ended or exc.fence != self.fence or self._reacquiring:
            return  # a stale writer's late news, or a re-acquire already under way
        if exc.current is None:
            # The store lost the session (Redis restarted empty): take it again.
            log.warning("session %s: store lost its lease; re-acquiring", self.id)
            self._reacquiring = True
            self.ctx.spawn(self._reacquire())
        else:
            self.replaced()

    async def _reacquire(self) -> None:
        try:
            while not self.ended:
                try:
                    fence = await self.ctx.store.acquire(
                        self.id, self.ctx.replica_id, self.ctx.lease_ttl_ms, quota=self.quota
                    )
                    break
                except StoreError as exc:
                    THROTTLE.warning(log, "reacquire", "session %s: re-acquire failed (%s); retrying", self.id, exc)
                    await asyncio.sleep(0.5)
            else:
                return
            self.fence = fence
            self.writer.abandon()  # its lease is gone: the new writer carries on
            self.writer = self._new_writer(fence)
            # Everything up to now may be missing from the journal (Redis came back
            # empty, and events made meanwhile were never written): say so, so that a
            # resume from before here gets resync_required instead of a silent hole.
            self.writer.mark_lost(self.session.seq)
            self._snapshot_whole(self.writer)
            self.ctx.metrics.store_writebacks.inc()
            log.info("session %s: taken again and written back whole (fence %d)", self.id, fence)
        finally:
            self._reacquiring = False

    def replaced(self) -> None:
        """Another replica (or connection) took the session over: stop serving it."""
        if self.ended:
            return
        log.info("session %s taken over elsewhere", self.id)
        if self.trace is not None:
            self.trace.end("taken over")
        doors, self.doors = self.doors, []
        for door in doors:
            door.replaced(self.id)
        self._stop()
        self.writer.abandon()  # fenced: nothing more of ours reaches the store
        self.ctx.hosts.pop(self.id, None)

    def on_bus(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == "replaced":
            self.replaced()
        elif kind == "hangup":
            self.ctx.spawn(self.hang_up())

    async def hang_up(self) -> None:
        """The call is over (``POST /v1/realtime/calls/{id}/hangup``): every connection is
        closed and the session ends for good."""
        for door in list(self.doors):
            door.close(1000, "call ended")
        await self.end(reason="hung up", delete=True)

    async def renewal_refused(self, fence: int) -> None:
        """The store would not renew the lease taken with ``fence`` (the lease loop
        says so): another replica took the session, or the lease lapsed or was lost
        with a Redis restart and is ours to take again."""
        ctx = self.ctx
        if self.ended or fence != self.fence or self._reacquiring:
            return  # a re-acquire since that renewal was sent, or one under way
        try:
            owner = await ctx.store.owner_of(self.id)
        except StoreError as exc:
            THROTTLE.warning(log, "lease-check", "session %s: lease check failed: %s", self.id, exc)
            return  # the next renewal round tries again
        if owner is not None and owner.owner != ctx.replica_id:
            self.replaced()
        elif not (self.ended or self._reacquiring):
            self._reacquiring = True
            await self._reacquire()

    # --- the end -------------------------------------------------------------------------

    def _stop(self) -> None:
        self.ended = True
        self._expiry.cancel()
        if self._detach_timer is not None:
            self._detach_timer.cancel()
        self.session.shutdown()
        self.session.take()
        for handle in self.handles.values():
            handle.cancel()
        self.handles.clear()
        for tasks in self.mcp_tasks.values():
            for task in tasks:
                task.cancel()
        self.mcp_tasks.clear()
        for backend in self.backend_tasks.values():
            backend.cancel()
        self.backend_tasks.clear()

    async def end(self, *, reason: str, delete: bool = False) -> None:
        """Stop serving the session here. Its state stays in the store (resumable
        until the journal's idle TTL) unless ``delete`` and the session keeps none
        (``RealtimeSession.retained``: stored for its client, until that TTL)."""
        if self.ended:
            return
        delete = delete and not self.session.retained
        log.info("session %s ends here: %s", self.id, reason)
        # The last snapshot is taken before stopping: a running answer stays in it, so
        # the replica that resumes the session ends it (incomplete) and re-issues it.
        if not delete:
            with contextlib.suppress(StoreError, RuntimeError):
                self._snapshot_changes(self.writer)
        if self.trace is not None:
            self.trace.end(reason)
        self._stop()
        self.ctx.hosts.pop(self.id, None)
        store = self.ctx.store
        with contextlib.suppress(StoreError, RuntimeError):
            await self.writer.close(flush=not delete)
            if delete:
                await store.delete_session(self.id, quota=self.quota)
            await store.release(self.id, self.ctx.replica_id, self.fence, quota=self.quota)


__all__ = ["HostContext", "OutputMeter", "SessionHost"]
