"""A batch whose calls were answered one by one, recovered after a crash mid-batch: each
call keeps its own person's answer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from turnkit import Agent, Approve, Deny, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, ToolCompletedEvent, ToolFailedEvent
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

RUNS: list[str] = []
HOLD = {"on": True}


@tool(approval="always")
async def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    RUNS.append(f"cancel {order_id}")
    return f"cancelled {order_id}"


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order (slowly)."""
    RUNS.append(f"refund {order_id}")
    for _ in range(500):  # bounded: 10 s
        if not HOLD["on"]:
            break
        await asyncio.sleep(0.02)
    return f"refunded {order_id}"


def _runtime(url: str, steps: list[ModelStep]) -> SessionRuntime:
    agent = Agent(name="desk", model=ScriptedModel(steps), tools=[cancel_order, refund])
    config = RuntimeConfig(database_url=url, lease_ttl_s=1.0, recover_in_process=True)
    return SessionRuntime(agent=agent, config=config)


async def _next_request(
    runtime: SessionRuntime, turn_id: str, after: int
) -> ApprovalRequestedEvent:
    events = await collect_events(runtime.follow(turn_id, after_seq=after))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent), asked
    return asked


async def test_a_call_keeps_its_own_answer_when_the_batch_is_recovered(tmp_path: Path) -> None:
    """The first call was denied (its result committed at once), the second approved and
    running when the process went away: recovered, the second is still the approved one."""
    RUNS.clear()
    HOLD["on"] = True
    url = f"sqlite:///{tmp_path / 'desk.db'}"
    first = _runtime(
        url,
        [
            ModelStep.tool_call_reply(
                call("cancel_order", order_id="A1"), call("refund", order_id="A1")
            )
        ],
    )
    await first.open()
    try:
        submission = await first.start("s1", "cancel and refund A1")
        asked = await _next_request(first, submission.turn_id, 0)
        assert asked.tool_name == "cancel_order"
        await first.resume(asked.turn_id, asked.request_id, Deny(note="keep the order"))
        asked = await _next_request(first, submission.turn_id, asked.seq)
        assert asked.tool_name == "refund"
        await first.resume(asked.turn_id, asked.request_id, Approve())
        for _ in range(250):  # bounded: until the approved refund runs
            if RUNS:
                break
            await asyncio.sleep(0.02)
        assert RUNS == ["refund A1"]
    finally:
        await first.close()  # the process goes away while the refund runs
    HOLD["on"] = False
    second = _runtime(url, [ModelStep.text_reply("Refunded, not cancelled.")])
    async with second:
        deadline = time.monotonic() + 30
        while (await second.turn(submission.turn_id)).status != "succeeded":
            assert time.monotonic() < deadline, "the turn was never recovered"
            await asyncio.sleep(0.05)
        events = [e async for e in second.events(submission.turn_id)]
    outcome = {
        e.result.tool_name: ("completed" if isinstance(e, ToolCompletedEvent) else e.code)
        for e in events
        if isinstance(e, ToolCompletedEvent | ToolFailedEvent)
    }
    assert outcome == {"cancel_order": "tool-denied", "refund": "completed"}
    assert "cancel A1" not in RUNS
