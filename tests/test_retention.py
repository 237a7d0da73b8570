"""Retention: `delete_idle_sessions` deletes the sessions nobody has used for a while, with
their turns' checkpoints, and keeps every session that is recent or has a live or paused turn.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.helpers import add
from tests.support.retention import ShiftedClock, checkpoint_rows
from turnkit import (
    Agent,
    InvalidInputError,
    RuntimeConfig,
    SessionNotFoundError,
    SessionRuntime,
)
from turnkit.ids import SessionId
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

DB = tuple[str, str | None]
DAYS_AGO_100 = timedelta(days=-100)
NINETY_DAYS = timedelta(days=90)


def _runtime(db: DB, clock: ShiftedClock, *, run_in_process: bool = True) -> SessionRuntime:
    """Ended turns' checkpoints are kept, so there is something for retention to delete."""
    url, schema = db
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    agent = Agent(model=model, tools=[add], approval="always")
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        keep_ended_checkpoints=True,
        run_in_process=run_in_process,
    )
    return SessionRuntime(agent=agent, config=config, clock=clock)


async def _chat(runtime: SessionRuntime, session_id: str, text: str = "hello") -> str:
    events = await collect_events(runtime.execute_message(session_id, text))
    return events[-1].turn_id


async def _exists(runtime: SessionRuntime, session_id: str) -> bool:
    try:
        await runtime.session(session_id)
    except SessionNotFoundError:
        return False
    return True


async def test_idle_sessions_go_with_their_checkpoints_and_the_rest_stay(db: DB) -> None:
    clock = ShiftedClock(DAYS_AGO_100)
    paused_model = ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3))])
    async with _runtime(db, clock) as runtime:
        old = [await _chat(runtime, "old-1"), await _chat(runtime, "old-1", "again")]
        old.append(await _chat(runtime, "old-2"))
        paused_agent = Agent(name="asks", model=paused_model, tools=[add], approval="always")
        paused = (
            await collect_events(runtime.execute_message("old-paused", "add", agent=paused_agent))
        )[-1].turn_id
        assert (await runtime.turn(paused)).status == "awaiting_approval"
        woken = await _chat(runtime, "old-then-recent")
        clock.shift = timedelta(0)
        recent = await _chat(runtime, "recent")
        again = await _chat(runtime, "old-then-recent", "back again")
        await runtime.wait_background()
        before = await checkpoint_rows(*db)
        assert set(old) | {paused, woken, recent, again} <= set(before)

        report = await runtime.delete_idle_sessions(NINETY_DAYS)

        assert report.session_ids == ("old-1", "old-2")  # oldest first
        assert (report.turns, report.batches, report.dry_run) == (3, 1, False)
        assert report.idle_before < clock.now() - NINETY_DAYS + timedelta(minutes=1)
        after = await checkpoint_rows(*db)
        assert not set(old) & set(after)  # every row of their checkpoint threads is gone
        assert {t: after[t] for t in (paused, woken, recent, again)} == {
            t: before[t] for t in (paused, woken, recent, again)
        }
        assert [await _exists(runtime, s) for s in ("old-1", "old-2")] == [False, False]
        for kept in ("old-paused", "old-then-recent", "recent"):
            assert await _exists(runtime, kept), kept
        assert (await runtime.turn(paused)).status == "awaiting_approval"
        # Audit and usage rows stay: budgets and usage reports keep counting the spend.
        usage = await runtime.store.usage_report(by="session")
        assert {"old-1", "old-2"} <= {line.key for line in usage}
        assert (await runtime.delete_idle_sessions(NINETY_DAYS)).session_ids == ()


async def test_a_dry_run_deletes_nothing_and_reports_what_would_go(db: DB) -> None:
    clock = ShiftedClock(DAYS_AGO_100)
    async with _runtime(db, clock) as runtime:
        turns = [await _chat(runtime, "old-1"), await _chat(runtime, "old-2")]
        clock.shift = timedelta(0)
        await _chat(runtime, "recent")
        await runtime.wait_background()
        before = await checkpoint_rows(*db)

        report = await runtime.delete_idle_sessions(NINETY_DAYS, dry_run=True)

        assert (report.session_ids, report.turns, report.dry_run) == (("old-1", "old-2"), 2, True)
        assert await checkpoint_rows(*db) == before
        assert set(turns) <= set(before)
        assert await _exists(runtime, "old-1")
        assert await _exists(runtime, "old-2")
        deleted = await runtime.delete_idle_sessions(NINETY_DAYS)
        assert deleted.session_ids == report.session_ids


