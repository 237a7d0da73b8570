"""`Recorder`: the single seam through which stages emit events and audit rows.

Durable events get their `seq` here and are staged; `flush()` commits everything staged in
one Store transaction and only then publishes the events. An ephemeral event flushes first,
so nothing is ever published ahead of a durable event produced before it (write before
send). Stages never touch the Store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import JsonValue

from turnkit.audit import AuditPayloads, AuditRow, CallIdentity, CallShape, UsageDelta
from turnkit.clock import Clock
from turnkit.events import (
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    MessageDeltaEvent,
    RunFinishedEvent,
)
from turnkit.ids import AuditStageId, SessionId, StageId, TurnId
from turnkit.journal import Journal, dedupe_key
from turnkit.models import Usage
from turnkit.pauses import PauseRequest
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import Rider, RunSummary, Store, TurnTranscript
from turnkit.telemetry._delta import DeltaBuilder
from turnkit.telemetry._notes import ShownAnswer, TurnNotes

__all__ = ("OpenCall", "Publish", "Recorder", "ShownAnswer", "usage_fields")

log = logging.getLogger("turnkit.runtime")

_TYPES: dict[type[DurableEvent], str] = {}
"""Each durable event class's `type` (pydantic's `model_fields` is slow to ask per event)."""

D = TypeVar("D", bound=DurableEvent)
E = TypeVar("E", bound=EphemeralEvent)
Publish = Callable[[Sequence[DurableEvent | EphemeralEvent]], None]
"""Sends events on, in order; a commit's events travel as one batch."""

_YIELD_EVERY = 32
"""A model that never suspends still lets readers run after this many text deltas."""


@dataclass(slots=True)
class OpenCall:
    """A model call in flight, so an abort can still audit it."""

    stage_id: StageId
    family: str
    model: str
    provider: str
    rung: int
    started: float
    block_id: str = ""
    text: list[str] = field(default_factory=list[str])
    """The text streamed so far (what Stop keeps as an interrupted block)."""
    estimate: Callable[[], dict[str, int]] | None = None
    """Its cost so far, estimated: the request, and all it wrote (shown or not). Asked
    only when it is cut short, so a call in a long session costs no extra pass."""
    usage: Usage | None = None
    """What the provider reported, once the call finished (its answer still being
    checked): an ending then bills that instead of an estimate."""

    def billed(self) -> dict[str, Any]:
        """The `CallShape` usage fields of the call cut short: reported, else estimated."""
        if self.usage is not None:
            return usage_fields(self.usage)
        return self.estimate() if self.estimate is not None else {}


HeldCheckpoints = Callable[[], tuple[Rider, Callable[[], None]] | None]
"""Checkpoints waiting for the turn's next commit, as a rider, with what to call once one
carried them (None: none wait)."""


