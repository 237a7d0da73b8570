"""The PostgreSQL checkpointer stores what a resume needs, in fewer transactions, and lets
turns write at once: a call on one thread never waits for another thread's.

Runs against the shared PostgreSQL, each test in a schema of its own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from tests.conftest import POSTGRES_URL, require_service
from tests.helpers import PostTurnGate, add, new_input, step_event
from tests.support.checkpoints import THREAD, checkpoint, config

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import CheckpointCreatedEvent, DoneEvent
from turnkit.graph import latest_checkpoint_id, open_checkpointer
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    name = f"tk_saver_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


@pytest.fixture
async def saver(schema: str) -> AsyncIterator[Any]:
    opened, close = await open_checkpointer(POSTGRES_URL, schema=schema)
    try:
        yield opened
    finally:
        await close()


async def _stored(schema: str) -> tuple[int, int]:
    """(checkpoints, writes) in the schema, read through a connection of its own."""
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        checkpoints = await conn.fetchval(f'SELECT count(*) FROM "{schema}".checkpoints')
        writes = await conn.fetchval(f'SELECT count(*) FROM "{schema}".checkpoint_writes')
    finally:
        await conn.close()
    return int(checkpoints), int(writes)


async def test_the_input_checkpoint_lands_with_the_next_one(saver: Any, schema: str) -> None:
    await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
    assert await _stored(schema) == (0, 0)  # held: nothing has run from it yet
    await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
    assert await _stored(schema) == (2, 0)
    history = [t async for t in saver.alist({"configurable": {"thread_id": THREAD}})]
    assert [t.checkpoint["id"] for t in history] == [checkpoint(1)["id"], checkpoint(0)["id"]]
    assert history[0].parent_config is not None
    assert history[0].parent_config["configurable"]["checkpoint_id"] == checkpoint(0)["id"]


async def test_a_connection_goes_back_to_the_pool_without_a_round_trip(
    schema: str, sent: list[str]
) -> None:
    saver, close = await open_checkpointer(POSTGRES_URL, schema=schema)
    try:
        await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
        sent.clear()
        await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
        await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    finally:
        await close()
    assert await _stored(schema) == (3, 0)
    # asyncpg's default sends RESET ALL (and more) each time a connection goes back
    assert [q for q in sent if "RESET ALL" in q or "pg_advisory_unlock_all" in q] == []


async def test_a_driver_that_just_ran_a_thread_names_its_newest_checkpoint_without_a_query(
    schema: str, sent: list[str]
) -> None:
    saver, close = await open_checkpointer(POSTGRES_URL, schema=schema)
    graph: Any = SimpleNamespace(checkpointer=saver)
    try:
        await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
        await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
        sent.clear()
        newest = checkpoint(1)["id"]
        assert await latest_checkpoint_id(graph, THREAD, just_ran=True) == newest
        assert sent == []
        # Taken once: asked again, the saver reads it back.
        assert await latest_checkpoint_id(graph, THREAD, just_ran=True) == newest
        assert any("select" in q.lower() for q in sent)
    finally:
        await close()


async def test_a_new_threads_opening_read_asks_no_database(
    saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(*args: object) -> None:
        raise AssertionError("asked the database")

    saver.expect_new(THREAD)
    monkeypatch.setattr(type(saver.pool), "acquire", refused)
    assert await saver.aget_tuple(config()) is None
    monkeypatch.undo()
    await saver.aput(config(), checkpoint(0), {"source": "loop", "step": 0}, {})
    found = await saver.aget_tuple(config())  # taken once: later reads ask
    assert found is not None
    assert found.checkpoint["id"] == checkpoint(0)["id"]


async def _tool_using_turn(schema: str, durability: Any = None) -> list[Any]:
    """One turn (a call asking for `add`, the tool, the answer) on PostgreSQL; its events."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("5")]
    )
    config_ = RuntimeConfig(
        database_url=POSTGRES_URL,
        database_schema=schema,
        checkpoint_durability=durability,
        keep_ended_checkpoints=True,  # what a turn stores is what these tests read
    )
    async with SessionRuntime(
        agent=Agent(model=model, tools=[add], skip_stages=frozenset({"anchor-plan"})),
        config=config_,
    ) as runtime:
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    return events


