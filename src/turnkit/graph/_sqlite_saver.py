"""LangGraph's own SQLite checkpointer, writing in place unless the database is busy.

`AsyncSqliteSaver` goes through aiosqlite, which costs a thread hop per statement.
`SqliteSaver` does the same work in plain sqlite3. Here a checkpoint (with the task writes
deferred to it) is written in one transaction, on the event loop when the write lock is
free — a small insert costs less than a thread hop — and on the saver's thread, which may
wait for the lock, when it is not. The loop never waits for a lock: its attempts use a
zero busy timeout and a non-blocking acquire of the saver's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.sqlite import SqliteSaver

__all__ = ("ThreadedSqliteSaver",)

T = TypeVar("T")
_WAIT_MS = 30_000
"""How long the saver's thread waits for the write lock."""
_FOLD_EVERY = 256
"""Commits between two WAL checkpoints."""


class _Busy(Exception):
    """The write lock is held elsewhere; the loop must not wait for it."""


class ThreadedSqliteSaver(SqliteSaver):
    """`SqliteSaver` with async methods that write in place when they need not wait."""

    def __init__(self, path: str) -> None:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # see _fold_wal
        super().__init__(conn)
        self._commits = 0
        self.lock = threading.RLock()  # type: ignore[assignment]  # held across a batch
        self._batch = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnkit-checkpoints")
        self._written: dict[str, str] = {}
        """thread id → id of the checkpoint this saver wrote last for it."""
        self._deferred: list[tuple[RunnableConfig, Sequence[tuple[str, Any]], str, str]] = []
        """Plain task writes, written together with the next checkpoint."""
        self._deferred_lock = threading.Lock()  # the loop appends while a thread may take

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """`SqliteSaver.cursor`, minus the per-call commit inside a batch."""
        with self.lock:
            self.setup()
            cur = self.conn.cursor()
            try:
                yield cur
            finally:
                if transaction and not self._batch:
                    self.conn.commit()
                cur.close()

    def _in_batch(self, fn: Callable[[], T], *, wait: bool) -> T:
        """Run `fn` (deferred writes first) in one write transaction; `_Busy` if it must wait."""
        if not self.lock.acquire(blocking=wait):
            raise _Busy
        try:
            if wait:
                self.conn.execute(f"PRAGMA busy_timeout={_WAIT_MS}")
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise _Busy from exc
                raise
            finally:
                if wait:
                    self.conn.execute("PRAGMA busy_timeout=0")
            with self._deferred_lock:
                deferred, self._deferred = self._deferred, []
            self._batch = True
            try:
                for config, writes, task_id, task_path in deferred:
                    self.put_writes(config, writes, task_id, task_path)
                result = fn()
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # SQLite may have rolled back already
                    with contextlib.suppress(sqlite3.Error):
                        self.conn.execute("ROLLBACK")
                with self._deferred_lock:
                    self._deferred[:0] = deferred
                raise
            finally:
                self._batch = False
            self._commits += 1
            return result
        finally:
            self.lock.release()

    async def _write(self, fn: Callable[[], T]) -> T:
        try:
            result = self._in_batch(fn, wait=False)
        except _Busy:
            result = await self._run(lambda: self._in_batch(fn, wait=True))
        if self._commits >= _FOLD_EVERY:
            self._commits = 0
            await self._run(self._fold_wal)
        return result

    def _fold_wal(self) -> None:
        """Fold the WAL into the database file (on the thread: it writes and syncs)."""
        with self.lock:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def asetup(self) -> None:
        """Create the checkpoint tables."""
        await self._run(self.setup)

    async def aclose(self) -> None:
        """Write what is deferred, close the connection and stop the thread."""
        if self._deferred:
            await self._write(lambda: None)
        await self._run(self.conn.close)
        self._thread.shutdown(wait=True)

    def _flush_deferred(self) -> None:
        if self._deferred:
            self._in_batch(lambda: None, wait=True)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple` on the saver's thread (after any deferred writes)."""

        def read() -> CheckpointTuple | None:
            self._flush_deferred()
            return self.get_tuple(config)

        return await self._run(read)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list` on the saver's thread."""

        def read() -> list[CheckpointTuple]:
            self._flush_deferred()
            return list(self.list(config, filter=filter, before=before, limit=limit))

        items = await self._run(read)
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put`, with the writes deferred for it, in one transaction."""
        saved = await self._write(lambda: self.put(config, checkpoint, metadata, new_versions))
        self._written[str(config["configurable"]["thread_id"])] = str(checkpoint["id"])
        while len(self._written) > 4096:  # threads that never settled: forget the oldest
            self._written.pop(next(iter(self._written)))
        return saved

    def take_written(self, thread_id: str) -> str | None:
        """The checkpoint id this saver last wrote for `thread_id` (forgotten once taken)."""
        return self._written.pop(thread_id, None)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes`: plain task writes wait for the next `put`; special ones go now.

        A write on a LangGraph-internal channel (an interrupt, a resume value, an error)
        must be durable before the run stops, so it is written at once (with anything
        deferred before it). A plain write lost to a crash only means the task runs again,
        and turnkit's journal makes a re-run repeat nothing.
        """
        if all(not channel.startswith("__") for channel, _ in writes):
            with self._deferred_lock:
                self._deferred.append((config, list(writes), task_id, task_path))
            return

        await self._write(lambda: self.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` on the saver's thread."""
        await self._run(lambda: self._in_batch(lambda: self.delete_thread(thread_id), wait=True))
