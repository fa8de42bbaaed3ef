#!/usr/bin/env bash
# A rolling deploy of the compose replicas (compose.yaml), one at a time, that no listener hears:
#   deploy/roll.sh            # rebuild the image, then replace gateway-1, then gateway-2
#   deploy/roll.sh --no-build # replace them on the image as it is (a config change)
# For each replica: `stop` sends SIGTERM (init: true forwards it), the gateway turns /readyz
# 503, hands each session over at its own first idle moment (close 1012; the client resumes
# on the other replica through nginx, from Redis) and exits, within stop_grace_period (60 s,
# longer than drain_window_s, 20 s); then `up --wait` starts the new one and returns once its
# healthcheck (/readyz) passes, so one replica always serves. Needs Docker Compose v2.
set -euo pipefail
cd "$(dirname "$0")"
compose=(docker compose -f compose.yaml)
replicas=(gateway-1 gateway-2)
if [[ "${1:-}" != "--no-build" ]]; then
  "${compose[@]}" build "${replicas[0]}"  # one image (omni-gateway:local) for every replica
fi
for service in "${replicas[@]}"; do
  echo "roll: draining $service"
  "${compose[@]}" stop "$service"
  echo "roll: starting $service"
  "${compose[@]}" up --detach --no-deps --wait "$service"
done
echo "roll: done"
