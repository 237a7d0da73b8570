"""`delivery=guide`: a message joins the running turn before its next model request, or,
if the turn never presents it, is answered by a turn of its own (never stranded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.conftest import RuntimeFactory
from tests.helpers import PostTurnGate
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import (
    ApprovalRequestedEvent,
    InputGuidedEvent,
    MessageCompleteEvent,
    ToolStartedEvent,
    TurnStartedEvent,
)
from turnkit.ids import SessionId
from turnkit.pauses import Approve
from turnkit.store import TurnRecord
from turnkit.testing import ModelStep, ScriptedModel, call


async def _drain(stream: AsyncIterator[object], sink: list[object]) -> None:
    async for event in stream:
        sink.append(event)


async def _wait_for(check: object, limit_s: float = 10) -> None:
    async with asyncio.timeout(limit_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def _slow_lookup(release: asyncio.Event) -> object:
    @tool
    async def slow_lookup(q: str) -> str:
        """Look something up, slowly."""
        await release.wait()
        return f"found {q}"

    return slow_lookup


async def _answered_by_a_second_turn(runtime: SessionRuntime) -> list[TurnRecord]:
    """Session s1's turns, once its second turn has succeeded (at most 10 s)."""
    async with asyncio.timeout(10):
        while True:
            turns = await runtime.store.list_turns(SessionId("s1"))
            if len(turns) == 2 and turns[1].status == "succeeded":
                return turns
            await asyncio.sleep(0.02)


async def test_a_guide_joins_the_running_turn_before_the_next_request(
    runtime_factory: RuntimeFactory,
) -> None:
    release = asyncio.Event()
    slow_lookup = _slow_lookup(release)
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_lookup", q="A")),
            ModelStep.text_reply("Checked A, and B as you asked."),
            ModelStep.text_reply("A and B are fine."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[slow_lookup]))
    events: list[object] = []
    consumer = asyncio.create_task(_drain(runtime.execute_message("s1", "check A"), events))
    await _wait_for(lambda: any(isinstance(e, ToolStartedEvent) for e in events))
    guided = await runtime.submit("s1", "also check B", delivery="guide")
    assert guided.guided
    assert guided.delivery == "guide"
    assert guided.turn_id == events[0].turn_id  # type: ignore[attr-defined]
    release.set()
    await asyncio.wait_for(consumer, 10)

    [joined] = [e for e in events if isinstance(e, InputGuidedEvent)]
    assert (joined.content, joined.input_seq) == ("also check B", 2)
    second_request = model.calls[1].messages
    assert (second_request[-1].role, second_request[-1].content) == ("user", "also check B")
    answers = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert answers[-1].input_seqs == (1, 2)  # the answer consumed both messages
    assert len(await runtime.store.list_turns(SessionId("s1"))) == 1


@pytest.mark.parametrize("durability", ["async", "exit"])
async def test_a_guide_joins_before_the_next_request_whatever_the_checkpoints(
    db: tuple[str, str | None], durability: str
) -> None:
    """With checkpoints written beside the work (`async`, PostgreSQL's default) no commit
    reports the guide before the next request is built: the process that took the
    guide tells its driver."""
    url, schema = db
    release = asyncio.Event()
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_lookup", q="A")),
            ModelStep.text_reply("Checked A, and B as you asked."),
        ]
    )
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        checkpoint_durability=durability,  # type: ignore[arg-type]
    )
    async with SessionRuntime(
        agent=Agent(model=model, tools=[_slow_lookup(release)]), config=config
    ) as runtime:
        events: list[object] = []
        consumer = asyncio.create_task(_drain(runtime.execute_message("s1", "check A"), events))
        await _wait_for(lambda: any(isinstance(e, ToolStartedEvent) for e in events))
        assert (await runtime.submit("s1", "also check B", delivery="guide")).guided
        release.set()
        await asyncio.wait_for(consumer, 10)
        assert len(await runtime.store.list_turns(SessionId("s1"))) == 1
    [joined] = [e for e in events if isinstance(e, InputGuidedEvent)]
    assert joined.content == "also check B"
    assert model.calls[1].messages[-1].content == "also check B"


