"""The browser tests: the demo pages and the browser SDK in a real Chromium.

Every test here carries the ``browser`` marker (select with ``-m browser``,
leave out with ``-m "not browser"``); they run by default. They need Debian's
Chromium at /usr/bin/chromium and Python Playwright, which
``scripts/install_browser.sh`` installs; without them the tests skip and say so,
except under CI (``CI`` set), where they fail: CI installs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: the demo pages and the browser SDK in headless Chromium (scripts/install_browser.sh)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from browser_support import missing_browser

    reason = missing_browser()
    for item in items:
        if HERE not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.browser)
        if reason is not None and not os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _browser_is_installed() -> None:
    """Under CI a missing browser fails the test (elsewhere it was skipped at collection)."""
    from browser_support import missing_browser

    reason = missing_browser()
    if reason is not None:
        pytest.fail(reason)
