"""`close()` at awkward moments: a turn pausing for a person, a close whose database hangs,
a streamed turn whose driver is still being built.

Closing the runtime is never a Stop: whatever the moment, the turn is left to another
process (or stays paused), the caller's stream ends with `RuntimeClosedError` (or at the
pause it saw), and the turn finishes elsewhere running no tool and asking the model
nothing twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.helpers import follow_to_done, until
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.errors import RuntimeClosedError
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    DurableEvent,
    ToolCompletedEvent,
    TurnRecoveringEvent,
)
from turnkit.ids import TurnId
from turnkit.states import TERMINAL_STATES
from turnkit.testing import ModelStep, ScriptedModel, call

DB = tuple[str, str | None]
SENT: list[str] = []


@tool(approval="always")
async def send_email(to: str, ctx: ToolContext) -> str:
    """Send an email (needs a person's approval)."""
    SENT.append(to)
    return f"sent to {to}"


def _runtime(db: DB, model: ScriptedModel, *, recover: bool = False) -> SessionRuntime:
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, lease_ttl_s=3.0, recover_in_process=recover
    )
    return SessionRuntime(agent=Agent(model=model, tools=[send_email]), config=config)


async def _ended(runtime: SessionRuntime, turn_id: TurnId, within_s: float = 20) -> str:
    deadline = time.monotonic() + within_s
    while (status := (await runtime.turn(turn_id)).status) not in TERMINAL_STATES:
        assert time.monotonic() < deadline, f"{turn_id} still {status}"
        await asyncio.sleep(0.05)
    return status


def _gate_pause(
    runtime: SessionRuntime, *, after_commit: bool
) -> tuple[asyncio.Event, list[TurnId]]:
    """Hold the commit that moves a turn to waiting for a person (before or after it lands).

    Set once the commit is held; the held turn's id is noted.
    """
    store = runtime.store
    commit: Callable[..., Awaitable[Any]] = store.commit
    held = asyncio.Event()
    turns: list[TurnId] = []

    async def gated(turn_id: TurnId, **kw: Any) -> Any:
        if kw.get("pause") is None:
            return await commit(turn_id, **kw)
        turns.append(turn_id)
        if after_commit:
            result = await commit(turn_id, **kw)
            held.set()
            await asyncio.sleep(60)  # cancelled by close()
            return result
        held.set()
        await asyncio.sleep(60)  # cancelled by close()
        return await commit(turn_id, **kw)

    store.commit = gated  # type: ignore[method-assign]
    return held, turns


@pytest.mark.parametrize("after_commit", [False, True], ids=["before-commit", "after-commit"])
async def test_closing_as_a_turn_pauses_leaves_the_pause_to_answer_from_a_new_runtime(
    db: DB, after_commit: bool
) -> None:
    """`close()` lands as the turn's move to waiting for approval commits.

    Whether that commit landed or not, the turn is not lost, not ended and not run
    twice: a new runtime finds it waiting for the approval (asking again if the first
    request never committed), and answering it there sends the email once.
    """
    SENT.clear()
    first_model = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@x.org"))])
    first = _runtime(db, first_model)
    await first.open()
    held, turns = _gate_pause(first, after_commit=after_commit)
    seen: list[DurableEvent] = []

    async def read() -> None:
        async for event in first.execute_message("s1", "email Ada"):
            if isinstance(event, DurableEvent):
                seen.append(event)

    reading = asyncio.create_task(read())
    async with asyncio.timeout(10):
        await held.wait()
    async with asyncio.timeout(10):
        await first.close()
    with pytest.raises(RuntimeClosedError) as left:
        async with asyncio.timeout(10):
            await reading
    [turn_id] = turns
    assert left.value.details == {"turn_id": turn_id, "last_seq": seen[-1].seq}
    assert not [e for e in seen if isinstance(e, ApprovalRequestedEvent)]  # never sent

    second_model = ScriptedModel([ModelStep.text_reply("Sent.")])
    second = _runtime(db, second_model, recover=True)
    async with second:
        asked: list[ApprovalRequestedEvent] = []
        for _ in range(200):  # bounded: 10 s, until the turn waits for the approval
            if (await second.turn(turn_id)).status == "awaiting_approval":
                events = [e async for e in second.events(turn_id)]
                asked = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
                break
            await asyncio.sleep(0.05)
        [request] = asked  # asked once, committed once
        await second.resume(turn_id, request.request_id, Approve())
        rest = await follow_to_done(second, turn_id, request.seq)
        assert await _ended(second, turn_id) == "succeeded"
        events = [e async for e in second.events(turn_id)]
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert SENT == ["ada@x.org"]  # the email went once, after the approval
    assert len(first_model.calls) == 1
    assert len(second_model.calls) == 1  # the call that asked for the tool was not asked again
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("approval.requested") == 1
    assert len([e for e in events if isinstance(e, ToolCompletedEvent)]) == 1
    recovering = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    # The pause that never committed: the turn was handed over, and taken over at once.
    assert [e.cause for e in recovering] == ([] if after_commit else ["handed-over"])


