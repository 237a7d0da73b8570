"""`turnkit.store._sqlite`: Core statements on plain sqlite3 behave as through SQLAlchemy."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from tests.helpers import new_input

from turnkit.errors import StoreError
from turnkit.store import _sqlite
from turnkit.store._lease_sql import _claim_query
from turnkit.store._schema import usage
from turnkit.store._submit_sql import _insert_claimed
from turnkit.store._tables import metadata
from turnkit.store.sql import SqlStore


def test_constant_column_defaults_are_filled_in(tmp_path: Path) -> None:
    """`x: int = 0` on a model is a default SQLAlchemy supplies; the raw path must too."""
    engine = create_engine(f"sqlite:///{tmp_path / 'd.db'}")
    metadata.create_all(engine)
    engine.dispose()
    conn = _sqlite.connect(str(tmp_path / "d.db"), busy_timeout_ms=0, autocheckpoint=True)
    try:
        with conn.transaction() as tx:
            tx.execute(usage.insert(), {"turn_id": "t1", "session_id": "s1"})
        row = conn.execute(select(usage).where(usage.c.turn_id == "t1")).one()
    finally:
        conn.close()
    assert (row.model_calls, row.input_tokens, row.cost_usd) == (0, 0, 0.0)


async def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'tk.db'}")
    await store.setup()
    await store.submit(new_input())
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.submit(new_input())
    with pytest.raises(StoreError, match="closed"):
        await store.list_sessions()


async def test_an_in_memory_store_can_be_shared_by_loops_on_several_threads() -> None:
    store = SqlStore.from_url("sqlite://")
    await store.setup()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        async def submits() -> None:
            for i in range(60):
                await store.submit(new_input(session=f"s{n}-{i}"))

        try:
            asyncio.run(submits())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert errors == []
        assert len(await store.list_sessions(limit=1000)) == 180
    finally:
        await store.close()


async def test_a_claim_probes_a_sessions_open_turns_without_scanning_its_history(
    tmp_path: Path,
) -> None:
    """Whether an earlier turn still runs is an index search, whatever the session's length."""
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'tk.db'}")
    await store.setup()
    await store.close()
    plain = ("turn_id", "session_id", "input_seq", "status", "last_seq", "created_at")
    statements = {
        "message claimed at once": _insert_claimed(plain),
        "worker claim": _claim_query(by_turn=False, by_session=False),
    }
    conn = sqlite3.connect(tmp_path / "tk.db")
    try:
        for name, statement in statements.items():
            compiled = _sqlite._Compiled(statement, None)
            params = dict.fromkeys(re.findall(r":(\w+)", compiled.sql)) | compiled.fixed
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {compiled.sql}", params)]
            earlier = [step for step in plan if "ix_turn_session_open" in step]
            assert earlier, f"{name}: {plan}"
            assert all("input_seq<?" in step for step in earlier), f"{name}: {plan}"
    finally:
        conn.close()


async def test_a_streams_first_event_is_read_without_waiting_for_the_stores_thread(
    tmp_path: Path,
) -> None:
    """A small event page is read in place: a busy store thread does not hold it up."""
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'tk.db'}")
    await store.setup()
    try:
        submission = await store.submit(new_input())
        busy = threading.Event()

        def occupy(conn: object) -> None:
            busy.wait(10)  # the store's thread is stuck until the test lets it go

        blocker = asyncio.create_task(store._tx(occupy, write=False))
        await asyncio.sleep(0.05)
        first = [e async for e in store.read_events(submission.turn_id, page_size=1)]
        still_blocked = not blocker.done()
        busy.set()
        await blocker
    finally:
        busy.set()
        await store.close()
    assert [e.type for e in first] == ["turn.started"]
    assert still_blocked  # read while the thread was busy: it never went there


def test_what_sqlite_cannot_write_for_now_and_what_needs_an_operator() -> None:
    def error(code: int) -> sqlite3.OperationalError:
        exc = sqlite3.OperationalError("refused")
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        return exc

    assert _sqlite.cannot_write(error(sqlite3.SQLITE_FULL)) == "is out of disk space"
    assert _sqlite.cannot_write(error(sqlite3.SQLITE_READONLY)) == "is read-only"
    assert _sqlite.cannot_write(error(sqlite3.SQLITE_READONLY_ROLLBACK)) == "is read-only"
    assert "I/O error" in str(_sqlite.cannot_write(error(sqlite3.SQLITE_IOERR_SHORT_READ)))
    # a file moved or deleted under the process does not come back by waiting
    assert _sqlite.cannot_write(error(sqlite3.SQLITE_READONLY_DBMOVED)) is None
    assert _sqlite.cannot_write(error(sqlite3.SQLITE_CONSTRAINT)) is None
    assert _sqlite.cannot_write(OSError("no code")) is None
