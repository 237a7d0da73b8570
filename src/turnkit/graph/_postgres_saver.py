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
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import asyncpg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.base import BasePostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from turnkit.graph._held import ThreadNotes, log_dropped, supersedable
from turnkit.store import Rider

__all__ = ("AsyncPgSaver", "Carrier", "prepare_connection")

Carrier = Callable[[Rider], Awaitable[bool | None]]
"""Commits what a thread's turn staged, with the rider: True if it carried it,
False if the saver must write it, None if the turn's next commit is to carry it (the
turn's ending, right after its last stage)."""

_LOST_CONNECTION = (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                    asyncpg.exceptions.ConnectionDoesNotExistError)  # fmt: skip
"""Failures of the connection, not of the write."""

_PUT_CHECKPOINT = """
WITH blobs AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $1, $2, b.channel, b.version, b.type, b.blob
    FROM unnest($7::text[], $8::text[], $9::text[], $10::bytea[]) AS b(channel, version, type, blob)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
)
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                         checkpoint, metadata)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
_PUT_WRITES = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                               idx, channel, type, blob)
SELECT $1, $2, $3, $4, $5, w.idx, w.channel, w.type, w.blob
FROM unnest($6::int[], $7::text[], $8::text[], $9::bytea[]) AS w(idx, channel, type, blob)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO {}
"""
_CARRIED_CHECKPOINTS = """
checkpoint_blobs_put AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT {0}::text, {1}::text, b.channel, b.version, b.type, b.blob
    FROM unnest({6}::text[], {7}::text[], {8}::text[], {9}::bytea[])
        AS b(channel, version, type, blob)
    WHERE EXISTS (SELECT FROM fence)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
), checkpoint_put AS (
    INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                             checkpoint, metadata)
    SELECT {0}::text, {1}::text, c.id, c.parent, c.checkpoint::jsonb, c.metadata::jsonb
    FROM unnest({2}::text[], {3}::text[], {4}::text[], {5}::text[])
        AS c(id, parent, checkpoint, metadata)
    WHERE EXISTS (SELECT FROM fence)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
)
"""
"""`_PUT_CHECKPOINT` for one or more checkpoints of a thread, as a `Rider`: written only if
the carrying commit's fence holds."""
_UPSERT_WRITES = _PUT_WRITES.format(
    "UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"
)
_INSERT_WRITES = _PUT_WRITES.format("NOTHING")


def _numbered(sql: str) -> str:
    """Turn psycopg's `%s` placeholders into asyncpg's `$1`, `$2`, and so on."""
    parts = sql.split("%s")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], start=1)) + parts[-1]


_PENDING_SENDS = _numbered(BasePostgresSaver.SELECT_PENDING_SENDS_SQL)


async def prepare_connection(conn: asyncpg.Connection) -> None:
    """Pool `init`: JSON columns in and out as Python values (as psycopg's `Jsonb`)."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


@dataclass(frozen=True, slots=True)
class _Held:
    """A write held for the thread's next write."""

    checkpoint_id: str | None
    """The checkpoint the write belongs to (task writes) or follows (a checkpoint)."""
    is_checkpoint: bool
    write: Callable[[asyncpg.Connection], Awaitable[Any]]
    args: tuple[Any, ...] = ()
    """A checkpoint's `_PUT_CHECKPOINT` arguments (to ride on a commit with the next)."""


