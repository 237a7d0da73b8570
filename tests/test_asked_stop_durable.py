"""An asking turn that ends without following the turn it asked stops that turn durably.

The asked turn is stopped in the transaction that ends the asking turn, so a process that
dies right after that ending (killed here with SIGKILL, just before the runtime goes on to
stop the asked turn) leaves nothing behind: no asked turn waiting for a person forever,
none a worker or a recovery loop later runs for a conversation that ended. And a Stop of
an asking turn driven here stops what it asked once, not once per path.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.asked_kill import config, front_desk
from turnkit import Approve, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, ToolStartedEvent
from turnkit.ids import TurnId
from turnkit.runtime.worker import Worker
from turnkit.states import TERMINAL_STATES
from turnkit.testing import ModelStep, collect_events

ROOT = Path(__file__).parent.parent
DB = tuple[str, str | None]


@pytest.fixture
def refunded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every refund (in any process) appends a line to."""
    path = tmp_path / "refunded.txt"
    path.touch()
    monkeypatch.setenv("TK_REFUNDED", str(path))
    return path


async def _waiting(url: str, schema: str | None) -> ApprovalRequestedEvent:
    """The asking turn waits on the asked turn's request (handed over to it)."""
    async with SessionRuntime(agent=front_desk(), config=config(url, schema)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    assert asked.asked is not None
    return asked


def _killed_after_the_ending(db: DB, how: str, asked: ApprovalRequestedEvent) -> None:
    url, schema = db
    script = "from tests.support.asked_kill import main; main()"
    args = [url, schema or "", how, asked.turn_id, asked.request_id]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-3000:]


async def _status(runtime: SessionRuntime, turn_id: str, *, within_s: float) -> str:
    """The turn's status once it ended, or as it is after `within_s`."""
    deadline = time.monotonic() + within_s
    while (status := (await runtime.turn(turn_id)).status) not in TERMINAL_STATES:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    return status


@pytest.mark.parametrize("how", ["stop", "gone", "handed"])
async def test_a_process_killed_right_after_the_asking_turn_ended_leaves_no_asked_turn(
    db: DB, refunded: Path, how: str
) -> None:
    """`stop`: Stop of the waiting asking turn; `gone`: the answer ends it `agent-not-found`
    (a deploy changed its agent); `handed`: the same, with the answer handed on to the
    asked turn first, which is then free to run. In each the process dies between the
    asking turn's ending and the Stop of the asked turn; a runtime recovering turns (and a
    worker) then finds the asked turn ended, and the refund nobody asks for any more never
    runs."""
    url, schema = db
    asked = await _waiting(url, schema)
    assert asked.asked is not None
    _killed_after_the_ending(db, how, asked)
    settings = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=front_desk(), config=settings) as runtime:
        ending = (await runtime.turn(asked.turn_id)).status
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=2, poll_interval_s=0.02, sweep_interval_s=0.2)
        working = asyncio.create_task(worker.run(stop))
        try:
            inner = await _status(runtime, asked.asked.turn_id, within_s=4)
        finally:
            stop.set()
            await working
    assert ending == ("cancelled" if how == "stop" else "failed")
    assert inner == "cancelled"
    assert await asyncio.to_thread(refunded.read_text) == ""  # no refund ran, anywhere


async def test_the_asked_turn_a_live_driver_holds_is_flagged_with_the_ending(
    db: DB, refunded: Path
) -> None:
    """A driver elsewhere holds the asked turn as the asking turn ends: the ending flags
    it in the same transaction, so the driver (or, once it died, whoever takes the turn
    over) ends it `cancelled` rather than running the refund."""
    url, schema = db
    asked = await _waiting(url, schema)
    assert asked.asked is not None
    settings = config(url, schema, run_in_process=False)
    async with SessionRuntime(agent=front_desk(), config=settings) as api:
        await api.resume(asked.turn_id, asked.request_id, Approve())  # handed on
        inner = TurnId(asked.asked.turn_id)
        lease = await api.store.claim("elsewhere", ttl_s=1.0, max_attempts=3, turn_id=inner)
        assert lease is not None  # ... and that driver dies at once
        assert await api.store.cancel(TurnId(asked.turn_id)) == "cancelled"
        flagged = await api.store.get_turn(inner)
    assert flagged is not None
    assert flagged.status == "running"  # a live lease: its driver ends it
    async with SessionRuntime(
        agent=front_desk(), config=config(url, schema, recover_in_process=True)
    ) as runtime:
        status = await _status(runtime, inner, within_s=6)
    assert status == "cancelled"
    assert await asyncio.to_thread(refunded.read_text) == ""  # no refund ran, anywhere


