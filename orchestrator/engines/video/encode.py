"""Encoding for the browser: fragmented MP4 (H.264) for Media Source
Extensions, or one JPEG per frame.

H.264 comes from PyAV's libx264 encoder (constrained baseline, yuv420p, no
B-frames, zero-latency tuning, one thread). The fMP4 boxes are written here
rather than by FFmpeg's mp4 muxer: with ``movflags=frag_keyframe+empty_moov+
default_base_moof`` that muxer only writes a fragment once the *next*
keyframe arrives (or on close), and PyAV cannot send it the flush packet
that would cut one early, so each chunk would leave a whole chunk late. The
layout written here is the one that muxer produces with those flags:

- init segment: ``ftyp`` + ``moov`` (one ``avc1`` track with an ``avcC``
  built from the encoder's SPS/PPS, empty sample tables, ``mvex``/``trex``);
- per chunk: ``moof`` (``mfhd``; ``traf`` with ``tfhd`` default-base-is-moof,
  ``tfdt``, ``trun``) + ``mdat``, starting with an IDR frame.

Frames come in as float RGB planes [n,3,H,W] in [0,1] and are converted to
4:2:0 here with torch (BT.601, limited range for H.264, full range for JPEG),
which skips a packed-RGB copy and swscale.
"""

from __future__ import annotations

import struct
from fractions import Fraction

import av
import numpy as np
import torch

# x264 settings. CRF 23 is x264's default quality; "ultrafast" keeps encoding
# well under a millisecond per 256x256 frame on one core.
H264_CRF = 23
H264_PRESET = "ultrafast"
JPEG_QSCALE = 4  # MJPEG quantiser, 2 (best) .. 31; 4 is visually clean
_TRACK_ID = 1
_TIMESCALE_PER_FPS = 1000  # track timescale = fps * 1000: integer frame durations

# Sample flags (ISO/IEC 14496-12 8.8.3.1): sync = depends on no other sample;
# non-sync = depends on others and is_non_sync_sample.
_SYNC_FLAGS = 0x02000000
_NON_SYNC_FLAGS = 0x01010000


# --- colour conversion -----------------------------------------------------------


# RGB -> YCbCr rows (BT.601) on a 0..255 scale, for studio (H.264) and full (JPEG) range.
_STUDIO = torch.tensor([[65.481, 128.553, 24.966], [-37.797, -74.203, 112.0], [112.0, -93.786, -18.214]])
_FULL = torch.tensor([[76.245, 149.685, 29.07], [-43.0277, -84.4723, 127.5], [127.5, -106.7654, -20.7346]])