async def test_a_tool_using_turn_reads_no_checkpoint_back(schema: str, sent: list[str]) -> None:
    """Its opening read (a new thread) and its settle (the id just stored) ask nothing."""
    events = await _tool_using_turn(schema)
    assert any(isinstance(e, CheckpointCreatedEvent) for e in events)
    reads = [q for q in sent if "from checkpoints" in q.lower() and "delete" not in q.lower()]
    assert reads == []


async def test_task_writes_a_newer_checkpoint_holds_are_not_stored(saver: Any, schema: str) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "next")], "task-a")
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert await _stored(schema) == (2, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.checkpoint["channel_values"] == {"content": "state 2"}
    assert found.pending_writes == []


async def test_langgraphs_own_writes_go_at_once_with_what_is_held(saver: Any, schema: str) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "done")], "task-a")
    # a sibling task fails: LangGraph's error write goes at once, the held write with it
    await saver.aput_writes(config(parent=1), [("__error__", "boom")], "task-b")
    assert await _stored(schema) == (1, 2)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert sorted(found.pending_writes) == [
        ("task-a", "content", "done"),
        ("task-b", "__error__", "boom"),
    ]


async def test_a_cancelled_tasks_writes_are_not_stored(saver: Any, schema: str) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    # The node returned (its writes are in), then its task was cancelled: LangGraph saves
    # its writes with the error. A resume would take them as the node's result, though
    # the events it staged were never committed: none is stored, so the node runs again.
    writes = [("content", "done"), ("__error__", asyncio.CancelledError())]
    await saver.aput_writes(config(parent=1), writes, "task-a")
    assert await _stored(schema) == (1, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == []


async def test_a_read_sees_writes_still_held(saver: Any) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "pending")], "task-a")
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == [("task-a", "content", "pending")]


async def test_closing_stores_what_is_held(schema: str) -> None:
    opened, close = await open_checkpointer(POSTGRES_URL, schema=schema)
    await opened.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
    assert await _stored(schema) == (0, 0)
    await close()
    assert await _stored(schema) == (1, 0)


class _NotStorable:
    """A value LangGraph's serializer refuses."""


async def test_a_held_write_that_cannot_be_stored_is_dropped_not_retried_forever(
    saver: Any, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", _NotStorable())], "task-a")
    await saver.aput_writes(config(parent=1), [("__error__", "boom")], "task-b")
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert await _stored(schema) == (2, 1)  # the thread went on; only the error write is kept
    assert "dropped a held task write of thread turn-1" in caplog.text


async def test_a_thread_waiting_on_a_lock_holds_up_no_other_thread(saver: Any, schema: str) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    other = config(thread="turn-2")
    await saver.aput(other, checkpoint(5), {"source": "loop", "step": 0}, {})
    blocker = await asyncpg.connect(POSTGRES_URL)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(  # holds turn-1's checkpoint row: its next write must wait
            f'SELECT 1 FROM "{schema}".checkpoints WHERE thread_id = $1 FOR UPDATE', THREAD
        )
        stuck = asyncio.create_task(
            saver.aput(config(parent=1), checkpoint(1), {"source": "loop", "step": 0}, {})
        )
        await asyncio.sleep(0.2)
        assert not stuck.done()
        async with asyncio.timeout(5):  # the other thread is served meanwhile
            found = await saver.aget_tuple({"configurable": {"thread_id": "turn-2"}})
            await saver.aput(
                config(parent=5, thread="turn-2"), checkpoint(6), {"source": "loop"}, {}
            )
        assert found is not None
        assert found.checkpoint["id"] == checkpoint(5)["id"]
        await tx.rollback()
        await asyncio.wait_for(stuck, 5)
    finally:
        await blocker.close()


async def test_a_held_checkpoint_the_database_refuses_is_dropped_not_retried_forever(
    saver: Any, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    refused = checkpoint(0) | {"channel_values": {"content": "nul \u0000 in jsonb"}}
    await saver.aput(config(), refused, {"source": "input", "step": -1}, {})
    await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert await _stored(schema) == (2, 0)  # the thread went on without the refused one
    assert "dropped a held checkpoint of thread turn-1" in caplog.text


async def test_two_writes_to_one_special_channel_in_a_call_keep_the_last(saver: Any) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("__error__", "one"), ("__error__", "two")], "t")
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == [("t", "__error__", "two")]


