"""DESIGN §5.5: the ceiling ends a run as `timed_out`; heartbeats fill a silent model call."""

from __future__ import annotations

import asyncio

import pytest
from tests.conftest import RuntimeFactory

from turnkit import Agent, ConfigurationError, RuntimeConfig
from turnkit.events import DoneEvent, ErrorEvent, HeartbeatEvent
from turnkit.testing import ModelStep, ScriptedModel, collect_events


async def test_the_ceiling_times_the_turn_out(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.hang("")])
    config = RuntimeConfig(
        database_url=database_url, ceiling_s=2.0, idle_window_s=1.5, heartbeat_interval_s=0.1
    )
    runtime = runtime_factory(Agent(model=model), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "never ends"))
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert [e.code for e in errors] == ["deadline-exceeded"]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
    assert model.aborted == 1
    record = await runtime.turn(done.turn_id)
    assert record.status == "timed_out"
    assert record.summary is not None
    assert record.summary.status == "timed_out"


async def test_heartbeats_flow_while_the_model_is_silent(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.hang("")])
    config = RuntimeConfig(
        database_url=database_url, ceiling_s=2.0, idle_window_s=1.5, heartbeat_interval_s=0.05
    )
    runtime = runtime_factory(Agent(model=model), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "think hard"))
    beats = [e for e in events if isinstance(e, HeartbeatEvent)]
    assert len(beats) >= 3
    assert all(not hasattr(b, "seq") for b in beats)  # ephemeral: never stored
    stored = {e.type async for e in runtime.events(events[0].turn_id)}
    assert "heartbeat" not in stored


def test_a_credential_that_dies_before_the_ceiling_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must exceed the ceiling"):
        RuntimeConfig(ceiling_s=900, credential_lifetime_s=600)
    RuntimeConfig(ceiling_s=900, credential_lifetime_s=3600)  # fine
