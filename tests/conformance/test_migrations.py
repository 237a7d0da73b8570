"""Schema migrations applied to a database an older turnkit wrote (SQLite)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command

from turnkit.ids import TurnId
from turnkit.store.migrate import _config, upgrade
from turnkit.store.sql import SqlStore

_OLD_TURN = """
INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content, agent, model,
    last_seq, lease_epoch, attempts, read_watermark, created_at, updated_at)
VALUES ('t-old', 's-old', 1, 'running', 'hi', 'a', 'm', 1, 0, 0, 0, :now, :now)
"""


def _columns(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[1] for row in conn.execute("PRAGMA table_info(tk_turns)")}


async def test_0005_drops_the_unused_read_watermark_and_keeps_the_turns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        upgrade(conn, "0004")  # the schema as the previous release left it, with a turn
        conn.execute(sa.text(_OLD_TURN), {"now": datetime(2026, 5, 1, tzinfo=UTC)})
    assert "read_watermark" in _columns(path)

    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        assert "read_watermark" not in _columns(path)
        record = await store.get_turn(TurnId("t-old"))
        assert record is not None
        assert (record.status, record.content) == ("running", "hi")
        lease = await store.claim("w1", ttl_s=10, max_attempts=3)
        assert lease is not None
        assert (lease.turn_id, lease.attempt) == ("t-old", 1)

    with engine.begin() as conn:  # and back: the column returns, filled with 0
        command.downgrade(_config(conn), "0004")
        assert conn.execute(sa.text("SELECT read_watermark FROM tk_turns")).scalar_one() == 0
    engine.dispose()
