"""An asking turn that ends without following the turn it asked stops that turn durably.

The asked turn is stopped in the transaction that ends the asking turn, so a process that
dies right after that ending (killed here with SIGKILL, just before the runtime goes on to
stop the asked turn) leaves nothing behind: no asked turn waiting for a person forever,
none a worker or a recovery loop later runs for a conversation that ended. And a Stop of
an asking turn driven here stops what it asked once, not once per path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import new_input, step_event
from tests.support.asked_kill import config, front_desk
from tests.support.asked_working import answering, front_desk as working_desk
from turnkit import Approve, SessionRuntime, tool
from turnkit.blocks import TextBlock
from turnkit.events import ApprovalRequestedEvent, MessageCompleteEvent, ToolStartedEvent
from turnkit.ids import SessionId, TurnId
from turnkit.runtime.worker import Worker
from turnkit.states import TERMINAL_STATES
from turnkit.store import ClaimRequest, Lease, Submission
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock, ModelStep, collect_events

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


async def _stored_status(store: SqlStore, turn_id: TurnId) -> str:
    """The turn's status as the Store holds it (the turn is there)."""
    record = await store.get_turn(turn_id)
    assert record is not None
    return record.status


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


# An asking turn that follows its asked agent while that agent still works (it never
# paused, so the asking turn was handed nothing of it): the asked turn names the asking
# one, and any ending of the asking turn but its success stops it all the same.


def _killed_while_the_asked_agent_works(db: DB) -> None:
    url, schema = db
    script = "from tests.support.asked_working import main; main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", script, url, schema or ""],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-3000:]


@pytest.mark.parametrize("how", ["stop", "gone"])
async def test_an_asking_turn_ended_while_its_agent_still_works_stops_that_agent(
    db: DB, refunded: Path, how: str
) -> None:
    """The process driving both turns dies while the asked agent's model call is under
    way. `stop`: the asking turn is then stopped (ended in the Store: no live driver);
    `gone`: a process whose asking agent changed (a deploy) takes it over and ends it
    `agent-not-found`. Either ending stops the asked turn in its transaction, so a
    runtime recovering turns (and a worker) finds it `cancelled` and never runs the
    refund nobody asks for any more."""
    url, schema = db
    _killed_while_the_asked_agent_works(db)
    edited = dataclasses.replace(working_desk(answering()), instructions="Edited.")
    settings = config(url, schema, run_in_process=False)
    async with SessionRuntime(agent=edited, config=settings) as api:
        [asking] = await api.store.list_turns(SessionId("s1"))
        [sub] = await api.store.delegated_sessions(SessionId("s1"))
        [inner] = await api.store.list_turns(sub)
        assert (asking.status, inner.status) == ("running", "running")
        assert await api.store.open_pauses() == []  # the asked agent never paused
        await asyncio.sleep(1.2)  # the dead process's leases lapse (lease_ttl_s=1)
        if how == "stop":
            assert await api.cancel(asking.turn_id) == "cancelled"
        else:
            api.host.detach(asking.turn_id)  # taken over here, where its agent changed
            assert await _status(api, asking.turn_id, within_s=10) == "failed"
        ended = await api.store.get_turn(inner.turn_id)
    assert ended is not None
    assert ended.status == "cancelled"  # in the asking turn's ending
    recovering = config(url, schema, recover_in_process=True)
    async with SessionRuntime(agent=working_desk(answering()), config=recovering) as runtime:
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=2, poll_interval_s=0.02, sweep_interval_s=0.2)
        working = asyncio.create_task(worker.run(stop))
        try:
            status = await _status(runtime, inner.turn_id, within_s=4)
        finally:
            stop.set()
            await working
    assert status == "cancelled"
    assert await asyncio.to_thread(refunded.read_text) == ""  # no refund ran, anywhere


