"""Responses (Sans-I/O): from response.create (or a turn) to response.done.

``Responses`` owns the running responses: the conversation's (``current``, at
most one) and the out-of-band ones (conversation ``"none"``), their outputs as
they stream, and ``audio_out_ms``. It builds each engine request (context,
voice, tools) and turns engine outputs into events.

A response that needs a transcript still being finished starts at once and
receives the transcript as a streamed input chunk (``transcribed``), so the
engine is never idle waiting for the whole pipeline.

Outputs follow the GA order. An assistant message: ``response.output_item.added``,
``conversation.item.added``, ``response.content_part.added``, its deltas, then
at the end ``..._audio.done``/``..._text.done``, ``response.content_part.done``,
``response.output_item.done``, ``conversation.item.done``. A function call:
``response.output_item.added`` (a ``function_call`` item, empty arguments),
``conversation.item.added``, ``response.function_call_arguments.delta``..., then
``response.function_call_arguments.done``, ``response.output_item.done``,
``conversation.item.done``. ``response.done`` carries every output.

MCP tools (mcp.py lists them) run inside the response. A call of one is an
``mcp_call``: ``response.output_item.added``, ``conversation.item.added``,
``response.mcp_call_arguments.delta``..., ``response.mcp_call_arguments.done``,
``response.mcp_call.in_progress``; the host calls the server (``CallMcpTool``)
and its answer (``called``) sends ``response.mcp_call.completed`` (or
``.failed``), ``response.output_item.done`` and ``conversation.item.done``
with the output (or the error). What the engine makes meanwhile waits, so
each item still finishes before the next begins. Where ``require_approval``
says so the call is first an ``mcp_approval_request`` item, and the response
waits for the client's ``mcp_approval_response`` (``approval``): approved,
the call runs as above, with its ``approval_request_id``; declined, the model
is told so. Once the round's calls are answered, the engine is asked again,
in the same response, with the results in its context: at most
``MCP_ROUNDS`` engine requests per response, the last one offered no tools,
so a response always ends.

It knows the event log, the history (to add outputs and read the context), and
through callbacks what it may not know itself: how a client's item spec becomes
an item (``make_item``), who wants to know an answer ended (``answered``), and
the dialect's turn-taking (``ResponseTurns``). It knows nothing of input audio.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from gateway.audio.convert import Converter, engine_format
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import (
    OPENAI_VOICES,
    SessionConfig,
    engine_voice,
    parse_beta_format,
    parse_ga_format,
)
from gateway.protocol.session_fields import check_tool_choice_names
from gateway.session.context import fit_context
from gateway.session.conversation import Item, ItemType, Part, to_messages
from gateway.session.effects import CallMcpTool, Cancel, EndInput, Feed, StartResponse
from gateway.session.events import EventLog
from gateway.session.history import History
from gateway.session.limits import SessionLimits, check_images
from gateway.session.mcp import McpServers
from gateway.session.response import Response, engine_tool_choice, engine_tools
from orchestrator.engine import (
    AudioDelta,
    EngineInfo,
    EngineOutput,
    Finished,
    ResponseRequest,
    TextChunk,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
    Usage,
)

log = logging.getLogger(__name__)

# Engine requests per response: the first, and one after each round of MCP results. The
# last is offered no tools, so a model that keeps calling still ends its response.
MCP_ROUNDS = 4


class ResponseTurns(Protocol):
    """What the responses part tells the dialect's turn-taking (``turn_taking.TurnTaking``):
    the conversation's answer ends (an out-of-band one ends unannounced); and what it asks of
    it: how a response's message is named."""

    @property
    def message_named_by_response(self) -> bool:
        """A response's (first) message is ``item_<response id>`` (the duplex document's
        identity rule: a client may build the id); False: a fresh ``item_`` id."""

    def answer_ending(self, resp: Response, status: str) -> None:
        """Before its closing events: what the dialect must capture of it."""

    def answer_ended(self, resp: Response, status: str) -> None:
        """After its ``response.done``: the dialect may start the next answer."""


