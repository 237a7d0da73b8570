"""Ctrl-C while the `turnkit` command is still starting: no traceback, exit status 130.

Each test runs what the installed `turnkit` script runs (the entry point that
`pyproject.toml` names, called as pip's script calls it), or `python -m turnkit`, in a
real subprocess, and sends it SIGINT while it imports: right after a given module
finished loading, which `-X importtime` reports on stderr as it happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _script() -> str:
    """What pip's `turnkit` script does: import the entry point, exit with what it returns."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, name = pyproject["project"]["scripts"]["turnkit"].split(":")
    return f"import sys\nfrom {module} import {name}\nsys.exit({name}())\n"


@pytest.mark.parametrize("started_as", ["script", "python -m turnkit"])
@pytest.mark.parametrize("after", ["turnkit.ids", "turnkit.runtime", "turnkit.cli._args"])
def test_ctrl_c_while_the_command_starts_exits_quietly(
    after: str, started_as: str, tmp_path: Path
) -> None:
    """Either way in, Ctrl-C while it loads: status 130 and at most one line.

    `python -m turnkit` printed a traceback: Python imports the package before it runs
    `turnkit.__main__`, and the package imported the runtime with it.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    how = ["-c", _script()] if started_as == "script" else ["-m", "turnkit"]
    argv = [sys.executable, "-X", "importtime", *how, "sessions"]
    said: list[str] = []  # stderr, less the import times
    interrupted = False
    with subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as started:
        watchdog = threading.Timer(60, started.kill)  # bounded: a hang fails, it never blocks
        watchdog.start()
        try:
            assert started.stderr is not None
            for line in started.stderr:  # read to the end: the pipe must never fill
                if not line.startswith("import time:"):
                    said.append(line)
                elif not interrupted and line.rstrip().endswith(f" {after}"):
                    started.send_signal(signal.SIGINT)  # Ctrl-C, right after it loaded
                    interrupted = True
            status = started.wait()
        finally:
            watchdog.cancel()
    assert interrupted, f"{after} was never imported: {''.join(said)}"
    assert status == 130, "".join(said)
    assert "Traceback" not in "".join(said)
    assert len(said) <= 1, "".join(said)
