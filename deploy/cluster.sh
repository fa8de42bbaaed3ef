#!/usr/bin/env bash
# Local cluster on 127.0.0.1: redis-server + N gateway replicas + nginx.
#   deploy/cluster.sh up --replicas 3 [--api-key sk-local] [--engine cascade]
# Runs until Ctrl-C; see deploy/local_cluster.py (also a library for tests).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$(command -v python || command -v python3)}"
exec "$python" "$here/local_cluster.py" "$@"
