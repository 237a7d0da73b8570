"""The turns a `TurnHost` drives in tasks of their own: what each task holds, Stop, close."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from turnkit.ids import TurnId
from turnkit.runtime._cancel import stop_task
from turnkit.runtime._slots import Slot
from turnkit.runtime.driver import TurnDriver
from turnkit.store import Lease

__all__ = ("Detached", "DetachedTurns")


@dataclass(slots=True, eq=False)
class Detached:
    """A turn driven in a task of the host: what the task holds, for a Stop to settle."""

    lease: Lease | None
    slot: Slot | None
    task: asyncio.Task[None] | None = None
    driver: TurnDriver | None = None
    ran: bool = False
    """The driver's run returned: its ending (or pause) stands, only its aftermath is left."""
    then_next: bool = False
    """Once it ends, take its session's next turn if nobody has (see `TurnHost.detach`)."""


class DetachedTurns:
    """The host's detached turns by id, each forgotten when its task ends."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[TurnId, Detached] = {}

    def start(self, turn_id: TurnId, entry: Detached, drive: Coroutine[Any, Any, None]) -> None:
        """Run `drive` (what drives `entry`'s turn) in a task of its own."""
        task = entry.task = asyncio.create_task(drive, name=f"turnkit-detached-{turn_id}")
        self._entries[turn_id] = entry
        task.add_done_callback(lambda _: self._forget(turn_id, entry))

    def _forget(self, turn_id: TurnId, entry: Detached) -> None:
        if self._entries.get(turn_id) is entry:
            del self._entries[turn_id]
        # A cancelled task keeps its CancelledError, whose traceback holds the frame that
        # held `entry`: let go of the task and driver, so nothing cycles back to them.
        entry.task = entry.driver = None

    def holds(self, turn_id: TurnId) -> bool:
        """Whether a task here drives (or is about to drive) `turn_id`."""
        return turn_id in self._entries

    async def stop(self, turn_id: TurnId) -> bool:
        """Cancel a turn detached here and wait for its task; False if none is."""
        entry = self._entries.get(turn_id)
        task = entry.task if entry is not None else None
        if entry is None or task is None:
            return False
        # After the run, only its aftermath is left: let it finish. Cancelled once only: a
        # second Stop (another tab) waits with the first, for a cancellation that lands
        # while the driver stops its graph would leave the graph's step (and its model
        # call) running, with nobody to close it.
        if not entry.ran and not task.cancelling():
            stop_task(task)
        await asyncio.gather(task, return_exceptions=True)
        if entry.slot is not None:
            entry.slot.release()  # a task cancelled before its first step never ran its own
        return True

    def abandon(self) -> tuple[list[asyncio.Task[None]], list[Lease]]:
        """Tell every detached driver to write nothing more; their tasks and drivers.

        The tasks are to cancel; the leases (also of a turn whose driver is not built yet,
        or whose ending is under way: cut short, it does not land) to hand over once they
        stopped, unless the turn's ending is committed (the Store refuses the lease of a
        turn that ended or paused meanwhile).
        Closing the runtime is not Stop: another process (a worker, a runtime recovering
        turns) takes the turns over.
        """
        entries = list(self._entries.values())
        for entry in entries:
            if entry.driver is not None:
                entry.driver.abandon()
        leases = [
            entry.driver.lease if entry.driver is not None else entry.lease
            for entry in entries
            if entry.lease is not None
            and not (entry.driver is not None and entry.driver.ending_committed)
        ]
        return [entry.task for entry in entries if entry.task is not None], leases
