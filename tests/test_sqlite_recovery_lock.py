"""Reads on SQLite that meet a lock another process holds (its WAL recovery) wait for it
as the store's own reads do, slice after slice, and a close cuts that wait short."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.support.sqlite_locks import recovering, recovering_for
from turnkit.graph._sqlite_saver import ThreadedSqliteSaver
from turnkit.store._copy_sql import held
from turnkit.store._schema import sessions
from turnkit.store.sql import SqlStore


async def test_a_held_read_waits_out_another_processs_wal_recovery(tmp_path: Path) -> None:
    """`turnkit db copy` reads the source in one held transaction: its first read meeting
    a recovery in another process waits for it (it used to fail after one 50 ms slice)."""
    path = str(tmp_path / "source.db")
    async with SqlStore.from_url(f"sqlite:///{path}") as store:
        await store.setup()
        async with held(store, write=False) as tx:
            with recovering_for(path, 0.5):
                count = await tx.run(
                    lambda conn: conn.execute(select(func.count()).select_from(sessions)).first()
                )
        assert tuple(count) == (0,)


async def test_closing_the_saver_cuts_short_a_read_waiting_for_a_lock(tmp_path: Path) -> None:
    """A checkpoint read queued on the saver's thread behind another process's lock does
    not hold `aclose` for SQLite's 30 s busy timeout: the close gives the wait up."""
    path = str(tmp_path / "checkpoints.db")
    saver = ThreadedSqliteSaver(path)
    await saver.asetup()
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    closed = False
    with recovering(path):
        reading = asyncio.ensure_future(saver.aget_tuple(config))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # met the lock in place, queued on the thread
        assert not reading.done()
        try:
            async with asyncio.timeout(15):  # the wait used to be 30 s
                await saver.aclose()
            closed = True
        finally:
            if not closed:  # let the thread end before the lock is gone
                await asyncio.gather(reading, return_exceptions=True)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        await reading
