"""Drives a Sans-I/O ``RealtimeSession`` directly: client events in (through the
real decoder), server events and effects out, engine outputs fed back. Every
event is checked as the client would receive it (encoded for its dialect)
against the official SDK's models (``support.sdk_shapes.check_event``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from support.sdk_shapes import check_event

from gateway.protocol import client_events as ce
from gateway.protocol.server_events import BETA_DROPPED, encode_json
from gateway.protocol.session_config import SessionConfig
from gateway.session.session import RealtimeSession, SessionLimits, VadStream
from orchestrator.engine import AudioDelta, EngineInfo, Finished, TextDelta, Usage
from orchestrator.engines.passthrough import PassthroughEngine

TONE = PassthroughEngine()._chunk  # 20 ms of 24 kHz PCM16


class Driver:
    """Feeds a session and keeps every event and effect it produced, in order."""

    def __init__(
        self,
        *,
        beta: bool = False,
        limits: SessionLimits | None = None,
        engine: EngineInfo | None = None,
        vad_factory: Callable[[], VadStream] | None = None,
        **config: Any,
    ) -> None:
        config.setdefault("turn_detection", None)
        self.session = RealtimeSession(
            session_id="sess_test",
            config=SessionConfig(model="test-model", **config),
            engine=engine or PassthroughEngine().info,
            beta=beta,
            limits=limits,
            vad_factory=vad_factory,
        )
        self.events: list[dict[str, Any]] = []
        self.effects: list[Any] = []
        self.session.start()
        self.take()

    def take(self) -> tuple[list[dict[str, Any]], list[Any]]:
        events, effects = self.session.take()
        for event in events:  # as the client receives it: strictly what the SDK accepts
            if self.session.beta and event["type"] in BETA_DROPPED:
                continue  # never sent to beta clients
            wire = orjson.loads(encode_json(event, beta=self.session.beta))
            check_event(wire, beta=self.session.beta, extensions=self.session.config.gateway_events)
        self.events += events
        self.effects += effects
        return events, effects

    def send(self, event: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """Decode with the real decoder, as the transport does, then handle."""
        self.session.handle(ce.decode(orjson.dumps(event)))
        return self.take()

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        return [e["type"] for e in (self.events if events is None else events)]

    def error(self, event: dict[str, Any]) -> dict[str, Any]:
        events, effects = self.send(event)
        assert self.types(events) == ["error"], self.types(events)
        assert effects == []
        return events[0]["error"]

    def respond(self, **response: Any) -> str:
        events, _ = self.send(
            {"type": "response.create", "response": response} if response else {"type": "response.create"}
        )
        created = [e for e in events if e["type"] == "response.created"]
        assert created, self.types(events)
        return str(created[0]["response"]["id"])

    def output(self, response_id: str, *outputs: Any) -> list[dict[str, Any]]:
        for out in outputs:
            self.session.on_response(response_id, out)
        return self.take()[0]

    def user_text(self, text: str, item_id: str | None = None) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        if item_id:
            item["id"] = item_id
        events, _ = self.send({"type": "conversation.item.create", "item": item})
        return events[0]

    def completed_audio_response(self, chunks: int = 5) -> tuple[str, str]:
        """A finished audio response: 'w<i> ' then 20 ms of tone per chunk, like the passthrough."""
        resp_id = self.respond()
        outs: list[Any] = []
        for i in range(chunks):
            outs += [TextDelta(f"w{i} "), AudioDelta(TONE)]
        events = self.output(resp_id, *outs, Finished(usage=Usage(output_text_tokens=chunks)))
        done = events[-1]
        assert done["type"] == "response.done"
        return resp_id, str(done["response"]["output"][0]["id"])


class EnergyVad:
    """A speech detector by loudness (``VadStream``): a 32 ms frame at 16 kHz is
    speech (probability 1) when its RMS is above ``level``. Not silero: a
    deterministic stand-in where the test is about turn-taking, not detection."""

    FRAME = 512

    def __init__(self, level: float = 300.0) -> None:
        self.level = level
        self._rest = b""

    def process(self, pcm16_16k: bytes) -> list[float]:
        import numpy as np

        data = self._rest + pcm16_16k
        n = len(data) // (2 * self.FRAME)
        self._rest = data[n * 2 * self.FRAME :]
        frames = np.frombuffer(data[: n * 2 * self.FRAME], "<i2").astype(np.float64).reshape(n, self.FRAME)
        return [1.0 if rms > self.level else 0.0 for rms in np.sqrt((frames**2).mean(axis=1))]

    def reset(self) -> None:
        self._rest = b""
