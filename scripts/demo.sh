#!/usr/bin/env bash
# Install turnkit into .venv (first run only) and run one turn on the embedded defaults:
# SQLite in ./turnkit.db, in-memory replay, the OFFLINE DEMO model (no server, no API key).
# Usage: bash scripts/demo.sh ["your message"]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

step() { printf '==> %s\n' "$*"; }

# pip's output shrunk to a running count of packages (one line, redrawn on a terminal);
# all of it is kept in .venv/install.log and shown when pip fails.
pip_install() {
  local log=.venv/install.log status count=0 name
  set +e
  .venv/bin/pip install --progress-bar off "$@" 2>&1 | tee "$log" | {
    while IFS= read -r line; do
      case $line in
        Collecting*)
          count=$((count + 1))
          name=${line#Collecting }
          name=${name%%[^A-Za-z0-9._-]*}
          if [ -t 1 ]; then printf '\r    fetching package %d: %s\033[K' "$count" "$name"; fi
          ;;
        "Installing collected packages"*)
          if [ -t 1 ]; then printf '\r\033[K'; fi
          echo "    installing $count packages…"
          ;;
      esac
    done
  }
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    if [ -t 1 ]; then echo; fi
    echo "pip failed (exit $status); its output, also in $log:" >&2
    cat "$log" >&2
    exit "$status"
  fi
}

if [ ! -x .venv/bin/python ]; then
  step "creating .venv ($PY -m venv)"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import turnkit" 2>/dev/null; then
  step "installing turnkit and its dependencies into .venv (first run, about a minute)…"
  SECONDS=0
  .venv/bin/pip install --quiet --upgrade pip
  pip_install -e .
  echo "    done in ${SECONDS} s"
fi
if [ -z "${TURNKIT_DATABASE_URL:-}${TURNKIT_MODEL:-}" ]; then
  step "running the demo on SQLite (./turnkit.db) with the offline demo model"
else
  step "running one turn (database ${TURNKIT_DATABASE_URL:-sqlite:///turnkit.db}," \
    "model ${TURNKIT_MODEL:-the offline demo model})"
fi
exec .venv/bin/turnkit run "${1:-What is (12 + 3) * 7?}"
