"""Stop of a turn streamed to a caller here whose driver has not begun.

`execute_message` claims its turn with the message and yields `turn.started`; the turn's
driver is built and runs only as the caller reads on. A Stop pressed in that gap found no
driver to cancel and only flagged the turn: `cancel` returned `running` in a single
process, and the turn went on to call its model once the caller read on (until the flag
reached it at a lease renewal). Found by `tests/invariants/test_random_operations.py`
(seed 5, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.runtime._runner import TurnRunner
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel, collect_events

DB = tuple[str, str | None]


def _runtime(db: DB, model: ScriptedModel) -> SessionRuntime:
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    return SessionRuntime(agent=Agent(model=model), config=config)


async def test_stop_before_the_caller_reads_past_turn_started_ends_the_turn(db: DB) -> None:
    model = ScriptedModel([ModelStep.text_reply("too late")])
    async with _runtime(db, model) as runtime:
        stream = runtime.execute_message("s1", "hello")
        async with contextlib.aclosing(stream):
            started = await anext(stream)
            assert started.type == "turn.started"
            status = await runtime.cancel(started.turn_id)
            assert status == "cancelled"
            rest = await collect_events(stream)
        assert [e.type for e in rest][-1:] == ["done"]
        assert rest[-1].status == "cancelled"
        assert (await runtime.turn(started.turn_id)).status == "cancelled"
        assert [e.type for e in await collect_events(runtime.follow(started.turn_id))][-1] == (
            "done"
        )
    assert model.calls == []  # nothing ran after the Stop


async def test_stop_while_the_streamed_turns_driver_is_built_ends_the_turn(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    building = asyncio.Event()
    gate = asyncio.Event()
    build = TurnRunner.driver

    async def slow_build(self: TurnRunner, *args: Any, **kwargs: Any) -> Any:
        building.set()
        await gate.wait()
        return await build(self, *args, **kwargs)

    monkeypatch.setattr(TurnRunner, "driver", slow_build)
    model = ScriptedModel([ModelStep.text_reply("too late")])
    async with _runtime(db, model) as runtime:
        stream = runtime.execute_message("s1", "hello")
        started = await anext(stream)
        reading = asyncio.create_task(collect_events(stream))
        await asyncio.wait_for(building.wait(), 30)
        status = await runtime.cancel(started.turn_id)
        gate.set()
        assert status == "cancelled"
        rest = await reading
        assert rest[-1].type == "done"
        assert rest[-1].status == "cancelled"
        assert (await runtime.turn(started.turn_id)).status == "cancelled"
    assert model.calls == []  # nothing ran after the Stop


async def test_stop_while_a_claim_of_the_turn_here_is_landing_ends_the_turn(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn waited behind an earlier one; Stop lands as this process claims it.

    The claim committed, but its driver was not registered yet: the Stop found none here
    and only flagged the turn (`running`), and the turn ran once the claim landed.
    """
    claim, cancel = SqlStore.claim, SqlStore.cancel
    target: list[str] = []
    claimed, flagged = asyncio.Event(), asyncio.Event()

    async def held_claim(self: SqlStore, *args: Any, **kwargs: Any) -> Any:
        lease = await claim(self, *args, **kwargs)
        if lease is not None and lease.turn_id in target:
            claimed.set()  # committed; whoever claimed it has not heard yet
            await flagged.wait()
        return lease

    async def seen_cancel(self: SqlStore, turn_id: Any, **kwargs: Any) -> Any:
        status = await cancel(self, turn_id, **kwargs)
        if turn_id in target:
            flagged.set()  # the Stop reached the Store: the claim may land now
        return status

    monkeypatch.setattr(SqlStore, "claim", held_claim)
    monkeypatch.setattr(SqlStore, "cancel", seen_cancel)
    model = ScriptedModel([ModelStep.hang(), ModelStep.text_reply("too late")])
    async with _runtime(db, model) as runtime:
        first = await runtime.start("s1", "first")  # runs until stopped
        stream = runtime.execute_message("s1", "second")  # waits behind it
        started = await anext(stream)
        target.append(started.turn_id)
        reading = asyncio.create_task(collect_events(stream))
        stopping_first = asyncio.create_task(runtime.cancel(first.turn_id))
        await asyncio.wait_for(claimed.wait(), 30)
        status = await runtime.cancel(started.turn_id)
        assert status == "cancelled"
        assert await stopping_first == "cancelled"
        rest = await reading
        assert rest[-1].type == "done"
        assert rest[-1].status == "cancelled"
        assert (await runtime.turn(started.turn_id)).status == "cancelled"
    said = [str(m.content) for request in model.calls for m in request.messages]
    assert "second" not in said  # the second turn never ran
