"""The encoded output: fMP4 that FFmpeg (and so MSE) plays, and JPEG frames."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
from video_support import decode_mp4, pure_frames, rgb, run

from orchestrator.engines.video.encode import split_annexb
from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.video_engine import VideoRequest


def boxes(data: bytes) -> list[bytes]:
    """Top-level ISO BMFF box types of ``data``."""
    kinds, pos = [], 0
    while pos < len(data):
        size = struct.unpack(">I", data[pos : pos + 4])[0]
        kinds.append(data[pos + 4 : pos + 8])
        pos += size
    assert pos == len(data)
    return kinds


async def test_mp4_chunks_decode_to_requested_size_and_frame_count(engine: CpuVideoEngine) -> None:
    request = VideoRequest("r1", "A red fox in snow", width=96, height=64, fps=12, num_frames=20, frames_per_chunk=6)
    chunks = await run(engine, request)

    assert [c.num_frames for c in chunks] == [6, 6, 6, 2]
    assert [c.generation_chunk_index for c in chunks] == [0, 1, 2, 3]
    assert boxes(chunks[0].data) == [b"ftyp", b"moov", b"moof", b"mdat"]
    assert all(boxes(c.data) == [b"moof", b"mdat"] for c in chunks[1:])
    frames = decode_mp4(b"".join(c.data for c in chunks))
    assert len(frames) == 20
    assert {(f.width, f.height) for f in frames} == {(96, 64)}
    # The decoded pictures are the rendering (up to codec loss).
    error = np.abs(rgb(frames) - pure_frames(request.prompt, request, 20)).mean()
    assert error < 4.0


async def test_each_fragment_starts_with_a_keyframe_and_decodes_on_its_own(engine: CpuVideoEngine) -> None:
    request = VideoRequest("r1", "A lighthouse at dusk", width=64, height=64, num_frames=24, frames_per_chunk=8)
    chunks = await run(engine, request)
    init = chunks[0].init_segment

    assert all(c.init_segment == init for c in chunks)
    assert chunks[0].data.startswith(init)
    for chunk in chunks:
        # A client joining mid-stream: init segment + this fragment alone.
        frames = decode_mp4(init + chunk.media)
        assert len(frames) == chunk.num_frames == 8
        assert [f.key_frame for f in frames] == [True] + [False] * 7
    # Fragments are contiguous in time: 8 frames at 12 fps each.
    frames = decode_mp4(b"".join(c.data for c in chunks))
    assert [round(float(f.time) * 12) for f in frames] == list(range(24))


async def test_mime_type_names_the_constrained_baseline_profile_in_the_stream(engine: CpuVideoEngine) -> None:
    request = VideoRequest("r1", "Rain on a window", width=256, height=256, fps=12, num_frames=6)
    (chunk,) = await run(engine, request)

    # The codec string is read from the SPS in the init segment's avcC.
    avcc = chunk.init_segment[chunk.init_segment.index(b"avcC") + 4 :]
    profile, constraints, level = avcc[1], avcc[2], avcc[3]
    assert profile == 0x42 and constraints & 0x40  # baseline, constraint_set1: constrained
    assert chunk.mime_type == f'video/mp4; codecs="avc1.{profile:02X}{constraints:02X}{level:02X}"'
    with av.open(io.BytesIO(chunk.data), mode="r", format="mp4") as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"


async def test_jpeg_format_yields_one_decodable_jpeg_per_frame(engine: CpuVideoEngine) -> None:
    request = VideoRequest("r1", "A paper boat", width=128, height=96, num_frames=7, frames_per_chunk=4, format="jpeg")
    chunks = await run(engine, request)

    assert [c.kind for c in chunks] == ["jpeg", "jpeg"]
    assert [len(c.frames) for c in chunks] == [c.num_frames for c in chunks] == [4, 3]
    assert all(c.mime_type == "image/jpeg" and c.data == b"".join(c.frames) for c in chunks)
    decoded = []
    for jpeg in (f for c in chunks for f in c.frames):
        assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
        with av.open(io.BytesIO(jpeg), mode="r", format="mjpeg") as container:
            (frame,) = list(container.decode(video=0))
        assert (frame.width, frame.height) == (128, 96)
        decoded.append(frame)
    # JPEG at this size loses a little more than H.264 at crf 18 (the caption's
    # thin strokes under 4:2:0 chroma), still far below a change of picture.
    error = np.abs(rgb(decoded) - pure_frames(request.prompt, request, 7)).mean()
    assert error < 6.0, error


def test_split_annexb_handles_three_and_four_byte_start_codes() -> None:
    stream = b"\x00\x00\x00\x01\x67\x42\x00\x00\x01\x68\xce\x00\x00\x00\x01\x65\x88"
    assert split_annexb(stream) == [b"\x67\x42", b"\x68\xce", b"\x65\x88"]
