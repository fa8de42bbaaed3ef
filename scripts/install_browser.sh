#!/usr/bin/env bash
# Installs what the browser tests (tests/browser/) need: Debian's Chromium at
# /usr/bin/chromium and Python Playwright (the driver only: the tests launch
# Debian's Chromium through ``executable_path``, so ``playwright install``,
# which downloads a browser build of its own, is never run); and the OpenAI
# Agents SDK's browser package, @openai/agents-realtime, from npm, pinned
# (AGENTS_REALTIME_VERSION), into $CLIENTS_VENV/npm (.venv-clients/npm, ignored:
# never committed); tests/browser/test_agents_realtime.py serves its dist/bundle
# to the page unchanged. Node and npm come from Debian when missing.
#
# - Idempotent: when /usr/bin/chromium exists and ``import playwright`` works,
#   it only says so and exits 0 (well under a second).
# - Needs root for apt-get (CI and the developer machines run as root); without
#   it, or without the network, it fails loudly and the browser tests skip
#   with the reason.
#
# Environment: PYTHON (default: python), CLIENTS_VENV (default: .venv-clients),
# AGENTS_REALTIME_VERSION (default: the one the tests and the README name).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python}"
NPM_DIR="${CLIENTS_VENV:-.venv-clients}/npm"
AGENTS_REALTIME="${AGENTS_REALTIME_VERSION:-0.20.0}"
say() { echo "install_browser: $*" >&2; }
# Another apt-get may hold dpkg's lock (a fresh machine's unattended upgrades, a second
# install run beside this one): wait up to 10 minutes for it instead of failing at once.
APT=(apt-get -o DPkg::Lock::Timeout=600)

if [ ! -x /usr/bin/chromium ]; then
    say "installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -q
    "${APT[@]}" install -y -q --no-install-recommends chromium fonts-dejavu-core
fi

if ! "$PY" -c "import playwright.async_api" 2>/dev/null; then
    say "installing playwright (Python driver)"
    "$PY" -m pip install -q playwright
fi

if ! command -v npm >/dev/null; then
    say "installing Debian's nodejs and npm"
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -q
    "${APT[@]}" install -y -q --no-install-recommends nodejs npm
fi

package="$NPM_DIR/node_modules/@openai/agents-realtime/package.json"
installed="$(node -p "require(process.argv[1]).version" "$PWD/$package" 2>/dev/null || true)"
if [ "$installed" != "$AGENTS_REALTIME" ]; then
    say "installing @openai/agents-realtime@$AGENTS_REALTIME into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    # (its package.json asks for node >= 22; only the browser bundle is used, so an older node will do)
    npm install --prefix "$NPM_DIR" --save-exact --no-audit --no-fund --loglevel=error \
        "@openai/agents-realtime@$AGENTS_REALTIME"
fi

/usr/bin/chromium --version >&2
echo "install_browser: @openai/agents-realtime $(node -p "require(process.argv[1]).version" "$PWD/$package")" >&2
"$PY" -c "import importlib.metadata as m; print('install_browser: playwright', m.version('playwright'))" >&2
