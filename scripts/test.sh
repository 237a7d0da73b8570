#!/usr/bin/env bash
# Install turnkit with its dev extras into .venv and run the whole test suite.
# PostgreSQL (127.0.0.1:5432, db `test`) and Redis (127.0.0.1:6379) tests skip when the
# services are down, except under CI=true, where they fail.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.turnkit-dev-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing turnkit with its dev extras into .venv (a minute the first time)..."
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
exec .venv/bin/python -m pytest "$@"
