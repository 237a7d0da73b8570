"""`TurnHost`: claims and drives turns inside one runtime's process.

It streams a turn to an in-process caller (`execute_message`), or runs it detached in a
task (`start`, `resume`, re-queued guides), always publishing to the replay buffer so other
readers can follow. Every turn it drives holds one of the process's `slots` (see
`TurnSlots`) until its driver returns. Closing the runtime abandons the turns it drives,
detached or streamed, and hands their leases over; only `stop` cancels one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Final, TypeVar

from turnkit.agent import Agent
from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.errors import RuntimeClosedError, TurnNotFoundError
from turnkit.events import DurableEvent, EphemeralEvent
from turnkit.ids import SessionId, TurnId
from turnkit.replay import ReplayBuffer
from turnkit.runtime._cancel import CancelToken, stop_task, stopped
from turnkit.runtime._claims import ClaimsInFlight
from turnkit.runtime._detached import Detached, DetachedTurns
from turnkit.runtime._publish import BufferPublisher
from turnkit.runtime._runner import TurnRunner
from turnkit.runtime._slots import Slot, TurnSlots
from turnkit.runtime._turn_log import TurnLog
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.driver import Sink, TurnDriver, hand_over_all
from turnkit.runtime.reader import TurnReader
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import Lease, Store, TurnRecord

__all__ = ("TurnHost",)

log = logging.getLogger("turnkit.runtime")

NEXT_TURN_GRACE_S: Final = 2.0
"""How long after a resumed turn ends before this process takes its session's next turn:
the process that took that message, while it lives, claims it within a second."""

_CLOSING_ROUNDS: Final = 5
"""How often `close` looks again for work the tasks it stopped started as they ended."""

T = TypeVar("T")


class TurnHost:
    """Claim, drive, detach and stop turns for one runtime (its `owner`)."""

    def __init__(
        self,
        *,
        owner: str,
        store: Callable[[], Store],
        replay: ReplayBuffer,
        config: RuntimeConfig,
        clock: Clock,
        runner: Callable[[], TurnRunner],
        reader: Callable[[], TurnReader],
    ) -> None:
        self.owner = owner
        self._store = store
        self.replay = replay
        self.config = config
        self.clock = clock
        self._runner = runner
        self._reader = reader
        self._detached = DetachedTurns()
        self._streamed: dict[TurnId, tuple[asyncio.Task[None], TurnDriver]] = {}
        """The driver tasks (and drivers) of turns streamed to a caller here (`stream`),
        for a Stop and for `close`."""
        self._starting: dict[TurnId, Lease] = {}
        """Turns claimed for a caller's stream whose driver does not run yet (`claimed`)."""
        self._left_starting: set[TurnId] = set()
        """Of those, the turns `close` handed over: their streams end, running nothing."""
        self._stopped_starting: set[TurnId] = set()
        """Of those, the turns a Stop ended in the Store: their streams end with that ending,
        running nothing."""
        self._shielded: set[asyncio.Task[Any]] = set()
        self._claims = ClaimsInFlight()
        """Claims of this host under way: a Stop that finds the turn claimed waits for them
        to land (the turn's driver here is then found, and stopped)."""
        self._deps = _HandedDeps()
        self.slots = TurnSlots(config.max_running_turns)

    async def claim(self, turn_id: TurnId) -> tuple[Lease, Slot] | None:
        """Claim our own turn and a slot to run it in.

        Waits (bounded by the ceiling) for earlier turns of its session to end, holding
        no slot meanwhile, and for a slot. None: it ended, or another driver has it.
        """
        store = self._store()
        delay, waited = 0.01, 0.0
        while waited < self.config.ceiling_s:
            slot = await self.slots.take()
            try:
                lease = await self._claims.claim(
                    store.claim(
                        self.owner,
                        ttl_s=self.config.lease_ttl_s,
                        max_attempts=self.config.max_attempts,
                        turn_id=turn_id,
                    )
                )
            except BaseException:
                slot.release()
                raise
            if lease is not None:
                return lease, slot
            slot.release()
            record = await store.get_turn(turn_id)
            if record is None or record.status != "running" or record.lease_owner is not None:
                return None  # ended, or another driver has it
            await self.clock.sleep(delay)
            waited += delay
            delay = min(delay * 2, 1.0)
        return None

    async def stream(
        self,
        turn_id: TurnId,
        cancel: CancelToken | None,
        *,
        lease: Lease | None = None,
        slot: Slot | None = None,
        record: TurnRecord | None = None,
        agent: Agent | None = None,
        deps: Any = NO_DEPS,
    ) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
        """Drive a turn here and stream it; closing the stream aborts the turn.

        `lease` and `slot`: the turn was claimed with its message (the slot is released
        when the stream ends); otherwise it is claimed here.
        """
        try:
            if lease is None:
                claimed = await self._claim_or_cancel(turn_id)
                if claimed is None:  # it ended, or another driver has it: follow that one
                    async for other in self._reader().events(turn_id, after_seq=1):
                        yield other
                    return
                lease, slot = claimed
            elif self._stopped_at_start(turn_id):  # stopped before its stream went on
                raise _StoppedEarly
            elif self.left_at_close(turn_id):  # closed before its stream went on
                raise _left_to_another(turn_id, lease.last_seq)
            drive = self._drive(turn_id, cancel, lease, record, agent, deps)
            async with contextlib.aclosing(drive):  # closing this stream aborts the turn
                async for event in drive:
                    yield event
        except _StoppedEarly:  # a Stop ended it in the Store before its driver ran
            assert lease is not None
            async for ended in self._reader().events(turn_id, after_seq=lease.last_seq):
                yield ended
        finally:
            if slot is not None:
                slot.release()

    def claimed(self, turn_id: TurnId, lease: Lease) -> None:
        """A turn claimed for a caller's stream, whose driver does not run yet.

        Closing the runtime before the driver runs (the caller has yet to read past
        `turn.started`, or the driver is being built) hands the turn over: its driver never
        runs here, and the stream ends with `RuntimeClosedError`.
        """
        self._starting[turn_id] = lease

    def left_at_close(self, turn_id: TurnId) -> bool:
        """Whether `close` handed the turn over before its stream's driver ran (forgets it)."""
        self._starting.pop(turn_id, None)
        self._stopped_starting.discard(turn_id)
        if turn_id in self._left_starting:
            self._left_starting.discard(turn_id)
            return True
        return False

    def _stop_starting(self, turn_id: TurnId) -> bool:
        """A Stop of a turn claimed for a caller's stream whose driver does not run yet.

        Its driver never runs: the Stop ends the turn in the Store, where this host's
        lease on it no longer counts, and the stream ends with that ending. False if no
        such turn is here.
        """
        if turn_id not in self._starting or turn_id in self._left_starting:
            return False
        self._stopped_starting.add(turn_id)
        return True

    def _stopped_at_start(self, turn_id: TurnId) -> bool:
        """Whether a Stop ended the turn before its stream's driver ran (forgets it)."""
        if turn_id not in self._stopped_starting:
            return False
        self._stopped_starting.discard(turn_id)
        self._starting.pop(turn_id, None)
        return True

    def _drives(self, turn_id: TurnId) -> bool:
        """Whether a driver here holds (or is about to drive) `turn_id`."""
        return (
            self._detached.holds(turn_id)
            or turn_id in self._streamed
            or (turn_id in self._starting and turn_id not in self._left_starting)
        )

    async def _claim_or_cancel(self, turn_id: TurnId) -> tuple[Lease, Slot] | None:
        """`claim`, for a caller that streams the turn.

        A caller that leaves while its turn waits aborts the turn, as it would a running
        one; otherwise the turn would stay queued, and its session's later turns with it.
        """
        try:
            return await self.claim(turn_id)
        except asyncio.CancelledError:
            # A claim that committed as we were cancelled holds our lease: it counts as lapsed.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.end_cancelled(turn_id, stopped=True))
            raise

    async def end_cancelled(
        self, turn_id: TurnId, *, stopped: bool, by: str | None = None
    ) -> TurnStatus:
        """End the turn `cancelled` in the Store (or flag its live driver), as `Store.cancel`.

        `stopped`: this host's drivers of the turn have stopped, so its lease on the turn
        no longer counts. Live readers wait on the buffer: they are handed the `done`.
        `by`: who pressed Stop (the audit of a paused turn's requests records it).
        """
        store = self._store()
        owner = self.owner if stopped else None
        status = await store.cancel(turn_id, stopped_owner=owner, by=by)
        if status in TERMINAL_STATES:
            self._deps.drop(turn_id)  # it will not resume
        if status == "cancelled":
            record = await store.get_turn(turn_id)
            after = record.last_seq - 2 if record is not None else 0
            ending = [
                (e.seq, e.data, e.type == "done")  # a reader's stream ends at done only
                async for e in store.read_events(turn_id, after_seq=after)
                if e.type in ("run.finished", "done")  # the Store's ending: its account, done
            ]
            if ending:
                await self.replay.publish(turn_id, ending)
            if record is not None:  # guides it never presented wait as turns of their own
                await self.pick_up(record.session_id)
        return status

    async def _drive(
        self,
        turn_id: TurnId,
        cancel: CancelToken | None,
        lease: Lease,
        record: TurnRecord | None,
        agent: Agent | None,
        deps: Any,
    ) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
        self.claimed(turn_id, lease)  # `close` hands it over until its driver runs
        queue = _Handoff()
        said = TurnLog(log, lease, self.clock, fallback_level=logging.INFO)
        # The publisher lets other readers follow the turn too.
        async with BufferPublisher(self.replay, turn_id) as publisher:

            def sink(event: DurableEvent | EphemeralEvent | None) -> None:
                said.see(event)
                queue.put(event)
                publisher(event)

            driver = await self._built(lease, sink, record, agent, deps)
            task = asyncio.create_task(driver.run(), name=f"turnkit-turn-{turn_id}")
            self._streamed[turn_id] = task, driver
            watcher = (
                asyncio.create_task(_cancel_when(cancel, task), name="turnkit-cancel-watch")
                if cancel is not None
                else None
            )
            try:
                last_seq, ended = lease.last_seq, False
                while (event := await queue.get()) is not None:
                    if isinstance(event, DurableEvent):
                        last_seq, ended = event.seq, event.type == "done"  # type: ignore[attr-defined]
                    yield event
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                if not ended:
                    async for ended_by in self._ended_elsewhere(driver, last_seq):
                        yield ended_by
            finally:
                if self._streamed.get(turn_id, (None,))[0] is task:
                    del self._streamed[turn_id]
                if watcher is not None:
                    watcher.cancel()
                if not task.done():
                    # The caller left its stream (closed it, or its task was cancelled): a
                    # Stop. Unless the driver's task is cancelled already: by a Stop, or
                    # by a shutdown that cancels every task (which leaves the turn).
                    if not task.cancelling():
                        stop_task(task)
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    if driver.recorder is None and not driver.lease_lost:  # before it began
                        with contextlib.suppress(Exception):
                            await asyncio.shield(self.end_cancelled(turn_id, stopped=True))
                said.finished(said.outcome(driver), driver)
                await self._after(driver)  # also when the caller closed the stream (abort)

    async def _built(
        self, lease: Lease, sink: Sink, record: TurnRecord | None, agent: Agent | None, deps: Any
    ) -> TurnDriver:
        """The driver of a turn streamed to a caller, not yet running.

        A caller that leaves meanwhile ends the turn `cancelled`; a `close` meanwhile
        handed it over, and the caller's stream ends with `RuntimeClosedError`; a Stop
        meanwhile ended the turn in the Store (`_StoppedEarly`: its driver never runs).
        """
        turn_id = lease.turn_id
        try:
            driver = await self._runner().driver(
                lease, sink=sink, agent=agent, record=record, deps=self._deps.keep(turn_id, deps)
            )
        except asyncio.CancelledError:  # the caller left before the turn began
            if not self.left_at_close(turn_id):
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.end_cancelled(turn_id, stopped=True))
            raise
        except BaseException:
            self._starting.pop(turn_id, None)
            self._stopped_starting.discard(turn_id)
            raise
        if self._stopped_at_start(turn_id):
            raise _StoppedEarly
        if self.left_at_close(turn_id):  # handed over meanwhile: it runs elsewhere
            raise _left_to_another(turn_id, lease.last_seq)
        return driver

    async def _ended_elsewhere(
        self, driver: TurnDriver, last_seq: int
    ) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
        """The rest of a streamed turn its driver here stopped without ending.

        Someone else owns the turn now (a takeover or the sweep): its ending, read from the
        log. A turn left at shutdown (the runtime closed) has none yet: the stream ends
        with `RuntimeClosedError` rather than wait for another process to finish it; one
        whose pause committed first ends as a paused turn's stream does.
        """
        turn_id = driver.lease.turn_id
        if driver.abandoned and not driver.paused:
            raise _left_to_another(turn_id, last_seq)
        if driver.lease_lost:
            async for ended_by in self._reader().events(turn_id, after_seq=last_seq):
                yield ended_by

    def detach(
        self,
        turn_id: TurnId,
        *,
        lease: Lease | None = None,
        slot: Slot | None = None,
        agent: Agent | None = None,
        deps: Any = NO_DEPS,
        hold_until: asyncio.Event | None = None,
        then_next: bool = False,
    ) -> None:
        """Drive a turn in a task of this runtime, publishing to the replay buffer.

        `lease` and `slot` as for `stream`; `hold_until` as for `TurnDriver.run`.
        `then_next`: the turn resumes from a pause, which may have outlived the process
        that took the session's next message (a deploy): once it ends, that turn is taken
        here if nobody has taken it (`NEXT_TURN_GRACE_S`), and so on down the session.
        """
        deps = self._deps.keep(turn_id, deps)
        entry = Detached(lease, slot, then_next=then_next)
        self._detached.start(
            turn_id, entry, self._run_detached(turn_id, entry, agent, deps, hold_until)
        )

    async def _run_detached(
        self,
        turn_id: TurnId,
        entry: Detached,
        agent: Agent | None,
        deps: Any,
        hold_until: asyncio.Event | None = None,
    ) -> None:
        try:
            if entry.lease is None:
                claimed = await self.claim(turn_id)
                if claimed is None:
                    return
                entry.lease, entry.slot = claimed
            said = TurnLog(log, entry.lease, self.clock, fallback_level=logging.INFO)
            async with BufferPublisher(self.replay, turn_id) as publisher:
                entry.driver = await self._runner().driver(
                    entry.lease, sink=said.watching(publisher), agent=agent, deps=deps
                )
                try:
                    await entry.driver.run(hold_until=hold_until)
                finally:
                    said.finished(said.outcome(entry.driver), entry.driver)
                entry.ran = True
        except TurnNotFoundError:  # its session was deleted meanwhile: nothing left to write
            log.info("turn %s ended with its session, deleted while it ran", turn_id)
        finally:
            if entry.slot is not None:
                entry.slot.release()
            if entry.driver is not None:
                await self._after(entry.driver)  # also after Stop, which cancels this task
                if entry.then_next and entry.driver.ended:
                    self._in_background(self._next_turn(entry.driver.lease.session_id))

    async def _after(self, driver: TurnDriver) -> None:
        """After a turn's driver, however it ended (a Stop or an abort included).

        Drops the turn's deps if it ended, and runs the guide messages its ending re-queued
        as turns of their own.
        """
        if driver.ended:  # not paused: it will not resume
            self._deps.drop(driver.lease.turn_id)
        if driver.requeued:  # claimed and detached together, even if this task is cancelled
            await self._shield(self.pick_up(driver.lease.session_id))

    async def _next_turn(self, session_id: SessionId) -> None:
        """The session's next turn, once its own process would have claimed it."""
        await self.clock.sleep(NEXT_TURN_GRACE_S)
        try:
            await self.pick_up(session_id, then_next=True)
        except Exception as exc:  # noqa: BLE001 - a worker or recovery still takes it
            log.warning("taking the next turn of session %s failed: %s", session_id, exc)

    def _in_background(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `work` in a task of its own, cancelled when the runtime closes."""
        task = asyncio.create_task(work)
        self._shielded.add(task)
        task.add_done_callback(self._shielded.discard)
        return task

    async def _shield(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` to its end even if the caller is cancelled meanwhile."""
        return await asyncio.shield(self._in_background(work))

    async def run_to_end(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` to its end even if the caller is cancelled meanwhile (a Stop)."""
        return await self._shield(work)

    async def pick_up(self, session_id: SessionId, *, then_next: bool = False) -> None:
        """Run a turn this session queued meanwhile (e.g. a re-queued guide message).

        `then_next` as for `detach`: such a turn waits for a slot, as any turn taken here
        does (a re-queued guide is counted at once: its turn ending claimed it).
        """
        if not self.config.run_in_process:
            return
        slot = await self.slots.take() if then_next else None
        try:
            lease = await self._claims.claim(
                self._store().claim(
                    self.owner,
                    ttl_s=self.config.lease_ttl_s,
                    max_attempts=self.config.max_attempts,
                    session_id=session_id,
                )
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if lease is None:
            if slot is not None:
                slot.release()
            return
        slot = slot if slot is not None else self.slots.hold()
        self.detach(lease.turn_id, lease=lease, slot=slot, then_next=then_next)

    async def cancel(self, turn_id: TurnId, *, by: str | None = None) -> TurnStatus:
        """Stop (see `SessionRuntime.cancel`); it runs to its end even if its caller leaves.

        A turn detached here is cancelled and its task awaited. What its driver wrote
        stands if it ended the turn; otherwise (it was waiting to be claimed, had not begun,
        had paused, or lost its lease) the turn is ended in the Store, where this host's own
        lease on it no longer counts.
        """
        return await self._shield(self._cancel(turn_id, by=by))

    async def _cancel(
        self, turn_id: TurnId, *, again: bool = True, by: str | None = None
    ) -> TurnStatus:
        here = (
            await self._detached.stop(turn_id)
            or await self._stop_streamed(turn_id)
            or self._stop_starting(turn_id)
        )
        if here:
            record = await self._store().get_turn(turn_id)
            if record is not None and record.status in TERMINAL_STATES:
                self._deps.drop(turn_id)
                return record.status  # its driver wrote the ending
        status = await self.end_cancelled(turn_id, stopped=here, by=by)
        if status == "running" and again:
            # A claim of ours may have taken the turn meanwhile (an approval, the session's
            # next turn picked up, a caller's stream waiting for its turn): once it lands,
            # its driver here is found. The flag would only reach it at its next renewal,
            # after its tools began. Stop it now.
            await self._claims.landed()
            if self._drives(turn_id):
                return await self._cancel(turn_id, again=False, by=by)
        return status

    def keep_deps(self, turn_id: TurnId, deps: Any) -> Any:
        """Keep the deps a caller handed in for a turn (while it may run here); what is kept.

        Whoever drives the turn in this process (its caller's stream, a detached task, the
        runtime's recovery loop) drives it with them, not the deps factory's.
        """
        return self._deps.keep(turn_id, deps)

    def turn_ended(self, turn_id: TurnId) -> None:
        """Forget what was kept for a turn that ended (its handed-in deps)."""
        self._deps.drop(turn_id)

    async def _stop_streamed(self, turn_id: TurnId) -> bool:
        """Cancel the driver of a turn streamed to a caller here; False if none is.

        The driver ends the turn `cancelled` (its call aborted, `user-aborted` audited) and
        the caller's stream ends with that `done`.
        """
        task, _ = self._streamed.get(turn_id, (None, None))
        if task is None:
            return False
        if not task.cancelling():  # once: a second Stop waits with the first (`stop`)
            stop_task(task)
        await asyncio.gather(task, return_exceptions=True)
        return True

    async def close(self) -> None:
        """Abandon the turns driven here and hand their leases over, as a worker does.

        Detached turns and turns streamed to a caller alike: each driver commits what it
        had staged, writes nothing more, and another process (a worker, a runtime
        recovering turns) takes the turn over at once. A caller's stream ends with
        `RuntimeClosedError` (see `_left_to_another`). Each driver's last commit waits at
        most `HAND_OVER_WITHIN_S` from the moment it is cancelled, its last publish
        `CUT_SHORT_FLUSH_S`, and then the hand-over `HAND_OVER_WITHIN_S` (as a worker's
        drain): a database that does not answer in time (a row locked by another
        connection) is given up on, logged, and those leases lapse instead, as after a
        crash.
        """
        leases: list[Lease] = []
        for _ in range(_CLOSING_ROUNDS):
            running, more = self._detached.abandon()
            streamed, left = self._abandon_streamed()
            leases += more + left
            tasks = [*running, *streamed, *self._shielded]
            if not tasks:
                break
            for task in tasks:
                if not stopped(task):  # a Stop's own ending is not cut short
                    task.cancel()
            # Their last steps may start more (a resumed turn that ended takes its session's
            # next turn): those are abandoned in the next round, never left running.
            await asyncio.gather(*tasks, return_exceptions=True)
        if leases:  # a runtime never opened has no Store to ask
            await hand_over_all(self._store(), leases, log)  # its own HAND_OVER_WITHIN_S

    def _abandon_streamed(self) -> tuple[list[asyncio.Task[None]], list[Lease]]:
        """Tell the drivers of streamed turns to write nothing more; their tasks and leases.

        As `DetachedTurns.abandon`: closing the runtime is not a Stop. A turn a Stop is
        already ending (its caller left the stream) is left to end `cancelled`; `close`
        waits for its task. A turn whose driver does not run yet (`claimed`) is handed
        over too, and never runs here.
        """
        tasks: list[asyncio.Task[None]] = []
        leases = [  # claimed, their drivers not running yet (a Stop ended some)
            lease
            for turn_id, lease in self._starting.items()
            if turn_id not in self._stopped_starting
        ]
        self._left_starting.update(self._starting)
        self._starting.clear()
        for task, driver in self._streamed.values():
            if task.done() or driver.abandoned:
                continue
            tasks.append(task)
            if stopped(task):
                continue
            driver.abandon()
            if not (driver.ending_committed or driver.paused):  # an ending cut short: not
                leases.append(driver.lease)
        return tasks, leases


MAX_HANDED_DEPS: Final = 4096
"""Turns whose handed-in deps one process keeps at most, the oldest kept dropped first.

A turn driven here holds its own deps; what is kept serves a turn that may come back here
(a resume after its pause, the recovery loop). One that paused and was answered in another
process, or was never answered, is not heard of here again: its deps would stay for good."""


class _HandedDeps:
    """Deps a caller handed in for a turn, kept while the turn may resume in this process."""

    __slots__ = ("_by_turn",)

    def __init__(self) -> None:
        self._by_turn: OrderedDict[TurnId, Any] = OrderedDict()

    def keep(self, turn_id: TurnId, deps: Any) -> Any:
        """`deps` if given (kept for the turn from now on), else what was kept for it."""
        if deps is not NO_DEPS:
            self._by_turn[turn_id] = deps
            self._by_turn.move_to_end(turn_id)
            while len(self._by_turn) > MAX_HANDED_DEPS:
                self._by_turn.popitem(last=False)  # it gets the factory's, as elsewhere
            return deps
        return self._by_turn.get(turn_id, NO_DEPS)

    def drop(self, turn_id: TurnId) -> None:
        """The turn ended: it will not resume."""
        self._by_turn.pop(turn_id, None)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._by_turn


class _Handoff:
    """The events a turn's driver sent, waiting for the stream to yield them.

    An `asyncio.Queue` without its per-item bookkeeping: one producer, one consumer,
    unbounded.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[DurableEvent | EphemeralEvent | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: DurableEvent | EphemeralEvent | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> DurableEvent | EphemeralEvent | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class _StoppedEarly(Exception):
    """A Stop ended a streamed turn in the Store before its driver ran."""


def _left_to_another(turn_id: TurnId, last_seq: int) -> RuntimeClosedError:
    """What a caller's stream raises when its turn was left unended (not a Stop).

    The runtime was closed while the turn ran (or its process is going away): the turn
    was handed over, still `running`, and another process finishes it.
    """
    return RuntimeClosedError(
        f"the runtime was closed while turn {turn_id!r} ran: the turn was not stopped, "
        "it goes on in another process (a worker, or a runtime recovering turns); follow "
        f"it from an open runtime with `follow({turn_id!r}, after_seq={last_seq})`",
        turn_id=turn_id,
        last_seq=last_seq,
    )


async def _cancel_when(token: CancelToken, task: asyncio.Task[None]) -> None:
    await token.wait()
    stop_task(task)
