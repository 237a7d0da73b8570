"""`BufferPublisher`: a driver sink that forwards committed events to the ReplayBuffer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from turnkit.events import (
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageSnapshotEvent,
    ProviderCascadeEvent,
    TurnRecoveringEvent,
    encode_event,
)
from turnkit.ids import TurnId
from turnkit.replay import EntriesLostError, ReplayBuffer
from turnkit.replay._gather import gather

__all__ = ("BufferPublisher",)

log = logging.getLogger("turnkit.replay")

CUT_SHORT_FLUSH_S = 2.0
"""How long an attempt whose task was cancelled waits for a remote buffer to take its last
entries (see `BufferPublisher.__aexit__`)."""


class BufferPublisher:
    """Called synchronously by the driver; publishes in order, batching what piled up.

    Events reach it only after their commit, so the buffer never holds an event the
    Store lacks. A buffer failure is logged and never fails the turn: readers fall back
    to the Store. A buffer with a synchronous `publish_now` (the in-memory one) gets each
    event at once; any other gets batches from a task of its own.
    """

    def __init__(self, buffer: ReplayBuffer, turn_id: TurnId) -> None:
        self.buffer = buffer
        self.turn_id = turn_id
        self._now: Callable[[TurnId, Sequence[Entry]], None] | None = getattr(
            buffer, "publish_now", None
        )
        self._queue: asyncio.Queue[DurableEvent | EphemeralEvent | None] = asyncio.Queue()
        self._task = (
            asyncio.create_task(self._run(), name=f"turnkit-publish-{turn_id}")
            if self._now is None
            else None
        )
        self._graced = False
        """A batch with the terminal entry went out: it set the grace period already."""
        self._open = _OpenBlocks()
        self._lost = False
        """A publish failed: its entries never reached the buffer (a remote one only)."""
        self._checked: _PublishChecked | None = getattr(buffer, "publish_checked", None)
        """A remote buffer's `publish` that raises `EntriesLostError` if this publisher's
        newest entry is gone (Redis restarted empty, or with an older copy of the stream),
        instead of adding the next entries after a hole."""
        self._position: str | None = None
        """The position of the newest entry a publish that went through added."""

    def __call__(self, event: DurableEvent | EphemeralEvent | None) -> None:
        if self._now is not None:
            if event is not None:
                try:
                    self._now(self.turn_id, (_entry(event),))
                except Exception:
                    log.exception("publishing an event of %s failed", self.turn_id)
            return
        if self._task is None or self._task.done():
            return  # ended already (a second end marker, or after a failure)
        self._queue.put_nowait(event)

    async def _run(self) -> None:
        finished = False
        while not finished:
            batch = [await self._queue.get()]
            # A driver still streaming adds more: one round trip carries them all.
            await gather(self._queue.qsize)
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            finished = None in batch
            events = [e for e in batch if e is not None]
            if not events:
                continue
            # After a failed publish, the blocks being written lost deltas in the buffer
            # (and, if Redis lost its data, their start): their text so far goes first.
            repair = self._open.snapshots() if self._lost else []
            entries = [_entry(e) for e in (*repair, *events)]
            try:
                if self._checked is None:
                    await self.buffer.publish(self.turn_id, entries)
                else:
                    try:
                        self._position = await self._checked(
                            self.turn_id, entries, after=self._position
                        )
                    except EntriesLostError:
                        # Redis lost entries since the last publish (restarted empty or
                        # from an older copy), so fast that no call failed: readers
                        # following may have missed some. The text so far goes first,
                        # after every position they may have read.
                        if not repair:
                            snapshots = self._open.snapshots()
                            entries = [_entry(e) for e in (*snapshots, *events)]
                        self._position = await self._checked(
                            self.turn_id, entries, after=None, floor=self._position
                        )
            except Exception as exc:  # noqa: BLE001 - never fatal: readers follow the Store
                self._lost = True
                _outages.failed(self.buffer, exc)
            else:
                self._lost = False
                _outages.worked(self.buffer)
                self._graced = self._graced or any(terminal for *_, terminal in entries)
            self._open.add(events)

    async def __aenter__(self) -> BufferPublisher:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Send the end marker (a no-op if the driver sent it), wait for the rest, release.

        Whatever way the attempt ended (done, paused, lease lost), no driver here
        publishes for the turn any more: the buffer keeps its entries for the grace
        period only (a paused turn would otherwise hold them for the whole TTL). A batch
        that carried the terminal entry to a remote buffer set that already, in its own
        round trip.

        An attempt cut short (its task cancelled: a worker's drain, a Stop, whether or
        not the driver let the cancellation through) waits at
        most `CUT_SHORT_FLUSH_S` for a remote buffer: one that does not answer (Redis
        hung, or behind a network that drops packets) would otherwise hold a stopping
        worker past its drain timeout, for as long as its client's timeouts and retries
        take. What was left unpublished readers read from the Store, and the entries
        expire with their TTL. Cancelling the task while it waits here stops the wait.
        """
        self(None)
        task = asyncio.current_task()
        cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        if not cancelled and (task is None or not task.cancelling()):
            await self._finish()
            return
        try:
            async with asyncio.timeout(CUT_SHORT_FLUSH_S):
                await self._finish()
        except TimeoutError:
            log.debug(
                "left the last entries of %s unpublished: the buffer did not answer", self.turn_id
            )

    async def _finish(self) -> None:
        await self.wait()
        if self._graced:
            return
        try:
            await self.buffer.release(self.turn_id)
        except Exception as exc:  # noqa: BLE001 - the entries then expire with their TTL
            _outages.failed(self.buffer, exc)  # an outage says so once, as publishing does
        else:
            _outages.worked(self.buffer)

    async def wait(self) -> None:
        """Return once everything up to the end marker is published.

        Cancelling the caller cancels the publishing as well (and is not swallowed).
        """
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.cancelled():
            task.result()