async def test_a_guide_the_turn_never_presented_gets_its_own_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    gate = PostTurnGate()
    model = ScriptedModel([ModelStep.text_reply("First answer."), ModelStep.text_reply("Second.")])
    runtime = runtime_factory(Agent(model=model, plugins=[gate]))
    events: list[object] = []
    consumer = asyncio.create_task(_drain(runtime.execute_message("s1", "first"), events))
    await asyncio.wait_for(gate.entered.wait(), 10)  # the answer is written; post-turn runs
    late = await runtime.submit("s1", "one more thing", delivery="guide")
    assert late.guided
    # The answer exists, but the turn has not ended: the guide is still queued on it.
    [queued] = await runtime.queue("s1")
    assert (queued.content, queued.delivery, queued.turn_id) == (
        "one more thing", "guide", late.turn_id,
    )  # fmt: skip
    gate.release.set()
    await asyncio.wait_for(consumer, 10)

    turns = await _answered_by_a_second_turn(runtime)
    started = [e async for e in runtime.events(turns[1].turn_id)][0]
    assert isinstance(started, TurnStartedEvent)
    assert (started.content, started.input_seq) == ("one more thing", 2)
    assert (started.delivery, started.requested_delivery) == ("queue", "guide")
    assert [t.answer for t in await runtime.history("s1")] == ["First answer.", "Second."]
    assert await runtime.queue("s1") == []


@tool(approval="always")
async def wire(amount: int) -> str:
    """Send money (needs approval)."""
    return f"sent {amount}"


async def test_an_answered_pause_leaves_the_pending_list_before_the_turn_goes_on(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("wire", amount=5))])
    asking = runtime_factory(Agent(model=model, tools=[wire]))
    events = [e async for e in asking.execute_message("s1", "pay 5")]
    asked = next(e for e in events if isinstance(e, ApprovalRequestedEvent))
    # A runtime that does not run turns itself: the answer is stored, nobody goes on yet.
    config = RuntimeConfig(database_url=database_url, run_in_process=False)
    answering = runtime_factory(Agent(model=model, tools=[wire]), config=config)
    await answering.open()
    assert [p.request_id for p in await answering.pending("s1")] == [asked.request_id]
    await answering.resume(asked.turn_id, asked.request_id, Approve())
    assert await answering.pending("s1") == []
    [turn] = (await answering.view("s1")).turns
    assert (turn.pending, turn.status) == (None, "running")


@pytest.mark.parametrize("ending", ["stop", "abort"])
async def test_a_guide_left_by_a_stopped_turn_gets_its_own_turn(
    runtime_factory: RuntimeFactory, ending: str
) -> None:
    """Stop (a detached turn) or closing `execute_message` (an attached one) ends the turn
    before it presented the guide: the guide still gets answered, in this process."""
    release = asyncio.Event()
    slow_lookup = _slow_lookup(release)
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_lookup", q="A")), ModelStep.text_reply("B is fine.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[slow_lookup]))
    guide = ("s1", "also check B")
    if ending == "stop":
        first = await runtime.start("s1", "check A")
        async with asyncio.timeout(10):
            while not [e async for e in runtime.events(first.turn_id) if e.type == "tool.started"]:
                await asyncio.sleep(0.01)
        assert (await runtime.submit(*guide, delivery="guide")).guided
        assert await runtime.cancel(first.turn_id) == "cancelled"
    else:
        stream = runtime.execute_message("s1", "check A")
        async with asyncio.timeout(10):
            async for event in stream:
                if isinstance(event, ToolStartedEvent):
                    break
        assert (await runtime.submit(*guide, delivery="guide")).guided
        await stream.aclose()

    turns = await _answered_by_a_second_turn(runtime)
    assert turns[0].status == "cancelled"
    started = [e async for e in runtime.events(turns[1].turn_id)][0]
    assert isinstance(started, TurnStartedEvent)
    assert started.content == "also check B"
    assert [t.answer for t in await runtime.history("s1")][-1] == "B is fine."
