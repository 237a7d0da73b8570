"""The processes a benchmark starts: every one stopped when the benchmark ends, however it ends.

A server or worker left running after its benchmark failed keeps its port, its database
connections and its CPU (one outlived a CI run by an hour). `start` records each process
it starts; `stopped_at_end` stops those still running when its block ends: normally, on an
error (a server that does not come up, a turn that fails), on Ctrl-C, or on SIGTERM (a CI
job's timeout), which it turns into an exit that runs every `finally` on the way.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType

__all__ = ("running", "start", "stop", "stopped_at_end")

_started: list[subprocess.Popen[bytes]] = []


def start(
    cmd: list[str],
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.Popen[bytes]:
    """Start `cmd` (its output to `log`, else this process's), to be stopped at the end."""
    if log is None:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env)
    else:
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=out)
    _started.append(proc)
    return proc


def running() -> list[subprocess.Popen[bytes]]:
    """The processes `start` started that have not exited."""
    return [proc for proc in _started if proc.poll() is None]


def stop(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM each of `procs` (they drain), wait up to `timeout` s, then SIGKILL the rest."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for proc in procs:
        if proc in _started:
            _started.remove(proc)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def stopped_at_end() -> Iterator[None]:
    """Every process started in the block is stopped when the block ends, however it ends.

    SIGTERM meanwhile exits (status 143) through the block's `finally`s, as Ctrl-C does,
    instead of ending this process on the spot and leaving its children running.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        yield
    finally:
        stop(list(_started))
        if main:
            signal.signal(signal.SIGTERM, previous)
