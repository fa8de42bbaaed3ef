"""The command line every third-party client script shares (they run on ``.venv-clients``'s
python, as ``python <script>.py --url U --speech F --out R [--timeout S]``, and import this
from their own directory).

``run`` parses it, runs ``main(report, url, speech, timeout)``, records what failed in
``report["errors"]`` (never raising: the test reads the report) and the ERROR records of
``log`` in ``report["log_errors"]``, and writes the report as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

Main = Callable[[dict[str, Any], str, bytes, float], Awaitable[None]]


class ErrorRecords(logging.Handler):
    """ERROR log records (clients log their validation failures rather than raise them)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:2000])


def run(main: Main, report: dict[str, Any], *, log: logging.Logger | None = None, timeout: float = 60.0) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--speech", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=timeout)
    args = parser.parse_args()
    handler = ErrorRecords()
    if log is not None:
        log.addHandler(handler)
    try:
        asyncio.run(main(report, args.url, Path(args.speech).read_bytes(), args.timeout))
    except BaseException as exc:  # the report says what failed; the test reads it
        report["errors"].append(f"{type(exc).__name__}: {exc}")
    if log is not None:
        report["log_errors"] = handler.messages
    Path(args.out).write_text(json.dumps(report, indent=1))