async def test_a_limit_deletes_the_oldest_first_and_many_go_in_batches(db: DB) -> None:
    clock = ShiftedClock(DAYS_AGO_100 - timedelta(days=10))
    async with _runtime(db, clock) as runtime:
        for n in range(250):  # sessions with no turn: a session created and never used
            clock.shift += timedelta(minutes=1)
            await runtime.create_session(f"s{n:03}")
        clock.shift = timedelta(0)

        first = await runtime.delete_idle_sessions(NINETY_DAYS, limit=150)

        assert first.session_ids == tuple(f"s{n:03}" for n in range(150))
        assert first.batches == 2  # at most 100 sessions a batch
        assert await _exists(runtime, "s150")
        assert not await _exists(runtime, "s149")
        rest = await runtime.delete_idle_sessions(NINETY_DAYS)
        assert rest.session_ids == tuple(f"s{n:03}" for n in range(150, 250))
        assert await runtime.store.list_sessions() == []


async def test_a_stopped_paused_turn_lets_its_session_age_from_the_stop(db: DB) -> None:
    """A paused session is never idle; once Stopped, it is idle `idle_for` after the Stop."""
    clock = ShiftedClock(DAYS_AGO_100)
    model = ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3))])
    async with _runtime(db, clock) as runtime:
        agent = Agent(name="asks", model=model, tools=[add], approval="always")
        paused = (await collect_events(runtime.execute_message("s1", "add", agent=agent)))[-1]
        clock.shift = timedelta(days=-10)
        assert await runtime.cancel(paused.turn_id) == "cancelled"
        clock.shift = timedelta(0)
        assert (await runtime.delete_idle_sessions(NINETY_DAYS)).session_ids == ()
        clock.shift = timedelta(days=81)
        report = await runtime.delete_idle_sessions(NINETY_DAYS)
        assert report.session_ids == ("s1",)
        assert paused.turn_id not in await checkpoint_rows(*db)


async def test_a_queued_turn_keeps_its_session(db: DB) -> None:
    clock = ShiftedClock(DAYS_AGO_100)
    async with _runtime(db, clock, run_in_process=False) as runtime:
        queued = await runtime.submit("s1", "for a worker, one day")
        clock.shift = timedelta(0)
        assert (await runtime.delete_idle_sessions(NINETY_DAYS)).session_ids == ()
        assert (await runtime.turn(queued.turn_id)).status == "running"  # queued


async def test_a_session_that_came_back_since_it_was_found_is_kept(db: DB) -> None:
    """Found idle, then a message arrived: the deletion checks again, in its transaction."""
    clock = ShiftedClock(DAYS_AGO_100)
    async with _runtime(db, clock) as runtime:
        await _chat(runtime, "s1")
        clock.shift = timedelta(0)
        idle_before = clock.now() - NINETY_DAYS
        [found] = await runtime.store.idle_sessions(idle_before=idle_before, limit=10)
        assert found.session_id == "s1"
        await _chat(runtime, "s1", "I am back")
        store = runtime.store
        assert await store.delete_idle_sessions([found.session_id], idle_before=idle_before) == []
        assert len(await runtime.history("s1")) == 2


async def test_a_session_that_came_back_mid_run_keeps_its_checkpoints(db: DB) -> None:
    """Its rows stay (the deletion checks again), and so do its ended turns' checkpoints."""
    clock = ShiftedClock(DAYS_AGO_100)
    async with _runtime(db, clock) as runtime:
        first = await _chat(runtime, "s1")
        gone = await _chat(runtime, "s2")
        clock.shift = timedelta(0)
        await runtime.wait_background()
        before = await checkpoint_rows(*db)
        assert {first, gone} <= set(before)
        store = runtime.store
        listed = store.idle_sessions

        async def then_a_message(**kwargs: object) -> object:
            found = await listed(**kwargs)  # type: ignore[arg-type]
            await _chat(runtime, "s1", "I am back")  # while the prune runs
            return found

        store.idle_sessions = then_a_message  # type: ignore[method-assign]
        try:
            report = await runtime.delete_idle_sessions(NINETY_DAYS)
        finally:
            del store.idle_sessions  # type: ignore[method-assign]
        assert report.session_ids == ("s2",)
        assert len(await runtime.history("s1")) == 2
        after = await checkpoint_rows(*db)
        assert after.get(first) == before[first]  # were deleted: the session stayed
        assert gone not in after


