"""DESIGN §5.3: one writer per turn. A driver that loses its lease stops at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tests.conftest import RuntimeFactory

from turnkit import Agent, ProviderError, RuntimeConfig, SessionRuntime
from turnkit.events import DoneEvent, ErrorEvent, MessageDeltaEvent
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.testing import ModelStep, ScriptedModel, collect_events


async def test_a_driver_that_loses_its_lease_stops_writing(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.hang("still thinking")])
    config = RuntimeConfig(
        database_url=database_url,
        lease_ttl_s=0.3,
        heartbeat_interval_s=0.05,
        idle_window_s=5,
        ceiling_s=60,
    )
    runtime = runtime_factory(Agent(model=model), config=config)
    seen = []
    swept = False
    async with asyncio.timeout(15):
        async for event in runtime.execute_message("s1", "go"):
            seen.append(event)
            if isinstance(event, MessageDeltaEvent) and not swept:
                swept = True
                # Someone else (here: the sweep, with a zero ceiling) takes the turn over.
                ended = await runtime.store.sweep(ceiling_s=0, max_attempts=3)
                assert ended == [event.turn_id]
    turn_id = seen[0].turn_id
    # The caller's stream still ends clearly: with the ending the new owner wrote.
    assert isinstance(seen[-1], DoneEvent)
    assert seen[-1].status == "timed_out"
    assert model.aborted == 1  # the driver cancelled its own model call
    stored = [e async for e in runtime.events(turn_id)]
    assert [type(e) for e in stored[-2:]] == [ErrorEvent, DoneEvent]
    last = stored[-1]
    assert isinstance(last, DoneEvent)
    assert last.status == "timed_out"
    # Nothing after the sweep's ending: the stale driver wrote no cancellation of its own.
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    record = await runtime.turn(turn_id)
    assert record.status == "timed_out"


SWEEP: list[SessionRuntime] = []


class _SlowThenRefused:
    """A model that takes a moment, then refuses the call (a 400: the turn fails)."""

    model, provider = "slow", "mine"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await asyncio.sleep(0.3)  # meanwhile someone else (the sweep) ends the turn
        raise ProviderError("bad request", status_code=400)
        yield TextDelta("")  # pragma: no cover - makes this an async generator


async def test_a_driver_whose_ending_is_refused_follows_the_ending_that_stands(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """Its failed ending comes too late: the stream ends with the one that was written."""
    config = RuntimeConfig(database_url=database_url, lease_ttl_s=60, ceiling_s=600)
    runtime = runtime_factory(Agent(model=_SlowThenRefused()), config=config)
    await runtime.open()

    async def sweep_soon() -> None:
        await asyncio.sleep(0.1)
        assert len(await runtime.store.sweep(ceiling_s=0, max_attempts=3)) == 1

    async with asyncio.timeout(15):
        sweeping = asyncio.create_task(sweep_soon())
        seen = await collect_events(runtime.execute_message("s1", "go"))
        await sweeping
    assert isinstance(seen[-1], DoneEvent)  # the sweep's ending stands, and is sent
    assert seen[-1].status == "timed_out"
    assert (await runtime.turn(seen[0].turn_id)).status == "timed_out"
