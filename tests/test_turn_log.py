"""A runtime driving its own turns logs them as a worker does: fallbacks, then each ending."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from tests.conftest import RuntimeFactory
from turnkit import Agent
from turnkit.errors import ProviderError
from turnkit.models.family import ModelFamily
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
    assert any(r.levelno == logging.WARNING and r.getMessage() == fallback for r in caplog.records)
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
