"""A process drives at most so many turns at once; the rest wait queued, in order, and all end."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from tests.helpers import GatedModel, calls_made, drain, until, waiting_for_slot
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import DoneEvent, MessageCompleteEvent
from turnkit.runtime.worker import Worker


@pytest.mark.parametrize("recover_in_process", [False, True])
async def test_turns_beyond_the_limit_wait_queued_without_a_lease_then_run(
    tmp_path: Path, recover_in_process: bool
) -> None:
    """Also beside the in-process recovery loop (as `turnkit serve` runs): it takes no
    turn that waits for a slot."""
    model = GatedModel()
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 't.db'}",
        max_running_turns=2,
        recover_in_process=recover_in_process,
    )
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        firsts: dict[int, str] = {}
        ends: dict[int, str] = {}

        async def run(i: int) -> None:
            async for event in runtime.execute_message(f"s-{i}", "hi"):
                if event.type == "turn.started":
                    firsts[i] = event.turn_id
                if isinstance(event, DoneEvent):
                    ends[i] = event.status

        tasks = [asyncio.create_task(run(i)) for i in range(5)]

        async def all_started() -> bool:
            return len(firsts) == 5 and model.active == 2

        await until(all_started, "every caller hears turn.started; two turns reach the model")
        records = [await runtime.turn(firsts[i]) for i in range(5)]
        leased = [r for r in records if r.lease_owner is not None]
        waiting = [r for r in records if r.lease_owner is None]
        assert len(leased) == 2
        assert len(waiting) == 3
        assert all(r.status == "running" and r.attempts == 0 for r in waiting)
        assert runtime.host.slots.waiting == 3
        model.gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert ends == dict.fromkeys(range(5), "succeeded")
    assert model.most == 2


async def test_detached_turns_share_the_limit(tmp_path: Path) -> None:
    model = GatedModel()
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", max_running_turns=1)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        submissions = [await runtime.start(f"s-{i}", "hi") for i in range(3)]
        assert [s.lease is not None for s in submissions] == [True, False, False]

        async def one_in_flight() -> bool:
            return model.active == 1

        await until(one_in_flight, "the first turn reaches the model")
        model.gate.set()

        async def all_ended() -> bool:
            return all([(await runtime.turn(s.turn_id)).status == "succeeded" for s in submissions])

        await until(all_ended, "every detached turn ends")
    assert model.most == 1


async def test_a_waiting_turn_taken_by_a_worker_is_still_streamed_to_its_caller(
    tmp_path: Path,
) -> None:
    model = GatedModel(per_call=True)
    agent = Agent(model=model)
    url = f"sqlite:///{tmp_path / 't.db'}"
    config = RuntimeConfig(database_url=url, max_running_turns=1)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        other = SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url),
                               replay=runtime.replay)  # fmt: skip
        busy = asyncio.create_task(drain(runtime.execute_message("s-busy", "hi")))
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        waiting = asyncio.create_task(drain(runtime.execute_message("s-wait", "hello")))
        await until(lambda: waiting_for_slot(runtime, 1), "the second turn waits for a slot")
        stop = asyncio.Event()
        worker = Worker(other, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            await until(lambda: calls_made(model, 2), "the worker drives the waiting turn")
            model.gates[1].set()
            await busy
            # The caller got the slot, found the turn taken, and gave the slot back.
            await until(lambda: waiting_for_slot(runtime, 0), "the caller stops waiting")
            assert runtime.host.slots.running == 0
            model.gates[2].set()
            events = await asyncio.wait_for(waiting, 20)
        finally:
            stop.set()
            await running
            await other.close()
    assert [e.type for e in events][0] == "turn.started"
    [answer] = [e for e in events if e.type == "message.complete"]
    assert answer.block.text == "Done."
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    seqs = [e.seq for e in events if hasattr(e, "seq")]
    assert seqs == sorted(set(seqs))
    assert seqs[0] == 1
    assert model.calls == 2  # the waiting turn's call was made once, by the worker


async def test_a_caller_that_leaves_while_its_turn_waits_cancels_it(tmp_path: Path) -> None:
    model = GatedModel()
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", max_running_turns=1)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        busy = asyncio.create_task(drain(runtime.execute_message("s-busy", "hi")))
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        started: list[str] = []

        async def leave_early() -> None:
            async for event in runtime.execute_message("s-wait", "hello"):
                started.append(event.turn_id)

        waiting = asyncio.create_task(leave_early())
        await until(lambda: waiting_for_slot(runtime, 1), "the second turn waits for a slot")
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert (await runtime.turn(started[0])).status == "cancelled"
        model.gate.set()
        await busy
        # The session is not blocked by the turn that never ran.
        again = await asyncio.wait_for(drain(runtime.execute_message("s-wait", "again")), 20)
    assert isinstance(again[-1], DoneEvent)
    assert again[-1].status == "succeeded"
    assert model.calls == 2


async def test_a_caller_that_leaves_at_turn_started_while_its_turn_waits_cancels_it(
    tmp_path: Path,
) -> None:
    model = GatedModel()
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", max_running_turns=1)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        busy = asyncio.create_task(drain(runtime.execute_message("s-busy", "hi")))
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        stream = runtime.execute_message("s-wait", "hello")
        first = await anext(stream)  # `turn.started`, committed with the message
        await stream.aclose()
        assert (await runtime.turn(first.turn_id)).status == "cancelled"
        model.gate.set()
        await busy
        again = await asyncio.wait_for(drain(runtime.execute_message("s-wait", "again")), 20)
    assert again[-1].status == "succeeded"
    assert model.calls == 2


async def test_a_stop_right_after_start_ends_the_turn_and_frees_its_slot(tmp_path: Path) -> None:
    # The gate opens only after the Stop: a driver that began before it (a loaded loop
    # runs it while the Stop commits) waits in its first model call and answers nothing.
    model = GatedModel()
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", max_running_turns=1)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        stopped = await runtime.start("s-a", "hi")
        assert stopped.lease is not None  # claimed with its message, not yet driven
        assert await runtime.cancel(stopped.turn_id) == "cancelled"
        record = await runtime.turn(stopped.turn_id)
        assert (record.status, record.lease_owner) == ("cancelled", None)
        events = [e async for e in runtime.events(stopped.turn_id)]
        done = events[-1]
        assert isinstance(done, DoneEvent)
        assert done.status == "cancelled"
        assert not [e for e in events if isinstance(e, MessageCompleteEvent)]  # no answer
        model.gate.set()
        # The only slot is free again, and the session is not held up.
        nxt = await asyncio.wait_for(drain(runtime.execute_message("s-b", "hi")), 20)
        same = await asyncio.wait_for(drain(runtime.execute_message("s-a", "again")), 20)
    assert [nxt[-1].status, same[-1].status] == ["succeeded", "succeeded"]


async def test_a_stop_while_a_detached_turn_waits_for_a_slot_ends_it(tmp_path: Path) -> None:
    model = GatedModel()
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", max_running_turns=1)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        busy = await runtime.start("s-busy", "hi")
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        waiting = await runtime.start("s-wait", "hello")
        assert waiting.lease is None
        await until(lambda: waiting_for_slot(runtime, 1), "the second turn waits for a slot")
        assert await runtime.cancel(waiting.turn_id) == "cancelled"
        assert runtime.host.slots.waiting == 0
        model.gate.set()
        async with asyncio.timeout(20):
            ended = [e async for e in runtime.reader().events(busy.turn_id)][-1]
        again = await asyncio.wait_for(drain(runtime.execute_message("s-wait", "again")), 20)
    assert isinstance(ended, DoneEvent)
    assert [ended.status, again[-1].status] == ["succeeded", "succeeded"]
    assert model.calls == 2
