"""`Aftermath`: work a turn leaves running after its ending (private).

A turn settles first (`done` is committed and sent, its stream ends, its lease and slot
are free) and only then does what it need not wait for: today, the utility model's name
for a session's opening turn. Closing the runtime cancels what is still running (the
name read off the opening message stands).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ("Aftermath", "Work")

log = logging.getLogger("turnkit.runtime")

Work = Callable[[], Awaitable[None]]
"""One piece of work for after a turn's ending (it logs its own failures)."""


class Aftermath:
    """The tasks turns left running after their ending, in one runtime."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def leave(self, work: Work, *, name: str, within_s: float) -> None:
        """Run `work` in a task of its own, for at most `within_s`; nobody waits for it.

        Once the runtime has closed, the work is dropped (its store is gone).
        """
        if self._closed:
            log.info("work left after a turn's ending was dropped: the runtime has closed")
            return
        task = asyncio.create_task(self._run(work, within_s), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run(work: Work, within_s: float) -> None:
        try:
            async with asyncio.timeout(within_s):
                await work()
        except TimeoutError:
            log.warning("work left after a turn's ending gave up after %g s", within_s)
        except Exception:  # a bug here must not end up as an unretrieved task exception
            log.exception("work left after a turn's ending failed")

    async def wait(self) -> None:
        """Wait until every task left so far (and any they left) has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is still running and wait for it to stop; take no more."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
