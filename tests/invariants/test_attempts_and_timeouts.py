"""Attempts and time-outs: a resumed run starts its attempts afresh; a live lease keeps its turn."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import pytest
from tests.helpers import new_input, step_event

from turnkit.events import (
    ApprovalRequestedEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    decode_event,
)
from turnkit.ids import TurnId
from turnkit.pauses import PauseRequest
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.store import Submission
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock

DB = tuple[str, str | None]


def _asked(sub: Submission, seq: int) -> ApprovalRequestedEvent:
    return ApprovalRequestedEvent(
        session_id=sub.session_id,
        turn_id=sub.turn_id,
        stage_id="tool-loop",
        ts=datetime.now(UTC),
        seq=seq,
        request_id="req-1",
        tool_call_id="c1",
        tool_name="refund",
        arguments={},
        summary="refund",
    )


async def test_an_answered_pause_gives_the_resumed_run_fresh_attempts(
    store: SqlStore, clock: FakeClock
) -> None:
    """'A resumed run is a new run: fresh attempts' — attempts that died before the
    pause must not count against the run the answer starts."""
    sub = await store.submit(new_input())
    for _ in range(2):  # two attempts die before any progress (a flaky host, say)
        assert await store.claim("w", ttl_s=10, max_attempts=3) is not None
        clock.advance(11)
    lease = await store.claim("w", ttl_s=10, max_attempts=3)
    assert lease is not None
    assert lease.attempt == 3
    pause = PauseRequest(request_id="req-1", kind="approval", tool_call_id="c1", payload={})
    await store.commit(
        sub.turn_id,
        epoch=lease.epoch,
        events=[_asked(sub, 2)],
        status="awaiting_approval",
        release=True,
        pause=pause,
    )
    await store.answer_pause(sub.turn_id, "req-1", {"kind": "approve"})
    # The resumed run: its first attempt dies before progress (worker OOM-killed).
    first = await store.claim("w", ttl_s=10, max_attempts=3)
    assert first is not None
    assert first.attempt == 1
    await store.commit(sub.turn_id, epoch=first.epoch, events=[step_event(sub, 3)])
    clock.advance(11)
    # A fresh run has two attempts left: the turn is recovered, not swept.
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == []
    again = await store.claim("w", ttl_s=10, max_attempts=3)
    assert again is not None, "the resumed run was refused after one attempt"


async def test_a_reader_never_times_out_a_turn_a_worker_just_took_over(db: DB) -> None:
    """A reader judges the turn abandoned (its lease lapsed, the idle window passed); a
    worker takes it over before the reader's time-out commits. The time-out must see the
    live lease, not end the turn under the driver that now holds it."""
    import asyncio

    from turnkit import Agent, RuntimeConfig, SessionRuntime
    from turnkit.testing import ModelStep, ScriptedModel

    url, schema = db
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        run_in_process=False,
        lease_ttl_s=0.3,
        idle_window_s=0.6,
        heartbeat_interval_s=0.2,
    )
    model = ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        store = runtime.store
        turn = await runtime.submit("s-1", "go")
        dead = await store.claim("worker-1", ttl_s=0.3, max_attempts=3)
        assert dead is not None  # claimed, then its worker died: the lease lapses
        time_out = store.time_out
        taken: list[object] = []

        async def a_worker_comes_back_first(turn_id: TurnId, *, reason: str) -> bool:
            # The reader has judged the turn abandoned; the fleet comes back in the same
            # instant, and a worker's claim commits before the reader's time-out does.
            taken.append(await store.claim("worker-2", ttl_s=60, max_attempts=3))
            return await time_out(turn_id, reason=reason)

        store.time_out = a_worker_comes_back_first  # type: ignore[method-assign]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3):
                async for _ in runtime.reader().events(turn.turn_id, after_seq=1):
                    pass
        assert taken
        assert taken[0] is not None
        record = await runtime.turn(turn.turn_id)
        assert (record.status, record.lease_owner) == ("running", "worker-2"), (
            "the reader timed out a turn whose new driver holds a live lease"
        )


async def test_the_sweep_leaves_a_turn_whose_driver_renewed_after_it_was_judged(
    store: SqlStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep judges a turn on its last attempt abandoned (its lease lapsed: the
    driver's event loop stalled), then the driver's renewal commits (nobody took the turn,
    so the epoch is unchanged and the renewal succeeds), then the sweep's time-out
    commits. The time-out must see the renewed lease, not end a turn whose driver lives."""
    from turnkit.store import _lease_sql as lease_sql, _sweep_sql as sweep_sql

    sub = await store.submit(new_input())
    for _ in range(2):  # two attempts died before any progress
        assert await store.claim("w", ttl_s=10, max_attempts=3) is not None
        clock.advance(11)
    lease = await store.claim("w-live", ttl_s=10, max_attempts=3)
    assert lease is not None
    assert lease.attempt == 3
    clock.advance(11)  # a long stall: the live driver's lease lapses
    real_sweep = sweep_sql.sweep

    def renewed_first(conn, row, now, reason):  # type: ignore[no-untyped-def]
        # The stalled driver wakes up: its renewal commits before the sweep's time-out.
        [outcome] = lease_sql.renew_many(conn, [(lease, 10)], clock.now).values()
        assert not isinstance(outcome, Exception)
        return real_sweep(conn, row, now, reason)

    monkeypatch.setattr(sweep_sql, "sweep", renewed_first)
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == []
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert (record.status, record.lease_owner) == ("running", "w-live")


