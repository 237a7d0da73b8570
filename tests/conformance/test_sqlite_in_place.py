"""SQLite writes run on the event loop only when they need not wait for the write lock.

Another connection (another process, a `turnkit worker`, a migration) holding the lock
must neither block the loop nor fail the write: the write moves to the store's thread,
waits there, and lands once the lock is free.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from tests.helpers import LoopTicker, new_input, step_event

from turnkit.errors import StoreError
from turnkit.events import ErrorEvent
from turnkit.graph import open_checkpointer
from turnkit.store import _engine as sql_module
from turnkit.store._schema import turns
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock

HOLD_S = 0.4


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    clock = FakeClock(datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC))
    async with SqlStore.from_url(f"sqlite:///{tmp_path / 'tk.db'}", clock=clock) as opened:
        yield opened


async def _while_locked(path: Path, write: Awaitable[Any]) -> tuple[Any, int, bool]:
    """Run `write` while another connection holds `path`'s write lock for HOLD_S.

    Returns the write's result, how often a 10 ms ticker ran on the loop meanwhile, and
    whether the write had finished before the lock was released.
    """
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    async with LoopTicker() as ticker:
        write_task = asyncio.ensure_future(write)
        await asyncio.sleep(HOLD_S)
        finished_early = write_task.done()
        other.execute("COMMIT")
        other.close()
        result = await asyncio.wait_for(write_task, 10)
    return result, ticker.ticks, finished_early


async def test_a_commit_waits_for_a_held_lock_off_the_loop(store: SqlStore, tmp_path: Path) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    commit = store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
    _, ticks, finished_early = await _while_locked(tmp_path / "tk.db", commit)
    assert not finished_early  # it waited for the lock instead of skipping or failing
    assert ticks >= HOLD_S / 0.01 / 2  # and the loop kept running while it waited
    assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2]


async def test_a_submit_waits_for_a_held_lock_off_the_loop(store: SqlStore, tmp_path: Path) -> None:
    sub, ticks, finished_early = await _while_locked(tmp_path / "tk.db", store.submit(new_input()))
    assert not finished_early
    assert ticks >= HOLD_S / 0.01 / 2
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.status == "running"


async def test_a_checkpoint_waits_for_a_held_lock_off_the_loop(tmp_path: Path) -> None:
    saver, close = await open_checkpointer(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint: Any = {
            "v": 4,
            "id": "1f0a0000-0000-6000-8000-000000000001",
            "ts": "2026-05-01T12:00:00+00:00",
            "channel_values": {"content": "hello"},
            "channel_versions": {"content": 1},
            "versions_seen": {},
        }
        put = saver.aput(config, checkpoint, {"source": "loop", "step": 0}, {})
        _, ticks, finished_early = await _while_locked(tmp_path / "tk.checkpoints.db", put)
        assert not finished_early
        assert ticks >= HOLD_S / 0.01 / 2
        found = await saver.aget_tuple({"configurable": {"thread_id": "t1"}})
        assert found is not None
        assert found.checkpoint["channel_values"] == {"content": "hello"}
    finally:
        await close()


async def test_times_are_stored_as_sqlalchemy_reads_them(store: SqlStore, tmp_path: Path) -> None:
    """Rows written on the raw path read back the same through SQLAlchemy (and Alembic)."""
    sub = await store.submit(new_input())
    engine = create_engine(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        with engine.connect() as conn:
            row = conn.execute(select(turns).where(turns.c.turn_id == sub.turn_id)).one()
    finally:
        engine.dispose()
    assert row.created_at == datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC).replace(
        tzinfo=None
    )  # SQLite keeps naive UTC
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.created_at == datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)


async def test_an_in_memory_store_works_and_forgets_on_close() -> None:
    for _ in range(2):
        async with SqlStore.from_url("sqlite://") as store:
            assert await store.list_sessions() == []
            sub = await store.submit(new_input())
            lease = await store.claim("w1", ttl_s=30, max_attempts=3)
            assert lease is not None
            assert lease.turn_id == sub.turn_id
            assert [e.seq async for e in store.read_events(sub.turn_id)] == [1]


async def test_the_wal_is_folded_back_while_writes_run_in_place(
    store: SqlStore, tmp_path: Path
) -> None:
    """The loop's connection never checkpoints the WAL itself; the store's thread does."""
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    body = "x" * 3000  # about one page per event
    for seq in range(2, 2002):
        event = ErrorEvent(
            session_id=sub.session_id,
            turn_id=sub.turn_id,
            stage_id="runtime",
            ts=datetime.now(UTC),
            seq=seq,
            code="internal-error",
            message=body,
        )
        await store.commit(sub.turn_id, epoch=lease.epoch, events=[event])
    wal = tmp_path / "tk.db-wal"
    # Folded every 256 commits in two passes (the second reaching the end of the log, so
    # it restarts), the log holds at most a few intervals' pages: ~7 MiB here, ~10 MiB
    # with both cores busy. Never folded, or folded only while writes go on, these 2,000
    # commits leave it at ~40 MiB.
    assert wal.stat().st_size < 16 * 1024 * 1024


async def test_the_checkpoint_wal_is_folded_back(tmp_path: Path) -> None:
    saver, close = await open_checkpointer(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        for n in range(2000):
            config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
            checkpoint: Any = {
                "v": 4,
                "id": f"1f0a0000-0000-6000-8000-{n:012d}",
                "ts": "2026-05-01T12:00:00+00:00",
                "channel_values": {"content": "y" * 6000},
                "channel_versions": {"content": n + 1},
                "versions_seen": {},
            }
            await saver.aput(config, checkpoint, {"source": "loop", "step": n}, {})
        wal = tmp_path / "tk.checkpoints.db-wal"
        # Folded every 256 commits in two passes, the log holds at most a few intervals'
        # pages: ~8 MiB here, ~10 MiB with both cores busy. Never folded, or folded only
        # while writes go on, these 2,000 checkpoints leave it at ~42 MiB.
        assert wal.stat().st_size < 16 * 1024 * 1024
    finally:
        await close()


async def test_a_lock_held_too_long_is_a_clear_error_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_module, "_THREAD_WAIT_MS", 200)
    async with SqlStore.from_url(f"sqlite:///{tmp_path / 'tk.db'}") as store:
        sub = await store.submit(new_input())
        lease = await store.claim("w1", ttl_s=30, max_attempts=3)
        assert lease is not None
        other = sqlite3.connect(tmp_path / "tk.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="stayed locked .* nothing was written"):
                await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
        finally:
            other.execute("COMMIT")
            other.close()
        assert [e.seq async for e in store.read_events(sub.turn_id)] == [1]
        await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
        assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2]


async def test_closing_the_checkpointer_waits_for_a_write_running_in_place(tmp_path: Path) -> None:
    """A turn still writing a checkpoint on the loop while the runtime closes: the
    connection is closed after that write, never under it (which crashed the process)."""
    saver, close = await open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}")
    conn: sqlite3.Connection = saver.conn  # type: ignore[attr-defined]
    lock = saver.lock  # type: ignore[attr-defined]
    lock.acquire()  # as `_in_batch` holds it for a write in place
    try:
        closing = asyncio.create_task(close())
        await asyncio.sleep(0.2)
        assert not closing.done()
        assert conn.execute("SELECT 1").fetchone() == (1,)  # still open under the write
    finally:
        lock.release()
    await asyncio.wait_for(closing, 10)
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")