class AsyncPgSaver(BasePostgresSaver):
    """LangGraph's PostgreSQL checkpointer on an asyncpg pool (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__()
        self.pool = pool
        self._held: dict[str, list[_Held]] = {}
        self._written = ThreadNotes()
        self._new = ThreadNotes()
        self._carriers: dict[str, Carrier] = {}

    def carry(self, thread_id: str, carrier: Carrier) -> Callable[[bool], Awaitable[None]]:
        """Let `carrier` write each checkpoint of the thread with its staged events.

        Every checkpoint of the thread then goes through the carrier first, so the events
        staged before it are stored with it or ahead of it. Returns what ends it (if
        another carrier has not replaced this one since): with `keep`, it stores what no
        commit carried (an ending that had to re-queue guide messages carries nothing);
        without, it drops it (the turn failed or lost its lease: a next attempt starts
        from the checkpoints stored, as after a crash).
        """
        self._carriers[thread_id] = carrier

        async def stop(keep: bool) -> None:
            if self._carriers.get(thread_id) != carrier:
                return
            del self._carriers[thread_id]
            if keep:
                await self._flush(thread_id)
            else:
                self._held.pop(thread_id, None)

        return stop

    def held_rider(self, thread_id: str) -> tuple[Rider, Callable[[], None]] | None:
        """The checkpoints the thread holds, as a rider for the turn's next commit.

        With what to call once a commit carried them (they are then no longer held);
        None if the thread holds no checkpoint. A checkpoint written both ways is written
        twice, to the same effect.
        """
        checkpoints = [h for h in self._held.get(thread_id, ()) if h.is_checkpoint]
        if not checkpoints:
            return None

        return _rider([h.args for h in checkpoints]), lambda: self._forget(thread_id, checkpoints)

    def _forget(self, thread_id: str, items: list[_Held]) -> None:
        """No longer hold `items` for the thread (a commit stored them)."""
        mine = self._held.get(thread_id, [])
        mine[:] = [h for h in mine if not any(h is c for c in items)]

    async def setup(self) -> None:
        """Create LangGraph's checkpoint tables (its own migrations, in its order)."""
        async with self.pool.acquire() as conn:
            await conn.execute(self.MIGRATIONS[0])
            done = await conn.fetchval("SELECT max(v) FROM checkpoint_migrations")
            start = -1 if done is None else int(done)
            for version in range(start + 1, len(self.MIGRATIONS)):
                await conn.execute(self.MIGRATIONS[version])  # CONCURRENTLY: no transaction
                await conn.execute("INSERT INTO checkpoint_migrations (v) VALUES ($1)", version)

    # ── writes ──

    async def _write(
        self, thread_id: str, write: Callable[[asyncpg.Connection], Awaitable[Any]]
    ) -> Any:
        """Run what the thread holds, then `write`, on one pooled connection."""
        held = self._held.pop(thread_id, [])
        try:
            async with self.pool.acquire() as conn:
                for item in held:
                    await _write_held(conn, thread_id, item)
                held = []
                return await write(conn)
        except BaseException:
            self._held.setdefault(thread_id, [])[:0] = held  # not stored: hold them again
            raise

    async def _flush(self, thread_id: str) -> None:
        if self._held.get(thread_id):
            await self._write(thread_id, _nothing)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (after what its thread holds).

        The thread's task writes held for this checkpoint's parent are dropped: this
        checkpoint holds their result, and turnkit only ever runs a thread from its newest
        checkpoint. A run's input checkpoint (`source: input`) is held for the next write,
        which comes right after it (the START task's checkpoint). With a carrier (see
        `carry`), see `_carry`.
        """
        args = self._checkpoint_args(config, checkpoint, metadata, new_versions)
        thread_id, checkpoint_ns, checkpoint_id, parent = args[:4]
        mine = self._held.get(thread_id, [])
        mine[:] = [h for h in mine if h.is_checkpoint or h.checkpoint_id != parent]
        saved: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
            }
        }

        async def put(conn: asyncpg.Connection) -> RunnableConfig:
            await conn.execute(_PUT_CHECKPOINT, *args)
            return saved

        carrier = self._carriers.get(thread_id)
        if metadata.get("source") == "input":
            self._held.setdefault(thread_id, []).append(_Held(parent, True, put, args))
        elif carrier is None:
            await self._write(thread_id, put)
        else:
            await self._carry(thread_id, carrier, _Held(parent, True, put, args))
        self._written.note(thread_id, checkpoint_id)
        return saved

    async def _carry(self, thread_id: str, carrier: Carrier, checkpoint: _Held) -> None:
        """Store `checkpoint` on the commit of the thread's staged events (see `carry`).

        The checkpoints the thread holds ride along with it, in the same statement. Held
        for the turn's next commit to carry (`held_rider`): the checkpoint the carrier
        asks to hold (the last, for the turn's ending), and, with nothing staged, the
        one right after the run's input (the START task's: no stage has run yet). Any
        other is written on its own, after the events a later step's commit already took.
        """
        mine = self._held.setdefault(thread_id, [])
        held = [h for h in mine if h.is_checkpoint]
        carried = await carrier(_rider([*(h.args for h in held), checkpoint.args]))
        if carried:
            self._forget(thread_id, held)
        elif carried is None or len(held) == 1:  # len 1: the run's input
            mine.append(checkpoint)
        else:
            await self._write(thread_id, checkpoint.write)

    def take_written(self, thread_id: str) -> str | None:
        """The checkpoint id this saver last stored for `thread_id` (forgotten once taken)."""
        return self._written.take(thread_id)

    def _checkpoint_args(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[Any, ...]:
        """`_PUT_CHECKPOINT`'s arguments: values inline, others as blobs (as LangGraph does).

        The first four: thread id, namespace, checkpoint id, parent checkpoint id.
        """
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = str(configurable.get("checkpoint_ns", ""))
        copy = checkpoint.copy()
        copy["channel_values"] = values = dict(checkpoint["channel_values"])
        blobs: dict[str, Any] = {}
        for key, value in checkpoint["channel_values"].items():
            if isinstance(value, _DeltaSnapshot):
                blobs[key] = value
                values[key] = True
            elif value is not None and not isinstance(value, str | int | float | bool):
                blobs[key] = values.pop(key)
        versions = {k: v for k, v in new_versions.items() if k in blobs}
        rows = self._dump_blobs(thread_id, checkpoint_ns, blobs, versions)
        return (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            configurable.get("checkpoint_id"),
            copy,
            get_serializable_checkpoint_metadata(config, metadata),
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
            [r[5] for r in rows],
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes: plain ones are held, LangGraph's own go now.

        Held writes wait for the next checkpoint; see `turnkit.graph._held`.
        """
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        kept = list(writes)

        async def put(conn: asyncpg.Connection) -> None:
            rows = self._dump_writes(
                thread_id,
                configurable["checkpoint_ns"],
                configurable["checkpoint_id"],
                task_id,
                task_path,
                kept,
            )
            special = all(channel in WRITES_IDX_MAP for channel, _ in kept)
            if special:  # one row per index: the last write to a channel wins, as upstream
                rows = list({row[5]: row for row in rows}.values())
            await conn.execute(
                _UPSERT_WRITES if special else _INSERT_WRITES,
                *rows[0][:5],
                [r[5] for r in rows],
                [r[6] for r in rows],
                [r[7] for r in rows],
                [r[8] for r in rows],
            )

        if not kept:
            return
        if supersedable(kept):
            checkpoint_id = configurable.get("checkpoint_id")
            self._held.setdefault(thread_id, []).append(_Held(checkpoint_id, False, put))
            return
        await self._write(thread_id, put)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes (and forget what it holds)."""
        self._held.pop(str(thread_id), None)
        async with self.pool.acquire() as conn, conn.transaction():
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
                await conn.execute(f"DELETE FROM {table} WHERE thread_id = $1", str(thread_id))

    async def aclose(self) -> None:
        """Store what every thread holds."""
        for thread_id in list(self._held):
            await self._flush(thread_id)

    # ── reads ──

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
        async with self.pool.acquire() as conn:
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
        async with self.pool.acquire() as conn:
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


def _rider(checkpoints: list[tuple[Any, ...]]) -> Rider:
    """Checkpoints of one thread (their `_PUT_CHECKPOINT` arguments) as one rider.

    JSON goes as text: the store's connections decode no JSON.
    """
    thread_id, checkpoint_ns = checkpoints[0][:2]
    columns = [[c[i] for c in checkpoints] for i in (2, 3)]
    json_columns = [[json.dumps(c[i]) for c in checkpoints] for i in (4, 5)]
    blobs = [[b for c in checkpoints for b in c[i]] for i in (6, 7, 8, 9)]
    return Rider(_CARRIED_CHECKPOINTS, (thread_id, checkpoint_ns, *columns, *json_columns, *blobs))


async def _nothing(_conn: asyncpg.Connection) -> None:
    return None


async def _write_held(conn: asyncpg.Connection, thread_id: str, held: _Held) -> None:
    """Write a held item; one the serializer or the database refuses is dropped.

    See `turnkit.graph._held`. A lost connection fails the write, and it stays held.
    """
    try:
        await held.write(conn)
    except _LOST_CONNECTION:
        raise  # nothing is wrong with the write: it stays held and goes with the next
    except Exception:  # noqa: BLE001 - logged with its traceback by log_dropped
        log_dropped(thread_id, is_checkpoint=held.is_checkpoint)
