"""What both checkpoint savers hold back, and how they give up on a held write.

A task's plain writes are held until the thread's next checkpoint, which supersedes them;
a write on a LangGraph-internal channel (`__interrupt__`, `__resume__`, `__error__`, …)
must be durable before the run stops, so it is never held. A held write that cannot be
stored would fail every later write of its thread if it were held again, so it is logged
and dropped: losing it only means its task runs again after a crash. The writes of a task
cancelled mid-run are never stored at all (see `cancelled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ("ThreadNotes", "cancelled", "log_dropped", "supersedable")

log = logging.getLogger("turnkit.graph")


def supersedable(writes: Iterable[tuple[str, Any]]) -> bool:
    """True when the thread's next checkpoint holds the result of all these writes."""
    return all(not channel.startswith("__") for channel, _ in writes)


def cancelled(writes: Iterable[tuple[str, Any]]) -> bool:
    """True for the writes of a task cancelled mid-run, which a saver stores none of.

    LangGraph saves them, with the `CancelledError` as an `__error__` write, so that its
    loop can finish the super-step; a resume would then take the task's other writes as
    its result and not run it again. But a task cancelled (a Stop, a lost lease, the
    process going away) committed none of its events, whatever its writes already hold
    (say the result of a tool that had just returned): its node must run again, from
    what the turn's log holds.
    """
    return any(
        channel == "__error__" and isinstance(value, asyncio.CancelledError)
        for channel, value in writes
    )


def log_dropped(thread_id: str, *, is_checkpoint: bool) -> None:
    """Log (with the current exception) a held write given up on."""
    log.exception(
        "dropped a held %s of thread %s: it cannot be stored",
        "checkpoint" if is_checkpoint else "task write",
        thread_id,
    )


class ThreadNotes:
    """A bounded note per thread id, taken once: the oldest notes go first.

    The savers keep two: the id of the checkpoint each thread stored (or holds) last, so
    a driver that just ran a thread need not read it back; and the threads a driver is
    about to run for the first time, whose newest checkpoint is known to be none.
    """

    def __init__(self, bound: int = 4096) -> None:
        self._notes: dict[str, str] = {}
        self._bound = bound

    def note(self, thread_id: str, value: str = "") -> None:
        self._notes.pop(thread_id, None)  # newest last, so the oldest go first
        self._notes[thread_id] = value
        while len(self._notes) > self._bound:
            self._notes.pop(next(iter(self._notes)))

    def take(self, thread_id: str) -> str | None:
        """The note for `thread_id`, if any (forgotten once taken)."""
        return self._notes.pop(thread_id, None)
