"""SIP trunks (gateway/transport/sip): sipp (Debian's sip-tester) places the calls, a small
Python RTP peer carries their media, all on 127.0.0.1. The media path needs the webrtc
extra's PyAV (the paced track): without it, or without sipp, these tests are not collected
(CI installs both: their absence fails there)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

HERE = Path(__file__).parent
PURE = {"test_sip_message.py", "test_sip_sdes.py"}

collect_ignore: list[str] = []
if importlib.util.find_spec("av") is None or shutil.which("sipp") is None:
    if os.environ.get("CI"):
        raise ImportError("the SIP tests need sipp (apt install sip-tester) and the webrtc extra")
    collect_ignore = sorted(p.name for p in HERE.glob("test_*.py") if p.name not in PURE)
