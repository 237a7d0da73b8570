"""`InMemoryReplayBuffer`: the embedded default (one process)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from turnkit.events import DoneEvent, DurableEvent, EphemeralEvent, encode_event
from turnkit.ids import TurnId
from turnkit.replay import START, BufferEntry, ReplaySettings

__all__ = ("InMemoryReplayBuffer",)


class _Slot:
    """One entry: its wire bytes, or the (frozen) event they are encoded from on first read."""

    __slots__ = ("position", "seq", "is_terminal", "_data", "_event")

    def __init__(
        self,
        position: int,
        seq: int | None,
        is_terminal: bool,
        data: bytes | None,
        event: DurableEvent | EphemeralEvent | None = None,
    ) -> None:
        self.position = position
        self.seq = seq
        self.is_terminal = is_terminal
        self._data = data
        self._event = event

    def entry(self) -> BufferEntry:
        if self._data is None:
            assert self._event is not None
            self._data, self._event = encode_event(self._event), None
        return BufferEntry(
            position=str(self.position), seq=self.seq, data=self._data, is_terminal=self.is_terminal
        )


@dataclass(slots=True)
class _Turn:
    slots: deque[_Slot]
    expires: float
    counter: int = 0
    wake: asyncio.Event | None = None
    """Set (and replaced) by the next publish; readers waiting for entries wait on it."""


class InMemoryReplayBuffer:
    """Per-turn bounded deques; live readers wait for the next publish.

    A driver in this process publishes synchronously (`publish_events`), with no task or
    queue in between, and an event is encoded only when a reader first reads it: a turn
    nobody follows through the buffer costs no encoding.
    """

    def __init__(self, settings: ReplaySettings | None = None) -> None:
        self.settings = settings or ReplaySettings()
        self._turns: dict[str, _Turn] = {}
        self._next_expiry = 0.0

    def _turn(self, turn_id: TurnId) -> _Turn:
        self._expire()
        turn = self._live(turn_id)
        if turn is None:
            # A reader may get here first; a turn that never publishes still expires.
            turn = _Turn(
                slots=deque(maxlen=self.settings.max_entries),
                expires=time.monotonic() + self.settings.ttl_s,
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
        turn = self._turn(turn_id)
        for seq, data, terminal in entries:
            turn.counter += 1
            turn.slots.append(_Slot(turn.counter, seq, terminal, data))
        self._published(turn, any(terminal for _, _, terminal in entries))

    def publish_events(
        self, turn_id: TurnId, events: Sequence[DurableEvent | EphemeralEvent]
    ) -> None:
        """`publish`, synchronously, from the events themselves (encoded when first read)."""
        turn = self._turn(turn_id)
        terminal = False
        for event in events:
            turn.counter += 1
            seq = event.seq if isinstance(event, DurableEvent) else None
            done = isinstance(event, DoneEvent)
            terminal = terminal or done
            turn.slots.append(_Slot(turn.counter, seq, done, None, event))
        self._published(turn, terminal)

    def _published(self, turn: _Turn, terminal: bool) -> None:
        """Refresh the turn's expiry (a grace period once it ended) and wake readers."""
        ttl = self.settings.terminal_grace_s if terminal else self.settings.ttl_s
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
        """Entries after `after`, waiting up to `wait_s` for the first."""
        turn = self._turn(turn_id)
        start = int(after)

        def ready() -> list[BufferEntry]:
            # Positions are consecutive, so the first wanted entry is found by arithmetic.
            slots = turn.slots
            if not slots:
                return []
            begin = max(0, start - slots[0].position + 1)
            return [slots[i].entry() for i in range(begin, min(len(slots), begin + limit))]

        found = ready()
        if found or wait_s <= 0:
            return found
        deadline = time.monotonic() + wait_s
        while not found and (left := deadline - time.monotonic()) > 0:
            if turn.wake is None:
                turn.wake = asyncio.Event()
            try:
                await asyncio.wait_for(turn.wake.wait(), left)
            except TimeoutError:
                return []
            found = ready()
        return found

    async def drop(self, turn_id: TurnId) -> None:
        """Forget a turn."""
        self._turns.pop(turn_id, None)

    async def close(self) -> None:
        """Nothing to release."""
        self._turns.clear()
