"""What an asked turn spent, counted when its asking call is cut short, and read only once.

Past the tool's `timeout_s`, or on a Stop of the asking turn, the asking call stops the
asked turn and counts what it spent once it ended: also when a driver in another process
holds it (that driver ends it when it hears the Stop, or at its next renewal), and also
when a Stop of the asking turn comes while the timeout's stop is still under way. Then the
asking turn's `asked` is what the asked turn's own `run.finished` says. An asked turn
followed to its end is counted from the events the call followed: its record is not read
again once it ended. An asked turn whose driver stalls is waited for only while the
asking turn's lease still runs, and a wait given up at shutdown is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import turnkit.runtime as runtime_module
from tests.helpers import until
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import AskedUsage, RunFinishedEvent, ToolFailedEvent
from turnkit.ids import SessionId, TurnId
from turnkit.models import Usage
from turnkit.runtime import _delegation
from turnkit.runtime.worker import Worker
from turnkit.states import TERMINAL_STATES
from turnkit.store import Lease
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

DB = tuple[str, str | None]

SPENT = AskedUsage(turns=1, model_calls=1, input_tokens=40, output_tokens=1, cost_usd=0.5)
"""What the asked agent spends: one model call, then its tool runs until it is stopped."""


def _config(db: DB, **config: Any) -> RuntimeConfig:
    url, schema = db
    return RuntimeConfig(database_url=url, database_schema=schema, **config)


def _orders(look_up: Any) -> Agent:
    usage = Usage(input_tokens=40, output_tokens=1, cost_usd=0.5)
    step = ModelStep(tool_calls=(call("look_up", order_id="7"),), usage=usage)
    return Agent(name="orders", model=ScriptedModel([step]), tools=[look_up])


def _front(orders: Agent, then: list[ModelStep], timeout_s: float) -> Agent:
    asks = ModelStep.tool_call_reply(call("orders", message="Order 7?"))
    return Agent(
        name="front-desk",
        model=ScriptedModel([asks, *then]),
        tools=[orders.as_tool(timeout_s=timeout_s)],
    )


async def _finished(runtime: SessionRuntime, turn_id: TurnId) -> RunFinishedEvent:
    [finished] = [e async for e in runtime.events(turn_id) if isinstance(e, RunFinishedEvent)]
    return finished


async def _asked_turn(runtime: SessionRuntime) -> TurnId:
    [session] = await runtime.store.delegated_sessions(SessionId("s1"))
    [asked] = await runtime.store.list_turns(session)
    return asked.turn_id


@contextlib.asynccontextmanager
async def _worker(runtime: SessionRuntime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    worker = Worker(runtime, concurrency=2, poll_interval_s=0.05, sweep_interval_s=3600)
    running = asyncio.create_task(worker.run(stop))
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await running


async def test_an_asked_turn_driven_elsewhere_past_the_timeout_counts_once_it_ended(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asked turn is driven by a worker of another process (its lease handed over
    there as it was submitted). Past `timeout_s` the asking call stops it, which only flags
    it for that driver, and the asking turn goes on to its answer: its `asked` still
    counts what the asked turn spent, as the asked turn's own `run.finished` says."""
    started = asyncio.Event()

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up (it runs until its turn is stopped)."""
        started.set()
        await asyncio.Event().wait()
        return f"order {order_id}"

    orders = _orders(look_up)
    front = _front(orders, [ModelStep.text_reply("Orders is slow today.")], timeout_s=1.0)
    handed: list[asyncio.Task[bool]] = []

    def driven_elsewhere(
        runtime: SessionRuntime, turn_id: TurnId, lease: Lease | None, agent: Agent, ctx: Any
    ) -> None:
        assert lease is not None
        handed.append(asyncio.ensure_future(runtime.store.hand_over(lease)))

    monkeypatch.setattr(_delegation, "_drive_here", driven_elsewhere)
    # The driver elsewhere renews its 3 s lease every second and hears the Stop there
    # (SQLite hears no Stops); the asking call waits half its own 6 s lease for that.
    config = _config(db, lease_ttl_s=6.0)
    async with contextlib.AsyncExitStack() as stack:
        here = await stack.enter_async_context(SessionRuntime(agent=front, config=config))
        elsewhere = await stack.enter_async_context(
            SessionRuntime(
                agents=[front, orders],
                config=_config(db, run_in_process=False, lease_ttl_s=3.0),
            )
        )
        await stack.enter_async_context(_worker(elsewhere))
        events = await collect_events(here.execute_message("s1", "Order 7?"), timeout_s=30)
        assert started.is_set()  # the asked agent's tool ran, elsewhere
        assert [e for e in events if isinstance(e, ToolFailedEvent)]  # past timeout_s
        asking = await _finished(here, events[0].turn_id)
        asked_id = await _asked_turn(here)

        async def asked_ended() -> bool:
            return (await here.turn(asked_id)).status in TERMINAL_STATES

        await until(asked_ended, "the asked turn ends")
        asked = await _finished(here, asked_id)
    assert asking.status == "succeeded"
    assert asked.status == "cancelled"
    assert asked.model_calls == SPENT.model_calls
    assert asking.asked == SPENT


async def test_a_stop_while_the_timeout_stops_the_asked_turn_still_counts_it(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `timeout_s` the asking call stops the asked turn, whose tool takes its time to
    give up; the asking turn is stopped meanwhile. Its cancelled ending still counts what
    the asked turn spent."""
    cut, gate = asyncio.Event(), asyncio.Event()

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up (it runs until stopped, then holds its stop until `gate`)."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cut.set()
            await gate.wait()
            raise
        return f"order {order_id}"

    orders = _orders(look_up)
    front = _front(orders, [], timeout_s=0.5)
    asking_tasks: list[asyncio.Task[Any]] = []
    ask = runtime_module.ask_agent

    async def noted(*args: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        asking_tasks.append(task)
        return await ask(*args)

    monkeypatch.setattr(runtime_module, "ask_agent", noted)
    async with SessionRuntime(agents=[front, orders], config=_config(db)) as runtime:
        submission = await runtime.start("s1", "Order 7?")
        await until(cut.is_set, "past timeout_s, the asked turn is being stopped")
        [asking_task] = asking_tasks
        assert asking_task.cancelling() == 1  # timeout_s's
        stopping = asyncio.create_task(runtime.cancel(submission.turn_id))
        await until(
            lambda: asking_task.cancelling() >= 2 or asking_task.done(),
            "the Stop reaches the asking call (which waits for the asked turn, or not)",
        )
        for _ in range(5):  # the Stop's cancellation is delivered before the gate opens
            await asyncio.sleep(0)
        gate.set()
        assert await stopping == "cancelled"
        asking = await _finished(runtime, submission.turn_id)
        asked_id = await _asked_turn(runtime)
        asked = await _finished(runtime, asked_id)
    assert (asking.status, asked.status) == ("cancelled", "cancelled")
    assert asked.model_calls == SPENT.model_calls
    assert asking.asked == SPENT


async def test_an_asked_turn_is_not_read_again_once_it_ended(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asking call counts an asked turn it followed to its end from the events it
    followed: no read of the asked turn's record returns it ended."""

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id} is packed"

    orders = Agent(
        name="orders",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("look_up", order_id="7")),
            ModelStep.text_reply("Packed."),
        ]),
        tools=[look_up],
    )  # fmt: skip
    front = _front(orders, [ModelStep.text_reply("It is packed.")], timeout_s=30)
    ended_reads: list[str] = []
    get_turn: Callable[..., Awaitable[Any]] = SqlStore.get_turn

    async def reading(self: SqlStore, turn_id: TurnId) -> Any:
        record = await get_turn(self, turn_id)
        if record is not None and record.agent == "orders" and record.status in TERMINAL_STATES:
            ended_reads.append(turn_id)
        return record

    async with SessionRuntime(agents=[front, orders], config=_config(db)) as runtime:
        monkeypatch.setattr(SqlStore, "get_turn", reading)
        events = await collect_events(runtime.execute_message("s1", "Order 7?"), timeout_s=30)
        monkeypatch.undo()
        asking = await _finished(runtime, events[0].turn_id)
        asked = await _finished(runtime, await _asked_turn(runtime))
    assert asking.status == "succeeded"
    assert asking.asked == AskedUsage(
        turns=1, model_calls=asked.model_calls, input_tokens=asked.input_tokens,
        output_tokens=asked.output_tokens, cost_usd=asked.cost_usd,
    )  # fmt: skip
    assert ended_reads == []