async def _asking_and_asked(
    store: SqlStore, n: int = 1, *, asked_owner: str | None, ttl_s: float = 60.0
) -> tuple[Lease, Submission]:
    """An asking turn its driver holds, and a turn asked by it (held by `asked_owner`)."""
    asking = await store.submit(
        new_input(f"s{n}", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
    )
    assert asking.lease is not None
    claim = (
        ClaimRequest(owner=asked_owner, ttl_s=ttl_s, max_attempts=3)
        if asked_owner is not None
        else None
    )
    asked = await store.submit(
        new_input(f"tk-sub.{n}", agent="refunds", asked_by=asking.turn_id, claim_for=claim)
    )
    assert (asked.lease is not None) == (asked_owner is not None)
    return asking.lease, asked


@pytest.mark.parametrize("held", [False, True])
async def test_a_failed_asking_turn_stops_the_turn_it_asked_that_handed_it_nothing(
    store: SqlStore, held: bool
) -> None:
    """The driver's own ending (on PostgreSQL its one-statement ending must leave this to
    the full transaction): the asked turn ends `cancelled`, or, held by a live driver
    elsewhere, is flagged for it."""
    lease, asked = await _asking_and_asked(store, asked_owner="elsewhere" if held else None)
    result = await store.commit(
        lease.turn_id, epoch=lease.epoch, status="failed", error_code="boom", release=True
    )
    assert result.stopped_asked == (asked.turn_id,)
    assert await _stored_status(store, asked.turn_id) == ("running" if held else "cancelled")
    if asked.lease is not None:  # its driver learns at its next renewal
        assert (await store.renew(asked.lease, ttl_s=60)).cancel_requested


async def test_a_succeeded_asking_turn_leaves_the_turn_it_asked(store: SqlStore) -> None:
    lease, asked = await _asking_and_asked(store, asked_owner=None)
    result = await store.commit(lease.turn_id, epoch=lease.epoch, status="succeeded")
    assert result.stopped_asked == ()
    assert await _stored_status(store, asked.turn_id) == "running"


async def test_a_stop_or_the_sweep_of_an_asking_turn_stops_the_turn_it_asked(
    store: SqlStore, clock: FakeClock
) -> None:
    """Their drivers died: a Stop ends one asking turn in the Store, the sweep times the
    other out; either way the turn it asked, which no live driver holds either, ends
    `cancelled` with it."""
    stopped, working = await _asking_and_asked(store, 1, asked_owner="died", ttl_s=1.0)
    swept, queued = await _asking_and_asked(store, 2, asked_owner=None)
    clock.advance(70)  # every lease lapses
    assert await store.cancel(stopped.turn_id) == "cancelled"
    assert await store.sweep(ceiling_s=60, max_attempts=3) == [swept.turn_id]
    for asked in (working, queued):
        assert await _stored_status(store, asked.turn_id) == "cancelled"


async def test_a_stop_flagged_for_a_live_asking_turn_flags_the_turn_it_asked(
    store: SqlStore, clock: FakeClock
) -> None:
    """Stop is pressed while another process drives the asking turn and the agent it asked
    (the Stop only flags them), and that process dies before it learns of the Stop. The
    asked turn's lease may lapse first, and a worker take it over before anyone takes the
    asking turn over: that worker ends it `cancelled` rather than run the refund the
    stopped conversation no longer asks for."""
    asking, asked = await _asking_and_asked(store, asked_owner="w", ttl_s=1.0)
    assert await store.cancel(asking.turn_id) == "running"  # a live driver holds it
    clock.advance(2)  # the process died: the asked turn's lease lapses first
    lease = await store.claim("worker-2", ttl_s=8, max_attempts=3)
    assert lease is not None
    assert lease.turn_id == asked.turn_id
    assert lease.cancel_requested  # ... so the new driver ends it `cancelled`


async def test_restarts_while_the_asked_agent_works_never_end_the_asking_turn(
    store: SqlStore, clock: FakeClock
) -> None:
    """Every attempt of the asking turn dies while the agent it asked works: the asking
    turn's call waits and commits nothing of its own, the asked turn commits progress.
    Ten such restarts end neither (the asked turn's own attempts bound a crash loop); once
    the asked turn ended, the asking turn's fruitless attempts count again."""
    asking, asked = await _asking_and_asked(store, asked_owner=None)
    seq = 1
    for attempt in range(2, 12):
        clock.advance(61)  # the process driving both died
        lease = await store.claim(f"w{attempt}", ttl_s=60, max_attempts=3, turn_id=asking.turn_id)
        assert lease is not None, f"attempt {attempt} of the asking turn was refused"
        await store.commit(asking.turn_id, epoch=lease.epoch, events=[step_event(asking, seq + 1)])
        inner = await store.claim(f"w{attempt}", ttl_s=60, max_attempts=3, turn_id=asked.turn_id)
        assert inner is not None, f"attempt {attempt} of the asked turn was refused"
        seq += 1
        await store.commit(
            asked.turn_id,
            epoch=inner.epoch,
            events=[
                MessageCompleteEvent(
                    session_id=asked.session_id,
                    turn_id=asked.turn_id,
                    stage_id="tool-loop",
                    ts=clock.now(),
                    seq=seq,
                    block=TextBlock(block_id=f"b{seq}", text="progress"),
                )
            ],
        )
    clock.advance(61)
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == []
    inner = await store.claim("w", ttl_s=60, max_attempts=3, turn_id=asked.turn_id)
    assert inner is not None
    await store.commit(asked.turn_id, epoch=inner.epoch, status="succeeded", release=True)
    claims = 0
    while await store.claim("w", ttl_s=60, max_attempts=3, turn_id=asking.turn_id):
        claims += 1  # ... and dies at once, getting nowhere
        assert claims < 3
        clock.advance(61)
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == [asking.turn_id]
