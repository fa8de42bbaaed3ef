"""Standard Webhooks signatures (pure): what the gateway's webhooks carry.

The scheme (standardwebhooks.com, the one OpenAI's webhooks use): a secret ``whsec_`` +
base64 of the key; the signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the
``webhook-signature`` header is ``v1,`` + base64 of its HMAC-SHA256 under the key
(several, space separated, while a secret is rotated).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The key of a ``whsec_`` secret (raises ValueError for one that is not base64)."""
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    content = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret_key(secret), content, hashlib.sha256).digest()).decode()


def sign_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a signed webhook."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }
