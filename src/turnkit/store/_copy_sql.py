"""Every turnkit row, read and written a page at a time (`turnkit db copy`).

The pages are keyset pages in primary-key order, so a table of any size is read in
bounded memory. The copy runs them in transactions it holds open (`held`): the source's
pages in one read transaction, a snapshot of every table, and the target's in one write
transaction, committed once every table is in. Rows travel as plain values: times as
aware UTC datetimes (SQLite gives them back naive), which each side stores its own way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, DateTime, Table, func, insert, inspect, select, text, tuple_

from turnkit.store._engine import SqlEngine
from turnkit.store._schema import (
    audit,
    aware,
    budget_limits,
    events,
    inputs,
    pauses,
    reservations,
    sessions,
    transcripts,
    turns,
    usage,
    workspace_files,
)
from turnkit.store._sqlite import BusyError, busy_error

__all__ = (
    "TABLES",
    "Held",
    "count_rows",
    "held",
    "insert_rows",
    "read_pages",
    "rows_present",
    "running_turns",
)

Row = dict[str, Any]
T = TypeVar("T")


class Held:
    """One transaction of a store held open across calls (see `held`)."""

    def __init__(self, store: SqlEngine, *, write: bool) -> None:
        self.store = store
        self.write = write
        self._sqlite: Any = None  # the SQLite connection in its transaction
        self._pg: Any = None  # SQLAlchemy's async connection in its transaction

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` inside the held transaction.

        On SQLite's thread, a read that meets a lock (another process's checkpoint, its
        WAL recovery) is tried again as the store's own reads are, until the store's
        lock wait runs out or a close gives it up.
        """
        if self._pg is not None:
            result: T = await self._pg.run_sync(fn, *args)
            return result
        if self.store._thread is None:  # in memory: the one connection, in place
            return fn(self._sqlite, *args)
        store, conn = self.store, self._sqlite

        def read() -> T:
            # A write holds its lock from BEGIN: `fn` may be half done, so it is not retried.
            again = (lambda exc: False) if self.write else busy_error
            try:
                return store._lock_wait.retry(lambda: fn(conn, *args), busy=again)
            except BusyError as exc:
                if self.write:
                    raise
                raise store._busy_too_long(exc) from exc

        return await asyncio.get_running_loop().run_in_executor(store._thread, read)

    async def export_snapshot(self) -> str | None:
        """PostgreSQL: an id another connection may read this snapshot by (SQLite: None)."""
        if self._pg is None:
            return None
        query = text("SELECT pg_export_snapshot()")
        return str(await self.run(lambda conn: conn.execute(query).scalar_one()))


@contextlib.asynccontextmanager
async def held(store: SqlEngine, *, write: bool) -> AsyncIterator[Held]:
    """One transaction on `store` for every `run`, committed when the block ends cleanly.

    Read (`write=False`): a snapshot. PostgreSQL's transaction is `REPEATABLE READ READ
    ONLY`; SQLite's is a plain `BEGIN` (its snapshot is taken by the first read, and WAL
    lets writers go on meanwhile). Write: PostgreSQL's default isolation, SQLite's `BEGIN
    IMMEDIATE`. An error rolls it back whole.
    """
    tx = Held(store, write=write)
    if store.dialect == "postgresql":
        assert store._async_engine is not None
        async with store._async_engine.connect() as conn:
            if not write:
                conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                if not write:
                    await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                tx._pg = conn
                yield tx
        return
    on_thread = store._thread is not None
    sqlite = store._thread_conn() if on_thread else store._on_loop
    assert sqlite is not None
    begun = sqlite.transaction(write=write)
    await _on(store, begun.__enter__)
    tx._sqlite = sqlite
    try:
        yield tx
    except BaseException as exc:
        with contextlib.suppress(Exception):  # rolls back (and raises `exc` again)
            await _on(store, functools.partial(begun.__exit__, type(exc), exc, exc.__traceback__))
        raise
    await _on(store, lambda: begun.__exit__(None, None, None))


async def _on(store: SqlEngine, fn: Callable[[], T]) -> T:
    """`fn()` on the SQLite store's thread (in place for a database in memory)."""
    if store._thread is None:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(store._thread, fn)


Reads = SqlEngine | Held
"""Where reads run: a store (a transaction each) or a held transaction."""


async def _read(on: Reads, fn: Callable[..., T], *args: Any) -> T:
    if isinstance(on, Held):
        return await on.run(fn, *args)
    return await on._tx(fn, *args, write=False)


def _in_dependency_order(tables: Sequence[Table]) -> tuple[Table, ...]:
    """`tables` in the order given, but each after the tables its foreign keys point to."""
    left, done = list(tables), list[Table]()
    while left:
        ready = next(t for t in left if all(p in done for p in _parents(t)) or t in _parents(t))
        left.remove(ready)
        done.append(ready)
    return tuple(done)


def _parents(table: Table) -> set[Table]:
    return {fk.referred_table for fk in table.foreign_key_constraints}


TABLES: tuple[Table, ...] = _in_dependency_order(
    (sessions, inputs, turns, transcripts, events, audit, usage, pauses, workspace_files,
     budget_limits, reservations)
)  # fmt: skip
"""Every turnkit table (the schema revision's own table aside), parents first."""


def _count(conn: Connection, table: Table) -> int:
    return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _running(conn: Connection) -> int:
    query = select(func.count()).select_from(turns).where(turns.c.status == "running")
    return int(conn.execute(query).scalar_one())


def _page(conn: Connection, table: Table, after: tuple[Any, ...] | None, limit: int) -> list[Row]:
    key = list(table.primary_key.columns)
    query = select(*table.columns).order_by(*key).limit(limit)
    if after is not None:
        query = query.where(key[0] > after[0] if len(key) == 1 else tuple_(*key) > tuple_(*after))
    names = [c.key for c in table.columns]
    times = [c.key for c in table.columns if isinstance(c.type, DateTime)]
    found = []
    for row in conn.execute(query).all():
        values = dict(zip(names, row, strict=True))
        for name in times:
            values[name] = aware(values[name])
        found.append(values)
    return found


def _insert(conn: Connection, table: Table, rows: list[Row]) -> None:
    conn.execute(insert(table), rows)


async def count_rows(on: Reads) -> dict[str, int]:
    """Rows in each turnkit table, by table name, in `TABLES` order."""
    return {t.name: await _read(on, _count, t) for t in TABLES}


async def rows_present(store: SqlEngine) -> int:
    """Rows in the turnkit tables the database has, at whatever revision (none: 0).

    Asks before anything is migrated: a table a later revision adds counts as empty.
    """

    def count(conn: Connection) -> int:
        present = set(inspect(conn).get_table_names())
        return sum(_count(conn, t) for t in TABLES if t.name in present)

    return await store._migrate(count)


async def running_turns(on: Reads) -> int:
    """Turns running or queued (status `running`: a process drives or will claim them)."""
    return await _read(on, _running)


async def read_pages(on: Reads, table: Table, *, size: int) -> AsyncIterator[list[Row]]:
    """The table's rows in primary-key order, `size` at a time."""
    after: tuple[Any, ...] | None = None
    key = [c.key for c in table.primary_key.columns]
    while True:
        rows = await _read(on, _page, table, after, size)
        if rows:
            yield rows
        if len(rows) < size:
            return
        after = tuple(rows[-1][k] for k in key)


async def insert_rows(target: Held, table: Table, rows: list[Row]) -> None:
    """Insert `rows` (as `read_pages` gives them) in the target's held transaction."""
    if rows:
        await target.run(_insert, table, rows)
