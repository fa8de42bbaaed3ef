"""What the model and secret-binding tests share: two passthrough routes, tenants' key hashes."""

from __future__ import annotations

import hashlib
import json

KEY_PROTO = "openai-insecure-api-key."  # the browser's credential subprotocol prefix
# Two models on one gateway, both passthrough (2 unpaced chunks: answers are instant).
ROUTES = json.dumps({"models": [
    {"name": "tone-a", "engine": "passthrough", "audio_chunks": 2, "paced": False},
    {"name": "tone-b", "engine": "passthrough", "audio_chunks": 2, "paced": False},
]})  # fmt: skip


def sha(key: str) -> str:
    """A keys-file entry's ``key_sha256``."""
    return hashlib.sha256(key.encode()).hexdigest()
