"""Input images as vLLM's multimodal processors take them (for the engines that send
``multi_modal_data["image"]``: ``vllm`` and ``omni``)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from orchestrator.engine import EngineError, Image, Message

# Pixels of one decoded image (5000 x 5000; 75 MB as RGB). The 10 MiB file bound
# (MAX_IMAGE_BYTES) does not bound them: a PNG of one colour compresses about a
# thousandfold. Larger: invalid_image, read from the header before anything is decoded.
MAX_IMAGE_PIXELS = 25_000_000


def decode_image(image: Image) -> Any:
    """A PIL image in RGB; ``EngineError("invalid_image")`` for a file that starts as
    PNG/JPEG (the session checked that much) but does not decode, or that would
    decode to more than ``MAX_IMAGE_PIXELS``."""
    from PIL import Image as PILImage  # vLLM's own dependency: present wherever vLLM is

    try:
        with PILImage.open(io.BytesIO(image.data)) as opened:  # reads the header only
            width, height = opened.size
            if width * height > MAX_IMAGE_PIXELS:
                raise EngineError(
                    "invalid_image",
                    f"an input image of {width}x{height} pixels is over the {MAX_IMAGE_PIXELS:,} pixels "
                    "one image may have: scale it down",
                )
            return opened.convert("RGB")
    except EngineError:
        raise
    except Exception as exc:
        raise EngineError("invalid_image", f"an input image ({image.mime}) could not be decoded: {exc}") from exc


def conversation_images(messages: Sequence[Message]) -> list[Image]:
    """Every image of the conversation, in prompt order (as their placeholders come)."""
    return [image for m in messages for image in m.images]
