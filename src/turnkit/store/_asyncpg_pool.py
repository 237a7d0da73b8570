"""What turnkit's asyncpg pools share: the Store's per-turn statements and the checkpoints."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ("close_pool", "keep_session")

CLOSE_WAIT_S = 5.0
"""How long closing a pool waits for connections still in use before cutting them."""


async def keep_session(conn: Any) -> None:
    """Pool `reset`: nothing to undo, so no round trip when a connection goes back.

    asyncpg's default sends `RESET ALL`, `UNLISTEN *` and an advisory-unlock to the server
    every time a connection is released: one extra round trip per statement. turnkit's
    pooled connections never set session state, listen or take advisory locks, and the
    pool still rolls back a transaction left open before this runs.
    """


async def close_pool(pool: Any) -> None:
    """Close an asyncpg pool; cut it after `CLOSE_WAIT_S` if a statement still runs.

    A statement still running is a cancelled turn's, whose result nobody awaits.
    """
    try:
        await asyncio.wait_for(pool.close(), CLOSE_WAIT_S)
    except TimeoutError:
        pool.terminate()
