"""Closing the stream or a cancel token aborts the turn and records `user-aborted`."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncGenerator

import pytest

from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import Agent, CancelToken, RuntimeConfig
from turnkit.events import DoneEvent, MessageCompleteEvent, MessageDeltaEvent, RunFinishedEvent
from turnkit.models import Usage
from turnkit.testing import ModelStep, ScriptedModel, call


async def test_closing_the_generator_aborts_the_model_call(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.hang("Thinking about it")])
    runtime = runtime_factory(Agent(model=model))
    stream = runtime.execute_message("s1", "tell me a long story")
    turn_id = None
    async for event in stream:
        turn_id = event.turn_id
        if isinstance(event, MessageDeltaEvent):
            break
    await stream.aclose()
    assert turn_id is not None
    assert model.aborted == 1  # the provider stream itself was cancelled
    record = await runtime.turn(turn_id)
    assert record.status == "cancelled"
    assert record.error_code is None
    rows = await runtime.audit(turn_id)
    last = rows[-1]
    assert last.call is not None
    assert last.call.outcome == "user-aborted"
    assert last.identity.stage_id == "synthesize"
    # Partial usage: the request's estimated size, and the text streamed before the cut
    # ("Thinking about it", 17 characters: 5 tokens at four characters a token).
    assert last.call.input_tokens > 0
    assert last.call.output_tokens == 5
    usage = await runtime.store.read_usage(turn_id)  # type: ignore[arg-type]
    assert usage.output_tokens >= 5
    stored = [e async for e in runtime.events(turn_id)]
    assert isinstance(stored[-1], DoneEvent)
    assert stored[-1].status == "cancelled"
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))


async def test_closing_the_stream_at_turn_started_cancels_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    """Its driver had not begun: the turn still ends, and the session goes on at once."""
    model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    runtime = runtime_factory(Agent(model=model))
    stream = runtime.execute_message("s1", "hi")
    first = await anext(stream)
    await stream.aclose()
    record = await runtime.turn(first.turn_id)
    assert (record.status, record.lease_owner) == ("cancelled", None)
    stored = [e async for e in runtime.events(first.turn_id)]
    assert [e.seq for e in stored] == [1, 2]
    assert isinstance(stored[-1], DoneEvent)
    assert stored[-1].status == "cancelled"
    assert model.calls == []
    async with asyncio.timeout(10):
        again = [e async for e in runtime.execute_message("s1", "again")]
    assert isinstance(again[-1], DoneEvent)
    assert again[-1].status == "succeeded"


async def test_cancel_token_ends_the_stream_with_cancelled(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.hang("Working")])
    runtime = runtime_factory(Agent(model=model))
    token = CancelToken()
    events = []
    async with asyncio.timeout(10):
        async for event in runtime.execute_message("s1", "go", cancel=token):
            events.append(event)
            if isinstance(event, MessageDeltaEvent):
                token.cancel()
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "cancelled"
    assert done.error_code is None
    assert model.aborted == 1
    rows = await runtime.audit(done.turn_id)
    assert rows[-1].call is not None
    assert rows[-1].call.outcome == "user-aborted"


async def test_no_model_stream_is_left_to_the_garbage_collector(
    runtime_factory: RuntimeFactory,
) -> None:
    """A call that ends at `Finish` closes its stream (and the provider connection in it)
    itself, instead of leaving an unfinished generator for asyncio's finalizer."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("Five.")],
        repeat_last=True,
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    finalized: list[str] = []
    firstiter, finalizer = sys.get_asyncgen_hooks()
    assert finalizer is not None

    def record(agen: AsyncGenerator[object, None]) -> None:
        finalized.append(agen.ag_code.co_qualname)
        finalizer(agen)

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=record)
    try:
        events = [e async for e in runtime.execute_message("s1", "what is 2 + 3?")]
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert len(model.calls) >= 2
    assert [n for n in finalized if "Model" in n] == []


