"""openai-agents' realtime runner sends the user a picture: one message with text and an
``input_image`` part (``RealtimeSession.send_message``), then waits for the answer (run on
``.venv-clients``'s python by tests/clients/test_agents_image.py). ``--speech`` names the
image file here (PNG), not speech. Writes a JSON report to ``--out``: the session's events,
the gateway's raw events, every error, and the data URL it sent.

    python agents_image.py --url ws://127.0.0.1:PORT/v1/realtime?model=vision-remote \
        --speech picture.png --out report.json
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import client_script  # this directory's shared command line (tests/clients/client_script.py)
from agents.realtime import RealtimeAgent, RealtimeRunner


async def main(report: dict[str, Any], url: str, picture: bytes, timeout: float) -> None:
    image_url = "data:image/png;base64," + base64.b64encode(picture).decode("ascii")
    report["sent"] = image_url
    agent = RealtimeAgent(name="looker", instructions="Say what the picture shows.")
    runner = RealtimeRunner(agent, config={"model_settings": {"model_name": "vision-remote",
                                                              "turn_detection": None}})  # fmt: skip
    async with await runner.run(model_config={"url": url, "api_key": "sk-test"}) as session:
        await session.send_message(
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What colour is it?"},
                    {"type": "input_image", "image_url": image_url, "detail": "low"},
                ],
            }
        )
        async with asyncio.timeout(timeout):
            async for event in session:
                report["events"].append(event.type)
                if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    data = event.data.data
                    report["raw"].append(data.get("type"))
                    if data.get("type") == "conversation.item.added":
                        report["added"].append(data.get("item"))
                    if data.get("type") == "response.done":
                        report["done"] = data["response"]["status"]
                        break
                if event.type == "error":
                    report["errors"].append(str(event.error)[:2000])


if __name__ == "__main__":
    report: dict[str, Any] = {"events": [], "raw": [], "errors": [], "added": [], "done": None}
    client_script.run(main, report, log=logging.getLogger("openai.agents"), timeout=60.0)
