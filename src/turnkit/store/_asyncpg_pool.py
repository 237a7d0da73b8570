"""What turnkit's asyncpg pools share: the Store's per-turn statements and the checkpoints.

asyncpg leaves callbacks on the event loop as it works: a connection's socket reader for
as long as the connection is open, a statement's expiry from the cache when it is first
prepared, and a connection's idle timeout each time it goes back to the pool (cancelled
when it is next taken, but still held by the loop until it would have fired). The loop
keeps a copy of the context each callback was scheduled in, and a turn's context holds
the whole turn: LangGraph's config for the stage running, and through it the turn's
state, transcript and recorder. So turnkit's pools keep no statement timers
(`NO_STATEMENT_EXPIRY`: a connection's cache is still bounded, least recently used out),
and take connections out and hand them back in an empty context (`pooled`): a finished
turn is let go when it ends, not minutes later, nor for as long as a connection it opened
stays open.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import AsyncIterator, Awaitable, Generator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

__all__ = ("NO_STATEMENT_EXPIRY", "close_pool", "keep_session", "pooled")

T = TypeVar("T")

NO_STATEMENT_EXPIRY: dict[str, Any] = {"max_cached_statement_lifetime": 0}
"""asyncpg connection options: cached statements leave the cache by use (100 statements
a connection, least recently used first), never on a timer set in a turn's context."""


@asynccontextmanager
async def pooled(pool: Any) -> AsyncIterator[Any]:
    """`pool.acquire()` and `pool.release()`, each run in an empty context.

    What asyncpg schedules meanwhile (a new connection's reader, its idle timeout) then
    holds nothing of the turn that used the connection. No task of its own: asyncpg's
    release already runs in one, shielded, so a caller cancelled again while it waits
    does not leave the connection out of the pool.
    """
    conn = await _in_empty_context(pool.acquire())
    try:
        yield conn
    finally:
        await _in_empty_context(pool.release(conn))


@types.coroutine
def _in_empty_context(awaitable: Awaitable[T]) -> Generator[Any, Any, T]:
    """Await `awaitable` in the caller's task, each of its steps run in an empty context.

    As `await` does (what it waits on, a cancellation, are passed through), but whatever
    it schedules on the loop, or starts as a task, copies an empty context instead of
    the caller's. Cheaper than a task of its own: no extra loop iteration.
    """
    context = contextvars.Context()
    steps = context.run(awaitable.__await__)
    step: Any = steps.send
    arg: Any = None
    while True:
        try:
            waited = context.run(step, arg)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            arg = yield waited
        except GeneratorExit:
            context.run(steps.close)
            raise
        except BaseException as exc:  # noqa: BLE001 - passed on, as `await` does
            step, arg = steps.throw, exc
        else:
            step = steps.send


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
