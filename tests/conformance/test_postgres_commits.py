"""PostgreSQL's hot writes are single statements that keep the full transaction's rules.

A new message, a turn's appends and its ending each cost one round trip. An ending that
meets a guide message its turn never presented (even one committed while the ending
waited for the turn's row) leaves it to the full transaction, which gives the guide a turn
of its own; two messages racing into one session never both run at once. Runs against
the shared PostgreSQL, each test in a schema of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from tests.conftest import POSTGRES_URL
from tests.helpers import new_input, step_event

from turnkit.errors import StaleEpochError
from turnkit.events import DoneEvent
from turnkit.ids import SessionId
from turnkit.store import ClaimRequest, Lease, RunSummary, Submission, TurnTranscript
from turnkit.store.sql import SqlStore

_CLAIM = ClaimRequest(owner="w1", ttl_s=30, max_attempts=3)
_TRANSCRIPT = TurnTranscript(
    messages=({"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}),
    last_request={"digest": "d1"},
)


@pytest.fixture
async def store(pg_schema: str, sent: list[str]) -> AsyncIterator[SqlStore]:
    async with SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as opened:
        yield opened


async def _running(store: SqlStore) -> tuple[Submission, Lease]:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    return sub, lease


def _done(sub: Submission, seq: int) -> DoneEvent:
    return DoneEvent(
        session_id=sub.session_id,
        turn_id=sub.turn_id,
        stage_id="post-turn",
        ts=step_event(sub, seq).ts,
        seq=seq,
        status="succeeded",
    )


async def _end(store: SqlStore, sub: Submission, lease: Lease, seq: int) -> int:
    """End the turn as a driver does; how many guide messages it re-queued."""
    result = await store.commit(
        sub.turn_id,
        epoch=lease.epoch,
        events=[_done(sub, seq)],
        status="succeeded",
        summary=RunSummary(status="succeeded", model_calls=1),
        release=True,
        guides_consumed_through=sub.input_seq,
        transcript=_TRANSCRIPT,
    )
    return result.requeued


async def test_a_message_an_append_and_an_ending_are_one_statement_each(
    store: SqlStore, sent: list[str]
) -> None:
    warm, lease = await _running(store)  # asyncpg asks the server for types on first use
    await store.commit(warm.turn_id, epoch=lease.epoch, events=[step_event(warm, 2)])
    await _end(store, warm, lease, 3)
    before = len(sent)
    sub = await store.submit(new_input(claim_for=_CLAIM))
    assert len(sent) == before + 1
    assert sub.lease is not None
    assert sub.started is not None
    assert (sub.input_seq, sub.started.input_seq, sub.lease.epoch) == (2, 2, 1)
    [started] = [e.decode() async for e in store.read_events(sub.turn_id)]
    assert started == sub.started
    lease = sub.lease
    before = len(sent)
    await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
    assert len(sent) == before + 1
    assert await _end(store, sub, lease, 3) == 0
    assert len(sent) == before + 2
    assert "tk_transcripts" in sent[-1]

    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert (record.status, record.lease_owner, record.last_seq) == ("succeeded", None, 3)
    assert record.summary is not None
    assert record.summary.model_calls == 1
    assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2, 3]
    kept = await store.kept_transcript(sub.session_id, before_input_seq=sub.input_seq + 1)
    turn = kept.turns[-1]
    assert turn.transcript is not None
    assert turn.transcript.messages == _TRANSCRIPT.messages
    assert kept.last_request == {"digest": "d1"}


async def test_an_ending_keeps_the_session_one_last_request(store: SqlStore) -> None:
    first, lease = await _running(store)
    await _end(store, first, lease, 2)
    second, lease = await _running(store)
    await _end(store, second, lease, 2)
    async with store._async_engine.connect() as conn:  # type: ignore[union-attr]
        raw = await conn.get_raw_connection()
        held = await raw.driver_connection.fetch(  # type: ignore[union-attr]
            "SELECT turn_id FROM tk_transcripts WHERE last_request IS NOT NULL"
        )
    assert [r["turn_id"] for r in held] == [second.turn_id]


async def test_a_stale_ending_writes_nothing_and_says_why(store: SqlStore, sent: list[str]) -> None:
    sub, lease = await _running(store)
    await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
    before = len(sent)
    with pytest.raises(StaleEpochError):
        await store.commit(
            sub.turn_id,
            epoch=lease.epoch + 1,
            events=[_done(sub, 3)],
            status="succeeded",
            release=True,
            guides_consumed_through=1,
            transcript=_TRANSCRIPT,
        )
    assert any("tk_transcripts" in q for q in sent[before:])  # the one statement refused
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert (record.status, record.lease_owner) == ("running", "w1")
    assert [e.seq async for e in store.read_events(sub.turn_id)] == [1, 2]


class _RowLock:
    """Rows a connection of its own holds locked until `release`, and who waits for them."""

    def __init__(self, schema: str, query: str, *args: object) -> None:
        self._schema, self._query, self._args = schema, query, args

    async def __aenter__(self) -> _RowLock:
        settings = {"search_path": self._schema}
        self._holder = await asyncpg.connect(POSTGRES_URL, server_settings=settings)
        # Outside a transaction: inside one, the activity view stays as it was first read.
        self._watcher = await asyncpg.connect(POSTGRES_URL)
        self._locked = self._holder.transaction()
        await self._locked.start()
        await self._holder.execute(self._query, *self._args)
        return self

    async def waiting(self, count: int) -> None:
        """Until `count` sessions wait, directly or in a queue, for the rows (at most 5 s)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            waiting = await self._watcher.fetchval(_WAITERS, self._holder.get_server_pid())
            if waiting >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"fewer than {count} sessions waited for a lock within 5 s")

    async def release(self) -> None:
        await self._locked.rollback()

    async def __aexit__(self, *exc: object) -> None:
        await self._holder.close()
        await self._watcher.close()


