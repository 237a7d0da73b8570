"""Group commit: write transactions queued while the store's thread is busy share one
transaction, each in a savepoint; one that fails is rolled back alone."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from turnkit.errors import StoreError
from turnkit.store import _sqlite as sqlite_conn
from turnkit.store._group_commit import BEHIND_SHARE, MAX_BATCH, GroupCommit


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "group.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    raw.commit()
    raw.close()
    return path


def _group(path: Path) -> tuple[GroupCommit, ThreadPoolExecutor]:
    thread = ThreadPoolExecutor(1)
    conn = sqlite_conn.connect(str(path), busy_timeout_ms=2000, autocheckpoint=True)
    return GroupCommit(thread, lambda: conn, lambda exc: exc), thread


def _insert(conn: sqlite_conn.SqliteConnection, key: int) -> int:
    time.sleep(0.002)  # a transaction that takes a moment: others queue meanwhile
    conn.raw.execute("INSERT INTO t (k) VALUES (?)", (key,))
    return key


def _insert_then_fail(conn: sqlite_conn.SqliteConnection, key: int) -> int:
    conn.raw.execute("INSERT INTO t (k) VALUES (?)", (key,))
    raise StoreError(f"refused {key}")


def _stored(path: Path) -> set[int]:
    raw = sqlite3.connect(path)
    try:
        return {k for (k,) in raw.execute("SELECT k FROM t")}
    finally:
        raw.close()


async def test_writes_queued_meanwhile_commit_together_and_each_caller_gets_its_result(
    db: Path,
) -> None:
    group, thread = _group(db)
    try:
        results = await asyncio.gather(*(group.run(_insert, k) for k in range(100)))
    finally:
        thread.shutdown(wait=True)
    assert results == list(range(100))
    assert _stored(db) == set(range(100))
    assert group.committed == 100
    assert group.batches < 100 // 4  # most of them shared a transaction
    assert group.batches >= 100 // MAX_BATCH


async def test_one_failure_is_rolled_back_alone(db: Path) -> None:
    group, thread = _group(db)
    try:
        outcomes = await asyncio.gather(
            *(group.run(_insert_then_fail if k == 7 else _insert, k) for k in range(20)),
            return_exceptions=True,
        )
    finally:
        thread.shutdown(wait=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failed) == 1
    assert isinstance(failed[0], StoreError)
    assert str(failed[0]).startswith("refused 7")
    assert _stored(db) == set(range(20)) - {7}  # its insert was undone, no other was


async def test_a_lone_write_runs_at_once_without_waiting_for_company(db: Path) -> None:
    group, thread = _group(db)
    try:
        assert await asyncio.wait_for(group.run(_insert, 1), 5) == 1
        assert await asyncio.wait_for(group.run(_insert, 2), 5) == 2
    finally:
        thread.shutdown(wait=True)
    assert (group.batches, group.committed) == (2, 2)
    assert _stored(db) == {1, 2}


async def test_new_work_waits_behind_work_in_progress_but_keeps_a_share_of_each_batch(
    db: Path,
) -> None:
    group, thread = _group(db)
    order: list[int] = []

    def record(conn: sqlite_conn.SqliteConnection, key: int) -> int:
        if key == -1:
            time.sleep(0.1)  # the thread is busy while the others queue
        order.append(key)
        return _insert(conn, key)

    try:
        blocker = asyncio.create_task(group.run(record, -1))
        await asyncio.sleep(0.02)
        new = [group.run(record, 1000 + k, behind=True) for k in range(40)]
        running = [group.run(record, k) for k in range(40)]
        await asyncio.gather(blocker, *new, *running)
    finally:
        thread.shutdown(wait=True)
    share = BEHIND_SHARE
    ahead = MAX_BATCH - share
    assert order[1:] == [
        *range(ahead), *range(1000, 1000 + share),  # a batch: mostly work in progress
        *range(ahead, 40), *range(1000 + share, 1000 + 2 * share),
        *range(1000 + 2 * share, 1040),  # then the rest of the new work
    ]  # fmt: skip
    assert _stored(db) == {-1, *range(40), *range(1000, 1040)}
