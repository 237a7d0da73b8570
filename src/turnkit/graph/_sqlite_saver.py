"""LangGraph's own SQLite checkpointer, writing in place unless the database is busy.

`AsyncSqliteSaver` goes through aiosqlite, which costs a thread hop per statement.
`SqliteSaver` does the same work in plain sqlite3. Here each checkpoint is one transaction,
run on the event loop when the database is free — a small insert costs less than a thread
hop — and on the saver's thread, which may wait for the lock, when it is not. The loop never
waits for a lock: its attempts use a zero busy timeout and a non-blocking acquire of the
saver's lock. Reads run the same way.

Two writes LangGraph asks for are folded into the next checkpoint instead of being a
transaction of their own (see `aput` and `aput_writes`): the run's input checkpoint, and a
task's plain writes, which the next checkpoint supersedes. Writes that go to the thread
share its transactions with those queued meanwhile: the Store's `GroupCommit`, running the
saver's own transaction (its lock, then what is deferred).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from turnkit.errors import StoreUnavailableError
from turnkit.graph._held import ThreadNotes, cancelled, log_dropped, supersedable
from turnkit.store._engine import close_lock_wait_s
from turnkit.store._folds import WalFolds
from turnkit.store._group_commit import GroupCommit
from turnkit.store._sqlite import (
    LockWait,
    SqliteConnection,
    busy_error,
    is_busy,
    refusal,
    tune,
)

__all__ = ("ThreadedSqliteSaver",)

T = TypeVar("T")
_WAIT_MS = 30_000
"""How long the saver's thread waits for the write lock."""
_FOLD_EVERY = 256
"""Checkpoint commits between two WAL folds."""


class _Busy(Exception):
    """The write lock is held elsewhere; the loop must not wait for it."""


def _write_held(saver: SqliteSaver, held: _Deferred) -> None:
    """Write a held item in the current transaction; one that cannot be stored is dropped.

    A value the serializer refuses fails before any SQL runs. Raising would put it back
    and fail every later write of every turn sharing this saver, so it is logged and
    dropped instead: losing it only means its task runs again after a crash. Database
    errors still fail the whole transaction (and the held items stay held).
    """
    try:
        held.write(saver)
    except sqlite3.Error:
        raise
    except Exception:  # noqa: BLE001 - logged with its traceback by log_dropped
        log_dropped(held.thread_id, is_checkpoint=held.is_checkpoint)


def _written_part(config: RunnableConfig) -> RunnableConfig:
    """What of a write's config the saver stores: its plain values.

    The thread, namespace, checkpoint id and metadata, not the objects LangGraph runs the
    turn with (its state, its recorder), which a write held for a later transaction would
    keep alive after the turn has ended.
    """
    plain = (str, int, float, bool)
    return {
        "configurable": {
            key: value
            for key, value in config.get("configurable", {}).items()
            if not key.startswith("__") and isinstance(value, plain)
        },
        "metadata": {
            key: value
            for key, value in config.get("metadata", {}).items()
            if isinstance(value, plain)
        },
    }


