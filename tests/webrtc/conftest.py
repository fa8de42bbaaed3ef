"""The WebRTC media layer (gateway/transport/webrtc): SDP checks, the paced outgoing track,
the incoming Opus track, the data channel and the watchdog, between real aiortc peers on
this machine's own addresses (no mocks).

All but the pure modules (SDP, config) need the ``webrtc`` extra (aiortc, PyAV): without it
they are not collected (``pip install -e '.[webrtc]'``). The Chromium test also needs the
browser (``scripts/install_browser.sh``) and skips without it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

HERE = Path(__file__).parent
PURE = {"test_sdp.py", "test_config.py"}

collect_ignore: list[str] = []
if importlib.util.find_spec("aiortc") is None:
    if os.environ.get("CI"):  # CI installs the webrtc extra: its absence fails, never skips
        raise ImportError("aiortc is not installed: pip install -e '.[webrtc]'")
    collect_ignore = sorted(p.name for p in HERE.glob("test_*.py") if p.name not in PURE)
