"""LangGraph's PostgreSQL checkpoints, on asyncpg: the store's driver, one round trip a write.

`AsyncPgSaver` keeps LangGraph's own tables, SQL semantics and serialization
(`BasePostgresSaver`: a database written by LangGraph's `AsyncPostgresSaver` reads the
same), but runs them on an asyncpg pool, as the Store does, instead of psycopg:

- a checkpoint (its blobs and its row) is one statement, so one round trip and atomic on
  its own; task writes are one statement too;
- calls run concurrently, each on a pooled connection (no saver-wide lock), and values are
  serialized in place (a turn's checkpoint is small: a thread hop cost more);
- the writes the SQLite saver holds are held here too: a run's input checkpoint goes with
  the next checkpoint, and a task's plain writes are dropped when the next checkpoint of
  the thread supersedes them (see `aput` and `aput_writes`). LangGraph reads those writes
  only to run a thread again from that checkpoint, which turnkit never does, or to rebuild
  a `DeltaChannel`, which `TurnState` does not have.

Held writes belong to their thread: a read of the thread, or any write of it, stores them
first, so the saver never answers from less than it was given. A connection the server
closed is replaced by the pool when it is next acquired.

A thread can have a *carrier* (`carry`): the turn's own commit, which takes the events
the super-step staged and writes the checkpoint in the same statement (a `Rider` fenced
by the turn's lease). A super-step's events and its checkpoint are then one round trip,
and one is never stored without the other.

`AsyncPgSaver` is the read side and the tables' setup; what it writes and holds is its
base, `PgCheckpointWrites` (`_postgres_writes`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any, cast

import asyncpg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, get_checkpoint_id
from langgraph.checkpoint.postgres.base import BasePostgresSaver

from turnkit.graph._held import ThreadNotes
from turnkit.graph._postgres_writes import Carrier, PgCheckpointWrites

__all__ = ("AsyncPgSaver", "Carrier", "prepare_connection")


def _numbered(sql: str) -> str:
    """Turn psycopg's `%s` placeholders into asyncpg's `$1`, `$2`, and so on."""
    parts = sql.split("%s")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], start=1)) + parts[-1]


_PENDING_SENDS = _numbered(BasePostgresSaver.SELECT_PENDING_SENDS_SQL)
_THREADS = " UNION ".join(
    f"(SELECT DISTINCT thread_id FROM {table} WHERE thread_id > $1"
    " AND starts_with(thread_id, $2) ORDER BY thread_id LIMIT $3)"
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
)
THREAD_IDS = f"SELECT thread_id FROM ({_THREADS}) AS t ORDER BY thread_id LIMIT $3"
"""Threads with any row, past one, named with a prefix, in order (keyset paging)."""


async def prepare_connection(conn: asyncpg.Connection) -> None:
    """Pool `init`: JSON columns in and out as Python values (as psycopg's `Jsonb`)."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class AsyncPgSaver(PgCheckpointWrites):
    """LangGraph's PostgreSQL checkpointer on an asyncpg pool (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self._new = ThreadNotes()

    async def athread_ids(self, *, prefix: str, after: str, limit: int) -> list[str]:
        """Up to `limit` threads holding any row whose ids start with `prefix`, past `after`.

        In order, so the last one is the next call's `after` (`""` to start).
        """
        async with self._connection() as conn:
            return [str(r[0]) for r in await conn.fetch(THREAD_IDS, after, prefix, limit)]

    async def setup(self) -> None:
        """Create LangGraph's checkpoint tables (its own migrations, in its order)."""
        async with self._connection() as conn:
            await conn.execute(self.MIGRATIONS[0])
            done = await conn.fetchval("SELECT max(v) FROM checkpoint_migrations")
            start = -1 if done is None else int(done)
            for version in range(start + 1, len(self.MIGRATIONS)):
                await conn.execute(self.MIGRATIONS[version])  # CONCURRENTLY: no transaction
                await conn.execute("INSERT INTO checkpoint_migrations (v) VALUES ($1)", version)

    def expect_new(self, thread_id: str) -> None:
        """`thread_id` has no checkpoint: its first read of the newest asks no database."""
        self._new.note(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (the thread's newest by default), after what is held."""
        thread_id = str(config["configurable"]["thread_id"])
        fresh = not get_checkpoint_id(config) and not self._held.get(thread_id)
        if fresh and self._new.take(thread_id) is not None:
            return None  # read before anything of the thread can have been written
        await self._flush(thread_id)
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        if checkpoint_id := get_checkpoint_id(config):
            where = "WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"
            args: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint_id)
        else:
            where = (
                "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1"
            )
            args = (thread_id, checkpoint_ns)
        async with self._connection() as conn:
            rows = [dict(r) for r in await conn.fetch(self.SELECT_SQL + where, *args)]
            await self._migrate_old_sends(conn, rows)
        return self._tuple(rows[0]) if rows else None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints, newest first, after what is held (for every thread if none)."""
        if config is not None:
            configurable = config["configurable"]
            config = {"configurable": {**configurable, "thread_id": str(configurable["thread_id"])}}
        threads = [str(config["configurable"]["thread_id"])] if config else list(self._held)
        for thread_id in threads:
            await self._flush(thread_id)
        where, params = self._search_where(config, filter, before)
        args = [getattr(p, "obj", p) for p in params]  # psycopg's Jsonb → the value
        query = self.SELECT_SQL + _numbered(where) + " ORDER BY checkpoint_id DESC"
        if limit is not None:
            args.append(int(limit))
            query += f" LIMIT ${len(args)}"
        async with self._connection() as conn:
            rows = [dict(r) for r in await conn.fetch(query, *args)]
            await self._migrate_old_sends(conn, rows)
        for row in rows:
            yield self._tuple(row)

    async def _migrate_old_sends(
        self, conn: asyncpg.Connection, rows: list[dict[str, Any]]
    ) -> None:
        """Checkpoints older than format 4 kept pending sends apart: fold them in (LangGraph)."""
        old = [r for r in rows if r["checkpoint"]["v"] < 4 and r["parent_checkpoint_id"]]
        if not old:
            return
        by_parent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in old:
            by_parent[row["parent_checkpoint_id"]].append(row)
        parents = list(by_parent)
        for sends in await conn.fetch(_PENDING_SENDS, rows[0]["thread_id"], parents):
            for row in by_parent[sends["checkpoint_id"]]:
                if row["channel_values"] is None:
                    row["channel_values"] = []
                self._migrate_pending_sends(
                    sends["sends"], row["checkpoint"], row["channel_values"]
                )

    def _tuple(self, row: dict[str, Any]) -> CheckpointTuple:
        """A row of `SELECT_SQL` as LangGraph's `CheckpointTuple` (serialized in place)."""
        thread_id, checkpoint_ns = row["thread_id"], row["checkpoint_ns"]
        checkpoint = row["checkpoint"]
        parent = row["parent_checkpoint_id"]
        return CheckpointTuple(
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": row["checkpoint_id"],
                }
            },
            cast(
                Checkpoint,
                {
                    **checkpoint,
                    "channel_values": {
                        **(checkpoint.get("channel_values") or {}),
                        **self._load_blobs(row["channel_values"]),
                    },
                },
            ),
            row["metadata"],
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": parent,
                }
            }
            if parent
            else None,
            self._load_writes(row["pending_writes"]),
        )