class Responses:
    """See the module docstring."""

    def __init__(
        self,
        log: EventLog,
        history: History,
        turns: ResponseTurns,
        *,
        engine: EngineInfo,
        limits: SessionLimits,
        beta: bool,
        config: SessionConfig,
        lazy_message: bool,
        make_item: Callable[[ce.ItemSpec, str], Item],
        answered: Callable[[float], None],
        rate_limits: Callable[[], dict[str, Any]] | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        """``make_item(spec, param)``: an item of ``response.input``; ``answered(audio_ms)``:
        the conversation's answer ended, with ``audio_ms`` of audio for the client to play;
        ``rate_limits()``: the fields of rate_limits.updated (sent after each response.done).
        ``lazy_message``: a response that may call a function opens its message on its first
        text or audio, so that a call alone is the whole output (False: always at once, as the
        duplex dialect's playback ledgers need it when the response is created)."""
        self.config = config  # the session's, set again on every update
        self.current: Response | None = None  # the conversation's (conversation "auto")
        self.audio_out_ms = 0.0  # output audio made on this replica (the host meters it per tenant)
        self._oob: dict[str, Response] = {}  # out-of-band responses (conversation "none"), by id
        self._log = log
        self._emit = log.emit
        self._effects = log.effects  # (the same list for the session's life)
        self._new_id = log.new_id
        self._history = history
        self._turns = turns
        self._engine = engine
        self._limits = limits
        self._beta = beta
        self._lazy_message = lazy_message
        self._make_item = make_item
        self._answered = answered
        self._rate_limits = rate_limits
        self._mcp = mcp or McpServers(log, history)
        # Responses asked for while an MCP server they offer is being listed: created once
        # every listing they need is over (``listings_done``): (params, event_id, turn start).
        self._deferred: list[tuple[ce.ResponseParams, str | None, float | None]] = []

    # --- what the session asks ---------------------------------------------------

    @property
    def out_of_band(self) -> list[Response]:
        """The out-of-band responses running, oldest first."""
        return list(self._oob.values())

    def running(self) -> list[Response]:
        """Every running response: the conversation's first."""
        return [r for r in (self.current, *self._oob.values()) if r is not None]

    def answering(self) -> bool:
        """Whether the conversation's answer runs (or waits for an MCP listing to start)."""
        return self.current is not None or any(p.conversation == "auto" for p, _, _ in self._deferred)

    def writes(self, item: Item) -> bool:
        """Whether ``item`` is an output of the conversation's running answer."""
        resp = self.current
        return resp is not None and any(item is out for out in resp.outputs)

    def restore(self, current: Response | None, out_of_band: list[Response]) -> None:
        """The responses a snapshot held (``recover`` ends them)."""
        self.current = current
        self._oob = {resp.id: resp for resp in out_of_band}

    def shutdown(self) -> None:
        """Cancel every running request (client gone or session over)."""
        effects = self._effects
        if self.current is not None:
            effects.append(Cancel(self.current.id))
            self.current = None
        for request_id in self._oob:
            effects.append(Cancel(request_id))
        self._oob.clear()
        self._deferred.clear()

    def transcribed(self, item_id: str, text: str) -> None:
        """The transcript of ``item_id`` is final: the responses waiting for it get it."""
        effects = self._effects
        for resp in (self.current, *self._oob.values()):
            if resp is not None and item_id in resp.awaiting:
                resp.awaiting.discard(item_id)
                if text:
                    effects.append(Feed(resp.id, TextChunk(text)))
                if not resp.awaiting:
                    effects.append(EndInput(resp.id))

    # --- responses ----------------------------------------------------------

    def create(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None,
               *, led: bool = False) -> str | None:  # fmt: skip
        """Start a response, or raise the ProtocolError that refuses it; its id (None: it waits
        for an MCP listing). ``led``: an answer the engine began by itself (``engine_turns``):
        no engine request is started for it, its outputs come from the engine's conversation."""
        cfg = self.config
        if cfg.type == "transcription":
            raise ProtocolError(
                Code.UNSUPPORTED,
                "This is a transcription session: it transcribes input audio and creates no responses "
                "(set session.type to 'realtime' for responses).",
                event_id=event_id,
            )
        in_conversation = params.conversation == "auto"
        if in_conversation and self.answering():
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"Conversation already has an active response {self.current.id if self.current else '(starting)'!r}; "
                'cancel it or wait for response.done (an out-of-band response, conversation "none", '
                "may run beside it).",
                event_id=event_id,
            )
        if not in_conversation and len(self._oob) >= self._limits.max_out_of_band:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"At most {self._limits.max_out_of_band} out-of-band responses run at once; "
                "cancel one or wait for its response.done.",
                event_id=event_id,
            )
        modalities = params.output_modalities or cfg.output_modalities
        voice = cfg.voice
        if params.voice is not None:
            voice = params.voice
            if not params.custom_voice and voice not in OPENAI_VOICES and voice not in self._engine.voices:
                raise ProtocolError(
                    Code.INVALID_VALUE, f"Unknown voice {voice!r}.", param="response.audio.output.voice"
                )
        out_fmt = cfg.output_format
        if isinstance(params.output_format, dict):
            out_fmt = parse_ga_format(params.output_format, "response.audio.output.format")
        elif isinstance(params.output_format, str):
            out_fmt = parse_beta_format(params.output_format, "response.output_audio_format")
        max_tokens = cfg.max_output_tokens if params.max_output_tokens == "unset" else params.max_output_tokens
        tools = cfg.tools if params.tools is None else params.tools
        tool_choice = cfg.tool_choice if params.tool_choice is None else params.tool_choice
        check_tool_choice_names(tool_choice, tools, "response.tool_choice")
        parallel = cfg.parallel_tool_calls if params.parallel_tool_calls is None else params.parallel_tool_calls
        instructions = cfg.instructions if params.instructions is None else params.instructions
        if params.tools is not None:
            for i, tool in enumerate(params.tools):
                if tool.get("type") == "mcp" and self._beta:
                    why = "MCP tools need the GA protocol (the beta has no MCP events)."
                    raise ProtocolError(Code.UNSUPPORTED, why, param=f"response.tools[{i}].type", event_id=event_id)
            self._mcp.configure(params.tools, "response.tools")  # (servers the session has are listed once)
        if self._mcp.listing(tools) and not led:
            self._deferred.append((params, event_id, turn_started_at))
            return None
        context, awaiting, input_items = self._context(params, instructions, max_tokens)
        functions = engine_tools(tools)
        mcp_functions, mcp = self._mcp.offered(tools, {t.name for t in functions})
        resp = Response(
            id=self._new_id("resp"),
            in_conversation=in_conversation,
            modalities=modalities,
            output_format=out_fmt,
            voice=voice,
            max_output_tokens=max_tokens,
            metadata=params.metadata,
            converter=Converter(engine_format(self._engine.output_sample_rate), out_fmt),
            awaiting=awaiting,
            instructions=params.instructions,
            event_id=event_id,
            overrides={
                k: v
                for k, v in (
                    ("tools", params.tools),
                    ("tool_choice", params.tool_choice),
                    ("parallel_tool_calls", params.parallel_tool_calls),
                    ("say", params.say),
                )
                if v is not None
            },
        )
        request = ResponseRequest(
            request_id=resp.id,
            messages=tuple(context),
            instructions=instructions,
            modalities=modalities,
            voice=engine_voice(voice, self._engine.voices, self._engine.default_voice),
            max_output_tokens=max_tokens,
            temperature=cfg.temperature if params.temperature is None else params.temperature,
            speed=cfg.speed,
            tools=functions + mcp_functions,
            tool_choice=engine_tool_choice(tool_choice, mcp, functions=bool(functions)),
            parallel_tool_calls=parallel,
            say=params.say,
        )
        resp.mcp, resp.request, resp.input_items = mcp, request, input_items
        if in_conversation:
            self.current = resp
        else:
            self._oob[resp.id] = resp
        eager = not (request.calls_tools and self._lazy_message)
        if eager:
            self._new_message(resp)
        self._emit("response.created", response=self._render(resp, "in_progress", None))
        if eager:
            self._announce_message(resp)
        if led:
            return resp.id
        self._effects.append(StartResponse(request, turn_started_at))
        if not awaiting:
            self._effects.append(EndInput(resp.id))
        return resp.id

    def listings_done(self) -> None:
        """An MCP listing ended: the responses that waited for it are created now (or wait
        on for another still running)."""
        waiting, self._deferred = self._deferred, []
        for params, event_id, turn_started_at in waiting:
            try:
                self.create(params, event_id, turn_started_at)
            except ProtocolError as err:
                err.event_id = err.event_id or event_id
                self._log.error(err)

    def _context(
        self, params: ce.ResponseParams, instructions: str, max_tokens: int | None
    ) -> tuple[list[Any], set[str], list[Item] | None]:
        if params.input is None:
            items = list(self._history.conversation)
            items = fit_context(
                items, instructions, self.config.truncation, self._engine.max_context_tokens, max_tokens
            )
        else:
            items = []
            for i, entry in enumerate(params.input):
                if isinstance(entry, str):
                    ref = self._history.get(entry)
                    if ref is None:
                        raise ProtocolError(
                            Code.ITEM_NOT_FOUND, f"Item with item_id {entry!r} not found.", param=f"response.input[{i}]"
                        )
                    items.append(ref)
                else:
                    items.append(self._make_item(entry, f"response.input[{i}]"))
            images = [it.images() for it in items]
            check_images((sum(n for n, _ in images), sum(p for _, p in images)), self._limits, "response.input")
        awaiting = {it.id for it in items if it.pending_transcription}
        # A pending item is sent with empty text; its transcript follows as a streamed input chunk.
        return to_messages(items), awaiting, (None if params.input is None else items)

    # --- outputs ----------------------------------------------------------------

    def _add_output(self, resp: Response, item: Item) -> None:
        outputs = resp.outputs
        if outputs and outputs[-1].status == "in_progress":
            # Each item is finished before the next begins, as the API does.
            self._close_item(resp, len(outputs) - 1, outputs[-1], "completed")
        resp.outputs.append(item)
        index = len(resp.outputs) - 1
        self._emit("response.output_item.added", response_id=resp.id, output_index=index, item=item.render(self._beta))
        if resp.in_conversation:
            prev = self._history.insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self._beta))

    def _new_message(self, resp: Response) -> Part:
        item_id = f"item_{resp.id}"
        if resp.message is not None or not self._turns.message_named_by_response or self._history.get(item_id):
            item_id = self._new_id("item")  # (a second message, after a call; or the name is taken)
        item = Item(item_id, "assistant", [], status="in_progress")
        part = Part("output_audio", transcript="") if "audio" in resp.modalities else Part("output_text", text="")
        resp.message, resp.part = item, part
        return part

    def _announce_message(self, resp: Response) -> None:
        item, part = resp.message, resp.part
        assert item is not None and part is not None
        self._add_output(resp, item)
        item.content.append(part)
        self._emit("response.content_part.added", **self._where(resp, item), part=part.render_part())

    def _open_message(self, resp: Response) -> Part:
        """The response's message, made and announced on its first text or audio."""
        part = self._new_message(resp)
        self._announce_message(resp)
        return part

    def _where(self, resp: Response, item: Item) -> dict[str, Any]:
        return {"response_id": resp.id, "item_id": item.id, "output_index": resp.index_of(item), "content_index": 0}

    def _render(self, resp: Response, status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        return resp.render(status, details, beta=self._beta, conversation_id=self._history.id)

    def find(self, request_id: str) -> Response | None:
        """The running response ``request_id``: the conversation's, or an out-of-band one."""
        resp = self.current
        if resp is not None and resp.id == request_id:
            return resp
        return self._oob.get(request_id)

    def on_output(self, request_id: str, output: EngineOutput) -> None:
        """An output of the engine for the response ``request_id`` (the hot path)."""
        resp = self.current
        if resp is None or resp.id != request_id:  # find(), inlined (the hot path)
            resp = self._oob.get(request_id)
            if resp is None:
                return  # output that raced a cancel
        if resp.running:
            resp.backlog.append(output)  # an MCP call runs: what follows it waits for its result
            return
        call = resp.open_call
        if call is not None and not (isinstance(output, ToolCallDelta) and resp.calls.get(output.index) is call):
            resp.open_call = None  # its arguments are whole: run it (or ask whether to)
            self._settle(resp, call)
            if resp.running:
                resp.backlog.append(output)
                return
        if isinstance(output, AudioDelta):
            if "audio" in resp.modalities:
                converter = resp.converter
                data = converter.process(output.pcm)
                if not converter.identity:
                    resp.source += output.pcm  # (carried by the next delta: the converter holds some back)
                if data:
                    part = resp.part
                    message = resp.message
                    if part is None or message is None or message.status != "in_progress":  # (a call finished it)
                        part = self._open_message(resp)
                    self._audio_delta(resp, part, data)
        elif isinstance(output, TextDelta):
            if output.text:
                part = resp.part
                message = resp.message
                if part is None or message is None or message.status != "in_progress":  # (a call finished it)
                    part = self._open_message(resp)
                self._text_delta(resp, part, output.text)
        elif isinstance(output, ToolCallDelta):
            self._call_delta(resp, output)
        elif isinstance(output, Finished):
            message = resp.message
            if "audio" in resp.modalities and resp.part is not None and message and message.status == "in_progress":
                self._audio_delta(resp, resp.part, resp.converter.flush())
            resp.usage = output.usage if resp.usage is None else _sum(resp.usage, output.usage)
            resp.finish_reason = output.reason
            resp.engine_done = True
            self._advance(resp)

    def _advance(self, resp: Response) -> None:
        """The response ends, or asks the engine again with its MCP results, once its engine
        request finished and nothing it started is still out (a call, an approval)."""
        if resp.running or resp.waiting or not resp.engine_done or self.find(resp.id) is not resp:
            return
        if resp.ran and resp.request is not None:
            self._next_round(resp, resp.request)
        elif resp.finish_reason == "length":
            self.end(resp, "incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
        else:
            self.end(resp, "completed", None)

    def _next_round(self, resp: Response, request: ResponseRequest) -> None:
        """The engine again, for the same response, with the MCP results in its context."""
        resp.ran = resp.engine_done = False
        resp.rounds += 1
        resp.calls = {}  # (the engine numbers the calls of each request from 0)
        if resp.input_items is None:
            items = fit_context(list(self._history.conversation), request.instructions, self.config.truncation,
                                self._engine.max_context_tokens, request.max_output_tokens)  # fmt: skip
        else:
            items = [*resp.input_items, *resp.outputs]
        last = resp.rounds >= MCP_ROUNDS
        # A forced choice was met by the call it forced: from here on the model decides.
        choice = request.tool_choice if request.tool_choice.mode in ("auto", "none") else ToolChoice("auto")
        resp.request = request = replace(
            request, messages=tuple(to_messages(items)), tools=() if last else request.tools,
            tool_choice=ToolChoice("none") if last else choice,
        )  # fmt: skip
        self._effects.append(StartResponse(request, None))
        self._effects.append(EndInput(resp.id))

    def _text_delta(self, resp: Response, part: Part, text: str) -> None:
        assert resp.message is not None
        where = self._where(resp, resp.message)
        if part.type == "output_audio":
            part.transcript = (part.transcript or "") + text
            part.marks.add(part.audio_ms, len(part.transcript))
            self._emit("response.output_audio_transcript.delta", **where, delta=text)
        else:
            part.text = (part.text or "") + text
            self._emit("response.output_text.delta", **where, delta=text)

    def _audio_delta(self, resp: Response, part: Part, data: bytes) -> None:
        """``data``: the engine's audio in the response's output format. The event carries the
        engine's own audio beside it (``AudioEvent.source``), for a media transport to convert once."""
        if not data or resp.message is None:
            return
        ms = resp.output_format.duration_ms(len(data))
        part.audio_ms += ms
        self.audio_out_ms += ms
        if resp.converter.identity:
            source = data
        else:
            source = bytes(resp.source)
            resp.source.clear()
        self._log.emit_audio("response.output_audio.delta", (source, resp.converter.src),
                             **self._where(resp, resp.message), delta=data)  # fmt: skip

    def _call_delta(self, resp: Response, delta: ToolCallDelta) -> None:
        item = resp.calls.get(delta.index)
        if item is None:
            tool = resp.mcp.get(delta.name or "")
            if tool is None:
                item = Item(
                    self._new_id("item"),
                    "assistant",
                    [],
                    status="in_progress",
                    type="function_call",
                    call_id=delta.call_id or self._new_id("call"),
                    name=delta.name or "",
                )
                resp.calls[delta.index] = item
                self._add_output(resp, item)
            else:
                label = tool.server.spec["server_label"]
                kind: ItemType = "mcp_approval_request" if tool.needs_approval else "mcp_call"
                item = Item(self._new_id("mcpr" if tool.needs_approval else "mcp"), "assistant", [],
                            status="in_progress", type=kind, server_label=label, name=tool.name)  # fmt: skip
                resp.calls[delta.index] = item
                resp.open_call = item
                if not tool.needs_approval:
                    self._add_output(resp, item)  # (an approval request is shown whole: _settle)
        elif item.status != "in_progress":
            # Arguments for a call already finished (another output began after it): its
            # arguments.done went out, so they cannot be added. No engine here does this.
            log.warning("response %s: late arguments for finished call %s dropped", resp.id, item.call_id)
            return
        if delta.arguments:
            item.arguments += delta.arguments
            if item.type == "function_call":
                self._emit(
                    "response.function_call_arguments.delta",
                    response_id=resp.id,
                    item_id=item.id,
                    output_index=resp.index_of(item),
                    call_id=item.call_id,
                    delta=delta.arguments,
                )
            elif item.type == "mcp_call":
                self._emit("response.mcp_call_arguments.delta", response_id=resp.id, item_id=item.id,
                           output_index=resp.index_of(item), delta=delta.arguments)  # fmt: skip

    # --- MCP calls ----------------------------------------------------------------

    def _settle(self, resp: Response, item: Item) -> None:
        """An MCP call's arguments are whole: run it, or ask the client whether to."""
        if item.type == "mcp_call":
            self._run_call(resp, item)
            return
        item.status = "completed"  # (an approval request has no status of its own on the wire)
        self._add_output(resp, item)
        index = resp.index_of(item)
        self._emit("response.output_item.done", response_id=resp.id, output_index=index, item=item.render(False))
        if resp.in_conversation:
            prev = self._history.conversation.previous_id(item.id)
            self._emit("conversation.item.done", previous_item_id=prev, item=item.render(False))
        resp.waiting.add(item.id)

    def _run_call(self, resp: Response, item: Item) -> None:
        index = resp.index_of(item)
        self._emit("response.mcp_call_arguments.done", response_id=resp.id, item_id=item.id, output_index=index,
                   arguments=item.arguments)  # fmt: skip
        self._emit("response.mcp_call.in_progress", item_id=item.id, output_index=index)
        tool = resp.mcp.get(item.name or "")
        if tool is None:  # (its server left the session's tools since it was offered)
            self._answer_call(
                resp, item, None, {"type": "tool_execution_error", "message": "The tool is no longer offered."}
            )
            return
        resp.running.add(item.id)
        self._effects.append(CallMcpTool(resp.id, item.id, tool.server.spec, item.name or "", item.arguments))

    def called(self, item_id: str, output: str | None, error: dict[str, Any] | None) -> None:
        """The host's answer to ``CallMcpTool``: the server's output, or the SDK's error
        object (``protocol_error``, ``tool_execution_error``, ``http_error``)."""
        for resp in self.running():
            if item_id in resp.running:
                item = next(it for it in resp.outputs if it.id == item_id)
                resp.running.discard(item_id)
                self._answer_call(resp, item, output, error)
                backlog, resp.backlog = resp.backlog, []
                for held in backlog:
                    if isinstance(held, Item):
                        self.approval(held)
                    else:
                        self.on_output(resp.id, held)
                self._advance(resp)
                return

    def _answer_call(self, resp: Response, item: Item, output: str | None, error: dict[str, Any] | None) -> None:
        index = resp.index_of(item)
        item.output, item.error = output or "", error
        item.status = "completed" if error is None else "incomplete"
        if error is None:
            self._emit("response.mcp_call.completed", item_id=item.id, output_index=index)
        else:
            self._emit("response.mcp_call.failed", item_id=item.id, output_index=index)
        rendered = item.render(False)
        self._emit("response.output_item.done", response_id=resp.id, output_index=index, item=rendered)
        if resp.in_conversation and self._history.get(item.id) is not None:
            prev = self._history.conversation.previous_id(item.id)
            self._emit("conversation.item.done", previous_item_id=prev, item=rendered)
        resp.ran = True

    def approval(self, answer: Item) -> None:
        """The client answered an ``mcp_approval_request`` (``answer``: its
        ``mcp_approval_response`` item, already in the conversation). The response that
        asked runs the call, or hears it was declined; if that response is over, the
        answer stays in the conversation only."""
        for resp in self.running():
            if answer.approval_request_id not in resp.waiting:
                continue
            if resp.running:
                resp.backlog.append(answer)  # after the call that runs (each item before the next)
                return
            asked = next(it for it in resp.outputs if it.id == answer.approval_request_id)
            resp.waiting.discard(asked.id)
            if answer.approve:
                call = Item(self._new_id("mcp"), "assistant", [], status="in_progress", type="mcp_call",
                            server_label=asked.server_label, name=asked.name, approval_request_id=asked.id)  # fmt: skip
                self._add_output(resp, call)
                call.arguments = asked.arguments
                if call.arguments:
                    self._emit("response.mcp_call_arguments.delta", response_id=resp.id, item_id=call.id,
                               output_index=resp.index_of(call), delta=call.arguments)  # fmt: skip
                self._run_call(resp, call)
            else:
                resp.ran = True  # the next round tells the model (conversation.to_messages)
            self._advance(resp)
            return

    def _close_item(self, resp: Response, index: int, item: Item, status: str) -> None:
        """Finish output ``index`` of ``resp``: its last events, then ``output_item.done``."""
        if item.type == "mcp_call":
            if item is resp.open_call:
                resp.open_call = None
                self._emit("response.mcp_call_arguments.done", response_id=resp.id, item_id=item.id,
                           output_index=index, arguments=item.arguments)  # fmt: skip
            elif item.id in resp.running:
                resp.running.discard(item.id)  # (the host's call is cancelled with the response)
                item.error = {"type": "tool_execution_error", "message": "The response ended before the call returned."}
                self._emit("response.mcp_call.failed", item_id=item.id, output_index=index)
        elif item.type == "function_call":
            self._emit(
                "response.function_call_arguments.done",
                response_id=resp.id,
                item_id=item.id,
                output_index=index,
                call_id=item.call_id,
                name=item.name,
                arguments=item.arguments,
            )
        elif item.content:
            where = {"response_id": resp.id, "item_id": item.id, "output_index": index, "content_index": 0}
            part = item.content[0]
            if part.type == "output_audio":
                self._emit("response.output_audio.done", **where)
                self._emit("response.output_audio_transcript.done", **where, transcript=part.transcript or "")
            else:
                self._emit("response.output_text.done", **where, text=part.text or "")
            self._emit("response.content_part.done", **where, part=part.render_part())
        item.status = "completed" if status == "completed" else "incomplete"
        rendered = item.render(self._beta)
        self._emit("response.output_item.done", response_id=resp.id, output_index=index, item=rendered)
        if resp.in_conversation and self._history.get(item.id) is not None:
            prev = self._history.conversation.previous_id(item.id)
            self._emit("conversation.item.done", previous_item_id=prev, item=rendered)

    def on_failed(self, request_id: str, code: str, message: str) -> None:
        resp = self.find(request_id)
        if resp is None:
            return
        self._log.fail(code, message, resp.event_id)
        self.end(
            resp, "failed", {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}
        )

    def cancel(self, response_id: str | None) -> None:
        """The response named, or without a name the conversation's (else the latest out-of-band one)."""
        if response_id is not None:
            resp = self.find(response_id)
        else:
            resp = self.current or next(reversed(self._oob.values()), None)
        if resp is None:
            raise ProtocolError(
                Code.RESPONSE_NOT_ACTIVE,
                "There is no active response to cancel" + (f" with id {response_id!r}." if response_id else "."),
                param="response_id" if response_id else None,
            )
        self.end(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)

    def end(self, resp: Response, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        """End ``resp`` with ``status`` (``cancel``: abort its engine request too)."""
        if resp is self.current:
            self.end_current(status, details, cancel=cancel)
        else:
            self._finish(resp, status, details, cancel=cancel)

    def end_current(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        """End the conversation's response, between the dialect's two hooks."""
        resp = self.current
        assert resp is not None
        self._turns.answer_ending(resp, status)
        self._finish(resp, status, details, cancel=cancel)
        self._turns.answer_ended(resp, status)

    def _finish(self, resp: Response, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        if cancel:
            self._effects.append(Cancel(resp.id))
        for index, item in enumerate(resp.outputs):
            if item.status == "in_progress":  # (the others were finished as the next began)
                self._close_item(resp, index, item, status)
        if resp is self.current:
            self.current = None
            # idle_timeout_ms counts from when the client has played this answer's audio.
            self._answered(resp.part.audio_ms if resp.part is not None else 0.0)
        else:
            self._oob.pop(resp.id, None)
        self._emit("response.done", response=self._render(resp, status, details))
        if self._rate_limits is not None:
            self._emit("rate_limits.updated", **self._rate_limits())


def _sum(a: Usage, b: Usage) -> Usage:
    """The usage of a response's rounds together."""
    return Usage(
        a.input_text_tokens + b.input_text_tokens,
        a.input_audio_tokens + b.input_audio_tokens,
        a.output_text_tokens + b.output_text_tokens,
        a.output_audio_tokens + b.output_audio_tokens,
        a.input_image_tokens + b.input_image_tokens,
    )