def planes_to_yuv420(planes: torch.Tensor, full_range: bool = False) -> np.ndarray:
    """float RGB [n,3,H,W] in [0,1] -> uint8 [n, H*3/2, W], one yuv420p image
    (Y, then U, then V planes) per frame."""
    n, _, h, w = planes.shape
    matrix = _FULL if full_range else _STUDIO
    luma_offset = 0.5 if full_range else 16.5  # +0.5 rounds in the float -> uint8 cast
    out = torch.empty((n, h * w * 3 // 2), dtype=torch.uint8)
    out[:, : h * w] = torch.matmul(matrix[:1], planes.reshape(n, 3, h * w)).add_(luma_offset).squeeze(1)
    # Chroma from the 2x2 sums of RGB: rows first (contiguous), then column pairs.
    rows = planes.reshape(n, 3, h // 2, 2, w)
    pairs = rows[:, :, :, 0] + rows[:, :, :, 1]
    quad = (pairs[..., 0::2] + pairs[..., 1::2]).reshape(n, 3, -1)
    chroma = torch.matmul(matrix[1:] * 0.25, quad).add_(128.5).clamp_(0.0, 255.0)
    out[:, h * w :] = chroma.reshape(n, -1)
    return out.numpy().reshape(n, h * 3 // 2, w)


def rgb_to_planes(frames: torch.Tensor) -> torch.Tensor:
    """uint8 RGB [n,H,W,3] -> float RGB planes [n,3,H,W] in [0,1]."""
    return frames.permute(0, 3, 1, 2).float().div_(255.0)


# --- ISO BMFF boxes ----------------------------------------------------------------


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I", 8 + len(body)) + kind + body


def _full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags), *payload)


_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)


def split_annexb(data: bytes) -> list[bytes]:
    """NAL units of an Annex B byte stream (start codes removed)."""
    nals: list[bytes] = []
    start = data.find(b"\x00\x00\x01")
    while start >= 0:
        begin = start + 3
        nxt = data.find(b"\x00\x00\x01", begin)
        # A NAL never ends in a zero byte: trailing zeros belong to the next start code.
        nal = data[begin : len(data) if nxt < 0 else nxt].rstrip(b"\x00")
        if nal:
            nals.append(nal)
        start = nxt
    return nals


def avc_codec_string(sps: bytes) -> str:
    """RFC 6381 codec string from an SPS NAL: avc1.PPCCLL."""
    return f"avc1.{sps[1]:02X}{sps[2]:02X}{sps[3]:02X}"


def init_segment(width: int, height: int, timescale: int, sps: bytes, pps: bytes) -> bytes:
    """ftyp + moov for one H.264 track with no samples (they come in fragments)."""
    ftyp = _box(b"ftyp", b"iso5", struct.pack(">I", 512), b"iso5iso6avc1mp41isom")
    mvhd = _full_box(
        b"mvhd", 0, 0,
        struct.pack(">IIII", 0, 0, 1000, 0),  # times, timescale, duration (unknown)
        struct.pack(">IH", 0x10000, 0x100), bytes(10), _MATRIX, bytes(24),
        struct.pack(">I", _TRACK_ID + 1),
    )  # fmt: skip
    tkhd = _full_box(
        b"tkhd", 0, 0x3,  # enabled, in movie
        struct.pack(">IIII", 0, 0, _TRACK_ID, 0), struct.pack(">I", 0), bytes(8),
        struct.pack(">hhhH", 0, 0, 0, 0), _MATRIX, struct.pack(">II", width << 16, height << 16),
    )  # fmt: skip
    mdhd = _full_box(b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, timescale, 0, 0x55C4, 0))  # 'und'
    hdlr = _full_box(b"hdlr", 0, 0, struct.pack(">I", 0), b"vide", bytes(12), b"VideoHandler\x00")
    avcc = _box(
        b"avcC",
        bytes((1, sps[1], sps[2], sps[3], 0xFF, 0xE1)),  # 4-byte NAL lengths, one SPS
        struct.pack(">H", len(sps)), sps, b"\x01", struct.pack(">H", len(pps)), pps,
    )  # fmt: skip
    avc1 = _box(
        b"avc1", bytes(6), struct.pack(">H", 1), bytes(16),
        struct.pack(">HHIIIH", width, height, 0x480000, 0x480000, 0, 1),
        bytes(32), struct.pack(">Hh", 0x18, -1), avcc,
    )  # fmt: skip
    stbl = _box(
        b"stbl",
        _full_box(b"stsd", 0, 0, struct.pack(">I", 1), avc1),
        _full_box(b"stts", 0, 0, struct.pack(">I", 0)),
        _full_box(b"stsc", 0, 0, struct.pack(">I", 0)),
        _full_box(b"stsz", 0, 0, struct.pack(">II", 0, 0)),
        _full_box(b"stco", 0, 0, struct.pack(">I", 0)),
    )
    dinf = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1)))
    minf = _box(b"minf", _full_box(b"vmhd", 0, 1, bytes(8)), dinf, stbl)
    trak = _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, minf))
    mvex = _box(b"mvex", _full_box(b"trex", 0, 0, struct.pack(">IIIII", _TRACK_ID, 1, 0, 0, 0)))
    return ftyp + _box(b"moov", mvhd, trak, mvex)


def media_fragment(sequence: int, base_time: int, duration: int, samples: list[tuple[bytes, bool]]) -> bytes:
    """moof + mdat for ``samples`` (AVCC bytes, is-sync) of equal ``duration``."""

    def moof(data_offset: int) -> bytes:
        tfhd = _full_box(b"tfhd", 0, 0x020000 | 0x08 | 0x20, struct.pack(">III", _TRACK_ID, duration, _NON_SYNC_FLAGS))
        tfdt = _full_box(b"tfdt", 1, 0, struct.pack(">Q", base_time))
        first_flags = _SYNC_FLAGS if samples[0][1] else _NON_SYNC_FLAGS
        sizes = struct.pack(f">{len(samples)}I", *(len(s) for s, _ in samples))
        trun = _full_box(
            b"trun", 0, 0x01 | 0x04 | 0x200, struct.pack(">IiI", len(samples), data_offset, first_flags), sizes
        )
        return _box(b"moof", _full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)), _box(b"traf", tfhd, tfdt, trun))

    size = len(moof(0))  # the box sizes do not depend on the offset's value
    return moof(size + 8) + _box(b"mdat", *(s for s, _ in samples))


# --- encoders ----------------------------------------------------------------------


class _CodecEncoder:
    """The PyAV codec context of an encoder: used while open, freed by ``close``."""

    def __init__(self, ctx: av.VideoCodecContext) -> None:
        self._ctx: av.VideoCodecContext | None = ctx
        self.closed = False

    def close(self) -> None:
        """Free the encoder (PyAV frees a codec context with its last reference)."""
        self.closed = True
        self._ctx = None

    def _live(self) -> av.VideoCodecContext:
        if self._ctx is None:
            raise RuntimeError("encoder is closed")
        return self._ctx


