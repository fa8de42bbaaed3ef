"""No credential ever reaches a log, from any logger, at any level.

uvicorn and websockets log handshake headers at DEBUG (``authorization:
Bearer ...``, ``sec-websocket-protocol: openai-insecure-api-key.<key>``), the
``remote`` engine's websockets client logs the upstream key it sends, and an
exception message may quote a header. A filter on a logger does not see its
children's records, so redaction happens where every record is made: a log
record factory (``logging.setLogRecordFactory``) rewrites each record's
message, and the text of its traceback, before any filter or handler sees it.

What is redacted: the secrets registered with ``register_secret`` (API keys,
the upstream key, JWT signing secrets: exact values, wherever they appear);
then, by *where* a credential can be, whatever its shape (a keys-file key is
known here only by its hash): the value of every credential header
(``Authorization`` of any scheme, ``Proxy-Authorization``, ``api-key``,
``X-Api-Key``, ``Cookie``, ``Set-Cookie``, ...: ``CREDENTIAL_HEADERS``), of
every query parameter that may carry one (``?api_key=``, ``key``, ``token``,
``client_secret``, ...: ``CREDENTIAL_PARAMS``), and of the browser subprotocol
``openai-insecure-api-key.`` in any case; and by shape, client secrets
(``ek_``), resume tokens (``rt_``) and JWTs (``eyJ...``) wherever they are.

The same factory turns the few records in which a library reports a client's
fault as an error with a traceback (``CLIENT_FAULTS``) into one warning line.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from typing import Any

REDACTED = "[redacted]"
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "api-key", "x-api-key", "openai-api-key",
                      "x-auth-token", "x-access-token", "cookie", "set-cookie", "x-omni-resume")  # fmt: skip
CREDENTIAL_PARAMS = ("api_key", "api-key", "apikey", "key", "token", "access_token", "auth", "authorization",
                     "client_secret", "secret", "password", "jwt", "resume_token")  # fmt: skip
_HEADER_NAMES = "|".join(re.escape(h) for h in CREDENTIAL_HEADERS)
_PARAM_NAMES = "|".join(re.escape(p) for p in CREDENTIAL_PARAMS)
_PATTERNS = (
    # A header as a line ("< api-key: ..."), in a mapping ('cookie': '...') or a pair ((b'cookie', b'...')):
    # its value to the end of the line or the closing quote (an auth scheme's name is kept).
    re.compile(
        rf"(?i)(\b(?:{_HEADER_NAMES})['\"]?\s*(?::|=|,)\s*(?:b?['\"])?(?:(?:bearer|basic|token|digest)\s+)?)[^'\"\r\n]+"
    ),
    re.compile(rf"(?i)([?&;](?:{_PARAM_NAMES})=)[^&#\s'\"]+"),  # a query parameter
    re.compile(r"(?i)(openai-insecure-api-key\.)[^\s'\",)]+"),  # the subprotocol, in any case
    re.compile(r"\b(ek_)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\b(rt_)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\b()eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]*"),
)
MIN_SECRET_CHARS = 4  # shorter registered values are not searched for (they would redact words)

# Records libraries log as errors, with a traceback, for what is a client's fault: one
# WARNING line each instead (the client gets its close code; an operator needs no stack).
CLIENT_FAULTS = {
    ("uvicorn.error", "Invalid UTF-8 sequence received from client."): "a client sent a text frame that is "
    "not UTF-8: closed with 1007",
}

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def register_secret(value: str | None) -> None:
    """Redact ``value`` wherever it appears in a log record from now on."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(value)


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):  # a longer secret may contain a shorter one
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(r"\1" + REDACTED, text)
    return text


def _clean(record: logging.LogRecord) -> None:
    fault = CLIENT_FAULTS.get((record.name, record.msg)) if isinstance(record.msg, str) else None
    if fault is not None:
        record.msg, record.args, record.exc_info = fault, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    try:
        message = record.getMessage()
    except Exception:  # a malformed record is not ours to fix; logging reports it
        return
    cleaned = redact(message)
    if cleaned != message:
        # Each argument on its own first: formatters that read ``args`` (uvicorn's access log
        # unpacks its five) keep working. Only a secret split across them collapses the record.
        args = record.args
        if isinstance(args, tuple) and isinstance(record.msg, str):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
            record.msg = redact(record.msg)
            with contextlib.suppress(Exception):
                if redact(record.getMessage()) == record.getMessage():
                    return
        record.msg, record.args = cleaned, None
    if record.exc_info and not record.exc_text:
        # Formatted now, once, as the default formatter would; handlers reuse exc_text.
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def install() -> None:
    """Idempotent: every record made from now on, by any logger, is redacted."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        _clean(record)
        return record

    logging.setLogRecordFactory(factory)


__all__ = ["REDACTED", "install", "redact", "register_secret"]