async def test_an_asking_turn_stopped_elsewhere_ends_itself_though_the_asked_one_stalls(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop is pressed in another process while the asking turn follows an asked turn a
    stalled process holds (it never hears the Stop, nor ends it). The asking turn's keeper
    renews no more once it learned of the Stop, so the asking call waits for the asked
    turn's ending only while the asking lease still runs: its own driver then ends it
    `cancelled`. Here a takeover is tried the moment that driver writes its ending (as a
    worker that polls at that instant would): it finds the lease still running."""

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up (never run: the asked turn's driver stalls)."""
        return f"order {order_id}"

    front = _front(_orders(look_up), [], timeout_s=60)
    held: list[Lease] = []
    holding: list[asyncio.Future[None]] = []

    def stalled_elsewhere(
        runtime: SessionRuntime, turn_id: TurnId, lease: Lease | None, agent: Agent, ctx: Any
    ) -> None:
        async def held_by_a_stalled_process() -> None:
            assert lease is not None
            await runtime.store.hand_over(lease)
            taken = await runtime.store.claim("stalled", ttl_s=60, max_attempts=3, turn_id=turn_id)
            assert taken is not None
            held.append(taken)

        holding.append(asyncio.ensure_future(held_by_a_stalled_process()))

    monkeypatch.setattr(_delegation, "_drive_here", stalled_elsewhere)
    taken: list[Lease] = []
    ending_written = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        here = await stack.enter_async_context(
            SessionRuntime(agent=front, config=_config(db, lease_ttl_s=2.0))
        )
        elsewhere = await stack.enter_async_context(
            SessionRuntime(agent=front, config=_config(db, run_in_process=False))
        )
        commit = here.store.commit

        async def taken_over_first(turn_id: TurnId, **kwargs: Any) -> Any:
            if kwargs.get("status") is None or turn_id != asking:
                return await commit(turn_id, **kwargs)
            lease = await elsewhere.store.claim(
                "worker-2", ttl_s=60, max_attempts=5, turn_id=turn_id
            )
            if lease is not None:  # the asking lease ran out: another worker took it
                taken.append(lease)
            try:
                return await commit(turn_id, **kwargs)
            finally:
                ending_written.set()

        monkeypatch.setattr(here.store, "commit", taken_over_first)
        submission = await here.start("s1", "Order 7?")
        asking = submission.turn_id
        await until(lambda: bool(held), "a stalled process holds the asked turn")
        assert await elsewhere.cancel(asking) == "running"  # flagged for its driver here
        await until(ending_written.is_set, "the asking turn's driver writes its ending")
        record = await elsewhere.store.get_turn(asking)
        stalled = await elsewhere.store.get_turn(held[0].turn_id)
    assert taken == []  # the asking lease still ran as its driver ended it
    assert record is not None
    assert record.status == "cancelled"
    assert stalled is not None
    assert stalled.status == "running"  # never ended: not counted, not waited for longer


async def test_a_count_given_up_at_shutdown_is_cancelled_with_the_asking_call(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `timeout_s` the asking call stops the asked turn (a stalled process holds it)
    and waits for its ending; the process then shuts down. The asking call gives the turn
    up to whoever takes it over, and its wait for the asked turn's ending goes with it: it
    is not left following a turn through a Store that closes."""

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up (never run: the asked turn's driver stalls)."""
        return f"order {order_id}"

    front = _front(_orders(look_up), [], timeout_s=0.2)
    held: list[Lease] = []
    holding: list[asyncio.Future[None]] = []

    def stalled_elsewhere(
        runtime: SessionRuntime, turn_id: TurnId, lease: Lease | None, agent: Agent, ctx: Any
    ) -> None:
        async def held_by_a_stalled_process() -> None:
            assert lease is not None
            await runtime.store.hand_over(lease)
            taken = await runtime.store.claim("stalled", ttl_s=60, max_attempts=3, turn_id=turn_id)
            assert taken is not None
            held.append(taken)

        holding.append(asyncio.ensure_future(held_by_a_stalled_process()))

    counting: list[asyncio.Task[Any]] = []
    following = asyncio.Event()
    follow = _delegation._followed_to_its_end

    async def noted(*args: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        counting.append(task)
        following.set()
        await follow(*args)

    monkeypatch.setattr(_delegation, "_drive_here", stalled_elsewhere)
    monkeypatch.setattr(_delegation, "_followed_to_its_end", noted)
    async with SessionRuntime(agent=front, config=_config(db, lease_ttl_s=20.0)) as here:
        await here.start("s1", "Order 7?")
        await until(following.is_set, "past timeout_s, the call waits for the asked turn's end")
    [task] = counting
    assert task.cancelled()