_WAITERS = """
WITH RECURSIVE waiter(pid) AS (
    SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN waiter w ON w.pid = ANY(pg_blocking_pids(a.pid))
)
SELECT count(*) FROM waiter
"""
_SESSION_ROW = "SELECT FROM tk_sessions WHERE session_id = 's1' FOR UPDATE"


async def test_a_guide_that_lands_while_the_ending_waits_gets_a_turn_of_its_own(
    store: SqlStore, pg_schema: str
) -> None:
    sub, lease = await _running(store)
    turn_row = "SELECT FROM tk_turns WHERE turn_id = $1 FOR UPDATE"
    async with _RowLock(pg_schema, turn_row, sub.turn_id) as lock:
        # The guide queues for the turn's row first, the ending behind it: the ending's
        # statement starts before the guide is committed, and runs right after it.
        guide = asyncio.create_task(store.submit(new_input(content="also", delivery="guide")))
        await lock.waiting(1)
        ending = asyncio.create_task(_end(store, sub, lease, 2))
        await lock.waiting(2)
        await lock.release()
        guided = await asyncio.wait_for(guide, 10)
        requeued = await asyncio.wait_for(ending, 10)

    assert (guided.turn_id, guided.delivery) == (sub.turn_id, "guide")
    assert requeued == 1
    turns = await store.list_turns(SessionId("s1"))
    assert [(t.content, t.status) for t in turns] == [("hello", "succeeded"), ("also", "running")]


async def test_two_messages_racing_into_one_session_never_both_run(
    store: SqlStore, pg_schema: str
) -> None:
    await store.create_session(SessionId("s1"))
    async with _RowLock(pg_schema, _SESSION_ROW) as lock:
        # Both statements start (and read their snapshot) before either is committed.
        first = asyncio.create_task(store.submit(new_input(content="a", claim_for=_CLAIM)))
        await lock.waiting(1)
        second = asyncio.create_task(store.submit(new_input(content="b", claim_for=_CLAIM)))
        await lock.waiting(2)
        await lock.release()
        subs = [await asyncio.wait_for(first, 10), await asyncio.wait_for(second, 10)]

    assert sorted(s.input_seq for s in subs) == [1, 2]
    claimed = [s for s in subs if s.lease is not None]
    assert [s.input_seq for s in claimed] == [1]  # the later one waits its turn
    turns = await store.list_turns(SessionId("s1"))
    assert [(t.input_seq, t.lease_owner) for t in turns] == [(1, "w1"), (2, None)]


async def test_a_guide_an_older_version_attached_is_still_requeued(
    store: SqlStore, pg_schema: str
) -> None:
    sub, lease = await _running(store)
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": pg_schema})
    try:  # what a guide looked like before turns noted their newest guide on their row
        await conn.execute(
            "INSERT INTO tk_inputs (session_id, seq, content, requested_delivery, delivery, "
            "turn_id, created_at) VALUES ('s1', 2, 'also', 'guide', 'guide', $1, now())",
            sub.turn_id,
        )
        await conn.execute("UPDATE tk_sessions SET last_input_seq = 2 WHERE session_id = 's1'")
    finally:
        await conn.close()
    assert await _end(store, sub, lease, 2) == 1
    turns = await store.list_turns(SessionId("s1"))
    assert [(t.content, t.status) for t in turns] == [("hello", "succeeded"), ("also", "running")]


async def test_a_request_retried_while_its_first_try_commits_is_one_turn(
    store: SqlStore, pg_schema: str
) -> None:
    await store.create_session(SessionId("s1"))
    async with _RowLock(pg_schema, _SESSION_ROW) as lock:
        tries = [
            asyncio.create_task(store.submit(new_input(request_id="r1", claim_for=_CLAIM)))
            for _ in range(2)
        ]
        await lock.waiting(2)
        await lock.release()
        first, again = [await asyncio.wait_for(t, 10) for t in tries]

    assert sorted([first.is_new, again.is_new]) == [False, True]
    assert (
        (first.turn_id, first.input_seq)
        == (again.turn_id, again.input_seq)
        == (
            first.turn_id,
            1,
        )
    )
    [turn] = await store.list_turns(SessionId("s1"))
    assert turn.turn_id == first.turn_id


async def test_closing_the_store_closes_every_connection_it_opened(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[asyncpg.Connection] = []
    init = asyncpg.Connection.__init__

    def tracked(self: asyncpg.Connection, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(asyncpg.Connection, "__init__", tracked)
    store = SqlStore.from_url(POSTGRES_URL, schema=pg_schema)
    await store.setup()
    # Hot statements from many turns at once: several connections of the driver's pool.
    runs = [await store.submit(new_input(f"s{i}", claim_for=_CLAIM)) for i in range(4)]
    leases = [sub.lease for sub in runs]
    assert None not in leases
    await asyncio.gather(
        *(_end(store, sub, lease, 2) for sub, lease in zip(runs, leases, strict=True) if lease)
    )
    assert opened
    await store.close()
    assert [c for c in opened if not c.is_closed()] == []


async def test_a_turn_start_reads_its_kept_transcript_in_one_statement(
    store: SqlStore, sent: list[str]
) -> None:
    first, lease = await _running(store)
    await _end(store, first, lease, 2)
    second, lease = await _running(store)
    await _end(store, second, lease, 2)
    before = len(sent)
    kept = await store.kept_transcript(SessionId("s1"), before_input_seq=3, after=first.turn_id)
    assert len(sent) == before + 1
    assert kept.continues
    assert [t.turn_id for t in kept.turns] == [second.turn_id]
    assert kept.turns[0].transcript is not None
    assert kept.turns[0].transcript.messages == _TRANSCRIPT.messages
    assert kept.last_request == {"digest": "d1"}
