"""DESIGN §5.5: the ceiling and the idle window end a run as `timed_out`; heartbeats fill
a silent model call and keep its idle window open, but not a silent tool's."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

import pytest
from tests.conftest import RuntimeFactory
from tests.helpers import WrappedModel

from turnkit import Agent, ConfigurationError, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.events import DoneEvent, ErrorEvent, HeartbeatEvent, StreamEvent
from turnkit.models import ModelChunk, ModelRequest
from turnkit.plugins import ModelCallView, Plugin, PluginContext
from turnkit.testing import FakeClock, ModelStep, ScriptedModel, call, collect_events


def _deadlines(database_url: str, *, ceiling_s: float, idle_window_s: float) -> RuntimeConfig:
    return RuntimeConfig(
        database_url=database_url,
        ceiling_s=ceiling_s,
        idle_window_s=idle_window_s,
        heartbeat_interval_s=0.05,
    )


def _timed_out(events: list[StreamEvent]) -> ErrorEvent:
    """The turn ended `timed_out` with one `deadline-exceeded` error; that error."""
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert [e.code for e in errors] == ["deadline-exceeded"]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
    return errors[0]


@tool
async def busy(ticks: int, ctx: ToolContext) -> str:
    """Work for a while, reporting progress every 0.1 s (for ever when ticks is 0)."""
    tick = 0
    while ticks == 0 or tick < ticks:
        tick += 1
        await ctx.report_progress(message=f"tick {tick}")
        await asyncio.sleep(0.1)
    return f"{ticks} ticks"


@tool
async def silent(seconds: float) -> str:
    """Work for a while without a word."""
    await asyncio.sleep(seconds)
    return "finally"


class _SlowModel(WrappedModel):
    """The scripted model with `gap` seconds before each of its chunks."""

    def __init__(self, steps: list[ModelStep], gap: float, *, repeat_last: bool = False) -> None:
        self.inner = ScriptedModel(steps, repeat_last=repeat_last)
        self.gap = gap

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        async for chunk in self.inner.stream(request):
            await asyncio.sleep(self.gap)
            yield chunk


async def test_the_ceiling_times_the_turn_out(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """A turn that never goes quiet still ends at its ceiling."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("busy", ticks=0))])
    config = _deadlines(database_url, ceiling_s=1.5, idle_window_s=0.5)
    runtime = runtime_factory(Agent(model=model, tools=[busy]), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "never ends"))
    message = _timed_out(events).message
    assert "ran past its ceiling of 1.5 s while tool 'busy' ran" in message
    assert "ceiling_s" in message
    assert sum(e.type == "job.progress" for e in events) > 5  # it was never quiet
    record = await runtime.turn(events[-1].turn_id)
    assert record.status == "timed_out"
    assert record.summary is not None
    assert record.summary.status == "timed_out"


class _SilentThinker(WrappedModel):
    """The scripted model, silent until `speak` is set: it thinks without a word."""

    def __init__(self, steps: list[ModelStep]) -> None:
        self.inner = ScriptedModel(steps)
        self.thinking = asyncio.Event()
        self.speak = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.thinking.set()
        await self.speak.wait()
        async for chunk in self.inner.stream(request):
            yield chunk


def _fake_clock_deadlines(db: tuple[str, str | None]) -> RuntimeConfig:
    """A 30 s idle window, beats every second (a `FakeClock`); the ceiling and the lease's
    renewals out of the way (the lease is not what these tests are about)."""
    return RuntimeConfig(
        database_url=db[0],
        database_schema=db[1],
        idle_window_s=30,
        heartbeat_interval_s=1,
        ceiling_s=6000,
        lease_ttl_s=600,
    )


async def _advance_by_heartbeats(
    clock: FakeClock, seen: asyncio.Queue[StreamEvent], seconds: float, interval: float
) -> list[StreamEvent]:
    """Move `clock` on one heartbeat interval at a time for `seconds`, waiting for each beat.

    Stops early at an `error` or `done` (the turn ending); the events seen.
    """
    got: list[StreamEvent] = []
    moved = 0.0
    while moved < seconds:
        clock.advance(interval)
        moved += interval
        while not isinstance(event := await seen.get(), HeartbeatEvent):
            got.append(event)
            if isinstance(event, (ErrorEvent, DoneEvent)):
                return got
        got.append(event)
    return got