async def _carried_turn(
    store: Any, saver: Any, *, stale: bool, staged: int = 1
) -> tuple[Any, list[Any], list[bool], Any]:
    """A turn on `store` whose commits carry `saver`'s checkpoints of thread THREAD.

    Returns the submission, the events its next commit takes (`staged` of them to begin
    with; the test can add more), what each call of the carrier carried, and what stops
    the carrying. `stale`: the
    commit presents an epoch the turn no longer has (another attempt's).
    """
    from turnkit.store import Rider

    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    events = [step_event(sub, 2 + i) for i in range(staged)]
    carried: list[bool] = []

    async def carrier(rider: Rider | None) -> bool:
        if not events:
            carried.append(False)
            return False
        result = await store.commit(
            sub.turn_id, epoch=lease.epoch + (1 if stale else 0), events=events, rider=rider
        )
        events.clear()
        carried.append(result.carried)
        return bool(result.carried)

    return sub, events, carried, saver.carry(THREAD, carrier)


def _with_blob(n: int) -> tuple[Any, dict[str, Any]]:
    """Checkpoint `n` with a channel stored as a blob, and its new versions."""
    kept = checkpoint(n)
    kept["channel_values"] = {**kept["channel_values"], "transcript": [{"role": "user"}]}
    kept["channel_versions"] = {**kept["channel_versions"], "transcript": str(n + 1)}
    return kept, {"transcript": str(n + 1)}


async def test_a_checkpoint_rides_in_the_statement_of_its_steps_events(
    saver: Any, schema: str, sent: list[str]
) -> None:
    from turnkit.store.sql import SqlStore

    async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
        sub, events, carried, _ = await _carried_turn(store, saver, stale=False)
        first, versions = _with_blob(1)  # asyncpg asks the server for types on first use
        await saver.aput(config(), first, {"source": "loop", "step": 0}, versions)
        events.append(step_event(sub, 3))
        kept, versions = _with_blob(2)
        before = len(sent)
        await saver.aput(config(parent=1), kept, {"source": "loop", "step": 1}, versions)
        [statement] = sent[before:]  # one round trip for both
        assert "tk_events" in statement
        assert "INSERT INTO checkpoints" in statement
        assert carried == [True, True]
        assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2, 3]
    found = await saver.aget_tuple(config())
    assert found is not None
    assert found.checkpoint["id"] == kept["id"]
    assert found.checkpoint["channel_values"]["transcript"] == [{"role": "user"}]
    assert found.metadata["step"] == 1
    assert found.parent_config is not None
    assert found.parent_config["configurable"]["checkpoint_id"] == first["id"]


async def test_a_stale_attempt_stores_neither_its_events_nor_its_checkpoint(
    saver: Any, schema: str
) -> None:
    from turnkit.errors import StaleEpochError
    from turnkit.store.sql import SqlStore

    async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
        sub, *_ = await _carried_turn(store, saver, stale=True)
        kept, versions = _with_blob(1)
        with pytest.raises(StaleEpochError):
            await saver.aput(config(), kept, {"source": "loop", "step": 0}, versions)
        assert [e.seq async for e in store.read_events(sub.turn_id)] == [1]
    assert await _stored(schema) == (0, 0)
    assert await _fetchval(f'SELECT count(*) FROM "{schema}".checkpoint_blobs') == 0