class _Outages:
    """One warning when publishing to a buffer starts failing, one when it works again.

    During a Redis outage every publish of every turn fails; a line (and a traceback)
    each would bury the log. The failures in between are logged at DEBUG.
    """

    def __init__(self) -> None:
        self._down: set[int] = set()
        """`id()` of the buffers failing now (any buffer: no hashing or weak references)."""

    def failed(self, buffer: ReplayBuffer, exc: Exception) -> None:
        if id(buffer) in self._down:
            log.debug("publishing still fails: %r", exc)
            return
        self._down.add(id(buffer))
        log.warning(
            "replay buffer unavailable for publishing (%s: %s); turns go on and readers "
            "follow the Store until it is back",
            type(exc).__name__,
            exc,
        )

    def worked(self, buffer: ReplayBuffer) -> None:
        if self._down and id(buffer) in self._down:
            self._down.discard(id(buffer))
            log.info("replay buffer is back; publishing again")


_outages = _Outages()


class _OpenBlocks:
    """The text so far of each block being written, as this publisher sent it.

    A remote buffer can lose entries (a publish that failed, a Redis that restarted
    empty); a live reader would then append the next deltas to text with a hole in it.
    After a failure, or a publish that found the turn's entries gone, the publisher sends
    a `message.snapshot` of each open block before the next entries, which the reader
    forwards and builds later snapshots from.
    """

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: dict[str, tuple[MessageDeltaEvent | MessageSnapshotEvent, list[str]]] = {}

    def add(self, events: Sequence[DurableEvent | EphemeralEvent]) -> None:
        blocks = self._blocks
        for event in events:
            if isinstance(event, MessageDeltaEvent):
                held = blocks.get(event.block_id)
                if held is None:
                    blocks[event.block_id] = (event, [event.text])
                else:
                    held[1].append(event.text)
            elif isinstance(event, MessageCompleteEvent):
                blocks.pop(event.block.block_id, None)
            elif isinstance(event, ProviderCascadeEvent):  # the failed rung's block is void
                for block_id in [b for b, (d, _) in blocks.items() if d.stage_id == event.stage_id]:
                    del blocks[block_id]
            elif isinstance(event, TurnRecoveringEvent):
                blocks.clear()

    def snapshots(self) -> list[MessageSnapshotEvent]:
        now = datetime.now(UTC)
        return [
            MessageSnapshotEvent(
                session_id=delta.session_id,
                turn_id=delta.turn_id,
                stage_id=delta.stage_id,
                ts=now,
                block_id=block_id,
                text="".join(texts),
            )
            for block_id, (delta, texts) in self._blocks.items()
        ]


Entry = tuple[int | None, bytes, bool]
"""What a ReplayBuffer publishes: `(seq, wire bytes, is_terminal)`."""


class _PublishChecked(Protocol):
    """`RedisReplayBuffer.publish_checked`: a publish that tells where its entries went."""

    def __call__(
        self,
        turn_id: TurnId,
        entries: Sequence[Entry],
        *,
        after: str | None,
        floor: str | None = None,
    ) -> Awaitable[str | None]: ...


def _entry(event: DurableEvent | EphemeralEvent) -> Entry:
    """The buffer's `(seq, wire bytes, is_terminal)` for an event."""
    seq = event.seq if isinstance(event, DurableEvent) else None
    return (seq, encode_event(event), isinstance(event, DoneEvent))
