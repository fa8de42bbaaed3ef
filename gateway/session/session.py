"""The realtime session state machine (Sans-I/O).

Inputs: decoded client events, input audio, and engine outputs delivered by
the shell. Outputs: server events appended to ``events`` (GA-shaped dicts,
each with ``event_id`` and a monotonic ``server_event_seq``) and effects
appended to ``effects`` for the shell to carry out. Nothing here awaits,
sleeps or touches a socket, so every rule below is unit-testable.

Input audio flows as it arrives: it is decoded from the session format,
resampled to the engine's rate and streamed into a transcription request
(vLLM's streaming-input shape: first chunk starts it, commit ends it). With
server VAD the request opens when speech starts (with ``prefix_padding_ms``
of audio before it) and is committed when speech stops. A response that
needs a transcript still being finished starts at once and receives the
transcript as a streamed input chunk, so the engine is never idle waiting for
the whole pipeline.
"""

from __future__ import annotations

from typing import Any

from gateway.audio.codecs import AudioFormat, decode_to_pcm16
from gateway.audio.resample import StreamResampler
from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import SessionConfig, apply_update, render
from gateway.session import snapshot
from gateway.session.conversation import Item, Part
from gateway.session.core import VAD_RATE, SessionCore, SessionLimits, VadStream, _Response
from gateway.session.effects import Cancel, CloseSocket, EndInput, Feed, StartTranscription
from gateway.session.input import InputAudio
from gateway.session.responses import Responses
from orchestrator.engine import (
    AudioChunk,
    EngineInfo,
)

__all__ = ["VAD_RATE", "RealtimeSession", "SessionCore", "SessionLimits", "VadStream"]


