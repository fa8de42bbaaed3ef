"""The pixel size a PNG or JPEG declares, read from its header (pure, no image library).

What an image costs once decoded is its width times its height (times 3 bytes as RGB),
whatever its file size: a PNG of one colour compresses about a thousandfold, so a 3 KB
file can declare 5000 x 5000 pixels (75 MB decoded). The session bounds what its
conversation holds by these declared pixels (``max_conversation_image_pixels``) when an
item is added, before any engine decodes anything; an engine that decodes checks the
header again (``orchestrator/engines/images.py``).

- PNG: the ``IHDR`` chunk, which must come first (bytes 16-24: width, height).
- JPEG: the first start-of-frame marker (``SOF0``-``SOF15`` but ``DHT``, ``JPG`` and
  ``DAC``), found by walking the segments from the start; a scan (``SOS``) or the end of
  the data before one: no size.
"""

from __future__ import annotations

import struct

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RST0-7, SOI: no length follows


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) that ``data`` (a PNG or JPEG file) declares; None: not readable as one."""
    if data.startswith(_PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            return None  # not at a marker: not a JPEG we can read
        while i < n and data[i] == 0xFF:  # (fill bytes)
            i += 1
        if i >= n:
            return None
        marker = data[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker in (0xD9, 0xDA):  # EOI, SOS: no frame header before the image data
            return None
        if i + 2 > n:
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if i + 7 > n:
                return None
            height, width = struct.unpack(">HH", data[i + 3 : i + 7])
            return width, height
        i += length
    return None
