"""A finished turn leaves no reference cycles of turnkit's objects behind.

Whatever a turn builds (its driver, Recorder, stage context) is freed by reference
counting when the turn ends, so the garbage collector has nothing of ours to find: a
process with many turns pays for collections only for what it keeps on purpose.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from tests.conftest import RuntimeFactory

from turnkit import Agent, RuntimeConfig, tool
from turnkit.models import ModelRequest
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _reply(request: ModelRequest) -> ModelStep:
    """Ask for the tool, then answer once its result is in."""
    if any(m.role == "tool" for m in request.messages):
        return ModelStep.text_reply("5.")
    return ModelStep.tool_call_reply(call("add", a=2, b=3))


@pytest.fixture
def saved_garbage() -> Iterator[None]:
    """The collector keeps what it finds unreachable in `gc.garbage` while the test runs."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("durability", ["sync", "exit"])
async def test_finished_turns_leave_no_cycles_of_ours(
    runtime_factory: RuntimeFactory,
    db: tuple[str, str | None],
    saved_garbage: None,
    durability: str,
) -> None:
    model = ScriptedModel([ModelStep.respond(_reply)], repeat_last=True)
    config = RuntimeConfig(
        database_url=db[0],
        database_schema=db[1],
        checkpoint_durability=durability,  # type: ignore[arg-type]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]), config=config)
    for session in ("s1", "s2"):  # the second turn runs on what the first left behind
        events = await collect_events(runtime.execute_message(session, "What is 2 + 3?"))
        assert events[-1].type == "done"
    assert _ours_in_garbage() == []


async def test_detached_turns_leave_no_cycles_of_ours(
    runtime_factory: RuntimeFactory, database_url: str, saved_garbage: None
) -> None:
    model = ScriptedModel([ModelStep.respond(_reply)], repeat_last=True)
    runtime = runtime_factory(
        Agent(model=model, tools=[add]), config=RuntimeConfig(database_url=database_url)
    )
    for session in ("s1", "s2"):
        submitted = await runtime.start(session, "What is 2 + 3?")
        events = [e async for e in runtime.reader().events(submitted.turn_id)]
        assert events[-1].type == "done"
    await runtime.wait_background()
    assert _ours_in_garbage() == []


def _ours_in_garbage() -> list[str]:
    """The turnkit types of what a collection now finds unreachable."""
    gc.collect()
    return sorted(
        {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("turnkit")}
    )


async def test_stopped_turns_leave_no_cycles_of_ours(
    runtime_factory: RuntimeFactory, database_url: str, saved_garbage: None
) -> None:
    """A Stop cancels the turn's task: the task keeps its CancelledError, whose traceback
    holds the frames that drove the turn; nothing of that may point back at the task."""

    @tool
    async def slow(x: int) -> int:
        """Take a while."""
        await asyncio.sleep(30)
        return x

    model = ScriptedModel([ModelStep.tool_call_reply(call("slow", x=1))], repeat_last=True)
    runtime = runtime_factory(
        Agent(model=model, tools=[slow]), config=RuntimeConfig(database_url=database_url)
    )
    for session in ("s1", "s2", "s3"):
        submitted = await runtime.start(session, "Take a while.")
        async for event in runtime.reader().events(submitted.turn_id):
            if event.type == "tool.started":
                break  # mid-call, in the tool
        assert await runtime.cancel(submitted.turn_id) == "cancelled"
    await runtime.wait_background()
    assert _ours_in_garbage() == []  # was Detached, TurnDriver, Recorder, StageContext …