class RealtimeSession(InputAudio, Responses):
    """The whole session: lifecycle, client events, conversation items, snapshots."""

    # --- lifecycle ----------------------------------------------------------

    def start(self, resume_token: str | None = None) -> None:
        """``resume_token`` (gateway extension) lets the client resume the session later."""
        if resume_token is None:
            self._emit("session.created", session=self.render_config())
        else:
            self._emit("session.created", session=self.render_config(), resume_token=resume_token)

    @property
    def dialect(self) -> str:
        """How the session's events are spelled on the wire (``server_events.dialect_encoder``)."""
        return "beta" if self.beta else "ga"

    @property
    def sends_gateway_events(self) -> bool:
        """Whether the gateway's own events (``session.warning``, ``session.replaced``) go
        to this client: the OpenAI SDKs cannot parse them, so only once it opted in
        (``gateway_events``)."""
        return self.config.gateway_events

    def render_config(self) -> dict[str, Any]:
        return render(self.config, session_id=self.id, expires_at=self.expires_at, beta=self.beta)

    def expire(self) -> None:
        self._fail(
            Code.SESSION_EXPIRED,
            f"The session reached its maximum lifetime of {self.limits.lifetime_s:.0f} s; open a new session.",
            None,
        )
        self.shutdown()
        self.effects.append(CloseSocket(CloseCode.SESSION_EXPIRED, "session expired"))

    def shutdown(self) -> None:
        """Cancel every running request (client gone or session over)."""
        if self._response is not None:
            self.effects.append(Cancel(self._response.id))
            self._response = None
        for request_id in self._oob:
            self.effects.append(Cancel(request_id))
        self._oob.clear()
        if self._input is not None:
            self.effects.append(Cancel(self._input.request_id))
            self._input = None
        for request_id in self._committed:
            self.effects.append(Cancel(request_id))
        self._committed.clear()

    # --- client events ------------------------------------------------------

    def handle(self, event: ce.ClientEvent) -> None:
        try:
            match event:
                case ce.AudioAppend():
                    self.append_audio(event.audio, event.event_id)
                case ce.SessionUpdate():
                    self._session_update(event)
                case ce.AudioCommit():
                    self._commit(event.event_id, manual=True)
                case ce.AudioClear():
                    self._clear()
                case ce.ItemCreate():
                    self._item_create(event)
                case ce.ItemRetrieve():
                    self._emit("conversation.item.retrieved", item=self._item(event).render(self.beta))
                case ce.ItemTruncate():
                    self._truncate(event)
                case ce.ItemDelete():
                    self._delete(event)
                case ce.ResponseCreate():
                    self.create_response(event.response, event.event_id)
                case ce.ResponseCancel():
                    self._cancel(event)
                case ce.OutputAudioClear():
                    raise ProtocolError(
                        Code.UNSUPPORTED,
                        "output_audio_buffer.clear is for WebRTC and SIP: over a WebSocket the client holds "
                        "the output audio; stop playing it and send conversation.item.truncate.",
                        param="type",
                    )
        except ProtocolError as err:
            if err.event_id is None:
                err.event_id = event.event_id
            self.error(err)

    def _session_update(self, event: ce.SessionUpdate) -> None:
        new, warnings = apply_update(self.config, event.session, beta=self.beta, limits=self._config_limits)
        self._apply_config(new, warnings)

    def _apply_config(self, new: SessionConfig, warnings: list[tuple[str, str]]) -> None:
        """Check what needs the engine, then apply ``new`` and announce it (session.updated)."""
        self._check_config(new)
        old = self.config
        self.config = new
        if new.input_format != old.input_format or new.turn_detection != old.turn_detection:
            self._setup_input()
        self._emit("session.updated", session=self.render_config())
        if not self.sends_gateway_events:
            return  # the SDKs have no type for session.warning: only for clients that opted in
        for param, message in warnings:
            if param in self._warned:
                continue  # each ignored field is reported once per session
            self._warned.add(param)
            # Not an error: the update applied; the client learns what has no effect here.
            self._emit("session.warning", code="unsupported_field", message=message, param=param)

    def _check_config(self, new: SessionConfig) -> None:
        """What a configuration needs of the engine and of the session (a speech
        detector; no running response to become a transcription session)."""
        old_td = self.config.turn_detection
        if new.turn_detection is not None and new.turn_detection != old_td and self._vad_factory is None:
            raise ProtocolError(
                Code.INVALID_VALUE,
                "Server VAD is not available on this gateway (no speech detector); "
                "set turn_detection to null and commit turns yourself.",
                param="session.audio.input.turn_detection",
            )
        if new.type == "transcription" and self._response is not None:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                "A session becomes a transcription session only with no response running; "
                "cancel it or wait for response.done.",
                param="session.type",
            )

    # --- conversation items -------------------------------------------------

    def _item(self, event: ce.ItemRetrieve | ce.ItemTruncate | ce.ItemDelete) -> Item:
        item = self.conversation.get(event.item_id)
        if item is None:
            raise ProtocolError(Code.ITEM_NOT_FOUND, f"Item with item_id {event.item_id!r} not found.", param="item_id")
        return item

    def _item_create(self, event: ce.ItemCreate) -> None:
        spec = event.item
        if spec.id is not None and self.conversation.get(spec.id) is not None:
            raise ProtocolError(Code.ITEM_EXISTS, f"An item with id {spec.id!r} already exists.", param="item.id")
        prev_id = event.previous_item_id
        if prev_id is not None and prev_id != "root" and self.conversation.get(prev_id) is None:
            raise ProtocolError(
                Code.ITEM_NOT_FOUND, f"previous_item_id {prev_id!r} not found.", param="previous_item_id"
            )
        item = self._item_from_spec(spec, "item")
        prev = self._insert(item, prev_id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self.beta))

    def _item_from_spec(self, spec: ce.ItemSpec, param: str) -> Item:
        """Build an item; validates every part before asking for any work."""
        if spec.type != "message":
            return Item(
                spec.id or self._new_id("item"),
                spec.role,
                [],
                type=spec.type,
                call_id=spec.call_id or self._new_id("call"),
                name=spec.name,
                arguments=spec.arguments,
                output=spec.output,
            )
        item = Item(spec.id or self._new_id("item"), spec.role, [])
        fmt = self.config.input_format
        audio: bytes | None = None
        for i, p in enumerate(spec.content):
            if p.audio is not None and p.transcript is None:
                if len(p.audio) % fmt.bytes_per_sample:
                    raise ProtocolError(
                        Code.INVALID_AUDIO,
                        f"Audio length {len(p.audio)} is not a whole number of {fmt.codec} samples.",
                        param=f"{param}.content[{i}].audio",
                    )
                if audio is not None:
                    raise ProtocolError(
                        Code.INVALID_VALUE, "Only one input_audio part per item.", param=f"{param}.content"
                    )
                audio = p.audio
            item.content.append(Part(p.type, text=p.text, transcript=p.transcript))
        if audio is not None:
            request_id = f"input_{item.id}"
            pcm = decode_to_pcm16(fmt, audio)
            resampler = StreamResampler(fmt.rate, self.engine.input_sample_rate)
            self.effects.append(StartTranscription(self._transcription_request(request_id)))
            self.effects.append(Feed(request_id, AudioChunk(resampler.process(pcm) + resampler.flush())))
            self.effects.append(EndInput(request_id))
            self._committed[request_id] = item.id
            item.pending_transcription = True
        return item

    def _truncate(self, event: ce.ItemTruncate) -> None:
        item = self._item(event)
        if item.role != "assistant":
            raise ProtocolError(Code.INVALID_TRUNCATE, "Only assistant audio items can be truncated.", param="item_id")
        if event.content_index >= len(item.content) or item.content[event.content_index].type != "output_audio":
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"content_index {event.content_index} is not an audio part of item {item.id!r}.",
                param="content_index",
            )
        part = item.content[event.content_index]
        if event.audio_end_ms > part.audio_ms + 1:
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"audio_end_ms {event.audio_end_ms} is beyond the item's audio ({part.audio_ms:.0f} ms).",
                param="audio_end_ms",
            )
        resp = self._response
        if resp is not None and resp.message is item:
            # The client stopped playing this answer: stop generating it too.
            self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        kept = 0
        for offset_ms, length in part.marks:
            if offset_ms < event.audio_end_ms:
                kept = length
        part.transcript = (part.transcript or "")[:kept]
        part.marks = [m for m in part.marks if m[1] <= kept]
        part.audio_ms = float(event.audio_end_ms)
        self._emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    def _delete(self, event: ce.ItemDelete) -> None:
        item = self._item(event)
        if self._response is not None and any(item is out for out in self._response.outputs):
            self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        self._remove(item.id)
        self._emit("conversation.item.deleted", item_id=item.id)

    # --- snapshots (resume) --------------------------------------------------

    def snapshot_state(self, *, with_items: bool = True) -> dict[str, Any]:
        """Everything another replica needs to carry the session on. ``with_items``
        False: the conversation's items are left out (stored one record each, see
        ``take_item_changes``); ``item_ids`` keeps their order either way."""
        return {
            "id": self.id,
            "beta": self.beta,
            "config": self.config,  # written by snapshot.dumps, read back by config_from_dict
            "created_at": self.created_at,
            "seq": self.seq,
            "epoch": self.epoch,
            "conversation_id": self.conversation_id,
            "id_base": self._id_base,
            "id_counter": self._id_counter,
            "audio_ms": self.audio_ms,
            "item_ids": [it.id for it in self.conversation],
            **({"items": [snapshot.item_to_dict(it) for it in self.conversation]} if with_items else {}),
            "response": None if self._response is None else _response_state(self._response),
            "oob": [_response_state(resp) for resp in self._oob.values()],
        }

    @classmethod
    def restore(cls, state: dict[str, Any], *, engine: EngineInfo, **kwargs: Any) -> RealtimeSession:
        """Rebuild a session from ``snapshot_state`` output (on any replica)."""
        session = cls(
            session_id=state["id"],
            config=snapshot.config_from_dict(state["config"]),
            engine=engine,
            beta=state["beta"],
            created_at=state["created_at"],
            **kwargs,
        )
        session.seq = state["seq"]
        session.epoch = state["epoch"]
        session.conversation_id = state["conversation_id"]
        session._id_base = state["id_base"]
        session._id_counter = state["id_counter"]
        session.audio_ms = state["audio_ms"]
        session._setup_input()
        for entry in state["items"]:
            item = snapshot.item_from_dict(entry)
            session.conversation.insert(item)
            session._item_bytes[item.id] = size = item.text_bytes()
            session._conversation_bytes += size
        if state["response"] is not None:
            session._response = session._restore_response(state["response"])
        for r in state.get("oob", ()):
            resp = session._restore_response(r)
            session._oob[resp.id] = resp
        session.dirty = False
        return session

    def _restore_response(self, r: dict[str, Any]) -> _Response:
        outputs = [self.conversation.get(d["id"]) or snapshot.item_from_dict(d) for d in r["outputs"]]
        by_id = {it.id: it for it in outputs}
        message = by_id.get(r["message"]) if r["message"] else None
        codec, rate = r["output_format"]
        fmt = AudioFormat(codec, rate)
        return _Response(
            id=r["id"],
            outputs=outputs,
            message=message,
            part=message.content[0] if message is not None and message.content else None,
            calls={int(index): by_id[item_id] for index, item_id in r["calls"].items()},
            overrides=r["overrides"],
            in_conversation=r["in_conversation"],
            modalities=tuple(r["modalities"]),
            output_format=fmt,
            voice=r["voice"],
            max_output_tokens=r["max_output_tokens"],
            metadata=r["metadata"],
            resampler=StreamResampler(self.engine.output_sample_rate, fmt.rate),
            awaiting=set(),
            instructions=r["instructions"],
        )

    def recover(self, reason: str) -> None:
        """After a takeover: end what died with the old replica, explicitly.

        A running response (the conversation's and each out-of-band one) ends
        with status ``incomplete`` and ``reason`` and, unless
        ``reissue_interrupted_responses`` is off, is created again from the
        conversation. A transcription that was running is reported failed.
        """
        self.epoch += 1
        for item in self.conversation:
            if item.pending_transcription:
                item.pending_transcription = False
                item.content[0].transcript = ""
                self._report_transcription_failure(
                    item.id, "replica_lost", "The replica transcribing this audio was lost."
                )
        for resp in [r for r in (self._response, *self._oob.values()) if r is not None]:
            # The SDK's status_details.reason has no value for this: the gateway's own
            # reason goes in the extension field gateway_reason.
            self._end(resp, "incomplete", {"type": "incomplete", "gateway_reason": reason})
            if self.config.reissue_interrupted_responses:
                self.create_response(
                    ce.ResponseParams(
                        output_modalities=resp.modalities,
                        instructions=resp.instructions,
                        voice=resp.voice,
                        max_output_tokens=resp.max_output_tokens,
                        conversation="auto" if resp.in_conversation else "none",
                        metadata=resp.metadata,
                        tools=resp.overrides.get("tools"),
                        tool_choice=resp.overrides.get("tool_choice"),
                        parallel_tool_calls=resp.overrides.get("parallel_tool_calls"),
                    ),
                    None,
                )


def _response_state(resp: _Response) -> dict[str, Any]:
    """A running response in a snapshot (its outputs so far, and what re-issuing it needs)."""
    return {
        "id": resp.id,
        "outputs": [snapshot.item_to_dict(it) for it in resp.outputs],
        "message": None if resp.message is None else resp.message.id,
        "calls": {str(index): it.id for index, it in resp.calls.items()},
        "overrides": resp.overrides,
        "in_conversation": resp.in_conversation,
        "modalities": list(resp.modalities),
        "output_format": [resp.output_format.codec, resp.output_format.rate],
        "voice": resp.voice,
        "max_output_tokens": resp.max_output_tokens,
        "metadata": resp.metadata,
        "instructions": resp.instructions,
    }
