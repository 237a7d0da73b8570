"""What both checkpoint savers hold back, and how they give up on a held write.

A task's plain writes are held until the thread's next checkpoint, which supersedes them;
a write on a LangGraph-internal channel (`__interrupt__`, `__resume__`, `__error__`, …)
must be durable before the run stops, so it is never held. A held write that cannot be
stored would fail every later write of its thread if it were held again, so it is logged
and dropped: losing it only means its task runs again after a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

__all__ = ("NewThreads", "WrittenIds", "log_dropped", "supersedable")

log = logging.getLogger("turnkit.graph")


def supersedable(writes: Iterable[tuple[str, Any]]) -> bool:
    """True when the thread's next checkpoint holds the result of all these writes."""
    return all(not channel.startswith("__") for channel, _ in writes)


def log_dropped(thread_id: str, *, is_checkpoint: bool) -> None:
    """Log (with the current exception) a held write given up on."""
    log.exception(
        "dropped a held %s of thread %s: it cannot be stored",
        "checkpoint" if is_checkpoint else "task write",
        thread_id,
    )


class WrittenIds:
    """Thread id → id of the checkpoint a saver stored (or holds) last for it.

    A driver that just ran a thread takes the id from here instead of reading the
    thread's newest checkpoint back. Bounded: threads that never settle are forgotten,
    oldest first (their driver then reads the id back).
    """

    def __init__(self, bound: int = 4096) -> None:
        self._ids: dict[str, str] = {}
        self._bound = bound

    def note(self, thread_id: str, checkpoint_id: str) -> None:
        self._ids.pop(thread_id, None)  # newest last, so the oldest go first
        self._ids[thread_id] = checkpoint_id
        while len(self._ids) > self._bound:
            self._ids.pop(next(iter(self._ids)))

    def take(self, thread_id: str) -> str | None:
        """The id noted for `thread_id` (forgotten once taken)."""
        return self._ids.pop(thread_id, None)


class NewThreads:
    """Threads about to run for the first time: their newest checkpoint is known to be none.

    LangGraph reads a thread's newest checkpoint when a run starts; for a thread a
    driver knows is new, the saver answers that read without asking its database.
    Bounded like `WrittenIds`.
    """

    def __init__(self, bound: int = 4096) -> None:
        self._ids: dict[str, None] = {}
        self._bound = bound

    def add(self, thread_id: str) -> None:
        self._ids[thread_id] = None
        while len(self._ids) > self._bound:
            self._ids.pop(next(iter(self._ids)))

    def take(self, thread_id: str) -> bool:
        """Whether `thread_id` was added (forgotten once taken)."""
        if thread_id in self._ids:
            del self._ids[thread_id]
            return True
        return False
