"""`TurnReader`: one reader for the first connection and every reconnect, on any process.

It replays committed events after the cursor from the Store (the source of truth, read in
bounded pages), then follows the ReplayBuffer live until a terminal event. The rules:

| cursor | answer |
|---|---|
| absent (0) or inside the log | replay from there, follow live to a terminal event |
| older than the buffer | the gap comes from the Store anyway, then live |
| turn finished | the remaining events from the Store, ending in the terminal one |
| silence for the idle window, claimed, no live lease | record `timed_out`, send the ending |
| ahead of anything written, or malformed | `ReplayCursorError` (the HTTP layer answers 4xx) |

Silence is measured from the last event (heartbeats and Store progress count), not from
connect; a turn whose lease is still being renewed is never timed out by a reader, so a
driver that publishes nowhere the reader can see is not mistaken for a dead one. A paused
turn's reader waits without timing out. While waiting, the reader yields `KEEPALIVE`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

from turnkit.clock import Clock
from turnkit.errors import ReplayCursorError, TurnNotFoundError
from turnkit.events import StreamEvent, decode_event
from turnkit.ids import TurnId
from turnkit.replay import START, BufferEntry, ReplayBuffer
from turnkit.store import Store, TurnRecord

__all__ = ("KEEPALIVE", "Frame", "TurnReader", "check_cursor", "parse_cursor")

_TERMINAL_TYPES: Final = frozenset({"done"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One event to send: `seq` is None for ephemeral events (no SSE id)."""

    seq: int | None
    data: bytes


class _KeepAlive:
    def __repr__(self) -> str:
        return "KEEPALIVE"


KEEPALIVE: Final = _KeepAlive()
"""Yielded while the reader waits; send a comment so proxies keep the stream open."""


def _leased(record: TurnRecord, clock: Clock) -> bool:
    """A live lease means a driver renewed it within its ttl: the driver is alive."""
    expires = record.lease_expires_at
    return record.lease_owner is not None and expires is not None and expires > clock.now()


def _abandoned(record: TurnRecord, clock: Clock) -> bool:
    """Running, claimed by a driver at least once, and no lease alive: its driver is gone.

    A turn no driver has claimed yet is waiting in the queue for a worker, not dead.
    """
    return record.status == "running" and record.attempts > 0 and not _leased(record, clock)


def _until_lapse(record: TurnRecord, clock: Clock) -> float:
    """Seconds until the turn's lease expires (at least 50 ms), or infinity if unleased."""
    expires = record.lease_expires_at
    if record.lease_owner is None or expires is None:
        return float("inf")
    return max(0.05, (expires - clock.now()).total_seconds())


def check_cursor(record: TurnRecord, after_seq: int) -> None:
    """Refuse a cursor ahead of anything the turn has written (never guessed forward)."""
    if after_seq > record.last_seq:
        raise ReplayCursorError(
            f"cursor {after_seq} is ahead of turn {record.turn_id!r}, which has written "
            f"{record.last_seq} events; a cursor is never guessed forward",
            cursor=after_seq,
            last_seq=record.last_seq,
        )


def parse_cursor(raw: str | None) -> int:
    """A `Last-Event-ID` / `?after=` value as a seq (0 when absent)."""
    if raw is None or raw == "":
        return 0
    if not raw.isdigit() or len(raw) > 18:
        raise ReplayCursorError(
            f"cursor {raw!r} is not an event id: send the `id` of the last event you received",
            cursor=raw,
        )
    return int(raw)


