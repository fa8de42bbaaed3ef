"""The ``remote`` engine: upstream vLLM-Omni servers (or other gateways: the
same protocols) reached over their own WebSocket protocols.

- ``RemoteEngine`` (``voice``): the voice ``Engine`` over upstream
  ``/v1/realtime`` sessions (OpenAI Realtime API).
- ``RemoteVideoEngine`` (``video``): the ``VideoEngine`` over upstream
  ``/v1/realtime/video`` sessions (vLLM-Omni's streaming video protocol).
- ``UpstreamPool`` (``pool``): the upstreams, their ``/readyz`` health, the
  least-loaded choice and the pooled connections; one pool can serve both
  engines (``RemoteEngine.video_engine()``).
"""

from __future__ import annotations

from orchestrator.engines.remote.pool import UpstreamLost, UpstreamPool, UpstreamUnavailable, split_url
from orchestrator.engines.remote.video import RemoteVideoEngine
from orchestrator.engines.remote.voice import OPENAI_VOICES, RemoteEngine

__all__ = [
    "OPENAI_VOICES",
    "RemoteEngine",
    "RemoteVideoEngine",
    "UpstreamLost",
    "UpstreamPool",
    "UpstreamUnavailable",
    "split_url",
]
