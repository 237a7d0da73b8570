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

The buffer is only a fast path. A reader asks the Store at least once a second while the
buffer is quiet, so a lost buffer message delays nothing by more than that; and when the
buffer fails (Redis down), the reader follows the Store alone, polling with backoff, and
returns to the buffer once it answers again — the Store holds every durable event, so
nothing is lost or sent twice (only deltas published during the outage are missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeVar

from turnkit.clock import Clock
from turnkit.errors import ReplayCursorError, TurnNotFoundError
from turnkit.events import (
    MessageSnapshotEvent,
    StreamEvent,
    TurnStartedEvent,
    decode_event,
    encode_event,
)
from turnkit.ids import TurnId
from turnkit.otel import record_replay_lag
from turnkit.replay import START, BufferEntry, ReplayBuffer
from turnkit.states import TERMINAL_STATES
from turnkit.store import Store, Submission, TurnProgress, TurnRecord

__all__ = (
    "KEEPALIVE",
    "Frame",
    "KeepAlive",
    "TurnReader",
    "check_cursor",
    "parse_cursor",
    "set_once_sent",
)

_TERMINAL_TYPES: Final = frozenset({"done"})
_CURSOR: Final = re.compile(r"(?:0|[1-9][0-9]{0,39})", re.ASCII)
_DIGITS: Final = 18
"""A cursor with more digits is ahead of anything a turn can have written (64-bit seqs)."""
CATCH_UP_S: Final = 1.0
"""A live reader asks the Store at least this often while the buffer is quiet."""
_BACKOFF_MAX_S: Final = 1.0

log = logging.getLogger("turnkit.replay")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Frame:
    """One event to send: `seq` is None for ephemeral events (no SSE id)."""

    seq: int | None
    data: bytes


class KeepAlive:
    """The type of `KEEPALIVE` (what a reader yields while it waits)."""

    def __repr__(self) -> str:
        return "KEEPALIVE"


KEEPALIVE: Final = KeepAlive()
"""Yielded while the reader waits; send a comment so proxies keep the stream open."""


def _leased(record: TurnProgress, clock: Clock) -> bool:
    """A live lease means a driver renewed it within its ttl: the driver is alive."""
    expires = record.lease_expires_at
    return record.lease_owner is not None and expires is not None and expires > clock.now()


def _abandoned(record: TurnProgress, clock: Clock) -> bool:
    """Running, claimed by a driver at least once, and no lease alive: its driver is gone.

    A turn no driver has claimed yet is waiting in the queue for a worker, not dead.
    """
    return record.status == "running" and record.attempts > 0 and not _leased(record, clock)


def _until_lapse(record: TurnProgress, clock: Clock) -> float:
    """Seconds until the turn's lease expires (at least 50 ms), or infinity if unleased."""
    expires = record.lease_expires_at
    if record.lease_owner is None or expires is None:
        return float("inf")
    return max(0.05, (expires - clock.now()).total_seconds())


def _just_started(
    submission: Submission | None, turn_id: TurnId, after_seq: int
) -> tuple[TurnProgress, TurnStartedEvent] | None:
    """Where a turn just opened by `submission` stands, and its `turn.started`, if known.

    Claimed with its message: as committed. Queued for another driver (a worker): running,
    unleased, with `turn.started` its only event.
    """
    if submission is None or after_seq != 0 or submission.turn_id != turn_id:
        return None
    started = submission.started
    if started is None or submission.guided or not submission.is_new:
        return None
    if submission.record is not None:
        return TurnProgress.of(submission.record), started
    queued = TurnProgress(
        turn_id=turn_id,
        status="running",
        last_seq=started.seq,
        attempts=0,
        lease_owner=None,
        lease_expires_at=None,
    )
    return queued, started


def check_cursor(record: TurnRecord | TurnProgress, after_seq: int) -> None:
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
    if _CURSOR.fullmatch(raw) is None:  # ASCII digits, no leading zeros, at most 40
        raise ReplayCursorError(
            f"cursor {raw!r} is not an event id: send the `id` of the last event you received",
            cursor=raw,
        )
    if len(raw) > _DIGITS:
        raise ReplayCursorError(
            f"cursor {raw} is ahead of anything a turn can have written; a cursor is never "
            "guessed forward",
            cursor=raw,
            last_seq=None,
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
        keepalive_s: float = 10.0,
        on_timed_out: Callable[[str], None] | None = None,
    ) -> None:
        self.on_timed_out = on_timed_out
        """Told of each turn this reader ended `timed_out` (its checkpoints resume nothing)."""
        self.store = store
        self.buffer = buffer
        self.clock = clock
        self.idle_window_s = idle_window_s
        self.keepalive_s = keepalive_s

    async def follow(self, turn_id: str, *, after_seq: int = 0) -> AsyncIterator[Frame | KeepAlive]:
        """Frames strictly after `after_seq`, ending with the turn's terminal event."""
        async for batch in self.follow_batches(TurnId(turn_id), after_seq=after_seq):
            if isinstance(batch, list):
                for frame in batch:
                    yield frame
            else:
                yield batch

    async def follow_batches(
        self, turn_id: TurnId, *, after_seq: int = 0, submission: Submission | None = None
    ) -> AsyncIterator[list[Frame] | KeepAlive]:
        """`follow`, a batch at a time: the frames ready together, in order (never empty).

        A stream can send a batch in one write: the client cannot tell it from frames
        sent one by one, and a fast turn costs one write per batch instead of per event.
        `submission`: what `start` answered for this turn, so a first connection sends
        its committed `turn.started` at once instead of reading the turn back.
        """
        buffer = _Buffer(self.buffer, turn_id)
        new = _just_started(submission, turn_id, after_seq)
        if new is not None:
            record, started = new
            progress = _Progress(sent=started.seq)
            yield [Frame(started.seq, encode_event(started))]
            buffer.position = START  # the live events it streamed since, as `_replay` does
        else:
            record = await self._check(turn_id, after_seq)
            progress = _Progress(sent=after_seq)
            if record.status in TERMINAL_STATES and after_seq >= record.last_seq:
                return  # the client has everything, its terminal event included
            async for batch in _batches(self._replay(record, buffer, progress)):
                yield batch
        last_event = last_keepalive = self.clock.monotonic()
        while not progress.done:
            idle_left = self.idle_window_s - (self.clock.monotonic() - last_event)
            # Past the idle window with the turn still alive, wait until its lease could
            # lapse (or a keep-alive interval if it is queued): never a busy loop.
            lapse = idle_left if idle_left > 0 else _until_lapse(record, self.clock)
            entries = await buffer.read(min(CATCH_UP_S, self.keepalive_s, lapse), self.clock)
            if entries:
                last_event = self.clock.monotonic()
                record_replay_lag(entries[-1].data, self.clock.now())
                frames = self._from_buffer(turn_id, entries, progress, buffer)
                if batch := [f async for f in frames]:
                    yield batch
                continue
            record = await self._progress(turn_id)
            if record.last_seq > progress.sent:
                # Committed but not in the buffer (the sweep ended it, the buffer was
                # trimmed, lost a message or is down): the Store has it, a sign of life.
                last_event = self.clock.monotonic()
                async for batch in _batches(self._from_store(turn_id, progress)):
                    yield batch
            elif record.status in TERMINAL_STATES:
                return  # ended with nothing left to send (e.g. cancelled while paused)
            elif _abandoned(record, self.clock) and idle_left <= 0:
                await self._time_out(turn_id)
            elif self.clock.monotonic() - last_keepalive >= self.keepalive_s:
                last_keepalive = self.clock.monotonic()
                yield KEEPALIVE

    async def events(
        self, turn_id: TurnId, *, after_seq: int = 0
    ) -> AsyncGenerator[StreamEvent, None]:
        """`follow`, decoded: the turn's events after `after_seq`, without keep-alives."""
        async for frame in self.follow(turn_id, after_seq=after_seq):
            if isinstance(frame, Frame):
                yield decode_event(frame.data)

    async def _replay(
        self, record: TurnProgress, buffer: _Buffer, progress: _Progress
    ) -> AsyncIterator[Frame]:
        """What the Store holds after the cursor, and where the buffer takes over."""
        turn_id = record.turn_id
        if progress.sent == 0 and record.status == "running":
            # A first connection to a live turn reads the buffer from the turn's start, so
            # it also gets the live events (deltas) a fast turn streamed before it attached,
            # in their order; durable events the buffer lacks come from the Store (gap fill).
            async for frame in self._from_store(turn_id, progress, limit=1):
                yield frame  # `turn.started`: committed at submit, never in the buffer
            buffer.position = START
            return
        synced = await buffer.sync()  # the position is taken before reading the Store
        async for frame in self._from_store(turn_id, progress):
            yield frame
        if synced and not progress.done and record.status == "running":
            # Joined mid-block: the text so far of each block still being written, up to
            # the position live reading starts after (so nothing is sent twice or lost).
            snapshots, partial = await _snapshots(buffer, self.clock, buffer.position)
            if buffer.seq >= progress.sent:
                progress.partial |= partial
                for snapshot in snapshots:
                    yield snapshot
            else:  # the Store is ahead of the buffer: snapshots once the buffer catches up
                progress.resnap = True

    async def _progress(self, turn_id: TurnId) -> TurnProgress:
        record = await self.store.turn_progress(turn_id)
        if record is None:  # unknown, or deleted with its session while being read
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return record

    async def _time_out(self, turn_id: TurnId) -> None:
        ended = await self.store.time_out(
            turn_id,
            reason=(
                f"nothing arrived for {self.idle_window_s:g} s (the idle window): "
                "the process driving this turn is gone"
            ),
        )
        if not ended:
            return
        if self.on_timed_out is not None:
            self.on_timed_out(turn_id)
        # No driver will publish its `done`: keep its entries for the grace period only
        # (the last publish of the driver that died set them to live for the whole TTL).
        with contextlib.suppress(Exception):
            await self.buffer.release(turn_id)

    async def _check(self, turn_id: TurnId, after_seq: int) -> TurnProgress:
        record = await self._progress(turn_id)
        check_cursor(record, after_seq)
        return record

    async def _from_store(
        self, turn_id: TurnId, progress: _Progress, *, limit: int | None = None
    ) -> AsyncIterator[Frame]:
        sent = 0
        page = limit if limit is not None else 500
        async for stored in self.store.read_events(
            turn_id, after_seq=progress.sent, page_size=page
        ):
            progress.sent = stored.seq
            progress.done = stored.type in _TERMINAL_TYPES
            yield Frame(stored.seq, stored.data)
            sent += 1
            if progress.done or sent == limit:
                return

    async def _from_buffer(
        self, turn_id: TurnId, entries: list[BufferEntry], progress: _Progress, buffer: _Buffer
    ) -> AsyncIterator[Frame]:
        for entry in entries:
            if progress.partial and not _sendable(entry, progress.partial):
                continue  # a delta of a block the client cannot be given whole
            if entry.seq is None:
                if buffer.seq < progress.sent:
                    # Published before a durable event the Store already sent (the buffer
                    # lags): sent now it would follow it (a delta after its block's
                    # `message.complete`). Snapshots replace it once the buffer catches up.
                    progress.resnap = True
                    continue
            else:
                buffer.seq = max(buffer.seq, entry.seq)
                if entry.seq > progress.sent + 1:  # a gap: fill it from the Store
                    async for stored in self.store.read_events(turn_id, after_seq=progress.sent):
                        if stored.seq >= entry.seq:
                            break
                        progress.sent = stored.seq
                        yield Frame(stored.seq, stored.data)
                if progress.resnap and buffer.seq >= progress.sent and not progress.done:
                    progress.resnap = False
                    snapshots, partial = await _snapshots(buffer, self.clock, entry.position)
                    progress.partial |= partial
                    for snapshot in snapshots:
                        yield snapshot
                if entry.seq <= progress.sent:
                    continue  # already sent from the Store
                progress.sent = entry.seq
            yield Frame(entry.seq, entry.data)
            if entry.is_terminal:
                progress.done = True
                return


_BATCH: Final = 64
"""At most this many frames read from the Store are sent as one batch."""


async def _batches(frames: AsyncIterator[Frame]) -> AsyncIterator[list[Frame]]:
    """Frames read from the Store, in batches of at most `_BATCH`."""
    batch: list[Frame] = []
    async for frame in frames:
        batch.append(frame)
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


_SNAPSHOT_PAGES: Final = 40
_COMPLETE: Final = b'"type":"message.complete"'
_CASCADE: Final = b'"type":"provider.cascade"'
_RECOVERING: Final = b'"type":"turn.recovering"'


async def _snapshots(
    buffer: _Buffer, clock: Clock, upto: str | None = None
) -> tuple[list[Frame], set[str]]:
    """Snapshots of the blocks being written as of the buffer position `upto` (its own).

    Also the blocks being written whose start the buffer no longer holds (see `_Drafts`):
    no snapshot of them can be whole, so the reader holds back their deltas and the
    client gets them whole in their `message.complete`.

    Bounded: at most 40 pages of entries are read. Sets `buffer.seq` to the newest durable
    event seen up to `upto`, when that is newer.
    """
    upto, after = buffer.position if upto is None else upto, START
    drafts = _Drafts()
    for _ in range(_SNAPSHOT_PAGES):
        if after == upto:
            break
        try:
            entries = await buffer.buffer.read(buffer.turn_id, after=after, wait_s=0)
        except Exception:  # noqa: BLE001 - no snapshot without the buffer; live goes on
            return [], set()
        if not entries:
            break
        for entry in entries:
            drafts.add(entry)
            if entry.seq is not None:
                buffer.seq = max(buffer.seq, entry.seq)
            after = entry.position
            if after == upto:
                break
    frames = [Frame(None, encode_event(snapshot)) for snapshot in drafts.snapshots(clock.now())]
    return frames, drafts.partial - drafts.finished


class _Drafts:
    """The blocks being written, folded from buffer entries.

    A block is being written when the buffer has its deltas but no `message.complete`, and
    no `provider.cascade` of its stage (the failed rung's block is void) or
    `turn.recovering` (the new attempt writes the block again) came after them. A
    `message.snapshot` in the buffer (a publisher sends one after its publishes failed)
    stands for the block's text up to it.

    A block is `partial` when its first delta comes before the buffer's first durable
    event and no snapshot of it followed: a driver publishes a durable event before any
    block, so the block began before what the buffer holds (Redis lost its data, or the
    stream was trimmed) and its text there lacks a start.
    """

    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.finished: set[str] = set()
        self.partial: set[str] = set()
        self.durable = False
        """A durable event was seen (a block begun after it is there from its start)."""

    def add(self, entry: BufferEntry) -> None:
        if entry.seq is None:
            event = json.loads(entry.data)
            kind = event.get("type")
            if kind == "message.delta":
                block_id = event["block_id"]
                if block_id not in self.parts and not self.durable:
                    self.partial.add(block_id)
                self.parts.setdefault(block_id, []).append(event["text"])
                self.last[block_id] = event
            elif kind == "message.snapshot":
                self.parts[event["block_id"]] = [event["text"]]
                self.last[event["block_id"]] = event
                self.partial.discard(event["block_id"])
            return
        self.durable = True
        if _COMPLETE in entry.data:
            self.finished.add(str(json.loads(entry.data)["block"]["block_id"]))
        elif _CASCADE in entry.data or _RECOVERING in entry.data:
            stage = json.loads(entry.data)["stage_id"] if _CASCADE in entry.data else None
            for block_id in [b for b, d in self.last.items() if stage in (None, d["stage_id"])]:
                del self.parts[block_id], self.last[block_id]  # void: written again, or never
                self.partial.discard(block_id)

    def snapshots(self, now: datetime) -> list[MessageSnapshotEvent]:
        """Each unfinished block's text so far (none of a partial block)."""
        return [
            MessageSnapshotEvent(
                session_id=self.last[block_id]["session_id"],
                turn_id=self.last[block_id]["turn_id"],
                stage_id=self.last[block_id]["stage_id"],
                ts=now,
                block_id=block_id,
                text="".join(texts),
            )
            for block_id, texts in self.parts.items()
            if block_id not in self.finished and block_id not in self.partial
        ]


def _sendable(entry: BufferEntry, partial: set[str]) -> bool:
    """Whether to send an entry while some blocks are `partial` (see `_Drafts`).

    Not a delta of a partial block. A snapshot of one makes it whole again (and is sent);
    its `message.complete` ends it, and `turn.recovering` ends them all (the new attempt
    writes open blocks again from their start).
    """
    if entry.seq is not None:
        if _COMPLETE in entry.data:
            partial.discard(str(json.loads(entry.data)["block"]["block_id"]))
        elif _RECOVERING in entry.data:
            partial.clear()
        return True
    event = json.loads(entry.data)
    block_id = event.get("block_id")
    if block_id not in partial:
        return True
    if event.get("type") == "message.snapshot":
        partial.discard(block_id)
        return True
    return bool(event.get("type") != "message.delta")


@dataclass(slots=True)
class _Progress:
    sent: int
    done: bool = False
    resnap: bool = False
    """Deltas were held back (the buffer lagged the Store): send snapshots once it caught up."""
    partial: set[str] = field(default_factory=set)
    """Blocks being written that no snapshot could make whole: their deltas are held back."""


class _Buffer:
    """The buffer as one reader uses it: a position, and the Store as fallback when down."""

    def __init__(self, buffer: ReplayBuffer, turn_id: TurnId) -> None:
        self.buffer = buffer
        self.turn_id = turn_id
        self.position = START
        self.seq = 0
        """The newest durable event the buffer holds up to `position` (0: not known)."""
        self.is_down = False
        self.backoff = 0.05

    async def sync(self) -> bool:
        """Take the buffer's newest position (events before it come from the Store).

        Returns whether the buffer answered.
        """
        try:
            self.position = await self.buffer.tail(self.turn_id)
            self.seq = 0  # not known at a new tail
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any buffer failure: follow the Store
            self._failed(exc)
            return False
        return True

    async def read(self, wait_s: float, clock: Clock) -> list[BufferEntry]:
        """Entries after the position; [] when quiet or down (the caller asks the Store)."""
        if self.is_down:
            await clock.sleep(min(self.backoff, wait_s))
            self.backoff = min(self.backoff * 2, _BACKOFF_MAX_S)
            if not await self.sync():  # back? read on from its newest entry (Store fills in)
                return []
            self.is_down = False
            log.info("replay buffer is back for %s; following it again", self.turn_id)
        try:
            entries = await self.buffer.read(self.turn_id, after=self.position, wait_s=wait_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any buffer failure: follow the Store
            self._failed(exc)
            return []
        if entries:
            self.position = entries[-1].position
        return entries

    def _failed(self, exc: Exception) -> None:
        if not self.is_down:
            log.warning(
                "replay buffer unavailable for %s (%s); following the Store until it is back",
                self.turn_id,
                exc,
            )
            self.is_down, self.backoff = True, 0.05


async def set_once_sent(chunks: AsyncIterator[T], sent: asyncio.Event) -> AsyncIterator[T]:
    """`chunks`, setting `sent` once the first was written (its writer asked for the next).

    A route that streams a turn it just started passes `sent` to `start(hold_until=…)`:
    the turn takes its first step once the stream's opening is on the wire, not before.
    A stream that ends, fails or is closed sets it too, and closing this closes `chunks`.
    (A response never started leaves it unset: the turn then waits out the hold's bound.)
    """
    try:
        async for chunk in chunks:
            yield chunk
            sent.set()
    finally:
        sent.set()
        close = getattr(chunks, "aclose", None)
        if close is not None:  # the stream under it stops reading at once
            await close()
