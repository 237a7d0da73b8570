"""`WalFolds`: when a SQLite WAL is folded back into its file, in two passes.

Connections that write on the event loop never checkpoint the WAL themselves: a checkpoint
copies every page the log holds and syncs the file (milliseconds). A worker thread does it
every `every` commits. The first pass runs while writes go on; it folds most of the log,
but only a log folded to its very end restarts from the beginning, so a second pass folds
what was written meanwhile while writes wait behind it on that thread. Writes stall about a
millisecond per fold instead of the whole fold, and the file stays bounded. A first pass
that falls a whole interval behind (a loaded machine) is followed at once by the second.

Used by `SqlStore` and by the checkpoint saver; it runs no SQL itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ("WalFolds",)

log = logging.getLogger(__name__)


class WalFolds:
    """Schedules two-pass WAL folds on a single-thread executor.

    `fold(second_pass)` runs on `thread` and checkpoints the log (`PRAGMA
    wal_checkpoint(PASSIVE)`); writers ask `must_wait()` before writing in place and call
    `committed()` after each commit. Whether a fold is done is read from a thread future,
    so it does not depend on the loop running its callbacks (a loop committing in place
    may not yield for a long time).
    """

    def __init__(
        self, thread: ThreadPoolExecutor, fold: Callable[[bool], None], *, every: int
    ) -> None:
        self._thread = thread
        self._fold = fold
        self._every = every
        self._commits = 0
        self._started_at = 0
        """`_commits` when the current fold started."""
        self._running: Future[None] | None = None
        self._second = False
        """Whether `_running` is the second pass, which writes wait behind."""

    def must_wait(self) -> bool:
        """Before a write: whether it must queue on the thread, behind a second pass.

        Starts the second pass once the first is done (or an interval behind).
        """
        running = self._running
        if running is None:
            return False
        if not self._second and (running.done() or self._commits - self._started_at >= self._every):
            running = self._start(second=True)
        return self._second and not running.done()

    def committed(self) -> None:
        """After a commit: start a first pass every `every` commits."""
        self._commits += 1
        if self._commits - self._started_at >= self._every and (
            self._running is None or self._running.done()
        ):
            self._start(second=False)

    async def wait(self) -> None:
        """Until the fold in progress, if any, is done (its failure is only logged)."""
        if self._running is not None:
            await asyncio.gather(asyncio.wrap_future(self._running), return_exceptions=True)

    def _start(self, *, second: bool) -> Future[None]:
        self._second = second
        self._started_at = self._commits
        self._running = self._thread.submit(self._fold, second)
        self._running.add_done_callback(_log_failure)
        return self._running


def _log_failure(fold: Future[None]) -> None:
    if not fold.cancelled() and (exc := fold.exception()) is not None:
        log.warning("WAL checkpoint failed: %s", exc)