class Recorder:
    """Stamps, stages, commits and publishes one turn's events and audit rows."""

    def __init__(
        self,
        *,
        store: Store,
        session_id: SessionId,
        turn_id: TurnId,
        epoch: int,
        clock: Clock,
        publish: Publish,
        last_seq: int = 0,
        last_audit_seq: int = 0,
        journal: Journal | None = None,
        usage: UsageDelta | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.turn_id = turn_id
        self.epoch = epoch
        self.clock = clock
        self.publish = publish
        self._seq = last_seq
        self._audit_seq = last_audit_seq
        self._events: list[DurableEvent] = []
        self._audit: list[AuditRow] = []
        self._lock = asyncio.Lock()
        self._ahead: asyncio.Task[None] | None = None
        """The commit `flush_ahead` started, until a wait finds it done."""
        self._held: list[EphemeralEvent] | None = None
        """Ephemeral events waiting for that commit, sent right after its events; None
        when no commit is ahead (what a failed commit held back is dropped)."""
        self._ending_after: int | None = None
        """The seq after which the turn's ending began staging (`ending_begins`)."""
        self.usage = usage or UsageDelta()
        self.journal = journal or Journal()
        self.notes = TurnNotes()
        """What the driver and the stages keep about the turn (never read per event)."""
        self.open_call: OpenCall | None = None
        self.on_commit: Callable[[Sequence[DurableEvent]], Awaitable[None]] | None = None
        """Told about each batch of committed events, outside the commit lock (plugins'
        `on_event`); what it stages goes out with the next commit."""
        self.last_activity = clock.monotonic()
        self.log_closed = False
        """The turn's ending is committed: no durable event is staged any more (work
        after the ending, the naming call, leaves audit rows only)."""
        self._deltas_since_yield = 0
        self._new_delta = DeltaBuilder(session_id, turn_id)
        self.held_checkpoints: HeldCheckpoints | None = None
        """Checkpoints waiting for a commit to carry them; set while the turn's checkpoints
        ride on its commits (`checkpoints_carry`)."""
        self.last_stage_ended = False
        """The turn's last stage has ended: its checkpoint waits for the turn's ending,
        which commits the stage's closing events too."""
        self.ending_commits_last_stage = False
        """The last stage ends without a commit: its checkpoint is held until the turn's
        ending, which commits the stage's closing events (SQLite; see `carry_events`)."""

    @property
    def checkpoints_carry(self) -> bool:
        """Stages end without a commit: their checkpoints commit their events (PostgreSQL)."""
        return self.held_checkpoints is not None

    def durable(self, cls: type[D], stage_id: StageId, **fields: Any) -> D | None:
        """Build a durable event with the next `seq` and stage it for the next flush.

        Returns None (and stages nothing) when the committed log already holds this
        event, as it does when a recovered attempt repeats a step, or when the turn's
        log is closed (its ending is committed).
        """
        if self.log_closed:
            return None
        event_type = _TYPES.get(cls)
        if event_type is None:
            event_type = _TYPES[cls] = cls.model_fields["type"].default
        key = dedupe_key(event_type, fields)
        if key is not None and key in self.journal.keys:
            return None
        event = cls(  # built before it takes its seq: fields that fail leave no gap
            session_id=self.session_id,
            turn_id=self.turn_id,
            stage_id=stage_id,
            ts=self.clock.now(),
            seq=self._seq + 1,
            **fields,
        )
        self._seq += 1
        if key is not None:
            self.journal.keys.add(key)
        self._events.append(event)
        return event

    def unstage_ending(self) -> None:
        """Drop the `run.finished` and `done` of an ending whose commit did not land.

        A commit cut off (a Stop cancelling it on its way, a database refusing it) keeps
        its events staged for the next one. The ending written instead stages its own
        `run.finished` and `done`, which would otherwise be taken for these (each occurs
        once per turn) and commit the first ending's status in the second's log.
        """
        while self._events and isinstance(last := self._events[-1], RunFinishedEvent | DoneEvent):
            self._events.pop()
            self._seq -= 1
            self.journal.keys.discard(last.type)  # each occurs once: its type is its key

    async def ephemeral(self, cls: type[E], stage_id: StageId, **fields: Any) -> E:
        """Publish an ephemeral event, after committing whatever durable events came first.

        While a commit started by `flush_ahead` travels (and nothing was staged since), the
        event waits for it instead of its caller.
        """
        event = cls(
            session_id=self.session_id,
            turn_id=self.turn_id,
            stage_id=stage_id,
            ts=self.clock.now(),
            **fields,
        )
        if self._held is not None and not (self._events or self._audit):
            self._held.append(event)  # the commit ahead sends it; no need to wait
        else:
            await self.join_ahead()
            async with self._lock:
                committed, _ = await self._commit_staged(None, None)
                self.last_activity = self.clock.monotonic()
                self.publish((event,))
            await self._committed(committed)
        # Let publishers and readers run: a model that never suspends must still stream
        # live, not in one burst at its end (which a bounded buffer would trim).
        await self.clock.sleep(0)
        return event

    async def delta(self, stage_id: StageId, block_id: str, text: str) -> None:
        """Publish a piece of a block's text (`message.delta`): `ephemeral`'s fast path.

        With nothing staged and no commit under way there is nothing to commit first, so
        the event is built without validation (its fields are ours) and sent at once; and
        a model that never suspends lets readers run once per many pieces, not each one.
        """
        if self._events or self._audit or self._lock.locked() or self._ahead is not None:
            await self.ephemeral(MessageDeltaEvent, stage_id, block_id=block_id, text=text)
            return
        event = self._new_delta(stage_id, self.clock.now(), block_id, text)
        self.last_activity = self.clock.monotonic()
        self.publish((event,))
        self._deltas_since_yield += 1
        if self._deltas_since_yield >= _YIELD_EVERY:
            self._deltas_since_yield = 0
            await self.clock.sleep(0)

    def audit(
        self,
        stage_id: AuditStageId,
        *,
        call: CallShape | None,
        payloads: AuditPayloads | None = None,
        plugin_payloads: Mapping[str, JsonValue] | None = None,
    ) -> AuditRow:
        """Stage an audit row (committed with the usage rollup at the next flush)."""
        self._audit_seq += 1
        row = AuditRow(
            identity=CallIdentity(
                session_id=self.session_id,
                turn_id=self.turn_id,
                stage_id=stage_id,
                seq_within_turn=self._audit_seq,
            ),
            call=call,
            payloads=payloads or AuditPayloads(),
            plugin_payloads=plugin_payloads or {},
        )
        self.usage = self.usage + UsageDelta.of(call)
        self._audit.append(row)
        return row

    async def flush(
        self,
        *,
        status: TurnStatus | None = None,
        error_code: str | None = None,
        summary: RunSummary | None = None,
        release: bool = False,
        pause: PauseRequest | None = None,
        transcript: TurnTranscript | None = None,
    ) -> None:
        """Commit everything staged (and a status move) in one transaction, then publish."""
        await self.join_ahead()
        async with self._lock:
            committed, _ = await self._commit_staged(
                status, error_code, summary, release, pause, transcript
            )
        await self._committed(committed)

    def ending_begins(self) -> None:
        """Mark where the turn's ending starts staging its events.

        Its `error`, cut jobs, `run.finished` and `done`: a turn left before that ending
        commits keeps none of them (`commit_left`).
        """
        self._ending_after = self._seq

    async def commit_left(self) -> None:
        """Commit what is staged as the turn is left to another process (it is not ended).

        A shutdown cancels the turn's task between a step's work and its commit: say a
        tool returned, its result staged. Committed now, under the lease still held, the
        attempt that takes the turn over finds it and does not run the tool again. The
        commit `flush_ahead` started is waited for first (cancelled with the other tasks
        of a loop shutting down, it staged its events again). An ending cut off on its way
        (every event it staged, from its `error` to its `done`) is not committed: the turn
        is not ended here, and the attempt that takes it over writes its own. Nor are the
        checkpoints held for the turn's next commit: its events are durable ahead of them,
        as after any flush, and the next attempt resumes from the checkpoint stored. No
        plugin hears of the commit (`on_commit`): nothing more is staged.
        """
        task = self._ahead
        if task is not None and task is not asyncio.current_task():
            await asyncio.gather(task, return_exceptions=True)  # what it raised is its own
            self._ahead = None
        ending = self._ending_after
        if ending is not None:  # nothing of it is committed: it is all staged (in order)
            while self._events and self._events[-1].seq > ending:
                self._events.pop()
                self._seq -= 1
        held, self.held_checkpoints = self.held_checkpoints, None
        try:
            async with self._lock:
                await self._commit_staged(None, None)
        finally:
            self.held_checkpoints = held

    async def flush_ahead(self) -> None:
        """Start committing what is staged, and return without waiting for the commit.

        Before a model call: the call starts while the commit travels, and on a store
        whose commit is a round trip (PostgreSQL) that trip no longer adds to the turn.
        The events still go out only once committed, and what the call streams meanwhile
        (ephemeral events, text deltas) right after them; what the commit held back is
        dropped if it fails. A flush or a checkpoint first waits for the commit, and
        raises its error (`join_ahead`).
        """
        await self.join_ahead()
        if self._events or self._audit:
            staged = self._events, self._audit
            self._events, self._audit = [], []
            held: list[EphemeralEvent] = []
            self._held = held
            self._ahead = asyncio.create_task(
                self._commit_ahead(staged, held), name="turnkit-commit"
            )

    async def _commit_ahead(
        self, staged: tuple[list[DurableEvent], list[AuditRow]], held: list[EphemeralEvent]
    ) -> None:
        try:
            async with self._lock:
                committed, _ = await self._commit_staged(None, None, staged=staged)
                if held:
                    self.publish(held)
        finally:
            self._held = None  # a failed commit's held events are never sent
        await self._committed(committed)

    async def join_ahead(self) -> None:
        """Wait for the commit `flush_ahead` started; raise its error if it failed.

        The commit is shielded: a waiter cancelled meanwhile does not cut it off (the
        server may have committed it), and every waiter sees how it ended.
        """
        task = self._ahead
        if task is None or task is asyncio.current_task():
            return  # none, or asked from the commit's own `on_commit` (a plugin's event)
        try:
            await asyncio.shield(task)
        finally:
            if self._ahead is task and task.done():
                self._ahead = None

    async def commit_carrying(self, rider: Rider) -> bool | None:
        """Commit what is staged, with `rider` in the same statement where the store can.

        A checkpoint's writer calls this (see `checkpoints_carry`): the super-step's
        events are then durable with its checkpoint, never after it. True if the rider
        was written; False if it is still the caller's to write (nothing was staged, or
        the store could not carry it); None, committing nothing,
        after the last stage: the turn's ending is to commit both (`held_checkpoints`).
        """
        if self.last_stage_ended:
            return None
        await self.join_ahead()
        async with self._lock:
            if not (self._events or self._audit):
                return False
            committed, carried = await self._commit_staged(None, None, rider=rider)
        await self._committed(committed)
        return carried

    async def _committed(self, events: Sequence[DurableEvent]) -> None:
        """Hand committed events to `on_commit` (plugins' `on_event`).

        After the commit that carried the turn's ending, what a hook stages has no next
        commit to ride on: its audit rows get one of their own, and what a hook raises
        (a required plugin's failure, say) is logged, since the ending it would change is
        already committed.
        """
        if not events or self.on_commit is None:
            return
        ended = self.log_closed
        try:
            await self.on_commit(events)
        except Exception as exc:  # a plugin's failure, a guardrail's block, a store error
            if not ended:
                raise
            log.warning("turn %s: %s (after its ending was committed)", self.turn_id, exc)
        if ended and self._audit:
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - e.g. the session was deleted meanwhile
                log.warning("turn %s: plugin audit rows after its ending: %s", self.turn_id, exc)

    async def _commit_staged(
        self,
        status: TurnStatus | None,
        error_code: str | None,
        summary: RunSummary | None = None,
        release: bool = False,
        pause: PauseRequest | None = None,
        transcript: TurnTranscript | None = None,
        rider: Rider | None = None,
        staged: tuple[list[DurableEvent], list[AuditRow]] | None = None,
    ) -> tuple[list[DurableEvent], bool]:
        if staged is None:
            staged = self._events, self._audit
            self._events, self._audit = [], []
        events, audit = staged
        if not (events or audit or status or release):
            return [], False
        waiting = None
        if rider is None and self.held_checkpoints is not None:
            waiting = self.held_checkpoints()
            rider = waiting[0] if waiting is not None else None
        try:
            result = await self.store.commit(
                self.turn_id,
                epoch=self.epoch,
                events=events,
                audit=audit,
                status=status,
                error_code=error_code,
                summary=summary,
                release=release,
                pause=pause,
                guides_consumed_through=self.notes.consumed_input_seq if release else None,
                transcript=transcript,
                rider=rider,
            )
        except BaseException:
            # Nothing was committed: keep it staged so a later flush (or the error path)
            # writes it, and `seq` stays gap-free.
            self._events[:0] = events
            self._audit[:0] = audit
            raise
        if status in TERMINAL_STATES:
            self.log_closed = True  # `done` is in: whatever a hook raises now stays out
        if waiting is not None and result.carried:
            waiting[1]()
        notes = self.notes
        notes.newest_guide_seq = max(notes.newest_guide_seq, result.newest_guide_seq)
        notes.requeued += result.requeued
        notes.stopped_asked += result.stopped_asked
        self.last_activity = self.clock.monotonic()
        if events:
            self.publish(tuple(events))
        return events, result.carried


def usage_fields(usage: Usage) -> dict[str, Any]:
    """A provider's reported usage as the `CallShape` fields it fills."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost_usd": usage.cost_usd,
    }
