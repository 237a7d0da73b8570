"""DESIGN §5.1: every durable event is in the Store before it is yielded; seq is 1..N."""

from __future__ import annotations

from tests.conftest import RuntimeFactory
from tests.helpers import add

from turnkit import Agent
from turnkit.events import DurableEvent
from turnkit.ids import TurnId
from turnkit.testing import ModelStep, ScriptedModel, call


async def test_each_durable_event_is_stored_before_it_is_yielded(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=1, b=1), call("add", a=2, b=2)),
            ModelStep.text_reply("Both done."),
            ModelStep.text_reply("2 and 4."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    seqs: list[int] = []
    async for event in runtime.execute_message("s1", "add things"):
        if isinstance(event, DurableEvent):
            stored = [s async for s in runtime.store.read_events(TurnId(event.turn_id))]
            assert stored, "nothing was stored before the first durable event was yielded"
            assert stored[-1].seq >= event.seq
            match = next(s for s in stored if s.seq == event.seq)
            assert match.decode() == event
            seqs.append(event.seq)
    assert seqs == list(range(1, len(seqs) + 1))


async def test_store_holds_exactly_what_was_yielded(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello there, friend.")])
    runtime = runtime_factory(Agent(model=model))
    yielded = [e async for e in runtime.execute_message("s1", "hi") if isinstance(e, DurableEvent)]
    stored = [e async for e in runtime.events(yielded[0].turn_id)]
    assert stored == yielded
    record = await runtime.turn(yielded[0].turn_id)
    assert record.last_seq == len(yielded)
