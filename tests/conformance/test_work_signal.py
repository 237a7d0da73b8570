"""PostgreSQL tells listening processes when a turn becomes claimable.

A turn queued unclaimed, a pause answered, or a session's turn ending while a later one
waits sends `turnkit_work`; a claim, an append, a renewal or a turn with no successor
does not. Another process's `work_signal()` event is set by it; a listening connection
the server closed is opened again. SQLite has no notifications. Runs against the shared
PostgreSQL, each test in a schema of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa
from alembic import command
from tests.conftest import POSTGRES_URL
from tests.helpers import new_input, step_event

from turnkit.pauses import PauseRequest
from turnkit.store import ClaimRequest, RunSummary
from turnkit.store.migrate import _config, upgrade
from turnkit.store.sql import SqlStore

_CLAIM = ClaimRequest(owner="w1", ttl_s=30, max_attempts=3)


@pytest.fixture
async def stores(pg_schema: str) -> AsyncIterator[tuple[SqlStore, SqlStore]]:
    """Two stores on one schema: a writing process and a listening one."""
    async with (
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as writer,
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as listener,
    ):
        yield writer, listener


class _Heard:
    """Every `turnkit_work` notification for one schema, in commit order, up to a marker.

    Other schemas' notifications are left out: other test runs may share the server.
    """

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.mark = f"-- end of the writes to {schema} --"
        self.payloads: list[str] = []
        self.marked = asyncio.Event()

    def __call__(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.mark:
            self.marked.set()
        elif payload == self.schema:
            self.payloads.append(payload)

    async def until_marked(self) -> list[str]:
        """What was heard before the marker (committed after every write before it)."""
        await self.conn.execute("SELECT pg_notify('turnkit_work', $1)", self.mark)
        await asyncio.wait_for(self.marked.wait(), 10)
        heard, self.payloads = self.payloads, []
        self.marked.clear()
        return heard


@pytest.fixture
async def heard(pg_schema: str) -> AsyncIterator[_Heard]:
    conn = await asyncpg.connect(POSTGRES_URL)
    listening = _Heard(conn, pg_schema)
    await conn.add_listener("turnkit_work", listening)
    try:
        yield listening
    finally:
        await conn.close()


async def test_what_makes_a_turn_claimable_is_announced_and_nothing_else(
    stores: tuple[SqlStore, SqlStore], heard: _Heard, pg_schema: str
) -> None:
    writer, _ = stores
    claimed = await writer.submit(new_input(session="s1", claim_for=_CLAIM))  # claimed at once
    assert claimed.lease is not None
    lease = claimed.lease
    await writer.commit(claimed.turn_id, epoch=lease.epoch, events=[step_event(claimed, 2)])
    lease = await writer.renew(lease, ttl_s=30)
    assert await heard.until_marked() == []

    queued = await writer.submit(new_input(session="s2"))  # nobody claimed it
    assert await heard.until_marked() == [pg_schema]
    taken = await writer.claim("w1", ttl_s=30, max_attempts=3, turn_id=queued.turn_id)
    assert taken is not None
    await writer.commit(
        queued.turn_id, epoch=taken.epoch, status="succeeded", release=True,
        summary=RunSummary(status="succeeded"), guides_consumed_through=queued.input_seq,
    )  # fmt: skip
    assert await heard.until_marked() == []  # claimed, then ended with nothing behind it

    behind = await writer.submit(new_input(session="s1"))  # waits for s1's running turn
    assert await heard.until_marked() == [pg_schema]
    await writer.commit(
        claimed.turn_id, epoch=lease.epoch, status="succeeded", release=True,
        summary=RunSummary(status="succeeded"), guides_consumed_through=claimed.input_seq,
    )  # fmt: skip
    assert await heard.until_marked() == [pg_schema]  # s1's next turn may run now

    lease_b = await writer.claim("w1", ttl_s=30, max_attempts=3, turn_id=behind.turn_id)
    assert lease_b is not None
    pause = PauseRequest(request_id="r1", kind="approval", tool_call_id="c1", payload={})
    await writer.commit(
        behind.turn_id, epoch=lease_b.epoch, status="awaiting_approval", release=True, pause=pause
    )
    assert await heard.until_marked() == []
    await writer.answer_pause(behind.turn_id, "r1", {"approved": True})
    assert await heard.until_marked() == [pg_schema]


async def test_another_process_hears_a_queued_turn(stores: tuple[SqlStore, SqlStore]) -> None:
    writer, listener = stores
    work = await listener.work_signal()
    assert work is not None
    work.clear()  # set once on connecting: look for what was queued before
    await writer.submit(new_input(session="s1", claim_for=_CLAIM))
    sub = await writer.submit(new_input(session="s2"))
    await asyncio.wait_for(work.wait(), 10)
    lease = await listener.claim("w2", ttl_s=30, max_attempts=3)
    assert lease is not None
    assert lease.turn_id == sub.turn_id


async def test_a_lost_listening_connection_is_opened_again(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    writer, listener = stores
    work = await listener.work_signal()
    assert work is not None
    work.clear()
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'turnkit-listen'"
        )
    finally:
        await admin.close()
    assert killed >= 1
    await asyncio.wait_for(work.wait(), 10)  # the loss itself wakes the claimer
    assert await listener.work_signal() is work  # listening again
    work.clear()
    await writer.submit(new_input(session="s3"))
    await asyncio.wait_for(work.wait(), 10)


async def test_sqlite_hears_nothing(tmp_path: Path) -> None:
    async with SqlStore.from_url(f"sqlite:///{tmp_path / 't.db'}") as store:
        assert await store.work_signal() is None


async def test_downgrading_0011_removes_the_announcements(
    stores: tuple[SqlStore, SqlStore], heard: _Heard
) -> None:
    writer, _ = stores

    def without_0011(conn: sa.Connection) -> None:
        command.downgrade(_config(conn), "0010")
        # This code writes a session's organisation (0013) and a turn's asking turn
        # (0018): only 0011's trigger goes.
        conn.execute(sa.text("ALTER TABLE tk_sessions ADD COLUMN organisation varchar(128)"))
        conn.execute(sa.text("ALTER TABLE tk_turns ADD COLUMN asked_by varchar(64)"))

    def back_to_0010(conn: sa.Connection) -> None:
        conn.execute(sa.text("ALTER TABLE tk_sessions DROP COLUMN organisation"))
        conn.execute(sa.text("ALTER TABLE tk_turns DROP COLUMN asked_by"))

    await writer._migrate(without_0011)
    await writer.submit(new_input(session="s1"))
    assert await heard.until_marked() == []
    await writer._migrate(back_to_0010)
    await writer._migrate(lambda conn: upgrade(conn))
    await writer.submit(new_input(session="s2"))
    assert await heard.until_marked() == [writer.schema]
