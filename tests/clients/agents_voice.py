"""openai-agents' realtime runner holds a voice conversation with the gateway
(run on ``.venv-clients``'s python by tests/vllm/test_agents_client.py).

The agent has one function tool. Its first turn must call it (``tool_choice``
``required``: the tiny test model calls only when structured outputs make it);
the tool, as it runs, lets the model decide again (``auto``) so that the
answer after the tool's result is spoken. Writes a JSON report to ``--out``:
every session event's type, every error (the agent's error events and the
SDK's "Failed to validate server event" log records), the tool's calls, and
the output audio's length.

    python agents_voice.py --url ws://127.0.0.1:PORT/v1/realtime?model=M --speech in.pcm --out report.json
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import client_script  # this directory's shared command line (tests/clients/client_script.py)
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendSessionUpdate

CHUNK = 24000 * 2 * 20 // 1000  # 20 ms of 24 kHz PCM16


async def main(report: dict[str, Any], url: str, speech: bytes, timeout: float) -> None:
    holder: dict[str, Any] = {}

    @function_tool
    async def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        report["tool_calls"].append(city)
        # The first turn had to call; from here the model decides (and answers in speech).
        await holder["session"].model.send_event(
            RealtimeModelSendSessionUpdate(session_settings={"tool_choice": "auto"})
        )
        result = f"It is sunny in {city} today."
        report["tool_results"].append(result)
        return result

    agent = RealtimeAgent(name="weather", instructions="Answer with the weather.", tools=[get_weather])
    runner = RealtimeRunner(
        agent,
        config={
            "model_settings": {
                "model_name": "gpt-realtime-2.1",
                "voice": "alloy",
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "input_audio_transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            }
        },
    )
    async with await runner.run(model_config={"url": url, "api_key": "sk-test"}) as session:
        holder["session"] = session

        async def talk() -> None:
            silence = bytes(CHUNK)
            for i in range(0, len(speech), CHUNK):
                await session.send_audio(speech[i : i + CHUNK])
            while True:  # a microphone keeps streaming: the pause that ends the turn, and after
                await session.send_audio(silence)
                await asyncio.sleep(0.02)

        talker = asyncio.create_task(talk())
        spoken_after_tool = False
        try:
            async with asyncio.timeout(timeout):
                async for event in session:
                    report["events"].append(event.type)
                    if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                        data = event.data.data
                        report["raw"].append(data.get("type"))  # the gateway's event, as sent
                        if data.get("type") in ("response.done", "error", "session.updated"):
                            report["details"].append(data)
                    if event.type == "error":
                        report["errors"].append(str(event.error)[:2000])
                    elif event.type == "audio":
                        report["audio_bytes"] += len(event.audio.data)
                        spoken_after_tool = spoken_after_tool or bool(report["tool_results"])
                    elif event.type == "audio_end" and spoken_after_tool:
                        break
        finally:
            talker.cancel()


if __name__ == "__main__":
    report: dict[str, Any] = {"events": [], "raw": [], "errors": [], "tool_calls": [], "tool_results": [],
                              "audio_bytes": 0, "details": []}  # fmt: skip
    client_script.run(main, report, log=logging.getLogger("openai.agents"), timeout=120.0)