async def _at_the_second_call(
    db: DB, log_path: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[SessionRuntime, list[DurableEvent], asyncio.Task[None]]:
    """A turn streamed to a caller, waiting on its second model call (the tool ran)."""
    from tests.support.shutdown_child import agent

    monkeypatch.setenv("TK_SHUTDOWN_LOG", str(log_path))
    url, schema = db
    settings = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=3.0)
    runtime = SessionRuntime(agent=agent(wait_s=60), config=settings)
    await runtime.open()
    seen: list[DurableEvent] = []

    async def read() -> None:
        async for event in runtime.execute_message("s1", "note A1"):
            if isinstance(event, DurableEvent):
                seen.append(event)

    reading = asyncio.create_task(read())
    await until(lambda: "model call 2" in log_path.read_text(), "the second call")
    return runtime, seen, reading


async def _taken_over_once(db: DB, turn_id: TurnId, log_path: Any) -> list[DurableEvent]:
    """A runtime recovering turns finishes the turn; its events (nothing ran twice)."""
    from tests.support.shutdown_child import agent, config

    url, schema = db
    settings = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=agent(wait_s=0, first=False), config=settings) as after:
        assert await _ended(after, turn_id) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    calls = [line.rsplit(" ", 1)[0] for line in log_path.read_text().splitlines()]
    # The tool ran once; the model was asked again only the call it had not answered.
    assert calls == ["model call 1", "tool A1", "model call 2", "model call 1"]
    return events


