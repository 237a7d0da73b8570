"""`PgCheckpointWrites`: `AsyncPgSaver`'s write side — checkpoints, task writes, held writes.

A base of `AsyncPgSaver` (see `_postgres_saver` for the whole): each write is one statement
on a pooled connection, after what its thread holds; a run's input checkpoint and a task's
plain writes are held for the thread's next write, and a thread's *carrier* (`carry`)
writes its checkpoints in the statement of the turn's own commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.base import BasePostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from turnkit.graph._held import ThreadNotes, cancelled, log_dropped, supersedable
from turnkit.store import Rider
from turnkit.store._asyncpg_pool import pooled
from turnkit.store.sql import Retirements, is_unreachable, reached_read_only, unavailable

__all__ = (
    "CARRIED_CHECKPOINTS",
    "INSERT_WRITES",
    "LOST_CONNECTION",
    "PUT_CHECKPOINT",
    "PUT_WRITES",
    "UPSERT_WRITES",
    "Carrier",
    "Held",
    "PgCheckpointWrites",
    "nothing",
    "rider",
    "write_held",
)

Carrier = Callable[[Rider], Awaitable[bool | None]]
"""Commits what a thread's turn staged, with the rider: True if it carried it,
False if the saver must write it, None if the turn's next commit is to carry it (the
turn's ending, right after its last stage)."""

LOST_CONNECTION = (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                   asyncpg.exceptions.ConnectionDoesNotExistError)  # fmt: skip
"""Failures of the connection, not of the write."""

PUT_CHECKPOINT = """
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
PUT_WRITES = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                               idx, channel, type, blob)
SELECT $1, $2, $3, $4, $5, w.idx, w.channel, w.type, w.blob
FROM unnest($6::int[], $7::text[], $8::text[], $9::bytea[]) AS w(idx, channel, type, blob)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO {}
"""
CARRIED_CHECKPOINTS = """
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
"""`PUT_CHECKPOINT` for one or more checkpoints of a thread, as a `Rider`: written only if
the carrying commit's fence holds."""
UPSERT_WRITES = PUT_WRITES.format(
    "UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"
)
INSERT_WRITES = PUT_WRITES.format("NOTHING")


@dataclass(frozen=True, slots=True)
class Held:
    """A write held for the thread's next write."""

    checkpoint_id: str | None
    """The checkpoint the write belongs to (task writes) or follows (a checkpoint)."""
    is_checkpoint: bool
    write: Callable[[asyncpg.Connection], Awaitable[Any]]
    args: tuple[Any, ...] = ()
    """A checkpoint's `PUT_CHECKPOINT` arguments (to ride on a commit with the next)."""


