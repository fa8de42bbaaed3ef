"""Small real image files for the input_image tests, written by hand (no imaging library):
a PNG of one colour, and its data URL as a client sends it; and ``SeeingPassthrough``, the
engine those tests give images to (no vision model runs on this CPU)."""

from __future__ import annotations

import base64
import dataclasses
import struct
import zlib
from typing import Any

from orchestrator.engine import Message, ResponseRequest
from orchestrator.engines.passthrough import PassthroughEngine


def png(width: int = 4, height: int = 3, rgb: tuple[int, int, int] = (200, 30, 60)) -> bytes:
    """A valid RGB PNG of ``width`` x ``height`` pixels, all ``rgb``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter 0 per row
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class SeeingPassthrough(PassthroughEngine):
    """The passthrough engine, declared to take images, keeping every message it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.info = dataclasses.replace(self.info, accepts_images=True)
        self.messages: list[Message] = []

    def respond(self, request: ResponseRequest, inputs: Any) -> Any:
        self.messages += request.messages
        return super().respond(request, inputs)