class Fmp4Encoder(_CodecEncoder):
    """H.264 in fragmented MP4: ``init_segment`` once, then one fragment per
    ``flush_chunk()``, each starting with an IDR frame. Not thread-safe: one
    thread at a time (the engine runs one chunk of a request at a time)."""

    def __init__(self, width: int, height: int, fps: int, frames_per_chunk: int, crf: int = H264_CRF) -> None:
        self.width, self.height, self.fps = width, height, fps
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
        ctx.time_base = Fraction(1, fps)
        ctx.framerate = Fraction(fps, 1)
        ctx.gop_size = frames_per_chunk
        ctx.max_b_frames = 0
        ctx.thread_count = 1
        ctx.flags |= av.codec.context.Flags.global_header  # SPS/PPS in extradata, for avcC
        # The codec context's profile, not libx264's "profile" option: PyAV 14 refuses the
        # option (EINVAL); both give x264's baseline, which is constrained baseline (42 c0).
        ctx.profile = "Baseline"
        ctx.options = {
            "preset": H264_PRESET,
            "tune": "zerolatency",  # one packet out per frame in: a chunk is complete when encoded
            "crf": str(crf),
            "x264-params": (
                f"keyint={frames_per_chunk}:scenecut=0:forced-idr=1:threads=1:"
                "colorprim=smpte170m:transfer=smpte170m:colormatrix=smpte170m"
            ),
        }
        ctx.open()
        super().__init__(ctx)
        nals = split_annexb(bytes(ctx.extradata or b""))
        sps = next(n for n in nals if n[0] & 0x1F == 7)
        pps = next(n for n in nals if n[0] & 0x1F == 8)
        self.codec = avc_codec_string(sps)
        self.mime_type = f'video/mp4; codecs="{self.codec}"'
        self.timescale = fps * _TIMESCALE_PER_FPS
        self.init_segment = init_segment(width, height, self.timescale, sps, pps)
        self._samples: list[tuple[bytes, bool]] = []
        self._frames_in_chunk = 0
        self._next_pts = 0
        self._chunk_start_pts = 0
        self._sequence = 0

    def encode(self, planes: torch.Tensor) -> None:
        """Add frames (float RGB planes [n,3,H,W] in [0,1]) to the current chunk."""
        for array in planes_to_yuv420(planes):
            frame = av.VideoFrame.from_ndarray(array, format="yuv420p")
            frame.pts = self._next_pts
            if self._frames_in_chunk == 0:  # every fragment starts with an IDR frame
                frame.pict_type = av.video.frame.PictureType.I
            for packet in self._live().encode(frame):
                self._samples.append((_to_avcc(bytes(packet)), packet.is_keyframe))
            self._next_pts += 1
            self._frames_in_chunk += 1

    def flush_chunk(self) -> bytes:
        """The fragment (moof+mdat) of the frames encoded since the last flush."""
        if len(self._samples) != self._frames_in_chunk or not self._samples[0][1]:
            # Cannot happen with zerolatency and forced IDR; a fragment that
            # did not start with a keyframe would break MSE playback.
            raise RuntimeError("encoder delayed frames or missed the chunk keyframe")
        self._sequence += 1
        fragment = media_fragment(
            self._sequence, self._chunk_start_pts * _TIMESCALE_PER_FPS, _TIMESCALE_PER_FPS, self._samples
        )
        self._samples, self._frames_in_chunk = [], 0
        self._chunk_start_pts = self._next_pts
        return fragment


class JpegEncoder(_CodecEncoder):
    """One baseline JPEG (full-range 4:2:0) per frame."""

    mime_type = "image/jpeg"

    def __init__(self, width: int, height: int, fps: int, qscale: int = JPEG_QSCALE) -> None:
        ctx = av.CodecContext.create("mjpeg", "w")
        ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuvj420p"
        ctx.time_base = Fraction(1, fps)
        ctx.flags |= av.codec.context.Flags.qscale
        ctx.qmin = ctx.qmax = qscale
        ctx.thread_count = 1
        ctx.open()
        super().__init__(ctx)
        self._frames: list[bytes] = []
        self._pts = 0

    def encode(self, planes: torch.Tensor) -> None:
        for array in planes_to_yuv420(planes, full_range=True):
            frame = av.VideoFrame.from_ndarray(array, format="yuvj420p")
            frame.pts = self._pts
            self._pts += 1
            self._frames.extend(bytes(p) for p in self._live().encode(frame))

    def flush_chunk(self) -> list[bytes]:
        frames, self._frames = self._frames, []
        return frames


def flush_chunk_media(encoder: Fmp4Encoder | JpegEncoder, first: bool) -> tuple[bytes, bytes, tuple[bytes, ...]]:
    """What ``encoder`` encoded since the last flush, as a ``VideoChunk``'s ``data``,
    ``init_segment`` and ``frames``: fMP4, the fragment (after the init segment
    in the ``first`` chunk, which a player starts from); JPEG, the frames and
    their concatenation."""
    if isinstance(encoder, JpegEncoder):
        frames = tuple(encoder.flush_chunk())
        return b"".join(frames), b"", frames
    init, fragment = encoder.init_segment, encoder.flush_chunk()
    return (init + fragment if first else fragment), init, ()


def _to_avcc(packet: bytes) -> bytes:
    """Annex B access unit -> 4-byte length-prefixed NAL units, without the
    parameter sets (they are in avcC) and access unit delimiters."""
    out = bytearray()
    for nal in split_annexb(packet):
        if nal[0] & 0x1F in (7, 8, 9):
            continue
        out += struct.pack(">I", len(nal))
        out += nal
    return bytes(out)
