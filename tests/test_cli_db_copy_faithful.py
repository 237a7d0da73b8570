"""`turnkit db copy` reads its source as one snapshot and copies every checkpoint as it is:
each thread's (a turn's row or not), and each pending write's task path."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL
from tests.test_cli_db_copy import DB, Databases, _config, _copy, _rows, _seed, dbs  # noqa: F401
from turnkit import Agent, SessionRuntime
from turnkit.events import DoneEvent
from turnkit.graph import open_checkpointer, sqlite_checkpoint_file
from turnkit.store import _copy_sql
from turnkit.testing import ModelStep, ScriptedModel, collect_events

KINDS = [("sqlite", "postgres"), ("postgres", "sqlite")]


async def _late_turn(db: DB) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Late.")]))
    async with SessionRuntime(agent=agent, config=_config(db)) as runtime:
        events = await collect_events(runtime.execute_message("late", "hello"))
    assert isinstance(events[-1], DoneEvent)


@pytest.mark.parametrize(("source_kind", "target_kind"), KINDS)
def test_a_turn_written_during_the_copy_is_not_half_copied(
    dbs: Databases,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    source_kind: str,
    target_kind: str,
) -> None:
    source, target = dbs.make(source_kind), dbs.make(target_kind)
    asyncio.run(_seed(source))
    before = asyncio.run(_rows(source))
    insert = _copy_sql._insert

    def insert_after_a_late_turn(conn: Any, table: Any, rows: Any) -> None:
        if table.name == "tk_sessions":  # the first table: the rest are still to be read
            writer = threading.Thread(target=lambda: asyncio.run(_late_turn(source)))
            writer.start()
            writer.join(timeout=60)
        insert(conn, table, rows)

    monkeypatch.setattr(_copy_sql, "_insert", insert_after_a_late_turn)

    code, out, err = _copy(source, target)

    assert (code, err) == (0, ""), err
    monkeypatch.undo()
    now = asyncio.run(_rows(source))
    assert len(now["tk_turns"]) == len(before["tk_turns"]) + 1  # the late turn is there
    assert asyncio.run(_rows(target)) == before  # and not in the copy, nor any part of it


async def _stray_thread(db: DB) -> None:
    """A checkpoint of a thread with no turn row (a LangGraph thread of the app's own)."""
    from langgraph.checkpoint.base import empty_checkpoint

    saver, close = await open_checkpointer(db[0], schema=db[1])
    try:
        config: Any = {"configurable": {"thread_id": "stray", "checkpoint_ns": ""}}
        await saver.aput(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    finally:
        await close()


async def _has_stray(db: DB) -> bool:
    saver, close = await open_checkpointer(db[0], schema=db[1])
    try:
        config: Any = {"configurable": {"thread_id": "stray", "checkpoint_ns": ""}}
        return await saver.aget_tuple(config) is not None
    finally:
        await close()


@pytest.mark.parametrize(("source_kind", "target_kind"), KINDS)
def test_checkpoints_of_a_thread_with_no_turn_are_copied(
    dbs: Databases,  # noqa: F811
    source_kind: str,
    target_kind: str,
) -> None:
    source, target = dbs.make(source_kind), dbs.make(target_kind)
    asyncio.run(_seed(source))
    asyncio.run(_stray_thread(source))

    code, out, err = _copy(source, target)

    assert (code, err) == (0, ""), err
    assert asyncio.run(_has_stray(target))
    assert "4 of 2 thread(s) in " in out


async def _task_paths(db: DB) -> dict[tuple[str, ...], str]:
    """Each stored pending write's task path, by thread, namespace, checkpoint, task, idx."""
    columns = "thread_id, checkpoint_ns, checkpoint_id, task_id, idx::text, task_path"
    if db[0].startswith("sqlite"):
        with sqlite3.connect(sqlite_checkpoint_file(db[0])) as conn:
            query = f"SELECT {columns.replace('::text', '')} FROM writes"
            rows: list[Any] = conn.execute(query).fetchall()
    else:
        import asyncpg

        conn_pg = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": db[1]})
        try:
            rows = [
                tuple(r) for r in await conn_pg.fetch(f"SELECT {columns} FROM checkpoint_writes")
            ]
        finally:
            await conn_pg.close()
    return {tuple(map(str, row[:5])): row[5] for row in rows}


@pytest.mark.parametrize(("source_kind", "target_kind"), KINDS)
def test_pending_writes_keep_their_task_path(
    dbs: Databases,  # noqa: F811
    source_kind: str,
    target_kind: str,
) -> None:
    source, target = dbs.make(source_kind), dbs.make(target_kind)
    asyncio.run(_seed(source))
    before = asyncio.run(_task_paths(source))
    assert any(before.values())  # the paused turn's interrupt, say, was written by a task

    code, out, err = _copy(source, target)

    assert (code, err) == (0, ""), err
    after = asyncio.run(_task_paths(target))
    assert after
    assert after == {key: before[key] for key in after}


@pytest.mark.parametrize(("source_kind", "target_kind"), KINDS)
def test_a_checkpoint_written_during_the_copy_is_not_copied(
    dbs: Databases,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    source_kind: str,
    target_kind: str,
) -> None:
    from turnkit.cli import _copy as cli_copy

    source, target = dbs.make(source_kind), dbs.make(target_kind)
    asyncio.run(_seed(source))
    listed = cli_copy.checkpoint_threads

    async def list_after_a_stray_thread(saver: Any) -> list[str]:
        await _stray_thread(source)  # after the reader's snapshot began
        return await listed(saver)

    monkeypatch.setattr(cli_copy, "checkpoint_threads", list_after_a_stray_thread)

    code, out, err = _copy(source, target)

    assert (code, err) == (0, ""), err
    assert "3 of 1 thread(s) in " in out
    assert asyncio.run(_has_stray(source))
    assert not asyncio.run(_has_stray(target))
