"""Closing the runtime while a turn's ending is being written hands the turn over.

The driver counts the turn as ended as its ending begins; a close that cut that ending
short (its commit never landed) left the turn `running` under the closed runtime's lease,
not handed over: until that lease lapsed, a Stop from the next runtime only flagged it
(`cancel` returned `running`) and no other process could take it. Found by
`tests/invariants/test_random_operations.py` (seed 19, PostgreSQL).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import turnkit.runtime.driver as driver
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.testing import ModelStep, ScriptedModel, collect_events

DB = tuple[str, str | None]


async def test_a_turn_closed_mid_ending_is_handed_over_and_a_stop_ends_it(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, schema = db
    ending = asyncio.Event()

    async def cut_short(*args: Any, **kwargs: Any) -> None:
        ending.set()  # the driver counts the turn as ended from here on
        await asyncio.Event().wait()  # until the runtime closes

    monkeypatch.setattr(driver, "end_succeeded", cut_short)
    config = RuntimeConfig(database_url=url, database_schema=schema)
    model = ScriptedModel([ModelStep.text_reply("an answer")])
    runtime = SessionRuntime(agent=Agent(model=model), config=config)
    await runtime.open()
    submission = await runtime.start("s1", "hello")
    await asyncio.wait_for(ending.wait(), 30)
    await runtime.close()

    async with SessionRuntime(agent=Agent(model=model), config=config) as again:
        record = await again.turn(submission.turn_id)
        assert (record.status, record.lease_owner) == ("running", "(handed over)")
        assert await again.cancel(submission.turn_id) == "cancelled"
        events = await collect_events(again.follow(submission.turn_id))
        assert events[-1].type == "done"
        assert events[-1].status == "cancelled"
