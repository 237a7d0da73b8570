"""DESIGN §5.1: every durable event is in the Store before it is yielded; seq is 1..N."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.conftest import RuntimeFactory
from tests.helpers import add

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import ProviderError, StoreError
from turnkit.events import (
    DoneEvent,
    DurableEvent,
    ErrorEvent,
    MessageDeltaEvent,
    StepStartEvent,
    StreamEvent,
)
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


async def test_a_model_call_starts_while_the_events_before_it_commit(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call does not wait for that commit; what it streams does, and goes out after it."""
    model = ScriptedModel([ModelStep.text_reply("Hello there, friend.")])
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan", "tool-loop"}))
    runtime = SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=db[0], database_schema=db[1])
    )
    await runtime.open()
    held, release = asyncio.Event(), asyncio.Event()
    commit = runtime.store.commit

    async def slow_commit(turn_id: TurnId, **kwargs: Any) -> Any:
        if any(isinstance(e, StepStartEvent) for e in kwargs["events"]) and not held.is_set():
            held.set()
            await asyncio.wait_for(release.wait(), 10)
        return await commit(turn_id, **kwargs)

    monkeypatch.setattr(runtime.store, "commit", slow_commit)
    seen: list[StreamEvent] = []

    async def read() -> None:
        async for event in runtime.execute_message("s1", "hi"):
            seen.append(event)

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(held.wait(), 10)
        for _ in range(200):  # the call starts while the step's commit is held
            if model.calls:
                break
            await asyncio.sleep(0.01)
        assert model.calls, "the model call waited for the commit of the events before it"
        await asyncio.sleep(0.05)
        assert not any(isinstance(e, StepStartEvent | MessageDeltaEvent) for e in seen)
        release.set()
        await asyncio.wait_for(reader, 10)
        stored = [e async for e in runtime.store.read_events(TurnId(seen[0].turn_id))]
    finally:
        release.set()
        reader.cancel()
        await runtime.close()
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    kinds = [e.type for e in seen if isinstance(e, StepStartEvent | MessageDeltaEvent)]
    assert kinds[0] == "step.start"
    assert "message.delta" in kinds
    assert "".join(e.text for e in seen if isinstance(e, MessageDeltaEvent)) == (
        "Hello there, friend."
    )


async def _first_step_commit_fails(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch, step: ModelStep
) -> tuple[ScriptedModel, list[StreamEvent]]:
    """A turn whose `step.start` commit fails 50 ms in, while its model call runs."""
    model = ScriptedModel([step])
    runtime = runtime_factory(
        Agent(model=model, skip_stages=frozenset({"anchor-plan", "tool-loop"}))
    )
    await runtime.open()
    commit = runtime.store.commit
    failed: list[bool] = []

    async def failing_commit(turn_id: TurnId, **kwargs: Any) -> Any:
        if any(isinstance(e, StepStartEvent) for e in kwargs["events"]) and not failed:
            failed.append(True)
            await asyncio.sleep(0.05)  # the call runs meanwhile
            raise StoreError("the database went away")
        return await commit(turn_id, **kwargs)

    monkeypatch.setattr(runtime.store, "commit", failing_commit)
    seen = [e async for e in runtime.execute_message("s1", "hi")]
    assert failed
    done = seen[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "failed"
    assert (await runtime.turn(done.turn_id)).status == "failed"
    durable = [e for e in seen if isinstance(e, DurableEvent)]
    assert [e.seq for e in durable] == list(range(1, len(durable) + 1))
    return model, seen


async def test_nothing_a_call_streamed_goes_out_when_the_commit_before_it_fails(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = ModelStep.text_reply("Hello there, friend.")
    model, seen = await _first_step_commit_fails(runtime_factory, monkeypatch, reply)
    assert model.calls
    assert not any(isinstance(e, MessageDeltaEvent) for e in seen)
    assert "StoreError" in next(e.message for e in seen if isinstance(e, ErrorEvent))


async def test_a_turn_still_ends_when_both_the_commit_before_a_call_and_the_call_fail(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ending commits what the failed commit left staged: the turn does not hang."""
    failing = ModelStep.fail(ProviderError("down", is_retriable=False))
    model, _ = await _first_step_commit_fails(runtime_factory, monkeypatch, failing)
    assert model.calls
