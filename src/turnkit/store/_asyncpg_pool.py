"""What turnkit's asyncpg pools share: the Store's per-turn statements and the checkpoints.

asyncpg sets timers on the event loop as it works: a statement's expiry from the cache
when it is first prepared, and a connection's idle timeout each time it goes back to the
pool (cancelled when it is next taken, but still held by the loop until it would have
fired). `loop.call_later` keeps a copy of the context it is called in, and a turn's
context holds the whole turn: LangGraph's config for the stage running, and through it
the turn's state, transcript and recorder. So turnkit's pools keep no statement timers
(`NO_STATEMENT_EXPIRY`: a connection's cache is still bounded, least recently used out)
and hand their connections back from a context of their own (`pooled`): a finished turn
is let go when it ends, not minutes later.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

__all__ = ("NO_STATEMENT_EXPIRY", "close_pool", "keep_session", "pooled")

NO_STATEMENT_EXPIRY: dict[str, Any] = {"max_cached_statement_lifetime": 0}
"""asyncpg connection options: cached statements leave the cache by use (100 statements
a connection, least recently used first), never on a timer set in a turn's context."""


@asynccontextmanager
async def pooled(pool: Any) -> AsyncIterator[Any]:
    """`pool.acquire()`, the connection handed back outside the caller's context.

    What asyncpg schedules as the connection goes back (its idle timeout) then holds
    nothing of the turn that used it.
    """
    conn = await pool.acquire()
    try:
        yield conn
    finally:
        loop = asyncio.get_running_loop()
        release = loop.create_task(pool.release(conn), context=contextvars.Context())
        _releasing.add(release)
        release.add_done_callback(_released)
        # Shielded: a caller cancelled again while it waits must not cancel the release
        # (the connection would be out of the pool for good).
        await asyncio.shield(release)


_releasing: set[asyncio.Task[None]] = set()
"""Releases under way (the loop keeps only weak references to tasks)."""


def _released(task: asyncio.Task[None]) -> None:
    """Forget a release; its failure reached a caller that left (cancelled) is not logged.

    asyncpg's pool has already dropped a connection it could not reset.
    """
    _releasing.discard(task)
    if not task.cancelled():
        task.exception()


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
