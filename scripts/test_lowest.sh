#!/usr/bin/env bash
# The transport and protocol tests on the LOWEST websockets, uvicorn and starlette that
# pyproject.toml admits, the session store's contract (one Redis, Sentinel, Cluster) on the
# lowest redis, and the WebRTC calls on the lowest aiortc, av and python-multipart of the
# webrtc extra, and the MCP client on the lowest mcp (the main CI run has the newest:
# what `pip install` resolves).
# Builds a fresh virtual environment (.venv-lowest) every run, with the same extras as the main
# run (the WebRTC tests trace a cascade turn with OpenTelemetry); .ci/run calls it.
#
# Usage: scripts/test_lowest.sh [all|install|test] (default all): `install` builds the venv and
# checks its pins, `test` runs the tests in the venv `install` built (.ci/run builds it while the
# main suite runs).
#
# Environment: PYTHON (default: python3), LOWEST_VENV (default: .venv-lowest).
set -euo pipefail
phase="${1:-all}"
case "$phase" in all|install|test) ;; *) echo "usage: $0 [all|install|test]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${LOWEST_VENV:-.venv-lowest}"
say() { echo "test_lowest: $*" >&2; }

# The lower bounds, read from pyproject.toml so they cannot drift from what we declare.
pins=$("$PY" - <<'PYEOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["webrtc"]
for name in ("websockets", "uvicorn", "starlette", "redis", "aiortc", "av", "python-multipart"):
    spec = next(d for d in deps if re.match(rf"{name}\b", d))
    low = re.search(r">=\s*([\w.]+)", spec)
    if not low:
        raise SystemExit(f"{name} has no lower bound in pyproject.toml")
    print(f"{name}=={low.group(1)}")
PYEOF
)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$pins" >"$constraints"
say "pins: $(tr '\n' ' ' <"$constraints")"

if [ "$phase" != test ]; then
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# (this machine's pip config names index folders that may not exist: their warnings are noise)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" 'torch==2.13.0' -e '.[cpu,video,otel,dev,webrtc]' \
    2> >(grep -v '^WARNING: Location' >&2)
"$VENV/bin/python" - "$constraints" <<'PYEOF'
import importlib.metadata as md, sys
from packaging.version import Version
for line in open(sys.argv[1]):
    name, want = line.strip().split("==")
    have = md.version(name)
    if Version(have) != Version(want):
        sys.exit(f"test_lowest: {name} {have} installed, {want} wanted")
PYEOF
fi
[ "$phase" = install ] && exit 0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 3 \
    tests/integration/test_ws_server.py \
    tests/integration/test_realtime_protocol.py \
    tests/integration/test_errors.py \
    tests/integration/test_auth_and_http.py \
    tests/integration/test_video_protocol.py \
    tests/integration/test_openai_sdk.py \
    tests/unit/test_protocol.py \
    tests/webrtc \
    tests/client \
    tests/store \
    tests/unit/test_redis_url.py

# The MCP client on the lowest mcp the mcp extra admits. Installed after the run above: the MCP
# SDK needs a newer starlette than our floor (sse-starlette), so pip may upgrade it here.
mcp_low=$("$PY" - <<'PYEOF'
import re, tomllib
spec = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mcp"][0]
print(re.search(r">=\s*([\w.]+)", spec).group(1))
PYEOF
)
say "mcp==$mcp_low"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "mcp==$mcp_low" 2> >(grep -v '^WARNING: Location' >&2)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integration/test_mcp.py
