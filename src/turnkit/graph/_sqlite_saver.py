"""LangGraph's own SQLite checkpointer, with its sync methods run on one dedicated thread.

`AsyncSqliteSaver` goes through aiosqlite, which costs a thread hop per statement;
`SqliteSaver` does the same work in plain sqlite3. Running each of its calls on one
thread costs one hop per call and keeps the connection on a single thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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


class ThreadedSqliteSaver(SqliteSaver):
    """`SqliteSaver` with working async methods (one thread hop per call)."""

    def __init__(self, path: str) -> None:
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        super().__init__(conn)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnkit-checkpoints")
        self._written: dict[str, str] = {}
        """thread id → id of the checkpoint this saver wrote last for it."""
        self._deferred: list[tuple[RunnableConfig, Sequence[tuple[str, Any]], str, str]] = []
        """Plain task writes, written together with the next checkpoint (one thread hop)."""

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def asetup(self) -> None:
        """Create the checkpoint tables."""
        await self._run(self.setup)

    async def aclose(self) -> None:
        """Write what is deferred, close the connection and stop the thread."""
        await self._run(self._flush_deferred)
        await self._run(self.conn.close)
        self._thread.shutdown(wait=True)

    def _flush_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for config, writes, task_id, task_path in deferred:
            self.put_writes(config, writes, task_id, task_path)

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
        """`put` on the saver's thread, after the writes deferred for it (one hop)."""

        def write() -> RunnableConfig:
            self._flush_deferred()
            return self.put(config, checkpoint, metadata, new_versions)

        saved = await self._run(write)
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
            self._deferred.append((config, list(writes), task_id, task_path))
            return

        def write() -> None:
            self._flush_deferred()
            self.put_writes(config, writes, task_id, task_path)

        await self._run(write)

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` on the saver's thread."""

        def delete() -> None:
            self._flush_deferred()
            self.delete_thread(thread_id)

        await self._run(delete)