class _Deferred:
    """A write held for a later transaction: an input checkpoint or one task's writes."""

    __slots__ = ("thread_id", "checkpoint_id", "is_checkpoint", "write")

    def __init__(
        self, config: RunnableConfig, is_checkpoint: bool, write: Callable[[SqliteSaver], Any]
    ) -> None:
        self.thread_id = str(config["configurable"]["thread_id"])
        self.checkpoint_id = config["configurable"].get("checkpoint_id")
        self.is_checkpoint = is_checkpoint
        self.write = write

    @classmethod
    def checkpoint(
        cls,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> _Deferred:
        kept = _written_part(config)
        return cls(kept, True, lambda s: s.put(kept, checkpoint, metadata, new_versions))

    @classmethod
    def task_writes(
        cls, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> _Deferred:
        kept = _written_part(config)
        return cls(kept, False, lambda s: s.put_writes(kept, writes, task_id, path))

    def superseded_in(self, superseded: set[tuple[str, str]]) -> bool:
        """Task writes on a checkpoint whose child checkpoint was put since they were held."""
        return not self.is_checkpoint and (self.thread_id, self.checkpoint_id) in superseded


class ThreadedSqliteSaver(SqliteSaver):
    """`SqliteSaver` with async methods that write in place when they need not wait."""

    def __init__(self, path: str) -> None:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        tune(conn, busy_timeout_ms=0, autocheckpoint=False)  # folds: see _fold_wal
        super().__init__(conn)
        self._path = path
        self._fold_conn: sqlite3.Connection | None = None  # the thread's, for folding
        self.lock = threading.RLock()  # type: ignore[assignment]  # held across a batch
        self._batch = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnkit-checkpoints")
        self._lock_wait = LockWait(_WAIT_MS)
        """How the thread's writes wait for the lock (given up on close)."""
        self._folds = (
            WalFolds(self._thread, self._fold_wal, every=_FOLD_EVERY)
            if path != ":memory:"
            else None
        )
        self._written = ThreadNotes()
        self._new = ThreadNotes()
        self._deferred: list[_Deferred] = []
        """Writes held for the next transaction (input checkpoints, plain task writes)."""
        self._deferred_lock = threading.Lock()  # the loop appends while a thread may take
        self._superseded: set[tuple[str, str]] = set()
        """(thread, checkpoint) pairs whose child checkpoint was put: their held task writes
        are dropped when a transaction takes what is deferred (not looked for at each put,
        which costs a scan of every turn's held writes when many turns run at once)."""
        self._last: dict[str, Callable[[], bool]] = {}
        """Threads whose last stage's checkpoint waits for the turn's ending (`hold_last`)."""
        self._held_last: dict[str, _Deferred] = {}
        batch_conn = _SaverConnection(self)
        self.group = GroupCommit(self._thread, lambda: batch_conn, _as_raised)
        """Writes that must wait for the lock, committed on the thread in batches."""

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
        with self.batch_transaction(wait=wait):
            return fn()

    @contextmanager
    def batch_transaction(self, *, wait: bool) -> Iterator[None]:
        """One write transaction, deferred writes first; `_Busy` if it must wait."""
        if not self.lock.acquire(blocking=wait):
            raise _Busy
        try:
            if wait:
                self.conn.execute(f"PRAGMA busy_timeout={LockWait.SLICE_MS}")
            try:
                if wait:
                    self._lock_wait.begin(self.conn)
                else:
                    self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if is_busy(exc):
                    raise _Busy from exc
                raise
            finally:
                if wait:
                    self.conn.execute("PRAGMA busy_timeout=0")
            with self._deferred_lock:
                deferred, self._deferred = self._deferred, []
                if self._superseded:
                    superseded, self._superseded = self._superseded, set()
                    deferred = [d for d in deferred if not d.superseded_in(superseded)]
            self._batch = True
            try:
                for held in deferred:
                    _write_held(self, held)
                yield
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
        finally:
            self.lock.release()

    async def _write(self, fn: Callable[[], T]) -> T:
        """Run `fn` in a write transaction; a file that cannot be written is an outage.

        A full disk, a read-only file or an I/O error raise `StoreUnavailableError` (the
        transaction was rolled back whole), which a driver rides out as it does the
        Store's: only the checkpointer's own errors count, never an app's SQLite.
        """
        try:
            try:
                if self._folds is not None and self._folds.must_wait():
                    raise _Busy  # behind the fold, on the thread
                result = self._in_batch(fn, wait=False)
            except _Busy:
                result = await self.group.run(lambda _: fn())
        except sqlite3.Error as exc:
            if (unavailable := refusal(exc, self._path)) is None:
                raise
            raise unavailable from exc
        if self._folds is not None:
            self._folds.committed()
        return result

    def _fold_wal(self, second_pass: bool) -> None:
        """Checkpoint the WAL on the thread, on a connection of its own (see `WalFolds`).

        The second pass holds the saver's lock, so nothing writes in place meanwhile.
        """
        if self._fold_conn is None:
            self._fold_conn = sqlite3.connect(self._path, check_same_thread=False)
        with self.lock if second_pass else contextlib.nullcontext():
            self._fold_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def asetup(self) -> None:
        """Create the checkpoint tables."""
        await self._run(self.setup)

    async def aclose(self) -> None:
        """Write what is deferred, close the connection and stop the thread.

        A read or a write that waits for a lock another process holds gives up after
        `CLOSE_LOCK_WAIT_S` (`close_lock_wait_s`), all told: a write's checkpoints are then
        not stored (`StoreUnavailableError`), a read fails.
        """
        try:
            if self._deferred:
                writing = asyncio.ensure_future(self._write(lambda: None))
                done, _ = await asyncio.wait([writing], timeout=close_lock_wait_s())
                if not done:
                    self._lock_wait.give_up()
                await writing
        finally:

            def close() -> None:
                with self.lock:  # never under a write running in place on the loop
                    self.conn.close()
                if self._fold_conn is not None:
                    self._fold_conn.close()

            # After any fold, and any read or write still waiting (the thread runs in order).
            closing = asyncio.ensure_future(self._run(close))
            done, _ = await asyncio.wait([closing], timeout=close_lock_wait_s())
            if not done:
                self._lock_wait.give_up()
            await closing
            self._thread.shutdown(wait=True)

    def _flush_deferred(self) -> None:
        if self._deferred:
            self._in_batch(lambda: None, wait=True)

    async def _read(self, fn: Callable[[], T]) -> T:
        """Run a read (after anything deferred) in place, or on the thread if it must wait."""
        try:
            if self._deferred:
                self._in_batch(lambda: None, wait=False)
            if not self.lock.acquire(blocking=False):
                raise _Busy
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if is_busy(exc):
                    raise _Busy from exc
                raise
            finally:
                self.lock.release()
        except _Busy:

            def wait_and_read() -> T:
                # Under the lock: the loop must never find a timeout on `conn`. Slice after
                # slice, as a write waits: a close can cut the wait short (`give_up`).
                with self.lock:
                    self._flush_deferred()
                    self.conn.execute(f"PRAGMA busy_timeout={LockWait.SLICE_MS}")
                    try:
                        return self._lock_wait.retry(fn, busy=busy_error)
                    finally:
                        self.conn.execute("PRAGMA busy_timeout=0")

            return await self._run(wait_and_read)

    def expect_new(self, thread_id: str) -> None:
        """`thread_id` has no checkpoint: its first read of the newest reads nothing."""
        self._new.note(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple`, after any deferred writes."""
        thread_id = str(config["configurable"]["thread_id"])
        if not get_checkpoint_id(config) and self._new.take(thread_id) is not None:
            return None  # read before anything of the thread can have been written
        return await self._read(lambda: self.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list`, after any deferred writes."""
        items = await self._read(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put`, in one transaction with what is deferred.

        The task writes deferred for this checkpoint's parent are dropped: this checkpoint
        holds their result, and LangGraph reads a checkpoint's pending writes only when a
        run starts from it, which turnkit only does from a thread's newest. (A LangGraph
        `DeltaChannel`, rebuilt from its ancestors' writes, would need them: `TurnState`
        has none.) A run's input checkpoint (`source: input`) is held for the next
        transaction, which comes right after it (the START task's checkpoint): a crash
        between the two loses only a checkpoint no turn has run from. The checkpoint after
        a turn's last stage waits for the turn's ending (see `hold_last`).
        """
        thread_id = str(config["configurable"]["thread_id"])
        parent = config["configurable"].get("checkpoint_id")
        is_last = self._last.get(thread_id)
        with self._deferred_lock:
            if parent is not None:
                self._superseded.add((thread_id, parent))
            if is_last is not None and is_last():
                held_last = _Deferred.checkpoint(config, checkpoint, metadata.copy(), new_versions)
                self._held_last[thread_id] = held_last
                held = True
            elif metadata.get("source") == "input":
                self._deferred.insert(
                    0, _Deferred.checkpoint(config, checkpoint, metadata.copy(), new_versions)
                )
                held = True
            else:
                held = False
        if held:
            saved: RunnableConfig = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                    "checkpoint_id": checkpoint["id"],
                }
            }
        else:
            saved = await self._write(lambda: self.put(config, checkpoint, metadata, new_versions))
        self._written.note(thread_id, str(checkpoint["id"]))
        return saved

    def hold_last(
        self, thread_id: str, is_last: Callable[[], bool]
    ) -> Callable[[bool], Awaitable[None]]:
        """Hold the checkpoint written once `is_last()` (the turn's last stage has ended).

        That stage's closing events then commit with the turn's ending, not before the
        checkpoint: one Store transaction less per turn. The checkpoint is stored only
        after them, by the function returned: `write` once the ending (or a pause) is
        committed and the checkpoint is still wanted; without it, it is dropped (a failed
        ending, or a turn whose checkpoints are deleted once it has ended). A crash
        before then resumes from the stage's own start, which commits nothing twice.
        """
        self._last[thread_id] = is_last

        async def release(write: bool) -> None:
            self._last.pop(thread_id, None)
            held = self._held_last.pop(thread_id, None)
            if held is not None and write:
                await self._write(lambda: _write_held(self, held))

        return release

    def take_written(self, thread_id: str) -> str | None:
        """The checkpoint id this saver last wrote for `thread_id` (forgotten once taken)."""
        return self._written.take(thread_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes`: plain task writes are held; special ones go now.

        A write on a LangGraph-internal channel (an interrupt, a resume value, an error)
        must be durable before the run stops, so it is written at once (with anything
        deferred before it). A plain write is held until the next checkpoint, which
        supersedes it (see `aput`), or until something else is written: a write lost to a
        crash only means the task runs again, and turnkit's journal makes a re-run repeat
        nothing. Those of a task cancelled mid-run are not stored (see `cancelled` in
        `turnkit.graph._held`): the task runs again.
        """
        if cancelled(writes):
            return
        if supersedable(writes):
            held = _Deferred.task_writes(config, list(writes), task_id, task_path)
            with self._deferred_lock:
                self._deferred.append(held)
            return

        await self._write(lambda: self.put_writes(config, writes, task_id, task_path))

    async def athread_ids(self, *, prefix: str, after: str, limit: int) -> list[str]:
        """Up to `limit` threads holding any row whose ids start with `prefix`, past `after`.

        In order, so the last one is the next call's `after` (`""` to start).
        """
        pattern = "".join(f"[{c}]" if c in "*?[" else c for c in prefix) + "*"
        query = " UNION ".join(
            f"SELECT thread_id FROM (SELECT DISTINCT thread_id FROM {table} WHERE thread_id > ?"
            " AND thread_id GLOB ? ORDER BY thread_id LIMIT ?)"
            for table in ("checkpoints", "writes")
        )
        args = (after, pattern, limit) * 2

        def read() -> list[str]:
            rows = self.conn.execute(f"{query} ORDER BY thread_id LIMIT ?", (*args, limit))
            return [str(r[0]) for r in rows.fetchall()]

        return await self._read(read)

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` on the saver's thread."""
        await self.adelete_threads((thread_id,))

    async def adelete_threads(self, thread_ids: Sequence[str]) -> None:
        """Delete the threads' checkpoints and writes in one transaction."""
        ids = [str(t) for t in thread_ids]

        def delete() -> None:
            for thread_id in ids:  # LangGraph's own deletion, in the batch's one transaction
                self.delete_thread(thread_id)

        if ids:
            await self._run(lambda: self._in_batch(delete, wait=True))


class _SaverConnection(SqliteConnection):
    """The saver's connection as `GroupCommit` uses it: its transactions are the saver's."""

    def __init__(self, saver: ThreadedSqliteSaver) -> None:
        super().__init__(saver.conn)
        self._saver = saver

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[SqliteConnection]:
        with self._saver.batch_transaction(wait=True):
            yield self


def _as_raised(exc: BaseException) -> BaseException:
    """What every caller of a batch whose transaction failed raises.

    That error; or for a lock not had (another process holds it), an outage the driver
    rides out.
    """
    if isinstance(exc, _Busy):
        error = StoreUnavailableError(
            "the SQLite checkpoint database stayed locked by another connection; "
            "nothing was written"
        )
        error.__cause__ = exc
        return error
    return exc
