"""LangGraph's PostgreSQL checkpointer: fewer transactions, one round trip each, no global lock.

`AsyncPostgresSaver` runs every call under one lock for the whole saver (it was written for
a single connection), writes each statement of a checkpoint as a transaction of its own
(its connections are in autocommit mode), and stores every task's writes although the next
checkpoint holds their result. On a pool, none of that is needed:

- calls run concurrently, each on a pooled connection of its own;
- values are serialized in place: a checkpoint of a turn is small, and a thread hop per
  write cost more than the serializing;
- a checkpoint, with what is held for it, is one transaction sent as one pipeline (one
  round trip to the server);
- the same two writes the SQLite saver holds are held here (see `aput` and `aput_writes`):
  a run's input checkpoint, folded into the next checkpoint's transaction, and a task's
  plain writes, dropped when the next checkpoint of the thread supersedes them.

Held writes belong to their thread: a read of the thread, or any write of it, stores them
first, so the saver never answers from less than it was given.
"""

from __future__ import annotations

import contextvars
import logging
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

__all__ = ("PooledPostgresSaver", "drop_if_closed")

log = logging.getLogger(__name__)

_BATCH: contextvars.ContextVar[AsyncCursor[DictRow] | None] = contextvars.ContextVar(
    "turnkit_checkpoint_batch", default=None
)
"""The cursor of the transaction the current task is writing in, if any."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A write held for the thread's next transaction."""

    checkpoint_id: str | None
    """The checkpoint the write belongs to (task writes) or follows (a checkpoint)."""
    is_checkpoint: bool
    write: Callable[[], Awaitable[Any]]


class PooledPostgresSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` on a connection pool, holding what the next checkpoint makes moot."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(pool)
        self._pool = pool
        self._held: dict[str, list[_Held]] = {}

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        """A cursor: the current batch's, or one on a pooled connection (no saver lock)."""
        batch = _BATCH.get()
        if batch is not None:
            yield batch
            return
        async with self._pool.connection() as conn:
            if pipeline:
                async with (
                    conn.pipeline(),
                    conn.transaction(),
                    conn.cursor(binary=True, row_factory=dict_row) as cur,
                ):
                    yield cur
            else:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur

    async def _in_batch(self, thread_id: str, write: Callable[[], Awaitable[Any]]) -> Any:
        """Run `write` after the thread's held writes, in one transaction, one round trip."""
        held = self._held.pop(thread_id, [])
        try:
            async with self._cursor(pipeline=True) as cur:
                token = _BATCH.set(cur)
                try:
                    for item in held:
                        await _write_held(thread_id, item)
                    return await write()
                finally:
                    _BATCH.reset(token)
        except BaseException:
            self._held.setdefault(thread_id, [])[:0] = held  # nothing was stored: hold again
            raise

    async def _flush(self, thread_id: str) -> None:
        if self._held.get(thread_id):
            await self._in_batch(thread_id, _nothing)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, in one transaction with what its thread holds.

        The thread's task writes held for this checkpoint's parent are dropped: this
        checkpoint holds their result, and turnkit only ever runs a thread from its newest
        checkpoint. A run's input checkpoint (`source: input`) is held for the next
        transaction, which comes right after it (the START task's checkpoint).
        """
        thread_id = str(config["configurable"]["thread_id"])
        parent = config["configurable"].get("checkpoint_id")
        mine = self._held.get(thread_id, [])
        mine[:] = [h for h in mine if h.is_checkpoint or h.checkpoint_id != parent]

        async def put() -> RunnableConfig:
            return await self._put_checkpoint(config, checkpoint, metadata, new_versions)

        if metadata.get("source") == "input":
            self._held.setdefault(thread_id, []).append(_Held(parent, True, put))
            return {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                    "checkpoint_id": checkpoint["id"],
                }
            }
        return await self._in_batch(thread_id, put)  # type: ignore[no-any-return]

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes: plain ones are held; LangGraph's own go now.

        A write on a LangGraph-internal channel (an interrupt, a resume value, an error)
        must be durable before the run stops, so it is written at once, after what the
        thread holds. A plain write waits for the next checkpoint, which supersedes it: a
        write lost to a crash only means the task runs again, and turnkit's journal makes
        a re-run repeat nothing.
        """
        thread_id = str(config["configurable"]["thread_id"])
        kept = list(writes)

        async def put() -> None:
            await self._put_writes(config, kept, task_id, task_path)

        if all(not channel.startswith("__") for channel, _ in kept):
            checkpoint_id = config["configurable"].get("checkpoint_id")
            self._held.setdefault(thread_id, []).append(_Held(checkpoint_id, False, put))
            return
        await self._in_batch(thread_id, put)

    async def _put_checkpoint(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`AsyncPostgresSaver.aput`'s statements, serialized in place (no thread hop)."""
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        copy = checkpoint.copy()
        copy["channel_values"] = values = dict(checkpoint["channel_values"])
        blobs: dict[str, Any] = {}
        for key, value in checkpoint["channel_values"].items():
            if isinstance(value, _DeltaSnapshot):
                blobs[key] = value
                values[key] = True
            elif value is not None and not isinstance(value, str | int | float | bool):
                blobs[key] = values.pop(key)
        async with self._cursor(pipeline=True) as cur:
            if versions := {k: v for k, v in new_versions.items() if k in blobs}:
                await cur.executemany(
                    self.UPSERT_CHECKPOINT_BLOBS_SQL,
                    self._dump_blobs(thread_id, checkpoint_ns, blobs, versions),
                )
            await cur.execute(
                self.UPSERT_CHECKPOINTS_SQL,
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint["id"],
                    configurable.get("checkpoint_id"),
                    Jsonb(copy),
                    Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
                ),
            )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        """`AsyncPostgresSaver.aput_writes`' statement, serialized in place (no thread hop)."""
        configurable = config["configurable"]
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        params = self._dump_writes(
            configurable["thread_id"],
            configurable["checkpoint_ns"],
            configurable["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        async with self._cursor(pipeline=True) as cur:
            await cur.executemany(
                self.UPSERT_CHECKPOINT_WRITES_SQL if special else self.INSERT_CHECKPOINT_WRITES_SQL,
                params,
            )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (the newest by default), after what is held."""
        await self._flush(str(config["configurable"]["thread_id"]))
        return await super().aget_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints, newest first, after what is held (for every thread if none)."""
        threads = [str(config["configurable"]["thread_id"])] if config else list(self._held)
        for thread_id in threads:
            await self._flush(thread_id)
        async for item in super().alist(config, filter=filter, before=before, limit=limit):
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes (and forget what it holds)."""
        self._held.pop(str(thread_id), None)
        await super().adelete_thread(thread_id)

    async def aclose(self) -> None:
        """Store what every thread holds."""
        for thread_id in list(self._held):
            await self._flush(thread_id)


async def drop_if_closed(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check: hand out no connection the server has closed (a restart).

    An idle connection has nothing to read unless the server closed it, so a zero-timeout
    poll of its socket tells, without the round trip `check_connection` makes per checkout.
    """
    if conn.closed or select.select([conn.pgconn.socket], [], [], 0)[0]:
        await conn.close()  # so the pool discards it instead of taking it back
        raise psycopg.OperationalError("the server closed the connection")


async def _nothing() -> None:
    return None


async def _write_held(thread_id: str, held: _Held) -> None:
    """Write a held item in the current transaction; one that cannot be stored is dropped.

    A value the serializer refuses fails before any SQL is sent. Raising would hold it
    again and fail every later write of its thread, so it is logged and dropped instead:
    losing it only means its task runs again after a crash. Database errors still fail the
    whole transaction (and the held items stay held).
    """
    try:
        await held.write()
    except psycopg.Error:
        raise
    except Exception:
        log.exception(
            "dropped a held %s of thread %s: it cannot be stored",
            "checkpoint" if held.is_checkpoint else "task write",
            thread_id,
        )
