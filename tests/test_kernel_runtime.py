"""Kernel behaviour through SessionRuntime: input commit, pinned config, sessions, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import Agent, InvalidInputError, RuntimeConfig, SessionNotFoundError, tool
from turnkit.events import DurableEvent, MessageCompleteEvent, TurnStartedEvent, decode_event
from turnkit.runtime.reader import KEEPALIVE, Frame
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def test_guide_without_a_live_turn_is_committed_as_queue(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.text_reply("ok")])))
    events = await collect_events(runtime.execute_message("s1", "hi", delivery="guide"))
    started = events[0]
    assert isinstance(started, TurnStartedEvent)
    assert (started.delivery, started.requested_delivery) == ("queue", "guide")
    assert started.input_seq == 1
    answer = next(e for e in events if isinstance(e, MessageCompleteEvent))
    assert answer.input_seqs == (1,)  # what the answer consumed


async def test_the_run_records_its_pinned_configuration_and_summary(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("5")])
    runtime = runtime_factory(
        Agent(model=model, tools=[add], effort="low", skip_stages=frozenset({"tool-loop"}))
    )
    events = await collect_events(runtime.execute_message("s1", "2+3"))
    record = await runtime.turn(events[0].turn_id)
    assert record.pinned["rungs"] == ["scripted"]
    assert record.pinned["effort"] == "low"
    assert record.pinned["tools"] == ["add"]
    assert record.summary is not None
    assert record.summary.status == "succeeded"
    assert record.summary.model_calls == 1
    assert record.lease_owner is None  # a settled run holds no lease


async def test_invalid_delivery_is_refused_and_writes_nothing(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    await runtime.open()
    with pytest.raises(InvalidInputError, match="'shout'"):
        await runtime.submit("s1", "hi", delivery="shout")  # type: ignore[arg-type]
    assert await runtime.store.get_session("s1") is None  # type: ignore[arg-type]


async def test_unknown_session_is_refused_when_sessions_are_explicit(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    config = RuntimeConfig(database_url=database_url, auto_create_sessions=False)
    model = ScriptedModel([ModelStep.text_reply("hello")])
    runtime = runtime_factory(Agent(model=model), config=config)
    with pytest.raises(SessionNotFoundError, match="create it first"):
        await runtime.submit("nobody", "hi")
    assert await runtime.store.list_turns("nobody") == []  # type: ignore[arg-type]
    await runtime.create_session("somebody", principal="alice", title="Chat")
    events = await collect_events(runtime.execute_message("somebody", "hi"))
    assert events[-1].type == "done"


async def test_turns_of_one_session_run_in_order(runtime_factory: RuntimeFactory) -> None:
    import asyncio

    model = ScriptedModel([ModelStep.text_reply("first"), ModelStep.text_reply("second")])
    runtime = runtime_factory(Agent(model=model))
    one, two = await asyncio.gather(
        collect_events(runtime.execute_message("s1", "one")),
        collect_events(runtime.execute_message("s1", "two")),
    )
    history = await runtime.history("s1")
    assert [t.answer for t in history] == ["first", "second"]
    # The second turn's request saw the first turn's answer.
    assert ("assistant", "first") in [(m.role, m.content) for m in model.calls[1].messages]


def _held_until(release: asyncio.Event) -> Any:
    """A `wait_here(x)` tool that holds its turn until `release` is set."""

    @tool
    async def wait_here(x: int) -> int:
        """Hold the turn until the test lets it go."""
        await release.wait()
        return x

    return wait_here


async def test_a_first_reader_of_a_live_turn_gets_what_it_streamed_before_attaching(
    runtime_factory: RuntimeFactory,
) -> None:
    """The first connection of a fast turn must not lose the deltas it was too late for."""
    release = asyncio.Event()
    wait_here = _held_until(release)
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("wait_here", x=1), text="Let me compute."),
            ModelStep.text_reply("Done."),
            ModelStep.text_reply("1"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[wait_here]))
    submission = await runtime.start("s1", "go")
    for _ in range(500):  # until the tool runs: the narration has streamed by then
        if any([e.type == "tool.started" async for e in runtime.events(submission.turn_id)]):
            break
        await asyncio.sleep(0.01)
    frames = []
    follow = runtime.reader().follow(submission.turn_id)
    async for frame in follow:
        if isinstance(frame, Frame):
            frames.append(decode_event(frame.data))
            if frames[-1].type == "tool.started":
                release.set()
    types = [e.type for e in frames]
    deltas = "".join(e.text for e in frames if e.type == "message.delta")
    assert deltas.startswith("Let me compute.")
    assert types.index("message.delta") < types.index("message.complete")
    seqs = [e.seq for e in frames if isinstance(e, DurableEvent)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert types[-1] == "done"


async def test_a_reader_given_its_submission_sends_turn_started_without_reading_it_back(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `start` answered carries the committed first event: the stream sends it at once."""
    release = asyncio.Event()
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("wait_here", x=1), text="Let me compute."),
            ModelStep.text_reply("Done."),
            ModelStep.text_reply("1"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[_held_until(release)]))
    submission = await runtime.start("s1", "go")
    store = runtime.store

    async def unreadable(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reader read the turn back")

    monkeypatch.setattr(store, "get_turn", unreadable)
    monkeypatch.setattr(store, "read_events", unreadable)
    batches = runtime.reader().follow_batches(submission.turn_id, submission=submission)
    first = await anext(batches)
    monkeypatch.undo()
    assert isinstance(first, list)
    assert [decode_event(f.data) for f in first] == [submission.started]
    release.set()
    frames = [*first]
    async for batch in batches:
        if isinstance(batch, list):
            frames += batch
    events = [decode_event(f.data) for f in frames]
    deltas = "".join(e.text for e in events if e.type == "message.delta")
    assert deltas.startswith("Let me compute.")  # streamed before the reader attached
    seqs = [e.seq for e in events if isinstance(e, DurableEvent)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[-1].type == "done"


async def test_a_message_queued_for_a_worker_streams_without_reading_its_turn_back(
    runtime_factory: RuntimeFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API process that only commits sends `turn.started` at once, then the worker's events."""
    config = RuntimeConfig(database_url=database_url, run_in_process=False)
    model = ScriptedModel([ModelStep.text_reply("Done by the worker.")])
    runtime = runtime_factory(Agent(model=model), config=config)
    submission = await runtime.start("s1", "for a worker")
    assert submission.lease is None  # queued: a worker drives it
    store = runtime.store

    async def unreadable(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reader read the turn back")

    for name in ("get_turn", "turn_progress", "read_events"):
        monkeypatch.setattr(store, name, unreadable)
    batches = runtime.reader().follow_batches(submission.turn_id, submission=submission)
    first = await anext(batches)
    monkeypatch.undo()
    assert isinstance(first, list)
    assert [decode_event(f.data) for f in first] == [submission.started]
    stop = asyncio.Event()
    worker = asyncio.create_task(Worker(runtime, poll_interval_s=0.02).run(stop))
    try:
        frames = [*first]
        async for batch in batches:
            if isinstance(batch, list):
                frames += batch
    finally:
        stop.set()
        await worker
    events = [decode_event(f.data) for f in frames]
    assert "".join(e.text for e in events if e.type == "message.delta") == "Done by the worker."
    seqs = [e.seq for e in events if isinstance(e, DurableEvent)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[-1].type == "done"


async def test_a_reader_waits_for_a_queued_turn_instead_of_timing_it_out(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """Silence on a turn no driver has claimed yet means "queued", not "driver died"."""
    config = RuntimeConfig(
        database_url=database_url,
        run_in_process=False,
        idle_window_s=0.2,
        heartbeat_interval_s=0.05,
    )
    runtime = runtime_factory(Agent(model=ScriptedModel([])), config=config)
    submission = await runtime.start("s1", "for a worker")
    reader = runtime.reader(keepalive_s=0.05)
    received: list[object] = []

    async def follow() -> None:
        async for item in reader.follow(submission.turn_id):
            received.append(item)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.8)  # four idle windows
    assert (await runtime.turn(submission.turn_id)).status == "running"
    assert len([i for i in received if i is KEEPALIVE]) >= 3
    await runtime.cancel(submission.turn_id)
    await asyncio.wait_for(task, 5)
    last = received[-1]
    assert isinstance(last, Frame)
    assert decode_event(last.data).type == "done"


async def test_start_claims_its_turn_with_the_message_when_the_session_is_free(
    runtime_factory: RuntimeFactory,
) -> None:
    release = asyncio.Event()
    wait_here = _held_until(release)
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("wait_here", x=1)),
            ModelStep.text_reply("first"),
            ModelStep.text_reply("second"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[wait_here]))
    first = await runtime.start("s1", "one")
    second = await runtime.start("s1", "two")
    assert first.lease is not None  # claimed in the message's own transaction
    assert (first.lease.epoch, first.lease.attempt) == (1, 1)
    assert second.lease is None  # its session is busy: it waits, then runs
    release.set()
    events = [e async for e in runtime.reader().events(second.turn_id)]
    assert events[-1].type == "done"
    assert [t.answer for t in await runtime.history("s1")] == ["first", "second"]
    assert [(await runtime.turn(t)).attempts for t in (first.turn_id, second.turn_id)] == [1, 1]
