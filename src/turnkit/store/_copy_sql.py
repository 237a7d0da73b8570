"""Every turnkit row, read and written a page at a time (`turnkit db copy`).

The pages are keyset pages in primary-key order, so a table of any size is read in
bounded memory and each page is one short transaction on either side. Rows travel as
plain values: times as aware UTC datetimes (SQLite gives them back naive), which each
side stores its own way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import Connection, DateTime, Table, func, insert, inspect, select, tuple_

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

__all__ = (
    "TABLES",
    "count_rows",
    "insert_rows",
    "read_pages",
    "rows_present",
    "running_turns",
    "turn_id_pages",
)

Row = dict[str, Any]


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


async def count_rows(store: SqlEngine) -> dict[str, int]:
    """Rows in each turnkit table, by table name, in `TABLES` order."""
    return {t.name: await store._tx(_count, t, write=False) for t in TABLES}


async def rows_present(store: SqlEngine) -> int:
    """Rows in the turnkit tables the database has, at whatever revision (none: 0).

    Asks before anything is migrated: a table a later revision adds counts as empty.
    """

    def count(conn: Connection) -> int:
        present = set(inspect(conn).get_table_names())
        return sum(_count(conn, t) for t in TABLES if t.name in present)

    return await store._migrate(count)


async def running_turns(store: SqlEngine) -> int:
    """Turns running or queued (status `running`: a process drives or will claim them)."""
    return await store._tx(_running, write=False)


async def read_pages(store: SqlEngine, table: Table, *, size: int) -> AsyncIterator[list[Row]]:
    """The table's rows in primary-key order, `size` at a time (one transaction each)."""
    after: tuple[Any, ...] | None = None
    key = [c.key for c in table.primary_key.columns]
    while True:
        rows = await store._tx(_page, table, after, size, write=False)
        if rows:
            yield rows
        if len(rows) < size:
            return
        after = tuple(rows[-1][k] for k in key)


async def insert_rows(store: SqlEngine, table: Table, rows: list[Row]) -> None:
    """Insert `rows` (as `read_pages` gives them) in one transaction."""
    if rows:
        await store._tx(_insert, table, rows)


def _turn_ids(conn: Connection, after: str | None, limit: int) -> list[str]:
    query = select(turns.c.turn_id).order_by(turns.c.turn_id).limit(limit)
    if after is not None:
        query = query.where(turns.c.turn_id > after)
    return [row[0] for row in conn.execute(query).all()]


async def turn_id_pages(store: SqlEngine, *, size: int) -> AsyncIterator[list[str]]:
    """Every turn's id, in order, `size` at a time."""
    after: str | None = None
    while True:
        ids = await store._tx(_turn_ids, after, size, write=False)
        if ids:
            yield ids
        if len(ids) < size:
            return
        after = ids[-1]
