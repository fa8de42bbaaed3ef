"""Images in on the ``vllm`` engine: a tiny random-weight Idefics3 (SmolVLM's
architecture, written at test time) served by vLLM's CPU build, with its own
``AsyncLLM`` (one model load for the file)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import orjson
import pytest
import pytest_asyncio
from support.gateway import run_gateway
from support.images import data_url, png
from support.sdk_shapes import check_event
from vllm_support import AddSpy, collect, fed, finished, idle, no_input

from gateway.settings import Settings
from orchestrator.engine import (
    EngineError,
    FunctionTool,
    Image,
    Message,
    ResponseRequest,
    ToolCallDelta,
    ToolChoice,
)
from orchestrator.engines.vllm_engine import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

IMAGE_TOKENS = 16  # <image> tokens per image: (64 / 8)**2 / 2**2 (tiny_model.write_tiny_idefics3)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import write_tiny_idefics3

    return write_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vlm(tiny_vlm: Path) -> AsyncIterator[VllmEngine]:
    engine = VllmEngine(str(tiny_vlm), max_model_len=1024, enforce_eager=True, sampling={"seed": 0})
    await engine.start()
    yield engine
    await engine.close()


def image(rgb: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Image:
    return Image("image/png", png(*size, rgb))


def image_id(engine: VllmEngine) -> int:
    return int(engine.tokenizer.convert_tokens_to_ids("<image>"))


async def test_a_multimodal_model_takes_images_as_multi_modal_data_in_one_streamed_request(vlm: VllmEngine) -> None:
    assert vlm.info.accepts_images
    assert "images in" in vlm.info.description
    messages = (
        Message("user", "What colour is it?", images=(image((200, 30, 60)),)),
        Message("assistant", "Red."),
        Message("user", "And these?", images=(image((10, 200, 30), (8, 8)), image((0, 0, 255), (64, 20)))),
    )
    request = ResponseRequest("r-images", messages, modalities=("text",), max_output_tokens=40)
    with AddSpy(vlm) as spy:
        done = finished(await collect(vlm.respond(request, fed(["tell me more"]))))
    await idle(vlm)
    (first, first_images), (streamed, streamed_images), *_ = spy.prompts
    # The conversation's three images went with the first chunk, each placeholder expanded.
    assert first_images == ["image"] * 3
    assert first.count(image_id(vlm)) == 3 * IMAGE_TOKENS
    # The streamed text extended the same resumable request, with no image of its own.
    assert spy.sent[0][1] and spy.sent[1] == spy.sent[0]
    assert streamed == vlm.tokenizer.encode("tell me more", add_special_tokens=False) and streamed_images == []
    # Each image is <fake><global-img>, its 16 <image> tokens and <fake>; its placeholder was one token.
    assert done.usage.input_image_tokens == 3 * (IMAGE_TOKENS + 3)
    assert done.usage.input_tokens == len(first) + len(streamed)


async def test_a_response_that_calls_a_tool_sends_the_images_with_its_one_request(vlm: VllmEngine) -> None:
    """Tool responses are ordinary requests (started once the input is complete):
    the images go with them, and with a streamed chunk joined to the image's turn."""
    tool = FunctionTool("get_colour", "Name the colour", {"type": "object", "properties": {}})
    request = ResponseRequest(
        "r-image-tool", (Message("user", "What colour?", images=(image((0, 0, 255)),)),), modalities=("text",),
        tools=(tool,), tool_choice=ToolChoice("function", "get_colour"),
    )  # fmt: skip
    with AddSpy(vlm) as spy:
        outs = await collect(vlm.respond(request, fed(["Be quick."])))
    finished(outs)
    assert [o.name for o in outs if isinstance(o, ToolCallDelta) and o.name] == ["get_colour"]
    ((sent, images),) = spy.prompts
    assert images == ["image"] and sent.count(image_id(vlm)) == IMAGE_TOKENS
    assert "What colour? Be quick." in vlm.tokenizer.decode(sent)


async def test_an_image_that_does_not_decode_is_a_coded_error_before_vllm(vlm: VllmEngine) -> None:
    broken = Image("image/png", png(4, 4)[:40])  # the PNG signature and header, then cut
    request = ResponseRequest("r-broken", (Message("user", "Look", images=(broken,)),), modalities=("text",))
    with AddSpy(vlm) as spy, pytest.raises(EngineError) as err:
        await collect(vlm.respond(request, no_input()))
    assert err.value.code == "invalid_image"
    assert spy.sent == []


