"""The SDK's binary frame codec agrees with the gateway's, its backoff stays in
bounds, and ``import omni_gateway_client`` needs nothing from the server."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
from sdk_support import ROOT

from gateway.protocol import server_events
from omni_gateway_client import FrameError, ReconnectPolicy, decode_audio_frame, encode_audio_frame, encode_input_frame


# 239 characters: the longest item id a u8 header length allows.
@pytest.mark.parametrize("item_id", ["", "i", "item_abc", "item_" + "x" * 60, "y" * 239])
def test_sdk_decodes_the_gateways_audio_frames(item_id: str) -> None:
    audio = bytes(range(256)) * 3
    event = {"type": "response.output_audio.delta", "item_id": item_id, "content_index": 3,
             "server_event_seq": 2**40 + 7, "delta": audio}  # fmt: skip
    frame = server_events.encode_audio_frame(event)
    header_len = frame[1]
    assert header_len % 4 == 0
    assert decode_audio_frame(frame) == {
        "type": "response.output_audio.delta",
        "server_event_seq": 2**40 + 7,
        "item_id": item_id,
        "content_index": 3,
        "delta": audio,
    }
    mine = encode_audio_frame(item_id=item_id, content_index=3, server_event_seq=2**40 + 7, audio=audio)
    assert mine == frame


def test_an_item_id_too_long_for_the_header_is_refused_by_both() -> None:
    with pytest.raises(FrameError):
        encode_audio_frame(item_id="z" * 240, content_index=0, server_event_seq=1, audio=b"")
    with pytest.raises(ValueError):
        server_events.encode_audio_frame({"item_id": "z" * 240, "content_index": 0, "server_event_seq": 1,
                                          "delta": b""})  # fmt: skip


def test_binary_layout_is_big_endian_with_padding() -> None:
    frame = encode_audio_frame(item_id="ab", content_index=0x0102, server_event_seq=0x0A0B, audio=b"\xff\xee")
    # kind, H, content_index, seq (u64), L, "ab", pad to 16, audio
    assert frame == bytes([2, 16, 1, 2, 0, 0, 0, 0, 0, 0, 0x0A, 0x0B, 2]) + b"ab" + b"\0" + b"\xff\xee"
    assert decode_audio_frame(frame, event_type="response.audio.delta")["type"] == "response.audio.delta"


def test_input_frames_match_the_gateway() -> None:
    audio = b"\x01\x02\x03\x04" * 10
    frame = encode_input_frame(audio)
    assert frame[:4] == b"\x01\x00\x00\x00"
    assert server_events.decode_input_frame(frame) == audio


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x02\x10\x00",  # shorter than the fixed header
        bytes([1, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),  # kind 1 is client -> server
        bytes([2, 14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),  # header not a multiple of 4
        bytes([2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0]),  # item id longer than the header
        bytes([2, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),  # header longer than the frame
        bytes([2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0xFF, 0, 0]),  # item id not ASCII
    ],
)
def test_malformed_audio_frames_raise_frame_error(frame: bytes) -> None:
    with pytest.raises(FrameError):
        decode_audio_frame(frame)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=2.0, multiplier=2.0, jitter=0.5)
    rng = random.Random(7)
    for attempt, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]):
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling * 0.5 - 1e-9 <= d <= ceiling + 1e-9 for d in delays)
        assert max(delays) - min(delays) > ceiling * 0.3  # jittered, not constant
    assert ReconnectPolicy(jitter=0.0).delay(10_000) == ReconnectPolicy().max_delay


def test_importing_the_sdk_pulls_in_no_server_code() -> None:
    """In a fresh interpreter with the server's packages made unimportable,
    ``import omni_gateway_client`` works and leaves no server module behind."""
    code = textwrap.dedent(
        """
        import sys
        from importlib.abc import MetaPathFinder

        BLOCKED = {"gateway", "orchestrator", "starlette", "uvicorn", "numpy", "redis", "prometheus_client"}

        class Block(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, Block())
        import omni_gateway_client
        from omni_gateway_client import RealtimeClient, encode_input_frame
        assert omni_gateway_client.__file__.startswith(sys.argv[1]), omni_gateway_client.__file__
        assert encode_input_frame(b"ab") == b"\\x01\\x00\\x00\\x00ab"
        RealtimeClient("ws://127.0.0.1:1/v1/realtime", model="m", api_key="k", binary=True)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code, str(ROOT / "omni_gateway_client")], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