class PgCheckpointWrites(BasePostgresSaver):
    """What `AsyncPgSaver` writes, and holds for a thread's next write (see the module doc)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__()
        self.pool = pool
        self._held: dict[str, list[Held]] = {}
        self._written = ThreadNotes()
        self._carriers: dict[str, Carrier] = {}
        self._retirements = Retirements(time.monotonic)
        """When the pool is retired for a read-only refusal (at most once an interval)."""

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; a database out of reach or refusing writes is an outage.

        Such a failure raises `StoreUnavailableError` (a driver rides it out, as the
        Store's); a read-only refusal also retires the pool's connections: after a
        failover, connections opened while the database's name still led to the old
        primary keep reaching it, now a replica, and a later acquire connects afresh. At
        most once an interval (`Retirements`): a server that stays read-only is not
        reconnected to on every refused write.
        """
        if self._retirements.due():
            await self.pool.expire_connections()
        try:
            async with pooled(self.pool) as conn:
                yield conn
        except Exception as exc:
            if reached_read_only(exc) and self._retirements.refused():
                await self.pool.expire_connections()
            if is_unreachable(exc):  # only this pool's connections run here
                raise unavailable(exc) from exc
            raise

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

        return rider([h.args for h in checkpoints]), lambda: self._forget(thread_id, checkpoints)

    def _forget(self, thread_id: str, items: list[Held]) -> None:
        """No longer hold `items` for the thread (a commit stored them)."""
        mine = self._held.get(thread_id, [])
        mine[:] = [h for h in mine if not any(h is c for c in items)]

    async def _write(
        self, thread_id: str, write: Callable[[asyncpg.Connection], Awaitable[Any]]
    ) -> Any:
        """Run what the thread holds, then `write`, on one pooled connection."""
        held = self._held.pop(thread_id, [])
        try:
            async with self._connection() as conn:
                for item in held:
                    await write_held(conn, thread_id, item)
                held = []
                return await write(conn)
        except BaseException:
            self._held.setdefault(thread_id, [])[:0] = held  # not stored: hold them again
            raise

    async def _flush(self, thread_id: str) -> None:
        if self._held.get(thread_id):
            await self._write(thread_id, nothing)

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
            await conn.execute(PUT_CHECKPOINT, *args)
            return saved

        carrier = self._carriers.get(thread_id)
        if metadata.get("source") == "input":
            self._held.setdefault(thread_id, []).append(Held(parent, True, put, args))
        elif carrier is None:
            await self._write(thread_id, put)
        else:
            await self._carry(thread_id, carrier, Held(parent, True, put, args))
        self._written.note(thread_id, checkpoint_id)
        return saved

    async def _carry(self, thread_id: str, carrier: Carrier, checkpoint: Held) -> None:
        """Store `checkpoint` on the commit of the thread's staged events (see `carry`).

        The checkpoints the thread holds ride along with it, in the same statement. Held
        for the turn's next commit to carry (`held_rider`): the checkpoint the carrier
        asks to hold (the last, for the turn's ending), and, with nothing staged, the
        one right after the run's input (the START task's: no stage has run yet). Any
        other is written on its own, after the events a later step's commit already took.
        """
        mine = self._held.setdefault(thread_id, [])
        held = [h for h in mine if h.is_checkpoint]
        carried = await carrier(rider([*(h.args for h in held), checkpoint.args]))
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
        """`PUT_CHECKPOINT`'s arguments: values inline, others as blobs (as LangGraph does).

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

        Held writes wait for the next checkpoint; those of a cancelled task are not
        stored. See `turnkit.graph._held`.
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
                UPSERT_WRITES if special else INSERT_WRITES,
                *rows[0][:5],
                [r[5] for r in rows],
                [r[6] for r in rows],
                [r[7] for r in rows],
                [r[8] for r in rows],
            )

        if not kept or cancelled(kept):  # its node runs again (see `cancelled`)
            return
        if supersedable(kept):
            checkpoint_id = configurable.get("checkpoint_id")
            self._held.setdefault(thread_id, []).append(Held(checkpoint_id, False, put))
            return
        await self._write(thread_id, put)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes (and forget what it holds)."""
        await self.adelete_threads((thread_id,))

    async def adelete_threads(self, thread_ids: Sequence[str]) -> None:
        """Delete the threads' checkpoints and writes in one transaction."""
        ids = [str(t) for t in thread_ids]
        for thread_id in ids:
            self._held.pop(thread_id, None)
        if not ids:
            return
        async with self._connection() as conn, conn.transaction():
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
                await conn.execute(f"DELETE FROM {table} WHERE thread_id = ANY($1::text[])", ids)

    async def aclose(self) -> None:
        """Store what every thread holds."""
        for thread_id in list(self._held):
            await self._flush(thread_id)


def rider(checkpoints: list[tuple[Any, ...]]) -> Rider:
    """Checkpoints of one thread (their `PUT_CHECKPOINT` arguments) as one rider.

    JSON goes as text: the store's connections decode no JSON.
    """
    thread_id, checkpoint_ns = checkpoints[0][:2]
    columns = [[c[i] for c in checkpoints] for i in (2, 3)]
    json_columns = [[json.dumps(c[i]) for c in checkpoints] for i in (4, 5)]
    blobs = [[b for c in checkpoints for b in c[i]] for i in (6, 7, 8, 9)]
    return Rider(CARRIED_CHECKPOINTS, (thread_id, checkpoint_ns, *columns, *json_columns, *blobs))


async def nothing(_conn: asyncpg.Connection) -> None:
    return None


async def write_held(conn: asyncpg.Connection, thread_id: str, held: Held) -> None:
    """Write a held item; one the serializer or the database refuses is dropped.

    See `turnkit.graph._held`. A lost connection fails the write, and it stays held.
    """
    try:
        await held.write(conn)
    except LOST_CONNECTION:
        raise  # nothing is wrong with the write: it stays held and goes with the next
    except Exception:  # noqa: BLE001 - logged with its traceback by log_dropped
        log_dropped(thread_id, is_checkpoint=held.is_checkpoint)
