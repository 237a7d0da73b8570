"""`Aftermath`: work a turn leaves running after its ending (private).

A turn settles first (`done` is committed and sent, its stream ends, its lease and slot
are free) and only then does what it need not wait for: the utility model's name for a
session's opening turn, and deleting the graph checkpoints of turns that ended (in
batches: one transaction for many turns). Closing the runtime cancels a naming call still
running (the name read off the opening message stands) and deletes what is left to delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

__all__ = ("PRUNE_BATCH", "PRUNE_DELAY_S", "Aftermath", "Work")

log = logging.getLogger("turnkit.runtime")

Work = Callable[[], Awaitable[None]]
"""One piece of work for after a turn's ending (it logs its own failures)."""
Forget = Callable[[Sequence[str]], Awaitable[None]]
"""Deletes the checkpoints of these turns."""

PRUNE_BATCH = 64
"""Ended turns whose checkpoints one transaction deletes at most."""
PRUNE_DELAY_S = 0.5
"""How long an ended turn waits for others to share its deletion."""


class Aftermath:
    """The tasks turns left running after their ending, in one runtime."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._forget: Forget | None = None
        self._ended: list[str] = []
        self._pruning: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    def prune_with(self, forget: Forget | None) -> None:
        """Delete ended turns' checkpoints with `forget` (None: keep them); take work again.

        Called when the runtime opens, also after it was closed.
        """
        self._forget = forget
        self._closed = False

    @property
    def prunes(self) -> bool:
        """Ended turns' checkpoints are deleted (`ended`), not kept."""
        return self._forget is not None and not self._closed

    def ended(self, turn_id: str) -> None:
        """The turn has ended: its checkpoints go with the next batch."""
        if self._forget is None or self._closed:
            return
        self._ended.append(turn_id)
        if self._pruning is None:
            self._pruning = asyncio.create_task(self._prune_soon(), name="turnkit-prune")

    async def _prune_soon(self) -> None:
        try:
            while self._ended:
                if len(self._ended) < PRUNE_BATCH:  # let later endings join the batch
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), PRUNE_DELAY_S)
                await self._prune_batch()
        finally:
            self._pruning = None

    async def _prune_batch(self) -> None:
        batch, self._ended = self._ended[:PRUNE_BATCH], self._ended[PRUNE_BATCH:]
        if not batch or self._forget is None:
            return
        try:
            await self._forget(batch)
        except Exception as exc:  # noqa: BLE001 - they stay until their session is deleted
            log.warning("deleting the checkpoints of %d ended turn(s) failed: %s", len(batch), exc)

    async def prune_now(self) -> None:
        """Delete the checkpoints of every turn that ended so far, without waiting."""
        self._hurry.set()
        try:
            if self._pruning is not None:
                await asyncio.shield(self._pruning)
            while self._ended:
                await self._prune_batch()
        finally:
            self._hurry.clear()

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
        await self.prune_now()

    async def close(self) -> None:
        """Cancel what is still running and wait for it to stop; take no more."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.prune_now()
