"""openai-agents' realtime runner sends an image (``send_message`` with an ``input_image``
part): it crosses a gateway whose remote engine relays it to an upstream gateway, whose
engine gets the very image. No vision model runs on this CPU: the upstream's engine is the
passthrough, declared to take images, keeping what it is given. The client runs on its own
environment (clients_support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_client
from support.gateway import run_gateway
from support.images import SeeingPassthrough, data_url, png

from gateway.settings import Settings
from orchestrator.engines.remote import RemoteEngine

pytestmark = pytest.mark.timeout(180)


async def test_the_agents_runner_sends_an_image_that_reaches_the_engine(tmp_path: Path) -> None:
    seeing = SeeingPassthrough()
    picture = png(5, 2, (0, 90, 250))
    async with run_gateway(Settings(engine="cascade", video_engine="none"), engine=seeing, vad_factory=None) as up:
        remote = RemoteEngine([up.http])
        async with run_gateway(Settings(model="vision-remote", video_engine="none"), engine=remote) as gw:
            url = f"ws://127.0.0.1:{gw.port}/v1/realtime?model=vision-remote"
            report = await run_client("agents_image.py", tmp_path, url=url, speech=picture, timeout=120)
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert report["done"] == "completed", report
    (user,) = [item for item in report["added"] if item.get("role") == "user"]
    assert user["content"][1] == {"type": "input_image", "image_url": data_url(picture), "detail": "low"}
    (seen,) = [m for m in seeing.messages if m.images]
    assert seen.text == "What colour is it?"
    assert [(i.mime, i.data, i.detail) for i in seen.images] == [("image/png", picture, "low")]