async def test_the_runs_input_and_start_checkpoints_ride_with_the_first_stages_events(
    saver: Any, schema: str, sent: list[str]
) -> None:
    """Before any stage ends there is nothing to carry them: they wait, then go as one."""
    from turnkit.store.sql import SqlStore

    async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
        sub, events, carried, _ = await _carried_turn(store, saver, stale=False, staged=0)
        before = len(sent)
        await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
        await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
        assert sent[before:] == []  # held: no stage has run
        events.append(step_event(sub, 2))
        await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
        assert carried == [False, True]
        assert await _stored(schema) == (3, 0)
        assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2]
    found = await saver.aget_tuple(config(parent=1))
    assert found is not None
    assert found.parent_config is not None
    assert found.parent_config["configurable"]["checkpoint_id"] == checkpoint(0)["id"]


async def test_a_run_that_stops_before_its_first_stage_ends_leaves_nothing_held(
    saver: Any, schema: str
) -> None:
    from turnkit.store.sql import SqlStore

    async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
        *_, stop = await _carried_turn(store, saver, stale=False, staged=0)
        await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
        await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
        await stop(False)  # the run failed or lost its lease
    await saver.aclose()  # stores what threads hold: this one holds nothing
    assert await _stored(schema) == (0, 0)


@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_each_stage_of_a_turn_commits_its_events_with_its_checkpoint(
    schema: str, sent: list[str], durability: Any
) -> None:
    events = await _tool_using_turn(schema, durability)
    durable = [e.seq for e in events if getattr(e, "seq", None) is not None]
    assert durable == list(range(1, len(durable) + 1))
    checkpoints = [q for q in sent if "INSERT INTO checkpoints" in q]
    assert "tk_transcripts" in checkpoints[-1]  # the last goes with the ending
    if durability == "sync":
        # The run's input and START checkpoints ride on the first stage's first commit
        # (its step.start, before the model call); the ends of tool-loop (twice) and
        # synthesize carry theirs; post-turn's closing events and the last checkpoint go
        # with the ending. (With `async`, the next stage's commit may take a stage's
        # events before its checkpoint is written, which then goes on its own.)
        assert len(checkpoints) == 5
        assert all("tk_events" in q for q in checkpoints)
    [created] = [e for e in events if isinstance(e, CheckpointCreatedEvent)]
    assert created.checkpoint_id == await _newest_checkpoint(schema, events[-1].turn_id)
    assert (await _stored(schema))[0] == 6


async def _newest_checkpoint(schema: str, thread_id: str) -> str | None:
    query = f'SELECT max(checkpoint_id) FROM "{schema}".checkpoints WHERE thread_id = $1'
    newest = await _fetchval(query, thread_id)
    return None if newest is None else str(newest)


async def _fetchval(query: str, *args: Any) -> Any:
    """One value, read through a connection of its own."""
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def test_an_ending_that_re_queues_a_guide_still_stores_the_last_checkpoint(
    schema: str,
) -> None:
    """The ending's one statement refuses (a guide is waiting), so it carries nothing."""
    gate = PostTurnGate()
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    config_ = RuntimeConfig(
        database_url=POSTGRES_URL, database_schema=schema, keep_ended_checkpoints=True
    )
    async with SessionRuntime(agent=Agent(model=model, plugins=[gate]), config=config_) as rt:
        first = asyncio.create_task(collect_events(rt.execute_message("s1", "first")))
        await asyncio.wait_for(gate.entered.wait(), 10)
        late = await rt.submit("s1", "one more thing", delivery="guide")
        assert late.guided
        gate.release.set()
        events = await asyncio.wait_for(first, 10)
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
        [created] = [e for e in events if isinstance(e, CheckpointCreatedEvent)]
        async with asyncio.timeout(5):  # stored right after the ending, not in it
            while await _newest_checkpoint(schema, events[-1].turn_id) != created.checkpoint_id:
                await asyncio.sleep(0.02)
        async with asyncio.timeout(10):  # the guide got a turn of its own
            while len(await rt.history("s1")) < 2:
                await asyncio.sleep(0.02)
        assert [t.answer for t in await rt.history("s1")] == ["First.", "Second."]