async def test_a_model_that_thinks_silently_past_the_idle_window_answers(
    runtime_factory: RuntimeFactory, db: tuple[str, str | None]
) -> None:
    """A model call that sends nothing for three idle windows is alive: its heartbeats
    keep the window open, and the turn ends with the model's answer."""
    clock = FakeClock()
    model = _SilentThinker([ModelStep.text_reply("Forty-two, after long thought.")])
    config = _fake_clock_deadlines(db)
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent, config=config, clock=clock)
    seen: asyncio.Queue[StreamEvent] = asyncio.Queue()

    async def consume() -> None:
        async for event in runtime.execute_message("s1", "think hard"):
            await seen.put(event)

    async with asyncio.timeout(30):
        consuming = asyncio.create_task(consume())
        await model.thinking.wait()
        during = await _advance_by_heartbeats(clock, seen, 3 * config.idle_window_s, 1.0)
        assert not any(isinstance(e, (ErrorEvent, DoneEvent)) for e in during)
        beats = [e for e in during if isinstance(e, HeartbeatEvent)]
        assert len(beats) == 3 * config.idle_window_s  # one a second, as the call thought
        model.speak.set()
        await consuming
    rest = []
    while not seen.empty():
        rest.append(seen.get_nowait())
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("succeeded", None)
    answer = "".join(e.text for e in rest if e.type == "message.delta")
    assert answer == "Forty-two, after long thought."
    assert (await runtime.turn(done.turn_id)).status == "succeeded"


async def test_a_tool_that_goes_quiet_after_a_silent_model_call_still_times_out(
    runtime_factory: RuntimeFactory, db: tuple[str, str | None]
) -> None:
    """Heartbeats count only while the model thinks: the tool it then calls, silent
    for the idle window, ends the turn `timed_out` all the same."""
    clock = FakeClock()
    model = _SilentThinker([ModelStep.tool_call_reply(call("wait_forever"))])

    @tool
    async def wait_forever() -> str:
        """Wait without a word."""
        await asyncio.Event().wait()
        return "never"

    config = _fake_clock_deadlines(db)
    agent = Agent(model=model, tools=[wait_forever], skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent, config=config, clock=clock)
    seen: asyncio.Queue[StreamEvent] = asyncio.Queue()

    async def consume() -> None:
        async for event in runtime.execute_message("s1", "wait"):
            await seen.put(event)

    async with asyncio.timeout(30):
        consuming = asyncio.create_task(consume())
        await model.thinking.wait()
        during = await _advance_by_heartbeats(clock, seen, 2 * config.idle_window_s, 1.0)
        assert not any(isinstance(e, (ErrorEvent, DoneEvent)) for e in during)
        model.speak.set()
        events: list[StreamEvent] = []
        while not any(e.type == "tool.started" for e in events):
            events.append(await seen.get())
        events += await _advance_by_heartbeats(clock, seen, 3 * config.idle_window_s, 1.0)
        await consuming
    while not seen.empty():
        events.append(seen.get_nowait())
    message = _timed_out(events).message
    assert "produced nothing for 30 s while tool 'wait_forever' ran" in message


async def test_a_silent_tool_ends_at_the_idle_window(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("silent", seconds=30))])
    config = _deadlines(database_url, ceiling_s=60, idle_window_s=0.5)
    runtime = runtime_factory(Agent(model=model, tools=[silent]), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "wait"))
    message = _timed_out(events).message
    assert "produced nothing for 0.5 s while tool 'silent' ran" in message
    assert "idle_window_s" in message
    assert [e.type for e in events if e.type.startswith("tool.")] == ["tool.delta", "tool.started"]


class _SlowHook(Plugin):
    name = "slow-hook"

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        await asyncio.sleep(30)
        return None


async def test_a_plugin_hook_that_goes_quiet_is_named_by_the_idle_window(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.text_reply("never asked")])
    config = _deadlines(database_url, ceiling_s=60, idle_window_s=0.5)
    agent = Agent(model=model, plugins=[_SlowHook()])
    runtime = runtime_factory(agent, config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "hello"))
    message = _timed_out(events).message
    assert "while plugin 'slow-hook' (before_model_request) ran" in message
    assert model.calls == []


