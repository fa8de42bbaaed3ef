"""No credential ever reaches a log.

uvicorn and websockets log handshake headers at DEBUG (``authorization:
Bearer ...``, ``sec-websocket-protocol: openai-insecure-api-key.<key>``). This
filter rewrites every record of those loggers, and of ours, before any handler
sees it.
"""

from __future__ import annotations

import logging
import re

_PATTERNS = (
    re.compile(r"(?i)(authorization['\"]?\s*[:=,]\s*['\"]?\s*bearer\s+)[^\s'\",)]+"),
    re.compile(r"(openai-insecure-api-key\.)[^\s'\",)]+"),
    re.compile(r"\b(ek_)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\b(rt_)[A-Za-z0-9_\-]{8,}"),
)
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "websockets", "omni")


def redact(text: str) -> str:
    for pattern in _PATTERNS:
        text = pattern.sub(r"\1[redacted]", text)
    return text


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to fix
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install() -> None:
    """Idempotent: attach the filter to every logger that may see credentials."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