async def test_an_image_of_too_many_pixels_is_refused_from_its_header() -> None:
    """A tiny file may claim (and decode to) a huge image: refused before decoding."""
    import struct
    import zlib

    from orchestrator.engines.images import MAX_IMAGE_PIXELS, decode_image

    small = png(4, 3)
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    header = b"IHDR" + struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    bomb = small[:12] + header + struct.pack(">I", zlib.crc32(header)) + small[33:]  # IHDR: bytes 8-33
    with pytest.raises(EngineError) as err:
        decode_image(Image("image/png", bomb))
    assert err.value.code == "invalid_image" and f"{side}x{side}" in err.value.message
    assert decode_image(Image("image/png", small)).size == (4, 3)


async def test_the_openai_sdk_sends_an_image_to_a_vllm_multimodal_model_through_the_gateway(vlm: VllmEngine) -> None:
    picture = png(40, 30, (10, 200, 30))
    engine = VllmEngine(vlm.model, llm=vlm.llm, sampling={"seed": 0})  # a view of the module's AsyncLLM
    settings = Settings(engine="passthrough", model="tiny-vlm", api_keys=("sk-test",), video_engine="none")
    events: list[Any] = []
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
        async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-test"}) as http:
            models = (await http.get(f"{gw.http}/v1/models")).json()["data"]
        assert [m["accepts_images"] for m in models if m["id"] == "tiny-vlm"] == [True]
        client = openai.AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        with AddSpy(engine) as spy:
            async with client.realtime.connect(model="tiny-vlm") as conn:
                await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What colour is it?"},
                    {"type": "input_image", "image_url": data_url(picture), "detail": "low"},
                ]})  # fmt: skip
                await conn.response.create()
                while True:
                    raw = await conn.recv_bytes()
                    check_event(orjson.loads(raw))
                    event = conn.parse_event(raw)
                    events.append(event)
                    assert event.type != "error", event
                    if event.type == "response.done":
                        break
    done = events[-1].response
    assert done.status == "completed", done.status_details
    assert done.output[0].content[0].text
    assert done.usage.input_token_details.image_tokens == IMAGE_TOKENS + 3
    (added,) = [e.item for e in events if e.type == "conversation.item.added" and e.item.role == "user"]
    assert added.content[1].image_url == data_url(picture)
    (sent,) = [ids for ids, images in spy.prompts if images == ["image"]]
    assert sent.count(image_id(vlm)) == IMAGE_TOKENS


async def test_image_support_is_read_from_the_model_config_and_falls_back_to_text_only(
    vlm: VllmEngine, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator.engines.vllm_engine import image_placeholder

    assert image_placeholder(vlm.llm.model_config) == "<image>"
    assert image_placeholder(SimpleNamespace(is_multimodal_model=False)) is None
    # vLLM internals not as expected: logged, and served text only (never a failed start).
    broken = SimpleNamespace(is_multimodal_model=True, multimodal_config=None, model="odd")
    assert image_placeholder(broken) is None
    assert "serving it text only" in caplog.text


async def test_images_past_the_models_limit_are_refused_before_any_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33, finding 3: every image of the conversation was decoded (99 MiB each for a
    5000x5000 one) before vLLM applied limit_mm_per_prompt; now none is."""
    from orchestrator.engines import vllm_engine

    decoded: list[Image] = []
    monkeypatch.setattr(vllm_engine, "decode_image", decoded.append)
    engine = VllmEngine("not-started")
    engine._image_limit = 2  # (start reads it from the model config: image_limit)
    with pytest.raises(EngineError, match=r"holds 3 images.*at most 2") as info:
        await engine._engine_input([1, 2, 3], [image((1, 2, 3))] * 3)
    assert info.value.code == "invalid_request" and decoded == []
    await engine._engine_input([1, 2], [image((1, 2, 3))] * 2)
    assert len(decoded) == 2


async def test_the_image_limit_is_read_from_the_model_config() -> None:
    from orchestrator.engines.vllm_engine import image_limit

    class Multimodal:
        def __init__(self, limit: Any) -> None:
            self.limit = limit

        def get_limit_per_prompt(self, modality: str) -> Any:
            if isinstance(self.limit, Exception):
                raise self.limit
            return self.limit

    class Config:
        def __init__(self, limit: Any) -> None:
            self.multimodal_config = Multimodal(limit)

    assert image_limit(Config(4)) == 4
    assert image_limit(Config(ValueError("no image modality"))) is None
    assert image_limit(Config(None)) is None
