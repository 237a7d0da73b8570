"""What `execute_message` streams once its message is committed: the turn's events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Final

from turnkit.agent import Agent
from turnkit.events import DurableEvent, EphemeralEvent, StreamEvent
from turnkit.ids import TurnId
from turnkit.runtime._cancel import CancelToken
from turnkit.runtime._host import TurnHost
from turnkit.runtime._slots import Slot
from turnkit.runtime.reader import TurnReader
from turnkit.states import PAUSED_STATES
from turnkit.store import Store, Submission, TurnRecord
from turnkit.store.records import readable, skip_unreadable

__all__ = ("follow_submission", "until_waiting")


async def follow_submission(
    submission: Submission,
    *,
    host: TurnHost,
    store: Store,
    turn: Callable[[str], Awaitable[TurnRecord]],
    reader: Callable[[], TurnReader],
    cancel: CancelToken | None,
    slot: Slot | None,
    agent: Agent | None,
    deps: Any,
) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
    """Drive a new turn here and stream it; replay a repeated one; follow a guided one.

    A caller that leaves before the driver begins still ends a new turn `cancelled`.
    """
    if submission.guided:
        # The message joined a running turn: follow that turn from here on.
        live = await turn(submission.turn_id)
        async for joined in reader().events(live.turn_id, after_seq=live.last_seq):
            yield joined
        return
    driving = False
    if submission.is_new and submission.lease is not None:
        host.claimed(submission.turn_id, submission.lease)  # `close` hands it over
    try:
        if submission.started is not None:
            yield submission.started  # committed with the input: no need to read it back
        elif not submission.is_new:
            async for repeated in _repeated(submission.turn_id, store, turn, reader):
                yield repeated
            return
        else:
            async for committed in skip_unreadable(store.read_events(submission.turn_id)):
                yield committed
        if not submission.is_new:
            return
        drive = host.stream(
            submission.turn_id,
            cancel,
            lease=submission.lease,
            slot=slot,
            record=submission.record,
            agent=agent,
            deps=deps,
        )
        driving = True
        async with contextlib.aclosing(drive):  # closing this stream must reach the driver
            async for event in drive:
                yield event
    finally:
        if not driving and submission.is_new and not host.left_at_close(submission.turn_id):
            # The caller left before the turn's driver began: abort it all the same.
            claimed = submission.lease is not None
            with contextlib.suppress(Exception):
                await asyncio.shield(host.end_cancelled(submission.turn_id, stopped=claimed))


_WAITS: Final = ("approval.requested", "clarification.requested", "budget.paused")
"""Where a stream of this process's turn returns: the turn waits for a person (or a limit)."""


async def until_waiting(
    events: AsyncIterator[StreamEvent],
    turn_id: TurnId,
    turn: Callable[[str], Awaitable[TurnRecord]],
) -> AsyncGenerator[StreamEvent, None]:
    """`events` up to the turn's `done`, or to the pause it waits on now.

    An earlier pause, answered already, is passed; a Stop that came first goes on to its
    `done`.
    """
    async for event in events:
        yield event
        if event.type == "done":
            return
        if event.type in _WAITS:
            now = await turn(turn_id)  # the pause it waits on is its latest event
            if now.status in PAUSED_STATES and event.seq >= now.last_seq:
                return


async def _repeated(
    turn_id: TurnId,
    store: Store,
    turn: Callable[[str], Awaitable[TurnRecord]],
    reader: Callable[[], TurnReader],
) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
    """A repeated request's turn: what it committed, then the rest while it still runs.

    It ends where the first request's stream would have: at `done`, or where the turn
    waits for a person. The status is read first: a turn that ends or pauses meanwhile is
    still followed to that event.
    """
    running = (await turn(turn_id)).status == "running"
    last = 0
    async for stored in store.read_events(turn_id):
        last = stored.seq
        event = readable(stored)  # None: unreadable by this version (logged, left out)
        if event is not None:
            yield event
    if not running:
        return  # ended, or waiting for a person: what it committed is all there is
    async for live in until_waiting(reader().events(turn_id, after_seq=last), turn_id, turn):
        yield live
