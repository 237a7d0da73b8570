"""A process that goes away mid-turn, unclosed, leaves its turns to recovery: not `cancelled`.

Only a Stop ends a turn `cancelled`. When `asyncio.run` returns, or is interrupted (Ctrl-C,
a `KeyboardInterrupt`), asyncio cancels the tasks left, the turns' drivers among them: the
turn stays `running`, its lease is handed over, and the next runtime recovering turns
finishes it, running no committed tool again and asking the model only what it had not
answered. A caller that was reading the turn's stream when Ctrl-C came left its stream,
which is a Stop, as closing it is.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import until
from tests.support.shutdown_child import agent, config
from tests.test_agent_tools import (
    SLOW,
    _crashing,
    _finished,
    _first_tool_of,
    _until_the_specialists_tool_runs,
)
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.errors import RuntimeClosedError
from turnkit.events import DoneEvent, DurableEvent, TurnRecoveringEvent
from turnkit.ids import TurnId
from turnkit.runtime import delegated_session_id
from turnkit.runtime._cancel import stop_task
from turnkit.states import TERMINAL_STATES
from turnkit.testing import ModelStep, ScriptedModel, call

ROOT = Path(__file__).parent.parent
DB = tuple[str, str | None]


def _child(db: DB, how: str, log: Path) -> TurnId:
    """Run `tests.support.shutdown_child` to its end; the id of the turn it started."""
    url, schema = db
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "TK_SHUTDOWN_LOG": str(log),
    }
    done = subprocess.run(
        [sys.executable, "-c", "from tests.support.shutdown_child import main; main()"]
        + [url, schema or "", how],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    ok = 0 if how in ("return", "stream-return", "tool-return") else 130
    assert done.returncode == ok, done.stderr
    return TurnId(done.stdout.split()[0])


async def _ended(runtime: SessionRuntime, turn_id: TurnId, within_s: float) -> str:
    deadline = time.monotonic() + within_s
    while (status := (await runtime.turn(turn_id)).status) not in TERMINAL_STATES:
        assert time.monotonic() < deadline, f"{turn_id} still {status}"
        await asyncio.sleep(0.05)
    return status


@pytest.mark.parametrize("how", ["return", "raise", "sigint", "stream-return"])
async def test_a_turn_left_as_its_process_goes_away_is_recovered_not_cancelled(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    log = tmp_path / "calls.txt"
    log.touch()
    monkeypatch.setenv("TK_SHUTDOWN_LOG", str(log))
    turn_id = _child(db, how, log)
    url, schema = db
    async with SessionRuntime(agent=agent(wait_s=0), config=config(url, schema)) as probe:
        left = await probe.turn(turn_id)
    # Not ended, and handed over: the next runtime takes it at once, not once it lapses.
    assert (left.status, left.lease_owner) == ("running", "(handed over)")
    settings = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=agent(wait_s=0, first=False), config=settings) as after:
        assert await _ended(after, turn_id, 20) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    [recovering] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert (recovering.cause, recovering.resumed_from) == ("handed-over", "checkpoint")
    calls = [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()]
    # The tool's result was committed: it did not run again. The model was asked again
    # only the call it had not answered (the recovering process's first).
    assert calls == ["model call 1", "tool A1", "model call 2", "model call 1"]


@pytest.mark.parametrize("how", ["tool-return", "tool-sigint"])
async def test_a_tool_result_in_hand_as_the_process_goes_away_is_kept(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The tool ran, its result not yet committed, when the loop cancels the turn's task.

    The driver commits what it holds on its way out (before it hands the lease over): the
    process that takes the turn over does not run the tool again.
    """
    log = tmp_path / "calls.txt"
    log.touch()
    monkeypatch.setenv("TK_SHUTDOWN_LOG", str(log))
    turn_id = _child(db, how, log)
    url, schema = db
    settings = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=agent(wait_s=0, first=False), config=settings) as after:
        assert await _ended(after, turn_id, 20) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    [recovering] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert recovering.cause == "handed-over"
    calls = [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()]
    assert calls.count("tool A1") == 1, calls
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("tool.completed") == 1


async def _streamed_at_the_second_call(
    db: DB, log: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[SessionRuntime, list[DurableEvent], asyncio.Task[None]]:
    """A turn streamed to a caller (its durable events into the list), at its second call.

    A 60 s lease: its driver renews only every 20 s.
    """
    monkeypatch.setenv("TK_SHUTDOWN_LOG", str(log))
    url, schema = db
    settings = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=60.0)
    runtime = SessionRuntime(agent=agent(wait_s=60), config=settings)
    await runtime.open()
    seen: list[DurableEvent] = []

    async def read() -> None:
        async for event in runtime.execute_message("s1", "note A1"):
            if isinstance(event, DurableEvent):
                seen.append(event)

    reading = asyncio.create_task(read())
    await until(lambda: "model call 2" in log.read_text(), "the second call")
    return runtime, seen, reading