async def test_the_sweep_that_ends_an_asking_turn_stops_the_asked_one(
    db: DB, refunded: Path
) -> None:
    """Answered, the asking turn's driver died and the sweep ends it past its ceiling: the
    asked turn, answered too and free to run, is ended in the same transaction."""
    url, schema = db
    asked = await _waiting(url, schema)
    assert asked.asked is not None
    settings = config(url, schema, run_in_process=False)
    async with SessionRuntime(agent=front_desk(), config=settings) as api:
        await api.resume(asked.turn_id, asked.request_id, Approve())  # handed on
        turn = TurnId(asked.turn_id)
        lease = await api.store.claim("died", ttl_s=0.01, max_attempts=3, turn_id=turn)
        assert lease is not None
        await asyncio.sleep(0.05)  # its lease lapses
        assert await api.store.sweep(ceiling_s=0.0, max_attempts=3) == [turn]
        inner = await api.store.get_turn(TurnId(asked.asked.turn_id))
    assert inner is not None
    assert inner.status == "cancelled"
    assert await asyncio.to_thread(refunded.read_text) == ""


SLOW: dict[str, Any] = {}


@tool(approval="always")
async def slow_refund(order_id: str) -> str:
    """Refund an order (slowly: until the test stops it, at most 20 s)."""
    SLOW["started"] = SLOW.get("started", 0) + 1
    for _ in range(400):
        await asyncio.sleep(0.05)
    return f"refunded {order_id}"


async def test_a_stop_of_an_asking_turn_driven_here_stops_the_asked_one_once(
    tmp_path: Path,
) -> None:
    """The asking turn resumed from its asked agent's request and follows its turn again
    when Stop is pressed: the asked turn is ended once (one Stop in the Store, one `done`
    handed to its readers), not once by the call, once by the asking turn's ending and
    once more by the Stop."""
    from turnkit import Agent
    from turnkit.testing import ScriptedModel, call

    SLOW.clear()
    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("slow_refund", order_id="A1")),
            ModelStep.text_reply("Refunded."),
        ]),
        tools=[slow_refund],
    )  # fmt: skip
    front = Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refunds", message="Refund A1")),
            ModelStep.text_reply("Done."),
        ]),
        tools=[refunds.as_tool()],
    )  # fmt: skip
    url = f"sqlite:///{tmp_path / 'once.db'}"
    async with SessionRuntime(agent=front, config=config(url, None)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        inner = asked.asked.turn_id
        stops: list[str] = []
        published: list[str] = []
        cancel, publish = runtime.store.cancel, runtime.replay.publish

        async def counted_cancel(turn_id: TurnId, **kwargs: Any) -> Any:
            stops.append(turn_id)
            return await cancel(turn_id, **kwargs)

        async def counted_publish(turn_id: TurnId, entries: Any) -> None:
            if any(terminal for _, _, terminal in entries):
                published.append(turn_id)
            await publish(turn_id, entries)

        runtime.store.cancel = counted_cancel  # type: ignore[method-assign]
        runtime.replay.publish = counted_publish  # type: ignore[method-assign]
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        async with asyncio.timeout(20):
            while SLOW.get("started") != 1:
                await asyncio.sleep(0.02)
        assert await runtime.cancel(asked.turn_id) == "cancelled"
        status = (await runtime.turn(inner)).status
        started = [
            e
            async for e in runtime.events(asked.turn_id)
            if isinstance(e, ToolStartedEvent) and e.asked_session_id
        ]
    assert status == "cancelled"
    assert started  # the call followed the asked turn again
    assert stops.count(inner) <= 1, stops
    assert published.count(inner) <= 1, published
