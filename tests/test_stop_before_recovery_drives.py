"""Stop of a turn the runtime's recovery loop claimed but has not started driving.

The recovery loop (`recover_in_process=True`) claims a queued turn, then builds its
driver. A Stop pressed in that gap found no driver to cancel and only flagged the turn:
`cancel` returned `running` in a single process, and the turn went on to call its model
(and run its tools) until its next lease renewal. Found by
`tests/invariants/test_random_operations.py` (seed 12).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.runtime._runner import TurnRunner
from turnkit.testing import ModelStep, ScriptedModel, collect_events

DB = tuple[str, str | None]


async def test_stop_while_the_recovery_loop_builds_the_driver_ends_the_turn_at_once(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, schema = db
    building = asyncio.Event()
    gate = asyncio.Event()
    build = TurnRunner.driver

    async def slow_build(self: TurnRunner, *args: Any, **kwargs: Any) -> Any:
        building.set()
        await gate.wait()
        return await build(self, *args, **kwargs)

    monkeypatch.setattr(TurnRunner, "driver", slow_build)
    model = ScriptedModel([ModelStep.text_reply("too late")])
    config = RuntimeConfig(database_url=url, database_schema=schema, recover_in_process=True)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        submission = await runtime.submit("s1", "hello")  # queued: the recovery loop takes it
        await asyncio.wait_for(building.wait(), 30)
        status = await runtime.cancel(submission.turn_id)
        gate.set()
        assert status == "cancelled"
        events = await collect_events(runtime.follow(submission.turn_id))
        assert events[-1].type == "done"
        assert events[-1].status == "cancelled"
        assert (await runtime.turn(submission.turn_id)).status == "cancelled"
    assert model.calls == []  # nothing ran after the Stop
