"""`TurnDriver`: drives one turn under a lease and writes exactly one ending.

Write before send holds throughout (the Recorder commits before it publishes). Its
`LeaseKeeper` renews the lease at least every ttl/3 and watches the idle window; the moment
renewal fails the driver stops writing and the turn's work is cancelled. An attempt that
takes over a dead one resumes from the last LangGraph checkpoint and repeats nothing the
log already holds (see `turnkit.journal`).

Only a Stop (`stop_task`: `SessionRuntime.cancel`, a `CancelToken`, the caller closing the
stream it reads, Stop pressed in another process) ends a turn `cancelled`. Any other
cancellation of the driver's task is the process going away (the event loop shutting
down): the turn is left to recovery, as after a crash, and its lease handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnkit.audit import AgentRepinnedPayload, AuditPayloads
from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.context._known import KnownHistory
from turnkit.context.prefix import PreviousRequest
from turnkit.errors import (
    AdmissionRefusedError,
    InternalError,
    LeaseLostError,
    StaleEpochError,
    StoreUnavailableError,
    TurnError,
)
from turnkit.events import DurableEvent, EphemeralEvent, TurnRecoveringEvent
from turnkit.graph import (
    TurnGraph,
    TurnState,
    bind_resumed,
    carry_events,
    expect_new_thread,
    has_pending_interrupt,
    latest_checkpoint_id,
    run_turn,
    stored_request,
    turn_part,
)
from turnkit.ids import TurnId
from turnkit.otel import TurnTrace, attempt
from turnkit.runtime._aftermath import Aftermath
from turnkit.runtime._attempt_log import open_recorder
from turnkit.runtime._cancel import stopped
from turnkit.runtime._endings import Attempt, end_aborted, end_failed, end_succeeded
from turnkit.runtime._lease_keeper import LeaseKeeper, renewal_due
from turnkit.runtime._transcript import ended_transcript
from turnkit.runtime.logs import turn_logging
from turnkit.stages import StageContext
from turnkit.stages._naming import name_thread
from turnkit.stages._plugins import guard_input, on_events
from turnkit.stages._types import Route, TranscriptMessage
from turnkit.states import awaiting
from turnkit.store import Lease, Store, TurnRecord, UnreadableEvent
from turnkit.telemetry import Publish, Recorder

__all__ = ("DriveSetup", "StopAsked", "TurnDriver", "hand_over_all", "renewal_due")

HOLD_MAX_S = 1.0
"""The longest a driver waits for its `hold_until` before it runs the turn anyway."""

HAND_OVER_WITHIN_S = 2.0
"""How long a driver left at shutdown waits to hand its lease over (else it lapses)."""

log = logging.getLogger("turnkit.runtime")


Sink = Callable[[DurableEvent | EphemeralEvent | None], None]
"""Where the driver sends events; `None` marks the end of the turn."""
StopAsked = Callable[[TurnId, Sequence[TurnId]], Awaitable[None]]
"""Told that a turn's ending (written by its driver here) stopped the listed turns of the
agents it asked, in the Store: a driver of one in this process stops at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveSetup:
    """What a turn runs with, built once the driver holds the lease (it may fail)."""

    ctx_factory: Callable[[Recorder], StageContext]
    transcript: list[TranscriptMessage]
    previous: PreviousRequest | None
    entry: Route
    repinned: AgentRepinnedPayload | None = None
    """The turn had not started and now runs on its agent's current version (audited)."""
    record: TurnRecord | None = None
    """The turn as the setup left it (re-pinned: its new `pinned` and `model`)."""
    known: KnownHistory | None = None
    """The transcript's history after its system message (`session_transcript`)."""


