#!/usr/bin/env bash
# Installs what the browser tests (tests/browser/) need: Debian's Chromium at
# /usr/bin/chromium and Python Playwright (the driver only: the tests launch
# Debian's Chromium through ``executable_path``, so ``playwright install``,
# which downloads a browser build of its own, is never run).
#
# - Idempotent: when /usr/bin/chromium exists and ``import playwright`` works,
#   it only says so and exits 0 (well under a second).
# - Needs root for apt-get (CI and the developer machines run as root); without
#   it, or without the network, it fails loudly and the browser tests skip
#   with the reason.
#
# Environment: PYTHON (default: python).
set -euo pipefail

PY="${PYTHON:-python}"
say() { echo "install_browser: $*" >&2; }

if [ ! -x /usr/bin/chromium ]; then
    say "installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi

if ! "$PY" -c "import playwright.async_api" 2>/dev/null; then
    say "installing playwright (Python driver)"
    "$PY" -m pip install -q playwright
fi

/usr/bin/chromium --version >&2
"$PY" -c "import importlib.metadata as m; print('install_browser: playwright', m.version('playwright'))" >&2
