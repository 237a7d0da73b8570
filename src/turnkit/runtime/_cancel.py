from __future__ import annotations

import asyncio

__all__ = ("CancelToken",)


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