async def test_checkpoints_a_prune_left_behind_go_with_a_later_one(db: DB) -> None:
    """Interrupted between a session's rows and its checkpoints: the next prune takes them."""
    clock = ShiftedClock(DAYS_AGO_100)
    async with _runtime(db, clock) as runtime:
        turns = [await _chat(runtime, "s1"), await _chat(runtime, "s1", "again")]
        clock.shift = timedelta(0)
        await runtime.wait_background()
        forget = runtime.forget_checkpoints

        async def crash(turn_ids: object) -> None:
            raise RuntimeError("the process died here")

        runtime.forget_checkpoints = crash  # type: ignore[method-assign,assignment]
        with pytest.raises(RuntimeError, match="died"):
            await runtime.delete_idle_sessions(NINETY_DAYS)
        runtime.forget_checkpoints = forget  # type: ignore[method-assign]
        assert not await _exists(runtime, "s1")  # its rows went first
        assert set(turns) <= set(await checkpoint_rows(*db))
        recent = await _chat(runtime, "s2")
        await runtime.wait_background()

        report = await runtime.delete_idle_sessions(NINETY_DAYS)

        assert report.session_ids == ()
        assert report.orphaned_turns == 2
        left = await checkpoint_rows(*db)
        assert not set(turns) & set(left)
        assert recent in left  # a live session's turn keeps its checkpoints
        assert (await runtime.delete_idle_sessions(NINETY_DAYS)).orphaned_turns == 0


async def test_the_checkpoint_threads_of_turns_are_listed_a_page_at_a_time(db: DB) -> None:
    clock = ShiftedClock()
    async with _runtime(db, clock) as runtime:
        turns = sorted([await _chat(runtime, f"s{n}") for n in range(5)])
        await runtime.wait_background()
        pages, after = [], ""
        while page := await runtime.turn_threads(after=after, limit=2):
            pages.append(page)
            after = page[-1]
        assert [len(p) for p in pages] == [2, 2, 1]
        assert sorted(t for p in pages for t in p) == turns


@pytest.mark.parametrize(
    ("idle_for", "limit", "says"),
    [
        (timedelta(0), None, "idle_for must be a timedelta above zero"),
        (timedelta(days=-1), None, "idle_for must be a timedelta above zero"),
        (90, None, "idle_for must be a timedelta above zero, not 90"),
        (NINETY_DAYS, 0, "limit must be a whole number of 1 or more, not 0"),
        (timedelta(days=10**6), None, "reaches back before the year 1"),  # OverflowError
    ],
)
async def test_bad_arguments_are_refused_and_nothing_is_deleted(
    tmp_path: object, idle_for: object, limit: object, says: str
) -> None:
    clock = ShiftedClock(DAYS_AGO_100)
    db = (f"sqlite:///{tmp_path}/turnkit.db", None)
    async with _runtime(db, clock) as runtime:
        await _chat(runtime, "s1")
        clock.shift = timedelta(0)
        with pytest.raises(InvalidInputError, match=says):
            await runtime.delete_idle_sessions(idle_for, limit=limit)  # type: ignore[arg-type]
        assert await runtime.session(SessionId("s1"))


async def test_a_runtime_given_its_store_leaves_checkpoints_it_cannot_account_for(
    tmp_path: object,
) -> None:
    """Its checkpoints come from `database_url`, which other Stores' turns may share: a
    prune there must not take their turns for deleted ones."""
    from turnkit.store.sql import SqlStore

    shared = f"sqlite:///{tmp_path}/shared.db"
    clock = ShiftedClock()
    async with _runtime((shared, None), clock) as owner:
        theirs = await _chat(owner, "s1")
        await owner.wait_background()
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    config = RuntimeConfig(database_url=shared, keep_ended_checkpoints=True)
    own_store = SqlStore.from_url(f"sqlite:///{tmp_path}/other.db")
    await own_store.setup()
    try:
        async with SessionRuntime(agent=Agent(model=model), config=config, store=own_store) as rt:
            report = await rt.delete_idle_sessions(NINETY_DAYS)
    finally:
        await own_store.close()
    assert report.orphaned_turns == 0
    assert theirs in await checkpoint_rows(shared, None)
