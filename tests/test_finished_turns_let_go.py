"""A finished turn is let go when it ends: nothing keeps its recorder, state or transcript.

A turn's context carries LangGraph's config for the stage running, and through it the
whole turn. Whatever is scheduled on the event loop during a turn keeps a copy of that
context: a database driver's timers kept each turn alive for minutes (PostgreSQL), a
connection it opened for a turn kept that turn as long as it stayed open (its socket's
reader), so did a tool's time limit (cancelled, its timer stays until it would have
fired), and a checkpoint write held for the next transaction kept its turn until then
(SQLite).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sqlite3
import weakref
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from tests.conftest import POSTGRES_URL, RuntimeFactory, require_service
from tests.test_held_transcripts import _agent, _Model, _text
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import DoneEvent
from turnkit.graph._sqlite_saver import ThreadedSqliteSaver
from turnkit.telemetry import Recorder


def _watch_recorders(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Recorder]]:
    recorders: list[weakref.ref[Recorder]] = []
    made = Recorder.__init__

    def recording(self: Recorder, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        recorders.append(weakref.ref(self))

    monkeypatch.setattr(Recorder, "__init__", recording)
    return recorders


async def _held_after(
    runtime: SessionRuntime, recorders: list[weakref.ref[Recorder]], *, own_task: bool
) -> int:
    """Run four turns; how many of their recorders are still alive once they have ended."""

    async def one(n: int) -> None:
        ended = [e async for e in runtime.execute_message(f"s{n % 2}", _text("ascii", 120, n))]
        assert isinstance(ended[-1], DoneEvent)
        assert ended[-1].status == "succeeded"

    for n in range(4):
        await (asyncio.create_task(one(n)) if own_task else one(n))
    assert len(recorders) == 4
    alive = 4
    for _ in range(50):  # what runs after a turn's end (its aftermath) has its moment
        await asyncio.sleep(0.01)
        gc.collect()
        alive = sum(ref() is not None for ref in recorders)
        if not alive:
            break
    return alive


@pytest.mark.parametrize("keep", [False, True], ids=["pruned", "checkpoints-kept"])
@pytest.mark.parametrize("own_task", [True, False], ids=["task-per-turn", "in-caller"])
async def test_no_finished_turn_is_kept_alive(
    runtime_factory: RuntimeFactory,
    db: tuple[str, str | None],
    monkeypatch: pytest.MonkeyPatch,
    own_task: bool,
    keep: bool,
) -> None:
    recorders = _watch_recorders(monkeypatch)
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema, keep_ended_checkpoints=keep)
    runtime = runtime_factory(_agent("ascii"), config=config)
    assert await _held_after(runtime, recorders, own_task=own_task) == 0


async def test_a_tool_with_a_time_limit_keeps_no_finished_turn_alive(
    runtime_factory: RuntimeFactory, db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit's timer, cancelled when the tool returns, stays on the event loop until
    it would have fired: it holds nothing of the turn."""

    @tool(timeout_s=300)
    async def look_up(topic: str) -> str:
        """Look a topic up."""
        return _text("ascii", 600, topic)

    recorders = _watch_recorders(monkeypatch)
    url, schema = db
    agent = Agent(model=_Model("ascii"), tools=[look_up], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=url, database_schema=schema)
    runtime = runtime_factory(agent, config=config)
    assert await _held_after(runtime, recorders, own_task=True) == 0


class _TurnState:
    """Stands for what LangGraph runs a stage with (the turn's state, its recorder)."""


async def test_a_checkpoint_write_held_for_later_keeps_nothing_of_its_turn(tmp_path: Path) -> None:
    """SQLite: a task's writes wait for the next transaction, holding only what is stored."""
    saver = ThreadedSqliteSaver(str(tmp_path / "checkpoints.db"))
    await saver.asetup()
    turn = _TurnState()
    config: RunnableConfig = {
        "configurable": {
            "thread_id": "t1",
            "checkpoint_ns": "",
            "checkpoint_id": "c1",
            "__pregel_runtime": turn,
        },
        "metadata": {"turn": "t1", "state": turn},
    }
    await saver.aput_writes(config, [("answer", "kept")], task_id="task-1")
    held = weakref.ref(turn)
    del turn, config
    gc.collect()
    assert held() is None  # the write is still held, its turn let go
    await saver.aclose()  # writes what is held
    stored = sqlite3.connect(tmp_path / "checkpoints.db")
    try:
        rows = stored.execute("SELECT thread_id, checkpoint_id, task_id FROM writes").fetchall()
    finally:
        stored.close()
    assert rows == [("t1", "c1", "task-1")]


async def _pool(**options: Any) -> Any:
    """A real asyncpg pool, as turnkit's are made (no statement timers, no reset)."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    import asyncpg

    from turnkit.store._asyncpg_pool import NO_STATEMENT_EXPIRY, keep_session

    options.setdefault("reset", keep_session)
    return await asyncpg.create_pool(POSTGRES_URL, min_size=0, max_size=1, **options,
                                     **NO_STATEMENT_EXPIRY)  # fmt: skip


_turn_var: contextvars.ContextVar[_TurnState] = contextvars.ContextVar("turn")


async def test_a_connection_a_pool_opens_for_a_turn_keeps_nothing_of_it() -> None:
    """PostgreSQL: a connection opened while a turn runs (the pool had none free) keeps
    its socket's reader on the event loop for as long as it is open; that reader holds
    nothing of the turn, nor does the idle timeout set as the connection goes back."""
    from turnkit.store._asyncpg_pool import close_pool, pooled

    pool = await _pool()

    async def turn() -> weakref.ref[_TurnState]:
        state = _TurnState()
        _turn_var.set(state)
        async with pooled(pool) as conn:
            assert await conn.fetchval("SELECT 1") == 1
        return weakref.ref(state)

    try:
        for _ in range(2):  # the first opens the connection, the second reuses it
            held = await asyncio.create_task(turn())
            await asyncio.sleep(0)  # the task's own last callbacks
            gc.collect()
            assert held() is None
    finally:
        await close_pool(pool)  # cut after a few seconds if a connection is still out


async def test_a_pooled_connection_goes_back_when_its_user_is_cancelled_twice() -> None:
    """A Stop and then a drain cancel the same task: the second cancel, landing while the
    connection is being handed back, must not leave it out of the pool for good."""
    from turnkit.store._asyncpg_pool import close_pool, pooled

    releasing = asyncio.Event()

    async def slow_reset(_conn: object) -> None:
        releasing.set()
        await asyncio.sleep(0.05)  # as a round trip to reset the connection would

    pool = await _pool(reset=slow_reset)

    async def user() -> None:
        async with pooled(pool):
            await asyncio.sleep(3600)

    try:
        task = asyncio.create_task(user())
        for _ in range(500):
            if pool.get_size() and not pool.get_idle_size():
                break
            await asyncio.sleep(0.01)
        task.cancel()  # the first cancel: the `async with` hands the connection back
        await asyncio.wait_for(releasing.wait(), 5)
        task.cancel()  # the second, while it is being handed back
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):  # the pool's one connection is back
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT 1") == 1
    finally:
        await close_pool(pool)  # cut after a few seconds if a connection is still out
