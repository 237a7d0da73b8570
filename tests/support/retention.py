"""What the retention tests share: a clock set back in time, the checkpoint tables' rows."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta

from tests.conftest import POSTGRES_URL
from turnkit.clock import SystemClock


class ShiftedClock(SystemClock):
    """The system clock moved by `shift` (negative: in the past); real sleeps."""

    def __init__(self, shift: timedelta = timedelta(0)) -> None:
        self.shift = shift

    def now(self) -> datetime:
        return super().now() + self.shift


async def checkpoint_rows(database_url: str, schema: str | None) -> dict[str, int]:
    """Rows the checkpointer's tables hold, by thread (turn)."""
    if schema is None:
        path = database_url.split("///", 1)[1].replace(".db", ".checkpoints.db")
        with sqlite3.connect(path) as conn:
            rows = conn.execute(
                "SELECT thread_id, count(*) FROM (SELECT thread_id FROM checkpoints "
                "UNION ALL SELECT thread_id FROM writes) GROUP BY thread_id"
            ).fetchall()
        return {str(thread): int(n) for thread, n in rows}
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        rows = await conn.fetch(
            "SELECT thread_id, count(*) FROM (SELECT thread_id FROM checkpoints "
            "UNION ALL SELECT thread_id FROM checkpoint_blobs "
            "UNION ALL SELECT thread_id FROM checkpoint_writes) AS t GROUP BY thread_id"
        )
        return {str(r[0]): int(r[1]) for r in rows}
    finally:
        await conn.close()
