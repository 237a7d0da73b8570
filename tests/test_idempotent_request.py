"""A retried `request_id` returns the same turn instead of a second message."""

from __future__ import annotations

from tests.conftest import RuntimeFactory
from turnkit import Agent
from turnkit.events import DurableEvent
from turnkit.testing import ModelStep, ScriptedModel, collect_events


async def test_same_request_id_twice_is_one_turn(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Once.")])
    runtime = runtime_factory(Agent(model=model))
    first = await collect_events(runtime.execute_message("s1", "hi", request_id="req-1"))
    again = await collect_events(runtime.execute_message("s1", "hi", request_id="req-1"))
    assert [e for e in first if isinstance(e, DurableEvent)] == again
    assert len(model.calls) == 1
    assert len(await runtime.history("s1")) == 1
