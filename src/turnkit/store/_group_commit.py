"""Group commit: write transactions of many turns share one SQLite transaction.

Under load, the store's thread gets a write transaction from every turn at once, and each
costs a transaction and a wake-up of the event loop. Here they queue instead, and the
thread takes up to `MAX_BATCH` of them at a time into one transaction, each in a savepoint
of its own: one that fails (a stale lease, a refused move) is rolled back alone and fails
alone, the others commit. Every caller hears back only after the COMMIT, so an event is
still durable before it is sent.

Nothing waits to fill a batch: a transaction that finds the thread idle runs at once, on
its own, and a batch holds only what queued while the previous one ran. So group commit
adds no latency at low load and fewer transactions at high load.

Work in progress goes first: transactions queued with `behind=True` (new messages) get
only a quarter of a batch while others wait, so a burst of new messages does not delay
the events of turns already running, and is not starved by them either. Each caller
awaits its own transactions one at a time, so no caller's writes are reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from turnkit.errors import StoreError
from turnkit.store._sqlite import SqliteConnection

__all__ = ("MAX_BATCH", "GroupCommit")

T = TypeVar("T")
MAX_BATCH = 32
"""The most write transactions committed together."""
BEHIND_SHARE = MAX_BATCH // 4
"""Places in every batch kept for transactions queued `behind`, while any wait."""


@dataclass(slots=True)
class _Item:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


class GroupCommit:
    """Runs write transactions on the store's thread, batching what queues meanwhile.

    `connection` gives the thread's connection; `failed(exc)` turns a failure of the
    whole transaction (the lock not had in time, COMMIT refused) into what every caller
    of the batch raises.
    """

    def __init__(
        self,
        executor: Executor,
        connection: Callable[[], SqliteConnection],
        failed: Callable[[BaseException], BaseException],
    ) -> None:
        self._executor = executor
        self._connection = connection
        self._failed = failed
        self._queue: deque[_Item] = deque()
        self._behind: deque[_Item] = deque()
        self._lock = threading.Lock()
        self._draining = False
        self.batches = 0
        """Transactions run so far (each one batch)."""
        self.committed = 0
        """Write transactions of callers run so far."""

    async def run(self, fn: Callable[..., T], *args: Any, behind: bool = False) -> T:
        """Run `fn(conn, *args)` in a write transaction; returns once it is committed.

        `behind`: new work, which yields most of each batch to work in progress.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            item = _Item(fn, args, future, loop)
            (self._behind if behind else self._queue).append(item)
            start, self._draining = not self._draining, True
        if start:
            loop.run_in_executor(self._executor, self._drain)
        return await future

    def _drain(self) -> None:
        """On the thread: commit one batch, then give the thread back.

        Reads and WAL folds queued on the same thread run between two batches; the next
        batch is queued behind them if writes are still waiting.
        """
        with self._lock:
            kept_back = min(len(self._behind), BEHIND_SHARE)  # new work is never starved
            ahead = min(len(self._queue), MAX_BATCH - kept_back)
            batch = [self._queue.popleft() for _ in range(ahead)]
            room = min(len(self._behind), MAX_BATCH - len(batch))
            batch += [self._behind.popleft() for _ in range(room)]
        outcomes: list[Any] = []
        try:
            outcomes = self._commit(batch)
        finally:
            if len(outcomes) != len(batch):  # `_commit` itself raised: not a database error
                outcomes = [_Failed(RuntimeError("the store's write thread failed"))] * len(batch)
            self.batches += 1
            self.committed += len(batch)
            _hand_back(batch, outcomes)
            with self._lock:
                more = self._draining = bool(self._queue or self._behind)
            if more:
                self._again()

    def _again(self) -> None:
        """Queue the next batch behind what else waits for the thread."""
        try:
            self._executor.submit(self._drain)
        except RuntimeError:  # the thread is shut down: the store is closing
            with self._lock:
                rest = [*self._queue, *self._behind]
                self._queue.clear()
                self._behind.clear()
                self._draining = False
            _hand_back(rest, [_Failed(StoreError("the store is closed"))] * len(rest))

    def _commit(self, batch: Sequence[_Item]) -> list[Any]:
        """One transaction for the batch; each item's result or `_Failed`."""
        try:
            conn = self._connection()
            with conn.transaction(write=True):
                if len(batch) == 1:  # nothing to keep apart: no savepoint
                    item = batch[0]
                    return [item.fn(conn, *item.args)]
                return [_in_savepoint(conn, item) for item in batch]
        except Exception as exc:  # noqa: BLE001 - the whole transaction failed: all hear it
            return [_Failed(self._failed(exc)) for _ in batch]


def _hand_back(batch: Sequence[_Item], outcomes: Sequence[Any]) -> None:
    """Send each caller its outcome on its own loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Item, Any]]] = {}
    for item, outcome in zip(batch, outcomes, strict=True):
        by_loop.setdefault(item.loop, []).append((item, outcome))
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
            loop.call_soon_threadsafe(_settle, settled)


def _in_savepoint(conn: SqliteConnection, item: _Item) -> Any:
    conn.raw.execute("SAVEPOINT turnkit_group")
    try:
        result = item.fn(conn, *item.args)
    except Exception as exc:
        if not conn.raw.in_transaction:  # SQLite rolled back everything (disk full, I/O)
            raise
        conn.raw.execute("ROLLBACK TO turnkit_group")
        conn.raw.execute("RELEASE turnkit_group")
        return _Failed(exc)
    conn.raw.execute("RELEASE turnkit_group")
    return result


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


def _settle(settled: list[tuple[_Item, Any]]) -> None:
    """On the loop: hand each caller its result or its exception."""
    for item, outcome in settled:
        if item.future.done():  # the caller was cancelled meanwhile
            continue
        if isinstance(outcome, _Failed):
            item.future.set_exception(outcome.error)
        else:
            item.future.set_result(outcome)
