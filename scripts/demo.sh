#!/usr/bin/env bash
# The main job: write a synthetic sharded dataset, train a small model on it for an epoch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh" ""
exec "$root/.venv/bin/python" "$root/examples/demo.py" "$@"