async def test_closing_the_runtime_hands_a_streamed_turn_over_and_ends_its_stream(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close()` while a caller reads the turn's stream is not a Stop: as a detached turn,
    the turn is handed over at once, and the caller's stream ends with `RuntimeClosedError`
    (it does not wait for the lease's next renewal to fail on the closed database)."""
    log = tmp_path / "calls.txt"
    log.touch()
    runtime, seen, reading = await _streamed_at_the_second_call(db, log, monkeypatch)
    url, schema = db
    await runtime.close()
    with pytest.raises(RuntimeClosedError) as left:
        async with asyncio.timeout(10):  # the lease renews only every 20 s
            await reading
    turn_id = seen[0].turn_id
    assert left.value.details == {"turn_id": turn_id, "last_seq": seen[-1].seq}
    async with SessionRuntime(agent=agent(wait_s=0), config=config(url, schema)) as probe:
        record = await probe.turn(turn_id)
    assert (record.status, record.lease_owner) == ("running", "(handed over)")
    recovering = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=agent(wait_s=0, first=False), config=recovering) as after:
        assert await _ended(after, turn_id, 20) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "handed-over"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    calls = [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()]
    assert calls == ["model call 1", "tool A1", "model call 2", "model call 1"]


async def test_closing_the_runtime_as_a_stop_is_under_way_lets_the_stop_end_the_turn(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Stop pressed just before `close()` (its task not yet run) still ends the turn
    `cancelled`: closing does not turn it into a hand-over."""
    log = tmp_path / "calls.txt"
    log.touch()
    runtime, seen, reading = await _streamed_at_the_second_call(db, log, monkeypatch)
    url, schema = db
    [(task, _)] = runtime.host._streamed.values()
    stop_task(task)  # what a Stop does first; its task has not run since
    await runtime.close()
    async with asyncio.timeout(10):
        await reading
    done = seen[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "cancelled"
    async with SessionRuntime(agent=agent(wait_s=0), config=config(url, schema)) as probe:
        record = await probe.turn(seen[0].turn_id)
    assert record.status == "cancelled"


NOTED: list[str] = []
CLOSING: list[SessionRuntime] = []
"""The runtime `note_then_close` closes (once: a second run finds none, and fails)."""
CLOSED: list[asyncio.Task[None]] = []


@tool
async def note_then_close(text: str) -> str:
    """Write a note down; the runtime closes as the note is written."""
    runtime = CLOSING.pop()
    NOTED.append(text)
    CLOSED.append(asyncio.create_task(runtime.close()))  # runs as the result is staged
    return f"noted {text}"


def _noting(url: str, schema: str | None, *steps: ModelStep, recover: bool) -> SessionRuntime:
    settings = config(url, schema, recover_in_process=recover)
    model = ScriptedModel(list(steps))
    return SessionRuntime(agent=Agent(model=model, tools=[note_then_close]), config=settings)


@pytest.mark.parametrize("streamed", [False, True], ids=["detached", "streamed"])
async def test_closing_the_runtime_as_a_tool_returns_keeps_its_result(
    db: DB, streamed: bool
) -> None:
    """The driver commits the result it holds before it hands the turn over."""
    NOTED.clear()
    url, schema = db
    asks = ModelStep.tool_call_reply(call("note_then_close", text="A1"))
    first = _noting(url, schema, asks, ModelStep.text_reply("Noted."), recover=False)
    await first.open()
    CLOSING.append(first)
    if streamed:
        with pytest.raises(RuntimeClosedError) as left:
            async for _ in first.execute_message("s1", "note A1"):
                pass
        turn_id = left.value.details["turn_id"]
    else:
        turn_id = (await first.start("s1", "note A1")).turn_id
        await until(lambda: CLOSED, "the tool ran")
    await CLOSED.pop()
    after = _noting(url, schema, ModelStep.text_reply("Noted."), recover=True)
    async with after:
        assert await _ended(after, turn_id, 20) == "succeeded"
        events = [e async for e in after.events(turn_id)]
    assert NOTED == ["A1"]  # not run again
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("tool.completed") == 1
    [taken] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert taken.cause == "handed-over"


async def test_ctrl_c_while_reading_the_turns_stream_stops_the_turn(db: DB, tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    log.touch()
    turn_id = _child(db, "stream-sigint", log)
    url, schema = db
    async with SessionRuntime(agent=agent(wait_s=0), config=config(url, schema)) as after:
        record = await after.turn(turn_id)
    assert (record.status, record.error_code) == ("cancelled", None)


async def _loop_shuts_down() -> None:
    """What asyncio does as `asyncio.run` ends: cancel every task left, then wait for them."""
    me = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not me]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


async def test_an_asking_turn_cut_by_a_shutdown_leaves_the_asked_turn_to_recovery(
    db: DB,
) -> None:
    url, schema = db
    SLOW.clear()
    SLOW["block"] = True
    first = _crashing(
        url,
        schema,
        [ModelStep.tool_call_reply(call("slow_lookup", order_id="8"))],
        [ModelStep.tool_call_reply(call("orders", message="Is order 8 packed?"))],
    )
    await first.open()
    submission = await first.start("s1", "is 8 packed?")
    started = await _first_tool_of(first, submission.turn_id)
    assert started.idempotency_key is not None
    child = delegated_session_id(started.idempotency_key, "orders")
    await _until_the_specialists_tool_runs()
    await _loop_shuts_down()  # the runtime was never closed
    [asked] = await first.store.list_turns(child)
    asking = await first.turn(submission.turn_id)
    assert (asking.status, asked.status) == ("running", "running")  # not stopped
    await first.close()  # (only what it opened: no turn is left to it)
    SLOW["block"] = False
    second = _crashing(
        url,
        schema,
        [ModelStep.text_reply("Order 8 is packed.")],
        [ModelStep.text_reply("Packed.")],
        idle_window_s=20.0,
    )
    async with second:
        await _finished(second, submission.turn_id, child)
