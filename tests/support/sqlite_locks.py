"""SQLite locks another process holds, as a test needs them.

A write transaction in another process (`BEGIN IMMEDIATE`, even `BEGIN EXCLUSIVE`) never
stops a reader in WAL mode. What does is another process recovering the WAL: it holds
the WAL index's write, checkpoint, recovery and read locks while the index's header is
being rebuilt, and a reader that finds the header torn waits (`SQLITE_BUSY_RECOVERY`).
`recovering` is such a process, paused mid-recovery until the block ends.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

_RECOVERING = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 120)  # WAL index locks 0-7: a recovery
torn = os.pread(fd, 1, 48 + 16)  # the header's second copy now differs from the first
os.pwrite(fd, bytes([torn[0] ^ 0xFF]), 48 + 16)
print("recovering", flush=True)
sys.stdin.read()  # until the test closes the pipe; the next reader recovers the index
"""


@contextlib.contextmanager
def recovering(database: str) -> Iterator[None]:
    """Another process recovering `database`'s WAL (open in WAL mode) until the block ends.

    Readers meet a lock meanwhile; the first after it recovers the index from the WAL.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", _RECOVERING, f"{database}-shm"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "recovering"
        yield
    finally:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.close()
        child.wait(timeout=30)
        child.stdout.close()


@contextlib.contextmanager
def recovering_for(database: str, seconds: float) -> Iterator[None]:
    """`recovering`, released after `seconds` by a timer while the block runs."""
    import threading

    stack = contextlib.ExitStack()
    stack.enter_context(recovering(database))
    timer = threading.Timer(seconds, stack.close)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join(timeout=30)
        stack.close()
