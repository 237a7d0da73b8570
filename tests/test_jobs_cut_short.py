"""A job an earlier attempt dispatched is completed when this attempt's ending cuts it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import JobCompletedEvent, JobDispatchedEvent
from turnkit.testing import ModelStep, ScriptedModel, call
from turnkit.tools import ToolContext

REPORTED: list[int] = []


@tool
async def long_export(rows: int, ctx: ToolContext) -> int:
    """Export rows for a long time."""
    await ctx.report_progress(0.1, "started")
    REPORTED.append(rows)
    await asyncio.sleep(60)
    return rows


def _runtime(db: Path, model: ScriptedModel) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True)
    return SessionRuntime(agent=Agent(model=model, tools=[long_export]), config=config)


async def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_job_an_earlier_attempt_dispatched_is_completed_when_a_stop_cuts_it(
    tmp_path: Path,
) -> None:
    REPORTED.clear()
    db = tmp_path / "jobs.db"
    first = _runtime(db, ScriptedModel([ModelStep.tool_call_reply(call("long_export", rows=1))]))
    await first.open()
    submission = await first.start("s1", "export")

    async def reported_once() -> bool:
        return len(REPORTED) >= 1

    await _until(reported_once, "the first attempt's report")
    await first.close()  # the process dies while the job runs
    second = _runtime(db, ScriptedModel([ModelStep.text_reply("Done.")]))
    await second.open()
    try:

        async def reported_twice() -> bool:
            return len(REPORTED) >= 2

        await _until(reported_twice, "the recovered attempt runs the job again")
        await second.cancel(submission.turn_id)

        async def ended() -> bool:
            return (await second.turn(submission.turn_id)).status != "running"

        await _until(ended, "the Stop")
        events = [e async for e in second.events(submission.turn_id)]
    finally:
        await second.close()
    assert events[-1].type == "done"
    assert [e for e in events if isinstance(e, JobDispatchedEvent)]
    # docs/concepts/tools.md: job.completed when the turn ends while the job runs
    assert [e for e in events if isinstance(e, JobCompletedEvent)], " ".join(e.type for e in events)