def _dispatched(sub: Submission, seq: int) -> JobDispatchedEvent:
    return JobDispatchedEvent(
        session_id=sub.session_id,
        turn_id=sub.turn_id,
        stage_id="tool-loop",
        ts=datetime.now(UTC),
        seq=seq,
        job_id="job-1",
        tool_call_id="c1",
        tool_name="export",
    )


@pytest.mark.parametrize("ending", ["stop", "sweep"])
async def test_a_job_a_dead_driver_left_running_is_completed_by_the_ending(
    store: SqlStore, clock: FakeClock, ending: str
) -> None:
    """A Stop or a sweep ending a turn whose driver died while a job ran: no job stays
    open in the log (`job.completed`, an error, before `done`)."""
    sub = await store.submit(new_input())
    lease = await store.claim("w", ttl_s=10, max_attempts=1)
    assert lease is not None
    await store.commit(sub.turn_id, epoch=lease.epoch, events=[_dispatched(sub, 2)])
    clock.advance(11)  # its worker died with the job running
    if ending == "stop":
        assert await store.cancel(sub.turn_id) == "cancelled"
    else:
        assert await store.sweep(ceiling_s=3600, max_attempts=1) == [sub.turn_id]
    events = [decode_event(e.data) async for e in store.read_events(sub.turn_id)]
    kinds = [e.type for e in events]
    assert kinds[-1] == "done"
    [completed] = [e for e in events if isinstance(e, JobCompletedEvent)]
    assert (completed.job_id, completed.tool_call_id, completed.is_error) == ("job-1", "c1", True)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gap-free


class _Releases(InMemoryReplayBuffer):
    """An in-memory buffer that records the turns released to their grace period."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []

    async def release(self, turn_id: TurnId) -> None:
        self.released.append(turn_id)
        await super().release(turn_id)


async def test_a_turn_ended_without_its_driver_keeps_its_live_entries_for_the_grace_only(
    db: DB,
) -> None:
    """The driver died after publishing (its entries then live for the buffer's TTL, an
    hour): the reader that times the turn out, or the sweep that ends it, shortens that
    to the grace period a finished turn gets, as the buffer's settings document."""
    import asyncio

    from turnkit import Agent, RuntimeConfig, SessionRuntime
    from turnkit.runtime.worker import Worker
    from turnkit.testing import ModelStep, ScriptedModel

    url, schema = db
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        run_in_process=False,
        lease_ttl_s=0.3,
        idle_window_s=0.6,
        heartbeat_interval_s=0.2,
        ceiling_s=1.0,
    )
    model = ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True)
    replay = _Releases()
    async with SessionRuntime(agent=Agent(model=model), config=config, replay=replay) as runtime:
        store = runtime.store
        timed = await runtime.submit("s-1", "go")
        assert await store.claim("worker-1", ttl_s=0.3, max_attempts=3) is not None
        async with asyncio.timeout(5):
            events = [e async for e in runtime.reader().events(timed.turn_id, after_seq=1)]
        assert events[-1].type == "done"
        assert (await runtime.turn(timed.turn_id)).status == "timed_out"
        assert replay.released == [timed.turn_id]

        swept = await runtime.submit("s-2", "go")
        assert await store.claim("worker-1", ttl_s=0.3, max_attempts=3) is not None
        await asyncio.sleep(1.1)  # past the ceiling, its lease lapsed: an orphan
        assert await Worker(runtime).sweep() == [swept.turn_id]
        assert replay.released == [timed.turn_id, swept.turn_id]