async def test_a_turn_that_keeps_producing_outlives_its_idle_window(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """The window restarts on every chunk: slow is fine, quiet is not."""
    model = _SlowModel(
        [
            ModelStep.tool_call_reply(call("busy", ticks=20)),
            ModelStep.text_reply("All twenty ticks are done.", chunk_size=2),
        ],
        gap=0.1,
    )
    config = _deadlines(database_url, ceiling_s=60, idle_window_s=1.0)
    runtime = runtime_factory(Agent(model=model, tools=[busy]), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "tick"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert "".join(e.text for e in events if e.type == "message.delta") == (
        "All twenty ticks are done."
    )


async def test_a_model_that_only_reasons_outlives_its_idle_window(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """Reasoning never reaches the stream, yet every piece of it is a chunk."""
    model = _SlowModel(
        [
            ModelStep.text_reply(
                "Four.", thinking="two plus two makes four, and four is the answer", chunk_size=2
            )
        ],
        gap=0.1,
    )
    config = _deadlines(database_url, ceiling_s=60, idle_window_s=1.0)
    runtime = runtime_factory(Agent(model=model), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "2 + 2?"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"


async def test_a_slow_thinking_summary_outlives_the_idle_window(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    """The utility model's summary streams beside the answer, and its chunks count too."""

    def background(request: ModelRequest) -> ModelStep:
        if request.purpose == "plan":
            return ModelStep.text_reply('{"intent": "math", "depth": "none"}')
        return ModelStep.text_reply(
            "It weighed the sum and chose to answer directly.", chunk_size=2
        )

    utility = _SlowModel([ModelStep.respond(background)], gap=0.1, repeat_last=True)
    model = ScriptedModel([ModelStep.text_reply("Four.", thinking="two and two")])
    config = _deadlines(database_url, ceiling_s=60, idle_window_s=1.0)
    runtime = runtime_factory(Agent(model=model, utility_model=utility), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "2 + 2?"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert any(e.type == "thinking.complete" for e in events)


async def test_heartbeats_flow_while_the_model_is_silent(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.hang("")])
    config = _deadlines(database_url, ceiling_s=2.0, idle_window_s=1.5)
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


class _HandOff:
    """Work handed to another process: the tool that waits for it without a word.

    With the agent that calls the tool once and then answers, and the config both
    processes' runtimes share.
    """

    def __init__(self, db: tuple[str, str | None], *, idle_window_s: float) -> None:
        self.handed: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        """What the other process gets: the turn, the tool call and the callback token."""
        self.finished = asyncio.Event()
        self.config = dataclasses.replace(
            _deadlines(db[0], ceiling_s=60, idle_window_s=idle_window_s),
            database_schema=db[1],
            callback_secret="a-long-shared-secret",
        )

        @tool
        async def hand_off(ctx: ToolContext) -> str:
            """Hand the work to another process and wait for it."""
            await self.handed.put((ctx.turn_id, ctx.tool_call_id, ctx.callback_token or ""))
            await self.finished.wait()
            return "done elsewhere"

        model = ScriptedModel(
            [ModelStep.tool_call_reply(call("hand_off")), ModelStep.text_reply("It is done.")]
        )
        self.agent = Agent(model=model, tools=[hand_off])


@pytest.mark.parametrize("reporter_window_s", [0.5, 5.0], ids=["same-window", "longer-window"])
async def test_progress_reported_from_another_process_keeps_the_turn_alive(
    db: tuple[str, str | None], reporter_window_s: float
) -> None:
    """A tool waiting on work elsewhere outlives the window while that work reports, whatever
    idle window the reporting process has."""
    work = _HandOff(db, idle_window_s=0.5)
    # The other process: a runtime of its own on the same database, driving nothing.
    reporter = dataclasses.replace(work.config, idle_window_s=reporter_window_s)
    async with (
        SessionRuntime(agent=work.agent, config=work.config) as runtime,
        SessionRuntime(agent=Agent(model=ScriptedModel([])), config=reporter) as elsewhere,
    ):

        async def work_elsewhere() -> int:
            turn_id, call_id, token = await work.handed.get()
            reports = 0
            for tick in range(15):  # 1.5 s, three idle windows
                await elsewhere.report_job_progress(
                    turn_id, token, job_id="job-1", tool_call_id=call_id, progress=tick / 15
                )
                reports += 1
                await asyncio.sleep(0.1)
            work.finished.set()
            return reports

        working = asyncio.create_task(work_elsewhere())
        async with asyncio.timeout(20):
            events = await collect_events(runtime.execute_message("s1", "hand it off"))
            reports = await working
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("succeeded", None)
    assert reports == 15
    assert "".join(e.text for e in events if e.type == "message.delta") == "It is done."
