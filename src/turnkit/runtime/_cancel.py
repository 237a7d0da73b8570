"""Stop: the one cancellation of a turn's task that ends the turn `cancelled`.

Anything else that cancels the task (the event loop shutting down, `asyncio.run`
returning or interrupted, an app cancelling its tasks as it exits) leaves the turn to
recovery, as a crash would (see `TurnDriver.run`).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

__all__ = ("CancelToken", "stop_task", "stopped")

_STOPPED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
"""Tasks driving a turn that a Stop cancelled (`stop_task`); forgotten with the task."""


def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel the task that drives a turn, as a Stop: its driver ends the turn `cancelled`."""
    _STOPPED.add(task)
    task.cancel()


def stopped(task: asyncio.Task[Any]) -> bool:
    """Whether `task` was cancelled as a Stop (`stop_task`), not by a shutdown."""
    return task in _STOPPED


class CancelToken:
    """Pass to `execute_message(cancel=...)`; `cancel()` aborts the turn (like an AbortSignal).

    The in-flight model call is aborted, the abort is audited as `user-aborted`, and the
    turn ends `cancelled` with a final `done` event the stream still delivers.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def cancel(self) -> None:
        """Abort the turn this token was given to."""
        self._event.set()

    @property
    def is_cancelled(self) -> bool:
        """Whether `cancel()` was called."""
        return self._event.is_set()

    async def wait(self) -> None:
        """Return once `cancel()` is called."""
        await self._event.wait()
