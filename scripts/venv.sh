#!/usr/bin/env bash
# Create .venv (if missing) and install pqloader with the given extras, CPU torch first.
# Usage: source scripts/venv.sh [extras]   e.g. "test" or "test,bench"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
python3 -m venv "$root/.venv"
# Pin torch (and the S3 test stack) for every install below: see scripts/constraints.txt.
export PIP_CONSTRAINT="$root/scripts/constraints.txt"
# pip, quietly; on failure its whole output, then stop (a failed install must not pass for a done one).
pip_install() {
  local log
  log="$(mktemp)"
  if ! "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2 || true
    rm -f "$log"
    echo "scripts/venv.sh: pip install $* failed (constraints: $PIP_CONSTRAINT)" >&2
    exit 1
  fi
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
}
pip_install "torch==2.13.0"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
pip_install -e "$spec"
"$root/.venv/bin/python" -c "import pqloader, torch; assert torch.__version__.startswith('2.13.0')"
