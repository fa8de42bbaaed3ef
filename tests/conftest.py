"""Makes ``tests/support`` importable as ``support``; shared helpers live there
(``support.gateway``: run_gateway, connect, Client), not in conftest files, so
that no test depends on which ``conftest`` module Python resolves."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from support.gateway import Client, RunningGateway, connect, free_port, run_gateway

__all__ = ["Client", "RunningGateway", "connect", "free_port", "run_gateway"]
