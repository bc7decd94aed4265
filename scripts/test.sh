#!/usr/bin/env bash
# The test suite: unit, property (hypothesis) and integration tests with real worker processes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh" "test"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q "$@"
