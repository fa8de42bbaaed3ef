"""Input images as vLLM's multimodal processors take them (for the engines that send
``multi_modal_data["image"]``: ``vllm`` and ``omni``)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from orchestrator.engine import EngineError, Image, Message


def decode_image(image: Image) -> Any:
    """A PIL image in RGB; ``EngineError("invalid_image")`` for a file that starts as
    PNG/JPEG (the session checked that much) but does not decode."""
    from PIL import Image as PILImage  # vLLM's own dependency: present wherever vLLM is

    try:
        with PILImage.open(io.BytesIO(image.data)) as opened:
            return opened.convert("RGB")
    except Exception as exc:
        raise EngineError("invalid_image", f"an input image ({image.mime}) could not be decoded: {exc}") from exc


def conversation_images(messages: Sequence[Message]) -> list[Image]:
    """Every image of the conversation, in prompt order (as their placeholders come)."""
    return [image for m in messages for image in m.images]
