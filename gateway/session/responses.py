"""Responses: from response.create (or a VAD turn) to response.done.

A response that needs a transcript still being finished starts at once and
receives the transcript as a streamed input chunk, so the engine is never idle
waiting for the whole pipeline.
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
from gateway.session.conversation import Item, Part
from gateway.session.core import SessionCore, _Response
from gateway.session.effects import Cancel, EndInput, StartResponse
from orchestrator.engine import (
    AudioDelta,
    EngineOutput,
    Finished,
    Message,
    ResponseRequest,
    TextDelta,
)


class Responses(SessionCore):
    # --- responses ----------------------------------------------------------

    def create_response(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None
    ) -> None:
        if self._response is not None:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"Conversation already has an active response {self._response.id!r}; "
                "cancel it or wait for response.done.",
                event_id=event_id,
            )
        cfg = self.config
        modalities = params.output_modalities or cfg.output_modalities
        voice = params.voice if params.voice is not None else cfg.voice
        if voice not in OPENAI_VOICES and voice not in self.engine.voices:
            raise ProtocolError(Code.INVALID_VALUE, f"Unknown voice {voice!r}.", param="response.audio.output.voice")
        out_fmt = cfg.output_format
        if isinstance(params.output_format, dict):
            out_fmt = parse_ga_format(params.output_format, "response.audio.output.format")
        elif isinstance(params.output_format, str):
            out_fmt = parse_beta_format(params.output_format, "response.output_audio_format")
        max_tokens = cfg.max_output_tokens if params.max_output_tokens == "unset" else params.max_output_tokens
        context, awaiting = self._context(params)
        in_conversation = params.conversation == "auto"
        resp_id = self._new_id("resp")
        part = Part("output_audio", transcript="") if "audio" in modalities else Part("output_text", text="")
        item = Item(self._new_id("item"), "assistant", [], status="in_progress")
        resp = _Response(
            id=resp_id,
            item=item,
            part=part,
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
        )
        self._response = resp
        self._emit("response.created", response=self._render_response(resp, "in_progress", None))
        self._emit("response.output_item.added", response_id=resp_id, output_index=0, item=item.render(self.beta))
        if in_conversation:
            prev = self._insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        item.content.append(part)
        self._emit(
            "response.content_part.added",
            response_id=resp_id,
            item_id=item.id,
            output_index=0,
            content_index=0,
            part=part.render_part(),
        )
        request = ResponseRequest(
            request_id=resp_id,
            messages=tuple(context),
            instructions=cfg.instructions if params.instructions is None else params.instructions,
            modalities=modalities,
            voice=engine_voice(voice, self.engine.voices, self.engine.default_voice),
            max_output_tokens=max_tokens,
            temperature=cfg.temperature if params.temperature is None else params.temperature,
            speed=cfg.speed,
        )
        self.effects.append(StartResponse(request, turn_started_at))
        if not awaiting:
            self.effects.append(EndInput(resp_id))

    def _context(self, params: ce.ResponseParams) -> tuple[list[Message], set[str]]:
        if params.input is None:
            items = list(self.conversation)
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
        return [it.as_message() for it in items], awaiting

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
            "output": [resp.item.render(self.beta)] if status != "in_progress" else [],
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

    def on_response(self, request_id: str, output: EngineOutput) -> None:
        resp = self._response
        if resp is None or resp.id != request_id:
            return  # output that raced a cancel
        part = resp.part
        where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        if isinstance(output, AudioDelta):
            if "audio" in resp.modalities:
                self._audio_delta(resp, resp.resampler.process(output.pcm), where)
        elif isinstance(output, TextDelta):
            if not output.text:
                return
            if part.type == "output_audio":
                part.transcript = (part.transcript or "") + output.text
                part.marks.append((part.audio_ms, len(part.transcript)))
                self._emit("response.output_audio_transcript.delta", **where, delta=output.text)
            else:
                part.text = (part.text or "") + output.text
                self._emit("response.output_text.delta", **where, delta=output.text)
        elif isinstance(output, Finished):
            if "audio" in resp.modalities:
                self._audio_delta(resp, resp.resampler.flush(), where)
            resp.usage = output.usage
            if output.reason == "length":
                self._end_response("incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
            else:
                self._end_response("completed", None)

    def _audio_delta(self, resp: _Response, pcm: bytes, where: dict[str, Any]) -> None:
        if not pcm:
            return
        data = encode_from_pcm16(resp.output_format, pcm)
        resp.part.audio_ms += resp.output_format.duration_ms(len(data))
        self._emit("response.output_audio.delta", **where, delta=data)

    def on_response_failed(self, request_id: str, code: str, message: str) -> None:
        resp = self._response
        if resp is None or resp.id != request_id:
            return
        self._fail(code, message, resp.event_id)
        self._end_response(
            "failed", {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}
        )

    def _cancel(self, event: ce.ResponseCancel) -> None:
        resp = self._response
        if resp is None or (event.response_id is not None and event.response_id != resp.id):
            raise ProtocolError(
                Code.RESPONSE_NOT_ACTIVE,
                "There is no active response to cancel"
                + (f" with id {event.response_id!r}." if event.response_id else "."),
                param="response_id" if event.response_id else None,
            )
        self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)

    def _end_response(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        resp = self._response
        assert resp is not None
        if cancel:
            self.effects.append(Cancel(resp.id))
        where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        part = resp.part
        if part.type == "output_audio":
            self._emit("response.output_audio.done", **where)
            self._emit("response.output_audio_transcript.done", **where, transcript=part.transcript or "")
        else:
            self._emit("response.output_text.done", **where, text=part.text or "")
        self._emit("response.content_part.done", **where, part=part.render_part())
        resp.item.status = "completed" if status == "completed" else "incomplete"
        self._emit("response.output_item.done", response_id=resp.id, output_index=0, item=resp.item.render(self.beta))
        if resp.in_conversation and self.conversation.get(resp.item.id) is not None:
            self._emit("conversation.item.done", previous_item_id=None, item=resp.item.render(self.beta))
        self._response = None
        self._emit("response.done", response=self._render_response(resp, status, details))
        if self._rate_limits is not None:
            self._emit("rate_limits.updated", rate_limits=self._rate_limits())

    @property
    def active_response_id(self) -> str | None:
        return self._response.id if self._response else None
