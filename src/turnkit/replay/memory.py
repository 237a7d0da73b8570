"""`InMemoryReplayBuffer`: the embedded default (one process)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from turnkit.ids import TurnId
from turnkit.replay import START, BufferEntry, ReplaySettings
from turnkit.replay._gather import gather

__all__ = ("InMemoryReplayBuffer",)

_LATE_S = 0.01
"""A released turn's timer fires this much after its expiry (so the entries are due)."""


@dataclass(slots=True)
class _Turn:
    entries: deque[BufferEntry]
    expires: float
    counter: int = 0
    wake: asyncio.Event | None = None
    """Set (and replaced) by the next publish; readers waiting for entries wait on it."""


class InMemoryReplayBuffer:
    """Per-turn bounded deques; live readers wait for the next publish.

    A driver in this process publishes synchronously (`publish_now`), with no task or
    queue in between. A turn's positions are consecutive and start above any position
    given before, so a turn dropped (paused past the grace period) and published to
    again goes on after its old ones.
    """

    def __init__(self, settings: ReplaySettings | None = None) -> None:
        self.settings = settings or ReplaySettings()
        self._turns: dict[str, _Turn] = {}
        self._next_expiry = 0.0
        self._highest = 0
        """The highest position given to any turn: where a new turn's positions start."""

    @property
    def turns(self) -> int:
        """How many turns the buffer holds (entries, or a reader waiting on them)."""
        return len(self._turns)

    def _turn(self, turn_id: TurnId, *, ttl_s: float | None = None) -> _Turn:
        now = time.monotonic()
        if now >= self._next_expiry:
            self._expire()
        turn = self._turns.get(turn_id)
        if turn is not None and turn.expires < now:
            del self._turns[turn_id]  # as `_live` does, with the clock read once
            turn = None
        if turn is None:
            # A reader may get here first (it waits on the turn's wake event); a turn
            # that never publishes still expires.
            turn = _Turn(
                entries=deque(maxlen=self.settings.max_entries),
                expires=now + (ttl_s if ttl_s is not None else self.settings.ttl_s),
                counter=self._highest,
            )
            self._turns[turn_id] = turn
        return turn

    def _live(self, turn_id: TurnId) -> _Turn | None:
        """The turn's entries, unless they expired (checked for this turn on every call)."""
        turn = self._turns.get(turn_id)
        if turn is not None and turn.expires < time.monotonic():
            del self._turns[turn_id]
            return None
        return turn

    def _expire(self) -> None:
        """Drop every expired turn, at most once a second (a scan is O(turns))."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        for turn_id in [t for t, v in self._turns.items() if v.expires < now]:
            del self._turns[turn_id]

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        """Append entries and wake readers."""
        self.publish_now(turn_id, entries)

    def publish_now(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        """`publish`, synchronously (a driver in this process needs no task for it)."""
        turn = self._turn(turn_id)
        ttl = self.settings.ttl_s
        counter, append = turn.counter, turn.entries.append
        for seq, data, terminal in entries:
            counter += 1
            append(BufferEntry(position=str(counter), seq=seq, data=data, is_terminal=terminal))
            if terminal:
                ttl = self.settings.terminal_grace_s
        turn.counter = counter
        if counter > self._highest:
            self._highest = counter
        turn.expires = time.monotonic() + ttl
        if turn.wake is not None:
            turn.wake.set()
            turn.wake = None

    async def tail(self, turn_id: TurnId) -> str:
        """Newest position."""
        turn = self._live(turn_id)
        return str(turn.counter) if turn is not None else START

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        """Entries after `after`, waiting up to `wait_s` for the first.

        A reader of a turn the buffer does not hold (paused, or not started) keeps it
        for the grace period only.
        """
        turn = self._turn(turn_id, ttl_s=self.settings.terminal_grace_s)
        start = int(after)

        def ready() -> list[BufferEntry]:
            # Positions are consecutive, so the first wanted entry is found by arithmetic.
            entries = turn.entries
            if not entries:
                return []
            begin = max(0, start - int(entries[0].position) + 1)
            return [entries[i] for i in range(begin, min(len(entries), begin + limit))]

        found = ready()
        if found or wait_s <= 0:
            return found
        deadline = time.monotonic() + wait_s
        while not found and (left := deadline - time.monotonic()) > 0:
            if turn.wake is None:
                turn.wake = asyncio.Event()
            try:
                async with asyncio.timeout(left):
                    await turn.wake.wait()
            except TimeoutError:
                return []
            # Woken by a new entry: let a publisher still streaming add more to the batch.
            await gather(lambda: turn.counter)
            found = ready()
        return found

    async def release(self, turn_id: TurnId) -> None:
        """Keep the turn's entries for the grace period only (no driver publishes).

        They are dropped then, even when nothing else uses the buffer (a timer, no task).
        """
        turn = self._turns.get(turn_id)
        if turn is None:
            return
        grace = self.settings.terminal_grace_s
        turn.expires = min(turn.expires, time.monotonic() + grace)
        asyncio.get_running_loop().call_later(grace + _LATE_S, self._live, turn_id)

    async def ping(self) -> None:
        """Always reachable (it lives in this process)."""

    async def drop(self, turn_id: TurnId) -> None:
        """Forget a turn."""
        self._turns.pop(turn_id, None)

    async def close(self) -> None:
        """Nothing to release."""
        self._turns.clear()
