#!/usr/bin/env bash
# Install turnkit into .venv (first run only) and run one turn on the embedded defaults:
# SQLite in ./turnkit.db, in-memory replay, the OFFLINE DEMO model (no server, no API key).
# Usage: bash scripts/demo.sh ["your message"]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import turnkit" 2>/dev/null; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e .
fi
exec .venv/bin/turnkit run "${1:-What is (12 + 3) * 7?}"
