"""The session's queued turns a process takes after a resumed turn ends (their own process
gone): taken within the process's bound on running turns, and never after it closed."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import GatedModel, until
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent
from turnkit.runtime import _host
from turnkit.runtime.driver import TurnDriver
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

RUNNING = asyncio.Event()
GO = asyncio.Event()


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order."""
    RUNNING.set()
    await GO.wait()
    return f"refunded {order_id}"


@pytest.fixture(autouse=True)
def _fresh_events() -> None:
    global RUNNING, GO
    RUNNING, GO = asyncio.Event(), asyncio.Event()


def _desk() -> Agent:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("refund", order_id="A1")), ModelStep.text_reply("Done.")],
        repeat_last=True,
    )
    return Agent(name="desk", model=model, tools=[refund], skip_stages=frozenset({"anchor-plan"}))


async def test_a_queued_turn_taken_after_a_resumed_one_waits_for_a_slot(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_host, "NEXT_TURN_GRACE_S", 0.1)
    busy_model = GatedModel()
    busy = Agent(name="busy", model=busy_model, skip_stages=frozenset({"anchor-plan"}))
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema, max_running_turns=1)
    async with SessionRuntime(agents=[_desk(), busy], config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1", agent="desk"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        # Queued behind the pause by a process that is gone (nothing here drives it).
        queued = await runtime.submit("s1", "and then?", agent="desk")

        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await until(RUNNING.is_set, "the approved call runs, in the only slot")
        other = await runtime.start("s2", "hi", agent="busy")  # waits for that slot
        await until(lambda: runtime.host.slots.waiting == 1, "the other turn waits")
        GO.set()
        await until(lambda: busy_model.active == 1, "the other turn takes the freed slot")

        await asyncio.sleep(1.0)  # well past the grace: the queued turn is due
        record = await runtime.turn(queued.turn_id)  # it waits for the slot, still queued
        assert (record.status, record.lease_owner) == ("running", None)
        assert runtime.host.slots.running == 1

        busy_model.gate.set()

        async def both_ended() -> bool:
            ids = (other.turn_id, queued.turn_id)
            return all([(await runtime.turn(t)).status == "succeeded" for t in ids])

        await until(both_ended, "the other turn, then the queued one, end")


async def test_no_next_turn_is_taken_once_the_runtime_closed(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime closes while a resumed turn that ended finishes its driver's last
    steps: the session's next turn is not taken after the close (nor left pending)."""
    monkeypatch.setattr(_host, "NEXT_TURN_GRACE_S", 0.1)
    release = TurnDriver._release_budget
    finishing = asyncio.Event()

    async def slow_release(self: TurnDriver) -> None:
        await release(self)
        if self.ended and self.lease.session_id == "s1" and self.lease.last_seq > 0:
            finishing.set()
            await asyncio.sleep(30)  # the close cancels this

    GO.set()
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    runtime = SessionRuntime(agent=_desk(), config=config)
    async with runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        queued = await runtime.submit("s1", "and then?")
        monkeypatch.setattr(TurnDriver, "_release_budget", slow_release)
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await asyncio.wait_for(finishing.wait(), 10)
    assert runtime.host._shielded == set(), "nothing of the closed runtime still runs"
    await asyncio.sleep(0.3)
    monkeypatch.undo()
    async with SessionRuntime(agent=_desk(), config=config) as probe:
        record = await probe.turn(queued.turn_id)
    assert record.status == "running"
    assert record.lease_owner is None  # queued still, for whoever runs the session next