async def test_a_call_the_ceiling_cuts_short_is_audited_and_counted_and_its_text_kept(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """The turn times out mid-call: the provider billed what it streamed, as for a Stop."""
    model = ScriptedModel([ModelStep.hang("Thinking about it")])
    config = RuntimeConfig(  # a model call is never idle: its ceiling cuts it
        database_url=database_url, ceiling_s=0.5, idle_window_s=0.5, heartbeat_interval_s=0.05
    )
    runtime = runtime_factory(Agent(model=model), config=config)
    async with asyncio.timeout(20):
        events = [e async for e in runtime.execute_message("s1", "tell me a long story")]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
    assert model.aborted == 1

    rows = await runtime.audit(done.turn_id)
    last = rows[-1]
    assert last.call is not None
    assert (last.call.outcome, last.call.error_code) == ("error", "deadline-exceeded")
    assert last.identity.stage_id == "synthesize"
    assert last.call.input_tokens > 0
    assert last.call.output_tokens == 5  # "Thinking about it": 17 characters, estimated
    assert last.payloads.interrupted_block is not None
    usage = await runtime.store.read_usage(done.turn_id)  # type: ignore[arg-type]
    assert usage.model_calls >= 1
    assert usage.output_tokens >= 5
    finished = next(e for e in events if isinstance(e, RunFinishedEvent))
    assert finished.output_tokens >= 5  # the turn's own account counts the call too

    kept = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert [(e.block.text, e.block.interrupted) for e in kept] == [("Thinking about it", True)]
    history = await runtime.history("s1")
    assert "Thinking about it" in [b.text for b in history[0].blocks if hasattr(b, "text")]


async def test_a_call_cut_short_is_priced_as_the_turns_earlier_calls(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """A USD limit sees a call cut short: its estimate costs what the turn paid per token."""
    priced = dataclasses.replace(
        ModelStep.tool_call_reply(call("add", a=2, b=3)),
        usage=Usage(input_tokens=900, output_tokens=100, cost_usd=0.01),  # $0.00001 a token
    )
    model = ScriptedModel([priced, ModelStep.hang("Thinking about it")])
    config = RuntimeConfig(  # a model call is never idle: its ceiling cuts it
        database_url=database_url, ceiling_s=0.5, idle_window_s=0.5, heartbeat_interval_s=0.05
    )
    runtime = runtime_factory(
        Agent(model=model, tools=[add], skip_stages=frozenset({"anchor-plan"})), config=config
    )
    async with asyncio.timeout(20):
        events = [e async for e in runtime.execute_message("s1", "add 2 and 3, then talk")]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "timed_out"
    *_, cut = [r.call for r in await runtime.audit(done.turn_id) if r.call is not None]
    assert cut is not None
    assert cut.error_code == "deadline-exceeded"
    tokens = cut.input_tokens + cut.output_tokens
    assert tokens > 0
    assert cut.cost_usd == pytest.approx(tokens * 0.00001)
    usage = await runtime.store.read_usage(done.turn_id)  # type: ignore[arg-type]
    assert usage.cost_usd == pytest.approx(0.01 + tokens * 0.00001)


async def test_a_planning_call_the_ceiling_cuts_is_billed_what_it_wrote_unshown(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """The plan's text is never streamed to the person: it is still what the call wrote."""
    planner = ScriptedModel([ModelStep.hang('{"intent": "a long story", "depth": "none"')])
    config = RuntimeConfig(  # a model call is never idle: its ceiling cuts it
        database_url=database_url, ceiling_s=0.5, idle_window_s=0.5, heartbeat_interval_s=0.05
    )
    runtime = runtime_factory(Agent(model=ScriptedModel([]), utility_model=planner), config=config)
    async with asyncio.timeout(20):
        events = [e async for e in runtime.execute_message("s1", "tell me a long story")]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "timed_out"
    [row] = [r for r in await runtime.audit(done.turn_id) if r.call is not None]
    assert row.identity.stage_id == "anchor-plan"
    assert row.call is not None
    assert (row.call.outcome, row.call.error_code) == ("error", "deadline-exceeded")
    assert row.call.output_tokens == 11  # 43 characters written, none of them shown
    assert not [e for e in events if isinstance(e, MessageCompleteEvent)]  # nothing to keep
