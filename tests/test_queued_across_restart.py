"""A message queued behind a paused turn, when the process restarts before the pause is
answered: answering it in the new process runs the paused turn and then the queued one."""

from __future__ import annotations

import asyncio

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent
from turnkit.states import TERMINAL_STATES
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def _runtime(url: str, schema: str | None, *steps: ModelStep) -> SessionRuntime:
    model = ScriptedModel([*steps, ModelStep.text_reply("Done.")], repeat_last=True)
    agent = Agent(name="desk", model=model, tools=[refund], skip_stages=frozenset({"anchor-plan"}))
    # The defaults: turns run in the process that took their message; no recovery loop.
    config = RuntimeConfig(database_url=url, database_schema=schema)
    return SessionRuntime(agent=agent, config=config)


async def _ended(runtime: SessionRuntime, turn_id: str, wait_s: float) -> str:
    async with asyncio.timeout(wait_s):
        while (status := (await runtime.turn(turn_id)).status) not in TERMINAL_STATES:
            await asyncio.sleep(0.05)
    return status


async def test_a_message_queued_behind_a_pause_runs_once_a_new_process_answers_it(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    async with _runtime(
        url, schema, ModelStep.tool_call_reply(call("refund", order_id="A1"))
    ) as before:
        events = await collect_events(before.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        queued = [await before.submit("s1", text) for text in ("and then?", "and after?")]
    # A deploy: the process that took both messages is gone.

    async with _runtime(url, schema) as after:  # its model answers each call "Done."
        await after.resume(asked.turn_id, asked.request_id, Approve(), principal="sam")
        assert await _ended(after, asked.turn_id, 15) == "succeeded"
        for later in queued:  # each in turn, down the session
            assert await _ended(after, later.turn_id, 15) == "succeeded"
        follow_up = await collect_events(after.execute_message("s1", "thanks"))
    assert follow_up[-1].status == "succeeded"  # type: ignore[attr-defined]
