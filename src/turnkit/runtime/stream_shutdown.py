"""Streams that say goodbye when the server shuts down, so their clients know to resume.

A browser's `EventSource` reconnects by itself when its stream ends; the AI SDK's and
AG-UI's clients take a stream that simply ends for a finished answer. When the server
begins to shut down (SIGTERM, a rolling restart) their streams therefore end with a last
frame saying so (an `error` part, a `RUN_ERROR`) instead of a silent close; the turn runs
on elsewhere, and the client resumes it as its protocol page says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Final, Protocol, TypeVar

__all__ = ("SHUTDOWN_GRACE_S", "ShutdownEvent", "until_shutdown")

T = TypeVar("T")

SHUTDOWN_GRACE_S: Final = 1.0
"""How long sse-starlette lets a stream send its last frame once shutdown began."""
_SHUTDOWN: Final = "turnkit: the server is shutting down"


class ShutdownEvent(Protocol):
    """What `until_shutdown` needs of the server's event (an `anyio.Event`)."""

    def is_set(self) -> bool: ...  # noqa: D102

    async def wait(self) -> object: ...  # noqa: D102


async def until_shutdown(
    body: AsyncIterator[T],
    shutdown: ShutdownEvent,
    farewell: Callable[[T | None], Iterable[T]],
) -> AsyncIterator[T]:
    """`body`'s items until `shutdown` is set, then `farewell(last item sent)`'s and the end.

    `shutdown` is the event sse-starlette sets when the server begins to shut down. A
    stream waiting for its turn's next event is woken at once (its wait is cancelled, the
    reader closed); one busy sending ends after that send. `farewell` gets the last item
    sent, so a stream whose end already went out adds nothing. Nothing is spent per item.
    """
    task = asyncio.current_task()
    assert task is not None
    waiting = cancelled_here = False

    async def watch() -> None:
        nonlocal cancelled_here
        await shutdown.wait()
        if waiting:
            cancelled_here = True
            task.cancel(_SHUTDOWN)

    watcher = asyncio.create_task(watch())
    last: T | None = None
    try:
        while not shutdown.is_set():
            waiting = True
            try:
                item = await anext(body)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not cancelled_here or task.cancelling() > 1:  # someone else's too
                    raise
                task.uncancel()
                cancelled_here = False
                break
            finally:
                waiting = False
            yield item
            last = item
        for item in farewell(last):
            yield item
    finally:
        watcher.cancel()
        if cancelled_here:  # the body swallowed our cancellation: take it back
            task.uncancel()
        if isinstance(body, AsyncGenerator):
            await body.aclose()
