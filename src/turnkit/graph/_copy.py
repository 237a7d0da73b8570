"""Threads' checkpoints copied from one checkpointer to another (`turnkit db copy`).

Through LangGraph's saver API, so SQLite and PostgreSQL checkpoints copy either way: each
checkpoint of a thread is read back whole (`alist`, with its pending writes) and put on
the target oldest first with its own id and parent, then its pending writes (a paused
turn's interrupt among them) with their task's path, which the saver API does not give
back and is read from the source's table. What the target saver holds back (a run's
input checkpoint, plain task writes a later checkpoint supersedes) it writes before it
closes.

The reader reads in one transaction: on PostgreSQL a `REPEATABLE READ READ ONLY` one,
which may take the snapshot of the store's tables (`snapshot`, exported by the store's
own read transaction), so rows and checkpoints are one snapshot; on SQLite a read
transaction on the checkpoint file, a snapshot of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

__all__ = (
    "ThreadCopy",
    "checkpoint_threads",
    "open_checkpoint_reader",
    "read_thread",
    "write_thread",
)

Saver = BaseCheckpointSaver[Any]
_TaskKey = tuple[str, str, str]
"""A task's writes: checkpoint namespace, checkpoint id, task id."""


@contextlib.asynccontextmanager
async def open_checkpoint_reader(
    database_url: str, *, schema: str | None = None, snapshot: str | None = None
) -> AsyncIterator[Saver | None]:
    """The database's checkpointer for reading, or None when it has no checkpoint tables.

    Its reads are one read transaction (see the module doc); `snapshot`, a PostgreSQL
    snapshot id (`pg_export_snapshot`), is the one it reads. Nothing is created: no
    checkpoint file beside a SQLite database, no tables in a PostgreSQL schema (a
    turnkit that never ran a turn there has none).
    """
    if database_url.startswith("sqlite"):
        from turnkit.graph import sqlite_checkpoint_file
        from turnkit.graph._sqlite_saver import ThreadedSqliteSaver

        where = sqlite_checkpoint_file(database_url)
        if not where or not Path(where).exists():  # noqa: ASYNC240 - one stat
            yield None
            return
        saver = ThreadedSqliteSaver(where)
        try:
            saver.setup()  # before the transaction: it may commit
            saver.conn.execute("BEGIN")
            saver.conn.execute("SELECT count(*) FROM checkpoints").fetchall()  # the snapshot
            yield saver
        finally:
            if saver.conn.in_transaction:
                saver.conn.execute("ROLLBACK")  # read only: nothing to keep
            await saver.aclose()
        return
    import asyncpg

    from turnkit.graph._postgres_saver import AsyncPgSaver, prepare_connection
    from turnkit.store._engine_pg import asyncpg_dsn

    dsn, timeout = asyncpg_dsn(database_url)
    settings = {"search_path": schema} if schema else None
    conn = await asyncpg.connect(dsn, server_settings=settings, timeout=timeout)
    try:
        await prepare_connection(conn)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            if snapshot is not None:  # a literal only: no parameter here
                quoted = snapshot.replace("'", "''")
                await conn.execute(f"SET TRANSACTION SNAPSHOT '{quoted}'")
            found = await conn.fetchval(
                "SELECT to_regclass('checkpoints') IS NOT NULL "
                "AND to_regclass('checkpoint_writes') IS NOT NULL "
                "AND to_regclass('checkpoint_blobs') IS NOT NULL"
            )
            yield AsyncPgSaver(cast(asyncpg.Pool, _OneConnection(conn))) if found else None
    finally:
        await conn.close()


class _OneConnection:
    """A pool of one connection, never reset: every read of the saver in its transaction."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def acquire(self) -> Any:
        return self._conn

    async def release(self, conn: Any) -> None:
        """Nothing to reset: the reader's one connection keeps its transaction."""

    async def expire_connections(self) -> None:
        """Nothing to retire: the reader's one connection ends with the copy."""


async def checkpoint_threads(saver: Saver) -> list[str]:
    """Every thread the saver holds any checkpoint of, in order."""
    from turnkit.graph._postgres_saver import AsyncPgSaver
    from turnkit.graph._sqlite_saver import ThreadedSqliteSaver

    query = "SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id"
    if isinstance(saver, ThreadedSqliteSaver):
        return await saver._read(lambda: [row[0] for row in saver.conn.execute(query)])
    if isinstance(saver, AsyncPgSaver):
        async with saver._connection() as conn:
            return [row[0] for row in await conn.fetch(query)]
    found = {str(t.config["configurable"]["thread_id"]) async for t in saver.alist(None)}
    return sorted(found)  # a saver of the app's own: every checkpoint, asked once


async def _task_paths(saver: Saver, thread_id: str) -> dict[_TaskKey, str]:
    """The path of each task with pending writes in the thread (none known: empty)."""
    from turnkit.graph._postgres_saver import AsyncPgSaver
    from turnkit.graph._sqlite_saver import ThreadedSqliteSaver

    columns = "checkpoint_ns, checkpoint_id, task_id, task_path"
    if isinstance(saver, ThreadedSqliteSaver):
        if not saver._has_task_path:  # a file from before LangGraph kept it
            return {}
        query = f"SELECT DISTINCT {columns} FROM writes WHERE thread_id = ?"
        rows = await saver._read(lambda: list(saver.conn.execute(query, (thread_id,))))
    elif isinstance(saver, AsyncPgSaver):
        query = f"SELECT DISTINCT {columns} FROM checkpoint_writes WHERE thread_id = $1"
        async with saver._connection() as conn:
            rows = [tuple(row) for row in await conn.fetch(query, thread_id)]
    else:
        return {}
    return {(ns, checkpoint_id, task_id): path for ns, checkpoint_id, task_id, path in rows}


def _thread(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


class ThreadCopy(NamedTuple):
    """A thread's checkpoints as read from the source, for `write_thread`."""

    thread_id: str
    found: list[CheckpointTuple]
    """Newest first, as listed."""
    paths: dict[_TaskKey, str]


async def read_thread(source: Saver, thread_id: str) -> ThreadCopy:
    """Every checkpoint of the thread with its pending writes, and their tasks' paths.

    A thread is one turn: its checkpoints are read at once (tens, not thousands).
    """
    found: list[CheckpointTuple] = [t async for t in source.alist(_thread(thread_id))]
    paths = await _task_paths(source, thread_id) if found else {}
    return ThreadCopy(thread_id, found, paths)


async def write_thread(target: Saver, thread: ThreadCopy) -> int:
    """Put the thread's checkpoints (with their pending writes) on `target`; how many.

    Oldest first, each with its id, parent and metadata, and every channel value it holds.
    """
    thread_id = thread.thread_id
    for item in reversed(thread.found):  # newest first as listed
        mine = item.config["configurable"]
        namespace = mine.get("checkpoint_ns", "")
        parent: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": namespace}
        if item.parent_config is not None:
            parent["checkpoint_id"] = item.parent_config["configurable"]["checkpoint_id"]
        checkpoint = item.checkpoint
        versions = dict(checkpoint["channel_versions"])  # every value it holds is stored
        await target.aput(
            cast(RunnableConfig, {"configurable": parent}), checkpoint, item.metadata, versions
        )
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or ():
            by_task.setdefault(task_id, []).append((channel, value))
        config = cast(
            RunnableConfig,
            {"configurable": {**parent, "checkpoint_id": checkpoint["id"]}},
        )
        for task_id, writes in by_task.items():
            path = thread.paths.get((namespace, checkpoint["id"], task_id), "")
            await target.aput_writes(config, writes, task_id, path)
    return len(thread.found)
