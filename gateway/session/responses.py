"""Responses: from response.create (or a VAD turn) to response.done.

A response that needs a transcript still being finished starts at once and
receives the transcript as a streamed input chunk, so the engine is never idle
waiting for the whole pipeline.

Outputs follow the GA order. An assistant message: ``response.output_item.added``,
``conversation.item.added``, ``response.content_part.added``, its deltas, then
at the end ``..._audio.done``/``..._text.done``, ``response.content_part.done``,
``response.output_item.done``, ``conversation.item.done``. A function call:
``response.output_item.added`` (a ``function_call`` item, empty arguments),
``conversation.item.added``, ``response.function_call_arguments.delta``..., then
``response.function_call_arguments.done``, ``response.output_item.done``,
``conversation.item.done``. ``response.done`` carries every output.
"""

from __future__ import annotations

from typing import Any

from gateway.audio.codecs import encode_from_pcm16
from gateway.audio.resample import StreamResampler
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import (
    OPENAI_VOICES,
    beta_format,
    engine_voice,
    ga_format,
    parse_beta_format,
    parse_ga_format,
)
from gateway.protocol.session_fields import check_tool_choice_names
from gateway.session.context import fit_context
from gateway.session.conversation import Item, Part, to_messages
from gateway.session.core import SessionCore, _Response
from gateway.session.effects import Cancel, EndInput, StartResponse
from orchestrator.engine import (
    AudioDelta,
    EngineOutput,
    Finished,
    FunctionTool,
    ResponseRequest,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
)


def engine_tools(tools: tuple[dict[str, Any], ...]) -> tuple[FunctionTool, ...]:
    """The function tools (MCP tools are kept in the session, never offered)."""
    return tuple(
        FunctionTool(t["name"], t.get("description", ""), t.get("parameters") or {"type": "object", "properties": {}})
        for t in tools
        if t.get("type") == "function"
    )


def engine_tool_choice(choice: str | dict[str, Any]) -> ToolChoice:
    if isinstance(choice, dict):
        if choice.get("type") == "function":
            return ToolChoice("function", choice["name"])
        return ToolChoice("auto")  # an MCP tool: none is offered here, the model decides without it
    return ToolChoice(choice)  # type: ignore[arg-type]


