"""`TurnSlots`: how many turns one process drives at once.

A process whose event loop is saturated serves every turn late: with a thousand turns in
flight, each event waits behind the work of all the others, so a reader hears about it
seconds after it happened. With a bound (`RuntimeConfig.max_running_turns`), a turn takes
a slot before it is claimed; while none is free it waits, queued in the Store (no lease,
no task of its own that runs), first come first served.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from turnkit.store import Submission

__all__ = ("Slot", "TurnSlots")


class Slot:
    """One running turn's place; `release()` gives it back (idempotent)."""

    __slots__ = ("_slots",)

    def __init__(self, slots: TurnSlots) -> None:
        self._slots: TurnSlots | None = slots

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._give()


class TurnSlots:
    """The process's running-turn slots: at most `ceiling` (None: every take succeeds)."""

    def __init__(self, ceiling: int | None) -> None:
        self.ceiling = ceiling
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Turns waiting for a slot."""
        return len(self._waiters)

    def try_take(self) -> Slot | None:
        """A slot if one is free and nobody waits for one; never waits."""
        if self._waiters or (self.ceiling is not None and self.running >= self.ceiling):
            return None
        return self.hold()

    async def submit_claiming(
        self, submit: Callable[..., Awaitable[Submission]], *, claim: bool = True
    ) -> tuple[Submission, Slot | None]:
        """`submit(claim=...)`: the turn claimed in its message's transaction if a slot is free.

        Without `claim` it is never claimed. The slot comes back with the claimed turn;
        None: the turn waits queued.
        """
        slot = self.try_take() if claim else None
        try:
            submission = await submit(claim=slot is not None)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if submission.lease is None and slot is not None:
            slot.release()  # not claimed (a guide, a replay, an earlier turn unfinished)
            slot = None
        return submission, slot

    def hold(self) -> Slot:
        """A slot for a turn already claimed elsewhere: counted, never refused."""
        self.running += 1
        return Slot(self)

    async def take(self) -> Slot:
        """Wait for a slot, in arrival order."""
        slot = self.try_take()
        if slot is not None:
            return slot
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as we were cancelled
                self._give()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)  # no longer counted as waiting
            raise
        return Slot(self)

    def _give(self) -> None:
        self.running -= 1
        while self._waiters and (self.ceiling is None or self.running < self.ceiling):
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter is skipped
                self.running += 1
                waiter.set_result(None)
