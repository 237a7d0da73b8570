"""Private Redis and PostgreSQL servers for fault tests, on free loopback ports.

Tests that kill or restart a database or Redis start their own instances here, never the
shared ones on 6379 / 5432. Every wait is bounded; every process is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

__all__ = ("PrivatePostgres", "PrivateRedis", "free_port", "private_postgres", "private_redis")

_START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    """Wait until `url` answers 200 while `proc` (the server behind it) stays up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"the process behind {url} exited; see {log}"
        time.sleep(0.1)
    raise AssertionError(f"{url} did not get ready: see {log}")


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every process still running, and reap them all."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def _wait_for_port(port: int, timeout_s: float = _START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on 127.0.0.1:{port} within {timeout_s:g} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (root / name).exists():
                return str(root / name)
        pytest.fail(f"{name} is not installed (the fault tests start their own servers)")
    return found


class PrivateRedis:
    """A redis-server of the test's own, which it may kill and restart."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="turnkit-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _binary("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb), run as the `postgres` user."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="turnkit-pg-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        subprocess.run(
            [*self._as_postgres, _binary("initdb"), "-D", str(self.data), "-A", "trust",
             "-U", "postgres", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*self._as_postgres, _binary("postgres"), "-D", str(self.data),
             "-p", str(self.port), "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:  # accepting connections, not just listening
            ready = subprocess.run(
                [_binary("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True, timeout=10,
            )  # fmt: skip
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError("the private PostgreSQL did not accept connections")

    def kill(self) -> None:
        """Stop at once, as a crash would (immediate shutdown: no checkpoint).

        The signal goes to the postmaster itself (from its pid file): `runuser` in front
        of it does not pass signals on.
        """
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.close()