class Responses(SessionCore):
    # A response that may call a function opens its message on its first text or audio, so
    # that a call alone is the whole output. False: always at once (the duplex dialect's
    # playback ledgers need the message item when the response is created).
    lazy_message = True

    # --- responses ----------------------------------------------------------

    def create_response(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None
    ) -> None:
        cfg = self.config
        if cfg.type == "transcription":
            raise ProtocolError(
                Code.UNSUPPORTED,
                "This is a transcription session: it transcribes input audio and creates no responses "
                "(set session.type to 'realtime' for responses).",
                event_id=event_id,
            )
        in_conversation = params.conversation == "auto"
        if in_conversation and self._response is not None:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"Conversation already has an active response {self._response.id!r}; "
                'cancel it or wait for response.done (an out-of-band response, conversation "none", '
                "may run beside it).",
                event_id=event_id,
            )
        if not in_conversation and len(self._oob) >= self.limits.max_out_of_band:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"At most {self.limits.max_out_of_band} out-of-band responses run at once; "
                "cancel one or wait for its response.done.",
                event_id=event_id,
            )
        modalities = params.output_modalities or cfg.output_modalities
        voice = cfg.voice
        if params.voice is not None:
            voice = params.voice
            if not params.custom_voice and voice not in OPENAI_VOICES and voice not in self.engine.voices:
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
        context, awaiting = self._context(params, instructions, max_tokens)
        resp = _Response(
            id=self._new_id("resp"),
            in_conversation=in_conversation,
            modalities=modalities,
            output_format=out_fmt,
            voice=voice,
            max_output_tokens=max_tokens,
            metadata=params.metadata,
            resampler=StreamResampler(self.engine.output_sample_rate, out_fmt.rate),
            awaiting=awaiting,
            instructions=params.instructions,
            event_id=event_id,
            overrides={
                k: v
                for k, v in (
                    ("tools", params.tools),
                    ("tool_choice", params.tool_choice),
                    ("parallel_tool_calls", params.parallel_tool_calls),
                )
                if v is not None
            },
        )
        request = ResponseRequest(
            request_id=resp.id,
            messages=tuple(context),
            instructions=instructions,
            modalities=modalities,
            voice=engine_voice(voice, self.engine.voices, self.engine.default_voice),
            max_output_tokens=max_tokens,
            temperature=cfg.temperature if params.temperature is None else params.temperature,
            speed=cfg.speed,
            tools=engine_tools(tools),
            tool_choice=engine_tool_choice(tool_choice),
            parallel_tool_calls=parallel,
        )
        if in_conversation:
            self._response = resp
        else:
            self._oob[resp.id] = resp
        eager = not (request.calls_tools and self.lazy_message)
        if eager:
            self._new_message(resp)
        self._emit("response.created", response=self._render_response(resp, "in_progress", None))
        if eager:
            self._announce_message(resp)
        self.effects.append(StartResponse(request, turn_started_at))
        if not awaiting:
            self.effects.append(EndInput(resp.id))

    def _context(
        self, params: ce.ResponseParams, instructions: str, max_tokens: int | None
    ) -> tuple[list[Any], set[str]]:
        if params.input is None:
            items = list(self.conversation)
            items = fit_context(items, instructions, self.config.truncation, self.engine.max_context_tokens, max_tokens)
        else:
            items = []
            for i, entry in enumerate(params.input):
                if isinstance(entry, str):
                    ref = self.conversation.get(entry)
                    if ref is None:
                        raise ProtocolError(
                            Code.ITEM_NOT_FOUND, f"Item with item_id {entry!r} not found.", param=f"response.input[{i}]"
                        )
                    items.append(ref)
                else:
                    items.append(self._item_from_spec(entry, f"response.input[{i}]"))
        awaiting = {it.id for it in items if it.pending_transcription}
        # A pending item is sent with empty text; its transcript follows as a streamed input chunk.
        return to_messages(items), awaiting

    # --- outputs ----------------------------------------------------------------

    def _add_output(self, resp: _Response, item: Item) -> None:
        resp.outputs.append(item)
        index = len(resp.outputs) - 1
        self._emit("response.output_item.added", response_id=resp.id, output_index=index, item=item.render(self.beta))
        if resp.in_conversation:
            prev = self._insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))

    def _new_message(self, resp: _Response) -> Part:
        item = Item(self._new_id("item"), "assistant", [], status="in_progress")
        part = Part("output_audio", transcript="") if "audio" in resp.modalities else Part("output_text", text="")
        resp.message, resp.part = item, part
        return part

    def _announce_message(self, resp: _Response) -> None:
        item, part = resp.message, resp.part
        assert item is not None and part is not None
        self._add_output(resp, item)
        item.content.append(part)
        self._emit("response.content_part.added", **self._where(resp, item), part=part.render_part())

    def _open_message(self, resp: _Response) -> Part:
        """The response's message, made and announced on its first text or audio."""
        part = self._new_message(resp)
        self._announce_message(resp)
        return part

    def _where(self, resp: _Response, item: Item) -> dict[str, Any]:
        return {"response_id": resp.id, "item_id": item.id, "output_index": resp.index_of(item), "content_index": 0}

    def _render_response(self, resp: _Response, status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        usage = None
        if resp.usage is not None:
            u = resp.usage
            usage = {
                "total_tokens": u.input_tokens + u.output_tokens,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "input_token_details": {
                    "text_tokens": u.input_text_tokens,
                    "audio_tokens": u.input_audio_tokens,
                    "cached_tokens": 0,
                },
                "output_token_details": {"text_tokens": u.output_text_tokens, "audio_tokens": u.output_audio_tokens},
            }
        out: dict[str, Any] = {
            "object": "realtime.response",
            "id": resp.id,
            "status": status,
            "status_details": details,
            "output": [it.render(self.beta) for it in resp.outputs] if status != "in_progress" else [],
            "conversation_id": self.conversation_id if resp.in_conversation else None,
            "max_output_tokens": "inf" if resp.max_output_tokens is None else resp.max_output_tokens,
            "usage": usage,
            "metadata": resp.metadata,
        }
        if self.beta:
            out["modalities"] = ["audio", "text"] if "audio" in resp.modalities else ["text"]
            out["voice"] = resp.voice
            out["output_audio_format"] = beta_format(resp.output_format)
        else:
            out["output_modalities"] = list(resp.modalities)
            out["audio"] = {"output": {"format": ga_format(resp.output_format), "voice": resp.voice}}
        return out

    def _running(self, request_id: str) -> _Response | None:
        """The running response ``request_id``: the conversation's, or an out-of-band one."""
        resp = self._response
        if resp is not None and resp.id == request_id:
            return resp
        return self._oob.get(request_id)

    def on_response(self, request_id: str, output: EngineOutput) -> None:
        resp = self._running(request_id)
        if resp is None:
            return  # output that raced a cancel
        if isinstance(output, AudioDelta):
            if "audio" in resp.modalities:
                pcm = resp.resampler.process(output.pcm)
                if pcm:
                    self._audio_delta(resp, resp.part or self._open_message(resp), pcm)
        elif isinstance(output, TextDelta):
            if output.text:
                self._text_delta(resp, resp.part or self._open_message(resp), output.text)
        elif isinstance(output, ToolCallDelta):
            self._call_delta(resp, output)
        elif isinstance(output, Finished):
            if "audio" in resp.modalities and resp.part is not None:
                self._audio_delta(resp, resp.part, resp.resampler.flush())
            resp.usage = output.usage
            if output.reason == "length":
                self._end(resp, "incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
            else:
                self._end(resp, "completed", None)

    def _text_delta(self, resp: _Response, part: Part, text: str) -> None:
        assert resp.message is not None
        where = self._where(resp, resp.message)
        if part.type == "output_audio":
            part.transcript = (part.transcript or "") + text
            part.marks.append((part.audio_ms, len(part.transcript)))
            self._emit("response.output_audio_transcript.delta", **where, delta=text)
        else:
            part.text = (part.text or "") + text
            self._emit("response.output_text.delta", **where, delta=text)

    def _audio_delta(self, resp: _Response, part: Part, pcm: bytes) -> None:
        if not pcm or resp.message is None:
            return
        data = encode_from_pcm16(resp.output_format, pcm)
        ms = resp.output_format.duration_ms(len(data))
        part.audio_ms += ms
        self.audio_out_ms += ms
        self._emit("response.output_audio.delta", **self._where(resp, resp.message), delta=data)

    def _call_delta(self, resp: _Response, delta: ToolCallDelta) -> None:
        item = resp.calls.get(delta.index)
        if item is None:
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
        if delta.arguments:
            item.arguments += delta.arguments
            self._emit(
                "response.function_call_arguments.delta",
                response_id=resp.id,
                item_id=item.id,
                output_index=resp.index_of(item),
                call_id=item.call_id,
                delta=delta.arguments,
            )

    def on_response_failed(self, request_id: str, code: str, message: str) -> None:
        resp = self._running(request_id)
        if resp is None:
            return
        self._fail(code, message, resp.event_id)
        self._end(
            resp, "failed", {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}
        )

    def _cancel(self, event: ce.ResponseCancel) -> None:
        """The response named, or without a name the conversation's (else the latest out-of-band one)."""
        if event.response_id is not None:
            resp = self._running(event.response_id)
        else:
            resp = self._response or next(reversed(self._oob.values()), None)
        if resp is None:
            raise ProtocolError(
                Code.RESPONSE_NOT_ACTIVE,
                "There is no active response to cancel"
                + (f" with id {event.response_id!r}." if event.response_id else "."),
                param="response_id" if event.response_id else None,
            )
        self._end(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)

    def _end(self, resp: _Response, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        if resp is self._response:
            self._end_response(status, details, cancel=cancel)
        else:
            self._finish(resp, status, details, cancel=cancel)

    def _end_response(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        """End the conversation's response (a dialect may add to this)."""
        assert self._response is not None
        self._finish(self._response, status, details, cancel=cancel)

    def _finish(self, resp: _Response, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        if cancel:
            self.effects.append(Cancel(resp.id))
        for index, item in enumerate(resp.outputs):
            if item.type == "function_call":
                self._emit(
                    "response.function_call_arguments.done",
                    response_id=resp.id,
                    item_id=item.id,
                    output_index=index,
                    call_id=item.call_id,
                    name=item.name,
                    arguments=item.arguments,
                )
            elif resp.part is not None:
                where = self._where(resp, item)
                part = resp.part
                if part.type == "output_audio":
                    self._emit("response.output_audio.done", **where)
                    self._emit("response.output_audio_transcript.done", **where, transcript=part.transcript or "")
                else:
                    self._emit("response.output_text.done", **where, text=part.text or "")
                self._emit("response.content_part.done", **where, part=part.render_part())
            item.status = "completed" if status == "completed" else "incomplete"
            rendered = item.render(self.beta)
            self._emit("response.output_item.done", response_id=resp.id, output_index=index, item=rendered)
            if resp.in_conversation and self.conversation.get(item.id) is not None:
                self._emit("conversation.item.done", previous_item_id=None, item=rendered)
        if resp is self._response:
            self._response = None
            # idle_timeout_ms counts from when the client has played this answer's audio.
            self._idle_from_ms = self.audio_ms + (resp.part.audio_ms if resp.part is not None else 0.0)
        else:
            self._oob.pop(resp.id, None)
        self._emit("response.done", response=self._render_response(resp, status, details))
        if self._rate_limits is not None:
            self._emit("rate_limits.updated", **self._rate_limits())

    @property
    def active_response_id(self) -> str | None:
        return self._response.id if self._response else None
