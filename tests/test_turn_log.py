"""A runtime driving its own turns logs them as a worker does: fallbacks, then each ending."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from tests.conftest import RuntimeFactory
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import ProviderError
from turnkit.events import DoneEvent, TurnRecoveringEvent
from turnkit.models.family import ModelFamily
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "turnkit.runtime"]


async def test_a_streamed_turn_logs_its_fallback_and_its_ending(
    runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkit.runtime")
    busy = ProviderError("overloaded", status_code=503, is_retriable=True)
    family = ModelFamily(
        "f",
        [
            ScriptedModel([ModelStep.cut("Partial ", busy)], name="first"),
            ScriptedModel([ModelStep.text_reply("Hello.")], name="second"),
        ],
    )
    runtime = runtime_factory(Agent(model=family, skip_stages=frozenset({"anchor-plan"})))
    events = [e async for e in runtime.execute_message("s-log", "hi")]
    turn_id = events[-1].turn_id

    lines = _lines(caplog)
    [fallback] = [line for line in lines if line.startswith(f"turn {turn_id}: model first")]
    assert fallback.endswith("; trying second")
    # INFO: the caller streams the same `provider.cascade`; an app with no logging set up
    # would get a WARNING on stderr (a worker, an operator's process, warns).
    assert any(r.levelno == logging.INFO and r.getMessage() == fallback for r in caplog.records)
    [done] = [line for line in lines if line.startswith(f"finished turn {turn_id} ")]
    assert re.fullmatch(
        rf"finished turn {turn_id} \(session s-log\): succeeded in (\d+ ms|\d+\.\d s)", done
    )


async def test_a_started_turn_logs_how_it_failed(
    runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkit.runtime")
    refused = ModelStep.fail(ProviderError("bad request", status_code=400))
    runtime = runtime_factory(
        Agent(model=ScriptedModel([refused]), skip_stages=frozenset({"anchor-plan"}))
    )
    submission = await runtime.start("s-bg", "hi")  # driven in a task of the runtime
    async with asyncio.timeout(10):
        while (await runtime.turn(submission.turn_id)).status == "running":
            await asyncio.sleep(0.02)
        while not any(line.startswith("finished turn") for line in _lines(caplog)):
            await asyncio.sleep(0.02)
    [done] = [line for line in _lines(caplog) if line.startswith("finished turn")]
    assert done.startswith(
        f"finished turn {submission.turn_id} (session s-bg): failed (provider-error) in "
    )


async def test_closing_a_runtime_hands_its_running_turns_over_and_says_so(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A deploy of a one-process server: the next process takes the turn over at once."""
    caplog.set_level(logging.INFO, logger="turnkit.runtime")
    config = RuntimeConfig(database_url=database_url, lease_ttl_s=60)
    first = SessionRuntime(agent=Agent(model=ScriptedModel([ModelStep.hang("Hm")])), config=config)
    await first.open()
    submission = await first.start("s-deploy", "hi")
    async with asyncio.timeout(10):
        while (await first.turn(submission.turn_id)).last_seq < 3:  # it is under way
            await asyncio.sleep(0.02)
    await first.close()
    [left] = [line for line in _lines(caplog) if line.startswith("finished turn")]
    assert left.startswith(
        f"finished turn {submission.turn_id} (session s-deploy): left to another process "
        "(shutting down) in "
    )
    answers = ScriptedModel([ModelStep.text_reply("Done.")])
    second = SessionRuntime(agent=Agent(model=answers), config=config)
    try:
        await second.open()
        worker = Worker(second, poll_interval_s=0.02)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        async with asyncio.timeout(20):  # not after the 60 s lease
            while (await second.turn(submission.turn_id)).status == "running":
                await asyncio.sleep(0.02)
        stop.set()
        await running
        events = [e async for e in second.events(submission.turn_id)]
    finally:
        await second.close()
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "handed-over"
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


async def test_closing_hands_over_a_turn_whose_driver_is_still_being_built(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed between its claim and its first step: no driver yet, and still handed over."""
    from turnkit.runtime._runner import TurnRunner

    building = asyncio.Event()

    async def slow_driver(self: TurnRunner, *args: object, **kwargs: object) -> object:
        building.set()
        await asyncio.Event().wait()  # until the close cancels it
        raise AssertionError("unreachable")

    monkeypatch.setattr(TurnRunner, "driver", slow_driver)
    config = RuntimeConfig(database_url=database_url, lease_ttl_s=60)
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    await runtime.open()
    submission = await runtime.start("s-early", "hi")
    async with asyncio.timeout(10):
        await building.wait()
    await runtime.close()
    monkeypatch.undo()
    async with SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config) as after:
        record = await after.turn(submission.turn_id)
    assert record.status == "running"
    assert record.lease_owner == "(handed over)"  # free now, not in 60 s