class TurnDriver:
    """Drives one claimed turn to a terminal state (or to a lost lease)."""

    def __init__(
        self,
        *,
        graph: TurnGraph,
        store: Store,
        clock: Clock,
        config: RuntimeConfig,
        lease: Lease,
        record: TurnRecord,
        setup: Callable[[], Awaitable[DriveSetup]],
        sink: Sink,
        traceparent: str | None = None,
        aftermath: Aftermath | None = None,
        stop_asked: StopAsked | None = None,
    ) -> None:
        self.graph = graph
        self.store = store
        self.clock = clock
        self.config = config
        self._keeper = LeaseKeeper(store=store, clock=clock, config=config, lease=lease)
        self.abandoned = False
        """Given up at shutdown (`abandon`, or its task cancelled by no Stop), not lost to
        another driver."""
        self._task: weakref.ref[asyncio.Task[Any]] | None = None
        """The task running `run` (weakly: its CancelledError's traceback holds this)."""
        self._left = False
        """Its task was cancelled by no Stop: it hands its lease over as it ends."""
        self._leave_by: float | None = None
        """When (loop time) a driver given up at shutdown stops waiting for the database:
        its last commit and its hand-over share `HAND_OVER_WITHIN_S`."""
        self.record = record
        self.setup = setup
        self.sink = sink
        self.traceparent = traceparent
        """The W3C trace context the turn was pinned to: this attempt's spans join it."""
        self.aftermath = aftermath
        """Where work for after a succeeded turn's ending runs (None: it is dropped)."""
        self.stop_asked = stop_asked
        """Stops what a turn that ended unanswered had asked (see `_stop_what_it_asked`)."""
        self._succeeded = False
        self._ctx: StageContext | None = None
        """The attempt's stage context, for the work after its ending."""
        self.ended = False
        """The turn reached a terminal state here (not a pause, not a lost lease)."""
        self.paused = False
        """The turn's pause (its move to waiting for a person) committed here."""
        self._ending_written = False
        """Its ending is committed: nothing resumes the turn now (its checkpoints may go)."""
        self.recorder: Recorder | None = None
        self.trace_ids: tuple[str, str] | None = None
        """The trace id and span id of this attempt's span, once it began (None untraced):
        the log line saying how the turn ended names them, written after the span ended."""
        self.skipped: list[UnreadableEvent] = []
        """Committed events of the turn this attempt could not decode (left out)."""
        self._started = time.perf_counter()
        self._stop_carrying: Callable[[bool], Awaitable[None]] | None = None
        """Ends the turn's commits carrying its checkpoints (PostgreSQL; see `carry_events`)."""

    @property
    def lease(self) -> Lease:
        """The turn's lease, as last renewed."""
        return self._keeper.lease

    @property
    def ending_committed(self) -> bool:
        """Its ending is committed (`ended` is set as the ending begins, before it lands)."""
        return self._ending_written

    @property
    def lease_lost(self) -> bool:
        """The turn may no longer be ours (renewal failed, or it was given up)."""
        return self._keeper.lost

    @property
    def why_lease_lost(self) -> str:
        """What `lease_lost` came from, in a few words (for the log)."""
        return self._keeper.why_lost

    @property
    def requeued(self) -> int:
        """Guide messages this turn's ending re-queued as turns of their own."""
        return self.recorder.notes.requeued if self.recorder is not None else 0

    def heard_guide(self, input_seq: int) -> None:
        """A guide message joined the turn: its next model request looks for it."""
        if self.recorder is not None:
            notes = self.recorder.notes
            notes.newest_guide_seq = max(notes.newest_guide_seq, input_seq)

    def abandon(self) -> None:
        """Give the turn up without ending it (shutdown): the next cancel writes nothing."""
        self._keeper.lost = True
        self.abandoned = True

    @property
    def leaving(self) -> bool:
        """Its task is being cancelled, and not by a Stop: the process is going away.

        Not for a lost lease, nor for the run's deadline (the idle window, the ceiling),
        which cancel the task too. The turn is then left to recovery (see `run`).
        """
        task = self._task() if self._task is not None else None
        if task is None or not task.cancelling() or stopped(task) or self.lease_lost:
            return False
        deadline = self._keeper.deadline
        return deadline is None or not deadline.expired()

    async def run(self, *, hold_until: asyncio.Event | None = None) -> None:
        """Run the turn to a terminal state, or until a Stop or the lease is lost.

        A Stop cancels this task (`stop_task`): the turn ends `cancelled`. Any other
        cancellation (the event loop shutting down, an app cancelling its tasks as it
        exits) writes nothing more: the turn stays `running`, its lease is handed over
        (within `HAND_OVER_WITHIN_S`, else it lapses), and the next attempt (a worker, a
        runtime recovering turns) takes it over from its last checkpoint; the
        cancellation is raised on.

        `hold_until`: wait for it (at most `HOLD_MAX_S`, and a third of the lease's TTL)
        before the turn's first step, so a caller streaming the turn sends `turn.started`
        first. The lease is renewed meanwhile, and a Stop still ends the turn `cancelled`.
        """
        graph_task = asyncio.current_task()
        assert graph_task is not None
        self._task = weakref.ref(graph_task)
        trace: TurnTrace = attempt(self.record, self.lease, self.traceparent)
        self.trace_ids = trace.ids()
        turn_logging(self.lease.turn_id, self.lease.session_id)  # this task is the turn's
        try:
            rec, self.skipped = await open_recorder(
                store=self.store,
                lease=self.lease,
                record=self.record,
                clock=self.clock,
                publish=_each_to(self.sink),
            )
            self.recorder = rec
            trace.watch(rec)
            # Renewed from here on, through the hold and the setup (the app's deps factory).
            keeper, beat = self._keeper.start(graph_task, rec, self.sink)
            # A cancelled task keeps its CancelledError, whose traceback holds this frame:
            # the frame must not name the tasks, or they and the turn form a cycle.
            del graph_task
            try:
                setup = await self._prepare(rec, trace, hold_until)
                await self._run_graph(rec, setup)
            finally:
                # Summaries still running: the turn no longer waits for them.
                tasks = [keeper, beat, *rec.notes.background]
                del keeper, beat  # (see above)
                rec.notes.background.clear()
                await _cancelled(tasks)
            if rec.notes.pending_pause is not None:
                await self._pause(rec)
            else:
                await self._settle(rec)
            await self._end_carrying(keep=True)
        except asyncio.CancelledError:
            await self._leave_if_shutting_down()
            lost = self.lease_lost  # (an abort refused below is lost too, yet still raises)
            if not lost and self.recorder is not None:
                await self._end_aborted(self.recorder)
            if lost and not self._left:
                return  # someone else owns the turn now: write nothing, end quietly
            raise
        except (StaleEpochError, LeaseLostError):
            self._keeper.lost = True
        except StoreUnavailableError as exc:
            self._left_to_recovery(exc)
        except (TurnError, AdmissionRefusedError) as exc:  # refused: a re-pinned turn's check
            if self.recorder is not None:
                await self._ending_or_recovery(self._end_failed(self.recorder, exc))
        except Exception as exc:  # noqa: BLE001 - any bug still ends the turn with a clear state
            await self._failed_unexpectedly(exc)
        finally:
            await self._join_commit_ahead()
            await self._end_carrying(keep=False)  # if the turn did not end as it should
            if self._left:
                await self._hand_over()
            trace.end(self.recorder, lease_lost=self.lease_lost)
            await self._release_budget()
            self.sink(None)
            self._prune_if_ended()
            await self._stop_what_it_asked()
        self._leave_aftermath()

    async def _leave_if_shutting_down(self) -> None:
        """Cancelled: by no Stop, the process goes away, and recovery goes on (see `run`).

        Given up at shutdown (so, or by `abandon`), the driver commits what it had staged
        (say a tool's result), so the attempt that takes the turn over repeats none of it:
        within `HAND_OVER_WITHIN_S`, which its hand-over shares. A database
        that does not answer in time, or a lease no longer ours, commits nothing, and the
        next attempt repeats the step from what the log holds, as after a crash. A pause
        under way commits nothing: its request commits with the turn's move to waiting,
        or not at all.
        """
        if self.leaving:
            self.abandon()
            self._left = True
        rec = self.recorder
        if not self.abandoned or rec is None or rec.notes.pending_pause is not None:
            return
        self._leave_by = asyncio.get_running_loop().time() + HAND_OVER_WITHIN_S
        try:
            async with asyncio.timeout_at(self._leave_by):
                await rec.commit_left()
        except Exception as exc:  # noqa: BLE001 - the turn is left either way
            log.debug("could not commit what %s had staged: %r", self.lease.turn_id, exc)

    async def _hand_over(self) -> None:
        """Left at shutdown: hand the lease over, for another process to take the turn now.

        As `SessionRuntime.close` and a worker's drain do (the attempt is not counted
        toward `max_attempts`). A database that does not answer in time (what is left of
        `HAND_OVER_WITHIN_S` after the driver's last commit) leaves the lease to lapse, as
        after a crash; asyncio waits for this before the loop closes.
        """
        await hand_over_all(self.store, [self.lease], log, by=self._leave_by)

    async def _stop_what_it_asked(self) -> None:
        """Tell the runtime the turn's ending is written, and which asked turns it stopped.

        A turn that ended without the answer of an agent it asked, whose request it was
        handed, stops that agent's turn in the transaction of its ending (see
        `Store.commit`): say the asking turn resumed after a deploy removed or changed its
        agent (`agent-not-found`) before its call followed the asked turn again. Nothing is
        left to a process that may die after that ending; here a driver of such a turn in
        this process is stopped at once, before this driver's slot is free, so the worker
        that drove it does not claim the asked turn meanwhile. A succeeded turn followed
        each to its end.
        """
        rec = self.recorder
        if rec is None or not self._ending_written or self.lease_lost or self.stop_asked is None:
            return
        try:  # with nothing stopped, only a Stop under way here is told (at once)
            async with asyncio.timeout(self.config.idle_window_s):
                await self.stop_asked(self.lease.turn_id, rec.notes.stopped_asked)
        except Exception as exc:  # noqa: BLE001 - never mask how the turn ended
            log.warning("stopping what %s asked failed: %s", self.lease.turn_id, exc)

    def _prune_if_ended(self) -> None:
        """A turn whose ending this attempt committed: its checkpoints resume nothing now.

        Not one whose ending failed to commit (a Stop during an outage): it is still
        running in the Store, and the attempt that takes it over resumes from them.
        """
        if self._ending_written and not self.lease_lost and self.aftermath is not None:
            self.aftermath.ended(self.lease.turn_id)

    async def _failed_unexpectedly(self, exc: Exception) -> None:
        """A bug ends the turn `internal-error`.

        A database out of reach or refusing writes is not one: the Store and the
        checkpointer raise `StoreUnavailableError` for their own connections (`run` leaves
        the turn to recovery), so an app's own database failing its code fails the turn.
        """
        if self.recorder is not None:
            unexpected = InternalError(f"unexpected {type(exc).__name__} inside the turn: {exc}")
            await self._ending_or_recovery(self._end_failed(self.recorder, unexpected))

    def _left_to_recovery(self, exc: StoreUnavailableError) -> None:
        """Nothing more of this attempt can be written: it stops, and leaves the turn.

        Its lease lapses, and an attempt that finds the database takes the turn over,
        repeating nothing.
        """
        self.ended = False  # an ending that met the outage is not one: keep the turn's deps
        self._keeper.why_lost = f"the database became unavailable ({exc.message})"
        self._keeper.lost = True

    async def _ending_or_recovery(self, ending: Awaitable[None]) -> None:
        """Commit a failed ending; if the database is gone meanwhile, leave it to recovery."""
        try:
            await ending
        except StoreUnavailableError as exc:
            self._left_to_recovery(exc)

    def _leave_aftermath(self) -> None:
        """After a succeeded turn's stream has ended: a session's opening turn names it.

        Whichever attempt ended the turn asks, so a takeover that only wrote the ending
        still does; the turn never waits for the call.
        """
        rec, ctx = self.recorder, self._ctx
        if rec is None or ctx is None or not self._succeeded or self.aftermath is None:
            return
        if self.record.input_seq != 1 or ctx.naming is None:
            return
        self.aftermath.leave(
            functools.partial(name_thread, ctx, rec.notes.request_text),
            name=f"turnkit-naming-{self.lease.turn_id}",
            within_s=self.config.idle_window_s,
        )

    async def _join_commit_ahead(self) -> None:
        """Wait for the commit started before a model call, whatever it raises.

        An ending calls this first: a commit that failed left its events staged, and the
        ending's own commit writes them (or says why it cannot). In `run`'s `finally` it
        covers an attempt that lost its lease, which ends without a flush.
        """
        if self.recorder is not None:
            with contextlib.suppress(Exception):
                await self.recorder.join_ahead()

    async def _release_budget(self) -> None:
        """The attempt is over: what its last call reserved is spent or free again.

        A failure here only keeps the reservation until it expires (the turn's ceiling).
        """
        if self.config.budgets != "enforce" or self.lease_lost:
            return
        try:
            await self.store.release_budget(self.lease.turn_id)
        except Exception as exc:  # noqa: BLE001 - never mask how the turn ended
            log.warning("releasing the budget of %s failed: %s", self.lease.turn_id, exc)

    async def _run_graph(self, rec: Recorder, setup: DriveSetup) -> None:
        elapsed = (self.clock.now() - self.lease.started_at).total_seconds()
        remaining = self.config.ceiling_s - elapsed
        # Turn ids are unique, so a checkpoint means this turn ran before: resume it. A
        # first attempt whose log holds only `turn.started` cannot have one.
        fresh = self.lease.attempt == 1 and self.lease.last_seq <= 1
        resume = (
            not fresh and await latest_checkpoint_id(self.graph, self.lease.turn_id) is not None
        )
        answer = None
        if resume and await has_pending_interrupt(self.graph, self.lease.turn_id):
            answer = await self.store.pending_answer(self.lease.turn_id)
        if self.lease.took_over:
            await self._announce_recovery(rec, resumed=resume)
        state: TurnState | None = None
        if not resume:
            guarded = await guard_input(setup.ctx_factory(rec), setup.transcript)
            own, part = turn_part(rec, guarded)
            previous = setup.previous
            if previous is not None:  # stored beside the transcript: what they share is counted
                previous = stored_request(rec, previous, guarded)
            state = {
                "transcript": own,
                "part": part,
                "content": rec.notes.request_text,  # as the input guardrails left it
                "route": setup.entry,
                "iteration": 0,
                "previous": previous,
                "answer": None,
            }
        if fresh:  # LangGraph's opening read of the newest checkpoint need ask nothing
            expect_new_thread(self.graph, self.lease.turn_id)
        durability = self.config.durability
        if durability != "exit":
            keep_ended = self.aftermath is None or not self.aftermath.prunes
            self._stop_carrying = carry_events(
                self.graph, self.lease.turn_id, rec, keep_ended=keep_ended
            )
        rec.last_activity = self.clock.monotonic()  # the idle window starts with the run
        deadline = asyncio.timeout(max(remaining, 0.001))
        try:
            async with deadline:
                self._keeper.deadline = deadline
                await run_turn(
                    self.graph,
                    state,
                    setup.ctx_factory(rec),
                    thread_id=self.lease.turn_id,
                    durability=durability,
                    resume=answer,
                )
                if resume and not rec.notes.bound:  # its last stage had run: nothing did
                    await bind_resumed(self.graph, self.lease.turn_id, rec)
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # raised inside the turn, not by its deadline
            # the idle window, or else the ceiling; naming what the turn waited on
            raise self._keeper.overdue(rec.notes.running) from exc
        finally:
            self._keeper.deadline = None
            del deadline  # it names this task, whose CancelledError holds this frame

    async def _end_carrying(self, *, keep: bool) -> None:
        """The turn's commits stop carrying its checkpoints (see `carry_events`)."""
        stop, self._stop_carrying = self._stop_carrying, None
        if stop is None:
            return
        try:
            await stop(keep)
        except Exception as exc:  # noqa: BLE001 - the turn has ended; its ending stands
            log.warning("storing the last checkpoint of %s failed: %s", self.lease.turn_id, exc)

    async def _announce_recovery(self, rec: Recorder, *, resumed: bool) -> None:
        """Tell readers at once that a new attempt took the turn over, and from where."""
        checkpoint = await latest_checkpoint_id(self.graph, self.lease.turn_id) if resumed else None
        rec.durable(
            TurnRecoveringEvent,
            "runtime",
            attempt=self.lease.attempt,
            cause="handed-over" if self.lease.handed_over else "lease-expired",
            resumed_from="checkpoint" if resumed else "start",
            checkpoint_id=checkpoint,
            last_seq=self.lease.last_seq,
        )
        await rec.flush()

    async def _prepare(
        self, rec: Recorder, trace: TurnTrace, hold_until: asyncio.Event | None
    ) -> DriveSetup:
        """Wait for `hold_until`, then set the turn up (a pinned agent gone ends the turn)."""
        if hold_until is not None:
            began = self.clock.monotonic()
            await self._hold(hold_until)
            trace.held(self.clock.monotonic() - began)
        rec.notes.input_seqs = (self.record.input_seq,)
        setup = await self.setup()
        if setup.repinned is not None:
            await self._audit_repin(rec, setup)
        rec.notes.transcript = setup.transcript
        rec.notes.history = setup.transcript[:-1]  # the turn's own start at its message
        rec.notes.base_len = len(rec.notes.history)
        rec.notes.known = setup.known
        rec.notes.last_request = setup.previous
        watcher = self._ctx = setup.ctx_factory(rec)
        if watcher.plugins:
            trace.watch(rec, functools.partial(on_events, watcher))
        return setup

    async def _audit_repin(self, rec: Recorder, setup: DriveSetup) -> None:
        """The turn runs on another version of its agent than it was pinned to: say so."""
        payload = setup.repinned
        assert payload is not None
        if setup.record is not None:
            self.record = setup.record
        log.info(
            "turn %s had not started and its agent %r is no longer at version %s: it runs "
            "on version %s",
            self.lease.turn_id,
            payload.agent,
            payload.from_version,
            payload.to_version,
        )
        rec.audit("runtime", call=None, payloads=AuditPayloads(agentRepinned=payload))
        await rec.flush()

    async def _hold(self, gate: asyncio.Event) -> None:
        """Wait for `gate`: a second at most, less with a short lease."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(HOLD_MAX_S, self.config.lease_ttl_s / 3)):
                await gate.wait()

    def _attempt(self) -> Attempt:
        return Attempt(
            number=self.lease.attempt,
            model=self.record.model,
            started=self._started,
            skipped_events=len(self.skipped),
        )

    async def _settle(self, rec: Recorder) -> None:
        self.ended = True
        checkpoint_id = await latest_checkpoint_id(self.graph, self.lease.turn_id, just_ran=True)
        await end_succeeded(rec, self._attempt(), checkpoint_id)
        self._ending_written = self._succeeded = True

    async def _pause(self, rec: Recorder) -> None:
        """End this invocation only: save the request, wait for a person, hold nothing.

        Unless Stop was pressed in another process since the last renewal: the turn ends
        `cancelled` instead (a paused turn renews nothing, so the Stop would otherwise
        wait for someone to answer the pause, and then cut the work they approved).
        """
        pause = rec.notes.pending_pause
        assert pause is not None
        self._keeper.lease = await self.store.renew(self.lease, ttl_s=self.config.lease_ttl_s)
        if self.lease.cancel_requested:
            await self._end_aborted(rec)
            return
        # What the session keeps if the turn ends without an answer to this pause (a Stop
        # ends it in the Store, with no driver); answering it lets the turn's end decide.
        unanswered = ended_transcript(rec, "cancelled", None, None)
        await rec.flush(
            status=awaiting(pause.kind), pause=pause, release=True, transcript=unanswered
        )
        self.paused = True

    async def _bind_unbound(self, rec: Recorder) -> None:
        """A Stop before any stage of a resumed attempt took the thread's state.

        The turn keeps what its earlier attempts did (their calls, results and answer,
        as the log shows them), as a stage would have bound it; a state that cannot be
        read leaves the transcript as the attempt set it up.
        """
        if rec.notes.bound or (self.lease.attempt == 1 and self.lease.last_seq <= 1):
            return
        try:
            await bind_resumed(self.graph, self.lease.turn_id, rec)
        except Exception as exc:  # noqa: BLE001 - never keep the turn from ending
            log.warning("reading the state of stopped turn %s failed: %s", self.lease.turn_id, exc)

    async def _end_failed(self, rec: Recorder, exc: TurnError | AdmissionRefusedError) -> None:
        self.ended = True
        await self._join_commit_ahead()  # its events, if it failed, commit with the ending
        self._ending_written = await end_failed(rec, self._attempt(), exc)
        self._keeper.lost |= not self._ending_written  # refused: someone else's ending stands

    async def _end_aborted(self, rec: Recorder) -> None:
        self.ended = True
        await self._join_commit_ahead()
        await self._bind_unbound(rec)
        self._ending_written = await end_aborted(rec, self._attempt())
        self._keeper.lost |= not self._ending_written


async def hand_over_all(
    store: Store, leases: Iterable[Lease], log: logging.Logger, *, by: float | None = None
) -> None:
    """Hand each lease over, for another process to take its turn at once.

    One no longer this process's (the turn ended or paused) is refused by the Store; a
    database out of reach leaves the leases to lapse on their own. `by` (loop time; by
    default `HAND_OVER_WITHIN_S` from now): a database that has not answered by then (a
    row locked by another connection) is given up on, and the leases not handed over yet
    lapse, as after a crash (logged).
    """
    if by is None:
        by = asyncio.get_running_loop().time() + HAND_OVER_WITHIN_S
    left = list(leases)
    try:
        async with asyncio.timeout_at(by):
            while left:
                try:
                    await store.hand_over(left[0])
                except Exception as exc:  # noqa: BLE001 - unreachable: the lease lapses on its own
                    log.debug("could not hand %s over at once: %r", left[0].turn_id, exc)
                del left[0]
    except TimeoutError:
        log.warning(
            "gave up handing over %s: the database did not answer within %.0f s; %s taken "
            "over once %s lease lapses",
            ", ".join(lease.turn_id for lease in left),
            HAND_OVER_WITHIN_S,
            "it is" if len(left) == 1 else "they are",
            "its" if len(left) == 1 else "each",
        )


def _each_to(sink: Sink) -> Publish:
    """A Recorder's `publish`: each event to `sink`.

    It holds the sink, not the driver: a bound method of the driver would tie the driver
    and its Recorder in a reference cycle, left for the garbage collector after every turn.
    """

    def publish(events: Sequence[DurableEvent | EphemeralEvent]) -> None:
        for event in events:
            sink(event)

    return publish


async def _cancelled(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait for them; what they raised is theirs (and dropped here)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()
