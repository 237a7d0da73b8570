"""Turns' checkpoints copied from one checkpointer to another (`turnkit db copy`).

Through LangGraph's saver API, so SQLite and PostgreSQL checkpoints copy either way: each
checkpoint of a thread is read back whole (`alist`, with its pending writes) and put on
the target oldest first with its own id and parent, then its pending writes (a paused
turn's interrupt among them). What the target saver holds back (a run's input
checkpoint, plain task writes a later checkpoint supersedes) it writes before it closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

__all__ = ("copy_thread", "open_checkpoint_reader", "threads_with_checkpoints")

Saver = BaseCheckpointSaver[Any]


@contextlib.asynccontextmanager
async def open_checkpoint_reader(
    database_url: str, *, schema: str | None = None
) -> AsyncIterator[Saver | None]:
    """The database's checkpointer for reading, or None when it has no checkpoint tables.

    Nothing is created: no checkpoint file beside a SQLite database, no tables in a
    PostgreSQL schema (a turnkit that never ran a turn there has none).
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
            yield saver
        finally:
            await saver.aclose()
        return
    import asyncpg

    from turnkit.graph._postgres_saver import AsyncPgSaver, prepare_connection
    from turnkit.store._asyncpg_pool import close_pool

    dsn = "postgresql://" + database_url.split("://", 1)[1]
    settings = {"search_path": schema} if schema else None
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=2, server_settings=settings, init=prepare_connection, timeout=10
    )
    try:
        async with pool.acquire() as conn:
            found = await conn.fetchval(
                "SELECT to_regclass('checkpoints') IS NOT NULL "
                "AND to_regclass('checkpoint_writes') IS NOT NULL "
                "AND to_regclass('checkpoint_blobs') IS NOT NULL"
            )
        yield AsyncPgSaver(pool) if found else None
    finally:
        await close_pool(pool)


async def threads_with_checkpoints(saver: Saver, thread_ids: Sequence[str]) -> list[str]:
    """Those of `thread_ids` the saver holds any checkpoint of, in the order given."""
    from turnkit.graph._postgres_saver import AsyncPgSaver
    from turnkit.graph._sqlite_saver import ThreadedSqliteSaver

    ids = [str(t) for t in thread_ids]
    if not ids:
        return []
    if isinstance(saver, ThreadedSqliteSaver):
        marks = ", ".join("?" * len(ids))
        query = f"SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id IN ({marks})"

        def read() -> set[str]:
            saver.setup()
            return {row[0] for row in saver.conn.execute(query, ids)}

        found = await saver._read(read)
    elif isinstance(saver, AsyncPgSaver):
        query = "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id = ANY($1::text[])"
        async with saver._connection() as conn:
            found = {row[0] for row in await conn.fetch(query, ids)}
    else:  # a saver of the app's own: ask it, thread by thread
        found = set()
        for thread_id in ids:
            async for _ in saver.alist(_thread(thread_id), limit=1):
                found.add(thread_id)
    return [t for t in ids if t in found]


def _thread(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


async def copy_thread(source: Saver, target: Saver, thread_id: str) -> int:
    """Put every checkpoint of the thread (with its pending writes) on `target`; how many.

    Oldest first, each with its id, parent and metadata, and every channel value it holds.
    A thread is one turn: its checkpoints are read at once (tens, not thousands).
    """
    found: list[CheckpointTuple] = [t async for t in source.alist(_thread(thread_id))]
    for item in reversed(found):  # newest first as listed
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
            await target.aput_writes(config, writes, task_id)
    return len(found)