class TurnReader:
    """Reads one turn for one connection (see the module docstring for the rules)."""

    def __init__(
        self,
        *,
        store: Store,
        buffer: ReplayBuffer,
        clock: Clock,
        idle_window_s: float,
        keepalive_s: float = 15.0,
    ) -> None:
        self.store = store
        self.buffer = buffer
        self.clock = clock
        self.idle_window_s = idle_window_s
        self.keepalive_s = keepalive_s

    async def follow(
        self, turn_id: TurnId, *, after_seq: int = 0
    ) -> AsyncIterator[Frame | _KeepAlive]:
        """Frames strictly after `after_seq`, ending with the turn's terminal event."""
        record = await self._check(turn_id, after_seq)
        progress = _Progress(sent=after_seq)
        first_wait = self.keepalive_s
        if after_seq == 0 and record.status == "running":
            # A first connection to a live turn reads the buffer from the turn's start, so
            # it also gets the live events (deltas) a fast turn streamed before it attached,
            # in their order; durable events the buffer lacks come from the Store (gap fill).
            async for frame in self._from_store(turn_id, progress, limit=1):
                yield frame  # `turn.started`: committed at submit, never in the buffer
            position = START
            first_wait = min(first_wait, 1.0)  # a driver publishing nowhere: ask the Store soon
        else:
            position = await self.buffer.tail(turn_id)  # taken before reading the Store
            async for frame in self._from_store(turn_id, progress):
                yield frame
        last_event = self.clock.monotonic()
        while not progress.done:
            idle_left = self.idle_window_s - (self.clock.monotonic() - last_event)
            # Past the idle window with the turn still alive, wait until its lease could
            # lapse (or a keep-alive interval if it is queued): never a busy loop.
            wait = min(first_wait, idle_left if idle_left > 0 else _until_lapse(record, self.clock))
            first_wait = self.keepalive_s
            entries = await self.buffer.read(turn_id, after=position, wait_s=wait)
            if entries:
                last_event = self.clock.monotonic()
                position = entries[-1].position
                async for frame in self._from_buffer(turn_id, entries, progress):
                    yield frame
                continue
            now = await self.store.get_turn(turn_id)
            assert now is not None
            record = now
            if record.last_seq > progress.sent:
                # Committed but not in the buffer (the sweep ended it, the buffer was
                # trimmed or lost): the Store has it, and it is a sign of life.
                last_event = self.clock.monotonic()
                async for frame in self._from_store(turn_id, progress):
                    yield frame
            elif _abandoned(record, self.clock) and idle_left <= 0:
                await self.store.time_out(
                    turn_id,
                    reason=(
                        f"nothing arrived for {self.idle_window_s:g} s (the idle window): "
                        "the process driving this turn is gone"
                    ),
                )
            else:
                yield KEEPALIVE

    async def events(self, turn_id: TurnId, *, after_seq: int = 0) -> AsyncIterator[StreamEvent]:
        """`follow`, decoded: the turn's events after `after_seq`, without keep-alives."""
        async for frame in self.follow(turn_id, after_seq=after_seq):
            if isinstance(frame, Frame):
                yield decode_event(frame.data)

    async def _check(self, turn_id: TurnId, after_seq: int) -> TurnRecord:
        record = await self.store.get_turn(turn_id)
        if record is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        check_cursor(record, after_seq)
        return record

    async def _from_store(
        self, turn_id: TurnId, progress: _Progress, *, limit: int | None = None
    ) -> AsyncIterator[Frame]:
        sent = 0
        async for stored in self.store.read_events(turn_id, after_seq=progress.sent):
            progress.sent = stored.seq
            progress.done = stored.type in _TERMINAL_TYPES
            yield Frame(stored.seq, stored.data)
            sent += 1
            if progress.done or sent == limit:
                return

    async def _from_buffer(
        self, turn_id: TurnId, entries: list[BufferEntry], progress: _Progress
    ) -> AsyncIterator[Frame]:
        for entry in entries:
            if entry.seq is not None:
                if entry.seq <= progress.sent:
                    continue  # already sent from the Store
                if entry.seq > progress.sent + 1:  # a gap: fill it from the Store
                    async for stored in self.store.read_events(turn_id, after_seq=progress.sent):
                        if stored.seq >= entry.seq:
                            break
                        progress.sent = stored.seq
                        yield Frame(stored.seq, stored.data)
                progress.sent = entry.seq
            yield Frame(entry.seq, entry.data)
            if entry.is_terminal:
                progress.done = True
                return


@dataclass(slots=True)
class _Progress:
    sent: int
    done: bool = False
