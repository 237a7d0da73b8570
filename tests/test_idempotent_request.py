"""A retried `request_id` returns the same turn instead of a second message."""

from __future__ import annotations

import asyncio

from tests.conftest import RuntimeFactory
from turnkit import Agent, tool
from turnkit.events import DoneEvent, DurableEvent, MessageCompleteEvent
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def test_same_request_id_twice_is_one_turn(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Once.")])
    runtime = runtime_factory(Agent(model=model))
    first = await collect_events(runtime.execute_message("s1", "hi", request_id="req-1"))
    again = await collect_events(runtime.execute_message("s1", "hi", request_id="req-1"))
    assert [e for e in first if isinstance(e, DurableEvent)] == again
    assert len(model.calls) == 1
    assert len(await runtime.history("s1")) == 1


@tool
async def slow_step() -> str:
    """A step that takes a while."""
    await asyncio.sleep(1.0)
    return "done slowly"


async def test_a_request_repeated_while_its_turn_runs_follows_it_to_the_end(
    runtime_factory: RuntimeFactory,
) -> None:
    """A retry that arrives mid-turn (a client that timed out, a tool asking a subagent
    again after a restart) gets the whole turn, not what was committed when it came."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_step")), ModelStep.text_reply("Done.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[slow_step]))
    first = asyncio.create_task(
        collect_events(runtime.execute_message("s1", "go", request_id="req-1"))
    )
    for _ in range(200):  # bounded: until the model has asked for the tool
        if model.calls:
            break
        await asyncio.sleep(0.01)
    again = await asyncio.wait_for(
        collect_events(runtime.execute_message("s1", "go", request_id="req-1")), 10
    )
    await first
    done = again[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    answers = [e for e in again if isinstance(e, MessageCompleteEvent) and e.block.is_answer]
    assert [a.block.text for a in answers] == ["Done."]
    assert len(model.calls) == 2  # one turn
