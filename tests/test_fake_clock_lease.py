"""A `FakeClock` jump past the lease's TTL while a turn's tool runs in silence: the driver
still owns the turn (nobody took it), so it honours the idle window that passed and ends the
turn `timed_out`.

docs/guides/testing.md promises this; it held on SQLite only (before: on PostgreSQL the
stream became a follower of a turn nothing drove, and stayed `running` for good).
"""

from __future__ import annotations

import asyncio

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import DoneEvent, StreamEvent
from turnkit.testing import FakeClock, ModelStep, ScriptedModel, call


@tool
async def wait_in_silence() -> str:
    """Wait for ever without a word (a model call that does so is alive: it is thinking)."""
    await asyncio.Event().wait()
    return "never"


def _config(db: tuple[str, str | None]) -> RuntimeConfig:
    """A 30 s idle window, well past the default 8 s lease; a ceiling out of the way."""
    url, schema = db
    return RuntimeConfig(
        database_url=url,
        database_schema=schema,
        idle_window_s=30,
        heartbeat_interval_s=1,
        ceiling_s=6000,
    )


@pytest.mark.parametrize("jump", [31.0, 600.0])
async def test_a_jump_past_the_idle_window_and_the_lease_times_the_turn_out(
    db: tuple[str, str | None], jump: float
) -> None:
    clock = FakeClock()
    config = _config(db)
    assert jump > config.lease_ttl_s  # one jump past the lease as well as the idle window
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("wait_in_silence")), ModelStep.text_reply("back")]
    )
    agent = Agent(model=model, tools=[wait_in_silence])
    seen: list[StreamEvent] = []
    async with SessionRuntime(agent=agent, config=config, clock=clock) as runtime:
        async with asyncio.timeout(15):
            async for event in runtime.execute_message("s1", "hi"):
                seen.append(event)
                if event.type == "tool.started":
                    clock.advance(jump)
        done = seen[-1]
        assert isinstance(done, DoneEvent), [e.type for e in seen]
        assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
        assert (await runtime.turn(done.turn_id)).status == "timed_out"
        # The session is free again: its next message runs.
        async with asyncio.timeout(15):
            after = [e async for e in runtime.execute_message("s1", "again")]
        assert isinstance(after[-1], DoneEvent)
        assert after[-1].status == "succeeded"


async def test_a_jump_past_the_lease_alone_costs_the_driver_nothing(
    db: tuple[str, str | None],
) -> None:
    """Past the lease but within the idle window: nobody took the turn, so its driver's
    next renewal (fenced by its epoch) keeps it, and the turn runs on in the same attempt."""
    clock = FakeClock()
    config = _config(db)
    model = ScriptedModel([ModelStep.tool_call_reply(call("wait_in_silence"))])
    agent = Agent(model=model, tools=[wait_in_silence])
    seen: list[StreamEvent] = []
    kept = False
    async with SessionRuntime(agent=agent, config=config, clock=clock) as runtime:
        async with asyncio.timeout(15):
            async for event in runtime.execute_message("s1", "hi"):
                seen.append(event)
                if event.type == "tool.started":
                    held = await runtime.turn(event.turn_id)
                    clock.advance(2 * config.lease_ttl_s)
                elif event.type == "heartbeat" and not kept:  # the jump woke the driver
                    record = await runtime.turn(event.turn_id)
                    while record.lease_expires_at is None or record.lease_expires_at <= clock.now():
                        await asyncio.sleep(0.01)  # its renewal is on its way
                        record = await runtime.turn(event.turn_id)
                    assert record.status == "running"
                    assert record.attempts == held.attempts
                    assert record.lease_owner == held.lease_owner
                    kept = True
                    clock.advance(config.idle_window_s)  # now the idle window ends it
        assert kept
        done = seen[-1]
        assert isinstance(done, DoneEvent), [e.type for e in seen]
        assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
        assert not any(e.type == "turn.recovering" for e in seen)  # one attempt throughout
        assert (await runtime.turn(done.turn_id)).attempts == held.attempts