async def test_closing_when_the_hand_over_hangs_leaves_the_lease_to_lapse(
    db: DB, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that never answers the hand-over does not hold `close()` up for good.

    `close()` gives up on it, says so in the log, and the turn is taken over once its
    lease lapses instead.
    """
    log_path = tmp_path / "calls.txt"
    log_path.touch()
    runtime, seen, reading = await _at_the_second_call(db, log_path, monkeypatch)
    never = asyncio.Event()

    async def hangs(lease: Any) -> bool:
        await never.wait()
        return True

    monkeypatch.setattr(runtime.store, "hand_over", hangs)
    with caplog.at_level("WARNING", logger="turnkit.runtime"):
        async with asyncio.timeout(15):  # would wait for ever
            await runtime.close()
    with pytest.raises(RuntimeClosedError):
        async with asyncio.timeout(10):
            await reading
    turn_id = seen[0].turn_id
    assert [r for r in caplog.records if turn_id in r.getMessage() and "hand" in r.getMessage()]
    events = await _taken_over_once(db, turn_id, log_path)
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "lease-expired"  # never handed over: it lapsed


@pytest.mark.parametrize("db", ["postgres"], indirect=True)
async def test_closing_while_another_connection_locks_the_turns_row_returns(
    db: DB, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The turn's row is locked by another connection (an operator's open transaction):
    `close()` gives up on the hand-over rather than wait for the lock, and the turn is
    taken over once the lock is gone and its lease lapsed."""
    import asyncpg

    from tests.conftest import POSTGRES_URL

    log_path = tmp_path / "calls.txt"
    log_path.touch()
    runtime, seen, reading = await _at_the_second_call(db, log_path, monkeypatch)
    turn_id = seen[0].turn_id
    _, schema = db
    locker = await asyncpg.connect(POSTGRES_URL)
    try:
        locking = locker.transaction()
        await locking.start()
        await locker.execute(
            f'SELECT 1 FROM "{schema}".tk_turns WHERE turn_id = $1 FOR UPDATE', turn_id
        )
        with caplog.at_level("WARNING", logger="turnkit.runtime"):
            async with asyncio.timeout(15):  # would wait for the lock for ever
                await runtime.close()
        with pytest.raises(RuntimeClosedError):
            async with asyncio.timeout(10):
                await reading
        await locking.rollback()
    finally:
        await locker.close()
    assert [r for r in caplog.records if turn_id in r.getMessage() and "hand" in r.getMessage()]
    events = await _taken_over_once(db, turn_id, log_path)
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "lease-expired"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_closing_while_another_process_holds_the_sqlite_write_lock_returns(
    db: DB, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process keeps write transactions open on the SQLite files (the Store's
    and the checkpoints'): `close()` does not wait out the busy timeout (made ten minutes
    here) for the last writes; they give up, and the turn is taken over once the locks
    are gone and its lease lapsed. The checkpointer's writes and the store's share one
    window for the lock (made 5 s here) after the hand-over's, as the docs say: they
    used to wait one after the other."""
    import sqlite3

    from turnkit.graph import sqlite_checkpoint_file
    from turnkit.runtime.driver import HAND_OVER_WITHIN_S

    window = 5.0
    monkeypatch.setattr("turnkit.store._engine._THREAD_WAIT_MS", 600_000)
    monkeypatch.setattr("turnkit.store._engine.CLOSE_LOCK_WAIT_S", window)
    log_path = tmp_path / "calls.txt"
    log_path.touch()
    runtime, seen, reading = await _at_the_second_call(db, log_path, monkeypatch)
    turn_id = seen[0].turn_id
    files = (db[0].removeprefix("sqlite:///"), sqlite_checkpoint_file(db[0]))
    lockers = [sqlite3.connect(file, isolation_level=None) for file in files]
    try:
        for locker in lockers:
            locker.execute("BEGIN IMMEDIATE")
        # A task's writes the checkpointer holds for its next transaction: its close
        # waits for the lock to write them, as the store's waits for the hand-over's.
        saver = runtime._graph.checkpointer  # type: ignore[union-attr]
        other = {"configurable": {"thread_id": "other", "checkpoint_ns": "", "checkpoint_id": "1"}}
        await saver.aput_writes(other, [("notes", "held")], "task-1")
        assert saver._deferred
        with caplog.at_level("WARNING", logger="turnkit.runtime"):
            began = time.monotonic()
            async with asyncio.timeout(60):  # would wait for the lock for ten minutes
                await runtime.close()
            took = time.monotonic() - began
        assert all(locker.in_transaction for locker in lockers)  # closed under the locks
        assert took < HAND_OVER_WITHIN_S + window + 3, took  # not a window each (+ 5 s)
        with pytest.raises(RuntimeClosedError):
            async with asyncio.timeout(10):
                await reading
        for locker in lockers:
            locker.execute("ROLLBACK")
    finally:
        for locker in lockers:
            locker.close()
    assert [r for r in caplog.records if turn_id in r.getMessage() and "hand" in r.getMessage()]
    events = await _taken_over_once(db, turn_id, log_path)
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "lease-expired"


@pytest.mark.parametrize("moment", ["driver-built", "started-yielded"])
async def test_closing_before_a_streamed_turns_driver_runs_hands_the_turn_over(
    db: DB, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """`close()` lands after the turn was claimed for the caller's stream, before its
    driver runs: while the driver is built, or while the caller has yet to read past
    `turn.started`. The turn is handed over, not run here and not lost: the caller's
    stream ends with `RuntimeClosedError`, and a runtime recovering turns runs it once."""
    from tests.support.shutdown_child import agent
    from turnkit.runtime._runner import TurnRunner

    log_path = tmp_path / "calls.txt"
    log_path.touch()
    monkeypatch.setenv("TK_SHUTDOWN_LOG", str(log_path))
    building, built = asyncio.Event(), asyncio.Event()
    driver = TurnRunner.driver

    async def gated(self: TurnRunner, *args: Any, **kwargs: Any) -> Any:
        building.set()
        await built.wait()
        return await driver(self, *args, **kwargs)

    if moment == "driver-built":
        monkeypatch.setattr(TurnRunner, "driver", gated)
    url, schema = db
    settings = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=3.0)
    runtime = SessionRuntime(agent=agent(wait_s=60), config=settings)
    await runtime.open()
    stream = runtime.execute_message("s1", "note A1")
    started = await anext(stream)
    assert isinstance(started, DurableEvent)
    turn_id = started.turn_id
    pulling: asyncio.Task[Any] | None = None
    if moment == "driver-built":
        pulling = asyncio.ensure_future(anext(stream))
        async with asyncio.timeout(10):
            await building.wait()
    async with asyncio.timeout(10):
        await runtime.close()
    built.set()
    with pytest.raises(RuntimeClosedError) as left:
        async with asyncio.timeout(10):
            await (pulling if pulling is not None else anext(stream))
    assert left.value.details == {"turn_id": turn_id, "last_seq": started.seq}
    await stream.aclose()
    assert "model call" not in log_path.read_text()  # nothing of it ran here
    from tests.support.shutdown_child import config

    async with SessionRuntime(agent=agent(wait_s=0), config=config(url, schema)) as probe:
        record = await probe.turn(turn_id)
    assert (record.status, record.lease_owner) == ("running", "(handed over)")
    settings = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=agent(wait_s=0), config=settings) as after:
        assert await _ended(after, turn_id) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    calls = [line.rsplit(" ", 1)[0] for line in log_path.read_text().splitlines()]
    assert calls == ["model call 1", "tool A1", "model call 2"]  # each once
    assert [e.type for e in events].count("turn.started") == 1
