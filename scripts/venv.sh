#!/usr/bin/env bash
# Create .venv (if missing) and install pqloader with the given extras, CPU torch first.
# Usage: source scripts/venv.sh [extras]   e.g. "test" or "test,bench"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
python3 -m venv "$root/.venv"
# Pin torch for every install below, so no dependency can pull a newer (CUDA) build.
constraints="$root/.venv/torch-constraints.txt"
echo "torch==2.13.0" > "$constraints"
export PIP_CONSTRAINT="$constraints"
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 \
  | grep -v "^WARNING: Location" || true
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$spec" 2>&1 \
  | grep -v "^WARNING: Location" || true
"$root/.venv/bin/python" -c "import pqloader, torch; assert torch.__version__.startswith('2.13.0')"
