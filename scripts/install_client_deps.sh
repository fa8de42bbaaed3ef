#!/usr/bin/env bash
# The third-party realtime clients tests/clients/ drives against the gateway, in a
# virtual environment of their own (.venv-clients): openai-agents requires
# websockets < 17, which must not pull the test environment below the websockets
# users get. The tests run the gateway in the main environment and each client as a
# subprocess on this one's python. Idempotent: an existing venv is updated in place.
#
# Environment: PYTHON (default: python3), CLIENTS_VENV (default: .venv-clients).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${CLIENTS_VENV:-.venv-clients}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2> >(grep -v '^WARNING: Location' >&2)
# numpy: the client scripts write and read PCM; soxr: pipecat's resampler. The floors are the
# releases whose GPT-Live clients the tests hold to (pipecat's OpenAILiveLLMService, LiveKit's
# GPTLiveModel).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    'openai-agents>=0.20' \
    'pipecat-ai[openai]>=1.14' \
    'livekit-plugins-openai>=1.8.9' \
    'numpy>=1.26' \
    2> >(grep -v '^WARNING: Location' >&2)
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as m
for name in ("openai-agents", "pipecat-ai", "livekit-plugins-openai", "openai", "websockets"):
    print(f"install_client_deps: {name} {m.version(name)}")
PYEOF
