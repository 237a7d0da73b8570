"""`scripts/demo.sh` (the README's first command) says what it does on a first run.

Run against stand-ins for python, pip and turnkit, so it needs no network and takes no time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent

_PIP_OUTPUT = """\
Obtaining file:///somewhere
Collecting pydantic>=2.10 (from turnkit==0.1.0)
  Downloading pydantic-2.12.0-py3-none-any.whl (444 kB)
Collecting litellm>=1.60 (from turnkit==0.1.0)
  Downloading litellm-1.80.0-py3-none-any.whl (9.1 MB)
Installing collected packages: pydantic, litellm, turnkit
Successfully installed litellm-1.80.0 pydantic-2.12.0 turnkit-0.1.0
"""

# `python3 -m venv .venv` makes a .venv whose python has no turnkit yet, whose pip prints
# what a real install prints (and fails when FAKE_PIP_FAILS is set), and whose turnkit
# echoes its arguments.
_FAKE_PYTHON = f"""\
#!/usr/bin/env bash
set -e
mkdir -p .venv/bin
printf '#!/usr/bin/env bash\\nexit 1\\n' > .venv/bin/python
cat > .venv/bin/pip <<'PIP'
#!/usr/bin/env bash
case " $* " in *" --upgrade pip "*) exit 0;; esac
cat <<'OUT'
{_PIP_OUTPUT}OUT
if [ -n "${{FAKE_PIP_FAILS:-}}" ]; then echo "ERROR: no space left" >&2; exit 1; fi
PIP
printf '#!/usr/bin/env bash\\necho "turnkit $*"\\n' > .venv/bin/turnkit
chmod +x .venv/bin/python .venv/bin/pip .venv/bin/turnkit
"""


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    python = tmp_path / "fake-python3"
    python.write_text(_FAKE_PYTHON)
    python.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TURNKIT_")}
    return subprocess.run(
        ["bash", "scripts/demo.sh", "hi"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**clean, "PYTHON": str(python), **env},
    )  # fmt: skip


def test_a_first_run_names_each_step_and_counts_packages(tmp_path: Path) -> None:
    done = _demo(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"    done in \d+ s", lines.pop(3))
    assert lines == [
        f"==> creating .venv ({tmp_path / 'fake-python3'} -m venv)",
        "==> installing turnkit and its dependencies into .venv (first run, about a minute)…",
        "    installing 2 packages…",
        "==> running the demo on SQLite (./turnkit.db) with the offline demo model",
        "turnkit run hi",
    ]
    assert "Downloading" in (tmp_path / ".venv" / "install.log").read_text()  # kept in full


def test_a_failed_install_shows_all_of_pips_output(tmp_path: Path) -> None:
    done = _demo(tmp_path, FAKE_PIP_FAILS="1")
    assert done.returncode == 1
    assert "turnkit run" not in done.stdout
    assert "pip failed (exit 1)" in done.stderr
    assert "Downloading litellm-1.80.0" in done.stderr
    assert "ERROR: no space left" in done.stderr
