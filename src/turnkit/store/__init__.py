"""The Store port: where turns, durable events, audit rows and usage live.

The Store is the source of truth. Durable events are committed here before anyone sees
them; `(turn_id, seq)` is unique, so re-appending an event changes nothing. Audit rows
are written in the same transaction as the usage rollup, with no foreign key into the
chat tables. Adapters: `SqlStore` (SQLite embedded default; PostgreSQL in production).
The records it takes and returns live in `turnkit.store.records` and are exported here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import JsonValue

from turnkit.audit import AuditRow, UsageDelta
from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetSubject, BudgetUse
from turnkit.events import DurableEvent
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TurnStatus
from turnkit.store._retention import IdleSession, Retention
from turnkit.store._usage import UsageLine
from turnkit.store._workspace import WorkspaceFile, check_workspace_path
from turnkit.store.records import (
    ClaimRequest,
    CommitResult,
    Delivery,
    KeptTranscript,
    KeptTurn,
    Lease,
    NewInput,
    Rider,
    RunSummary,
    SessionRecord,
    StoredEvent,
    Submission,
    TurnProgress,
    TurnRecord,
    TurnTranscript,
    UnreadableEvent,
    decode_events,
    readable_events,
)

if TYPE_CHECKING:
    from turnkit.store.sql import SqlStore

__all__ = (
    "BudgetBook",
    "UsageLine",
    "decode_events",
    "readable_events",
    "ClaimRequest",
    "CommitResult",
    "Delivery",
    "Rider",
    "Lease",
    "GuideFeed",
    "IdleSession",
    "KeptTranscript",
    "KeptTurn",
    "NewInput",
    "PauseBook",
    "Retention",
    "RunQueue",
    "RunSummary",
    "SessionDirectory",
    "SessionRecord",
    "SqlStore",
    "Store",
    "StoredEvent",
    "Submission",
    "TurnLedger",
    "TurnProgress",
    "TurnRecord",
    "TurnTranscript",
    "UnreadableEvent",
    "Watchdog",
    "Workspace",
    "WorkspaceFile",
    "check_workspace_path",
)


class TurnLedger(Protocol):
    """The append-only side: events, audit rows, usage, status moves."""

    async def commit(
        self,
        turn_id: TurnId,
        *,
        epoch: int,
        events: Sequence[DurableEvent] = (),
        audit: Sequence[AuditRow] = (),
        status: TurnStatus | None = None,
        error_code: str | None = None,
        summary: RunSummary | None = None,
        release: bool = False,
        pause: PauseRequest | None = None,
        guides_consumed_through: int | None = None,
        transcript: TurnTranscript | None = None,
        rider: Rider | None = None,
    ) -> CommitResult:
        """Append events, audit rows (+ usage rollup) and a status move, atomically.

        `transcript` (with `summary`, when the turn ends) is what the turn added to the
        session's model-facing transcript.

        `pause` saves the approval or clarification request the turn now waits on. When a
        turn ends, guide messages it never presented (input seq above
        `guides_consumed_through`) are re-queued as turns of their own, in the same
        transaction: a message that arrived mid-run is answered, never stranded.
        A turn that ends other than `succeeded` stops, in the same transaction, the
        unfinished turns of the agents it asked as tools (one no live driver holds ends
        `cancelled`, one a live driver holds is flagged as by `cancel`):
        nobody reads their answers any more (`CommitResult.stopped_asked` lists them).

        Rejects a stale `epoch` with `StaleEpochError` and an illegal status move with
        `StoreError`; an already-stored `(turn_id, seq)` is kept as is (no error).
        `release` drops the lease (a settled or paused turn holds none). A `rider` goes
        in the same statement where the store can (`CommitResult.carried` says).
        """
        ...

    def read_events(
        self, turn_id: TurnId, *, after_seq: int = 0, page_size: int = 500
    ) -> AsyncIterator[StoredEvent]:
        """Committed events with `seq > after_seq`, in order, in bounded pages."""
        ...

    async def read_audit(self, turn_id: TurnId) -> list[AuditRow]:
        """A turn's audit rows in `seq_within_turn` order."""
        ...

    async def read_usage(self, turn_id: TurnId) -> UsageDelta:
        """The turn's usage rollup."""
        ...

    async def kept_transcript(
        self, session_id: SessionId, *, before_input_seq: int, after: TurnId | None = None
    ) -> KeptTranscript:
        """What the session's turns before `before_input_seq` keep of its transcript (one read).

        The turns come oldest first, from the newest one that replaced history on (or
        from the first). When `after` names one of those turns and no later one replaced
        history, only the turns after it come (`continues`): the caller holds the rest.
        A turn that stored no transcript comes with its record and answer instead.
        """
        ...


class RunQueue(Protocol):
    """The run side: committing input, claiming, renewing and sweeping runs."""

    async def submit(self, new: NewInput) -> Submission:
        """Commit a user message and queue its turn in one transaction.

        The turn's first event (`turn.started`, seq 1) is written in the same
        transaction, so an input is never visible without its queued run.

        A turn asked as a tool (`asked_by`) is refused (`AskingTurnEndedError`, nothing
        written) when the asking turn has ended or has a Stop pending; the empty session
        opened for it (its `parent_session` the asking turn's session) is then deleted.
        """
        ...

    async def claim(
        self,
        owner: str,
        *,
        ttl_s: float,
        max_attempts: int,
        turn_id: TurnId | None = None,
        session_id: SessionId | None = None,
    ) -> Lease | None:
        """Claim the next runnable turn (or `turn_id`, or one of `session_id`).

        One winner per turn and epoch.

        A turn is runnable when it is `running`, unleased or its lease expired, has
        attempts left, and no earlier turn of its session is unfinished.
        """
        ...

    async def work_signal(self) -> asyncio.Event | None:
        """An event set when a turn may have become claimable, or None if none is heard.

        A claimer clears it, claims, and waits on it (with a timeout: a lapsed lease is
        not announced) instead of only polling. Each call re-establishes what sets it if
        that was lost, which also sets it.
        """
        ...

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend the lease; `StaleEpochError` when it is no longer this driver's."""
        ...

    def stop_signal(self, turn_id: TurnId) -> asyncio.Event | None:
        """An event set when Stop may have been pressed for `turn_id` in another process.

        Its driver renews at once when it is set (`renew` says `cancel_requested`), rather
        than at its next renewal. None where Stops are not heard: renewals alone tell.
        """
        ...

    async def hand_over(self, lease: Lease) -> bool:
        """End the lease now, for the next claim to take the turn at once.

        For a driver that stops without ending its turn (a worker shutting down): the
        next claim's `Lease.handed_over` says the turn was left, not orphaned by a crash.
        False when the lease was no longer this driver's.
        """
        ...

    async def repin(self, lease: Lease, *, pinned: dict[str, JsonValue], model: str) -> None:
        """Replace the leased turn's pinned configuration (and its `model`) before it starts.

        For a turn whose log holds only its `turn.started`: its driver found the agent
        version it was pinned to gone and pins it to the current one.
        `StaleEpochError` when the lease is no longer this driver's, or the turn's log grew.
        """
        ...

    async def sweep(self, *, ceiling_s: float, max_attempts: int) -> list[TurnId]:
        """End orphaned `running` turns as `timed_out`; paused turns are never touched.

        Orphaned: started longer ago than the ceiling, or out of attempts with no live
        lease. Each gets an `error` and a `done` event, and its epoch moves on so a
        zombie driver can commit nothing more.
        """
        ...


class SessionDirectory(Protocol):
    """Sessions: create, look up, list, rename, delete."""

    async def create_session(
        self,
        session_id: SessionId,
        *,
        principal: str | None = None,
        organisation: str | None = None,
        title: str | None = None,
        parent: SessionId | None = None,
    ) -> SessionRecord:
        """Create a session owned by `principal` of `organisation` (idempotent).

        Returns the session as stored; its `is_new` says whether this call created it, so
        of calls racing for one id exactly one gets `is_new=True`.

        `parent`: the session whose turn asked the delegated agent that answers here
        (`Agent.as_tool`); such a session is not listed and goes when its parent does.
        """
        ...

    async def get_session(self, session_id: SessionId) -> SessionRecord | None:
        """One session, or None."""
        ...

    async def list_sessions(
        self,
        *,
        principal: str | None = None,
        organisation: str | None = None,
        anonymous: bool = False,
        limit: int = 100,
    ) -> list[SessionRecord]:
        """Sessions, newest first.

        Only the principal's when `principal` is given (with `organisation`: only those it
        owns there); only those with no principal when `anonymous`; only those owned in
        `organisation` when it is given alone; else every session. Sessions delegated
        agents answered in (those with a `parent_session`) are never listed.
        """
        ...

    async def delegated_sessions(self, session_id: SessionId) -> list[SessionId]:
        """The sessions agents asked as tools answered in for this one, 16 levels deep.

        They are deleted with it (`delete_session`).
        """
        ...

    async def rename_session(
        self,
        session_id: SessionId,
        title: str,
        *,
        visible_to: tuple[str | None, str | None] | None = None,
    ) -> SessionRecord:
        """Set a session's title (`SessionNotFoundError` if there is none).

        `visible_to`: a caller's principal and organisation (both None: a caller nobody
        signed in). The title is set only if that caller may see the session
        (`SessionRecord.visible_to`), checked in the statement that writes it, so a
        session deleted and made anew by someone else meanwhile is never renamed; else
        `SessionNotFoundError`.
        """
        ...

    async def usage_report(
        self,
        *,
        by: Literal["session", "principal", "department", "day"],
        principal: str | None = None,
        anonymous: bool = False,
        since: datetime | None = None,
        until: datetime | None = None,
        organisation: str | None = None,
    ) -> list[UsageLine]:
        """Usage summed by session, principal, department or day (UTC).

        Tokens in/out/cached, model calls, turns and USD over turns created in
        [since, until); only `principal`'s when given, only unowned sessions' when
        `anonymous`. Read from the same per-turn rollup
        the audit transaction writes.
        """
        ...

    async def name_session(
        self, session_id: SessionId, title: str, *, current: str | None = None
    ) -> bool:
        """Set the title only while it is still `current` (None: the session is unnamed).

        Automatic naming uses it, so a person's rename is never overwritten. Returns
        whether the title was set.
        """
        ...

    async def delete_session(
        self,
        session_id: SessionId,
        *,
        visible_to: tuple[str | None, str | None] | None = None,
    ) -> bool:
        """Delete a session with its inputs, turns, events and files (audit rows stay).

        False if there is no such session. `visible_to`: as for `rename_session`; a
        session that caller may not see (checked in the transaction that deletes it) is
        left as it is, and the answer is False.
        """
        ...


class Watchdog(Protocol):
    """What a reader records when the driver of a running turn is gone; signs of life."""

    async def note_activity(self, turn_id: TurnId) -> None:
        """Stamp a running turn's `updated_at`: work outside its driver reported progress.

        The turn's driver reads the stamp before it ends the turn for its idle window, so
        a callback's progress report from another process keeps the turn alive. A turn
        that is not running is left as it is.
        """
        ...

    async def time_out(self, turn_id: TurnId, *, reason: str) -> bool:
        """End a `running` turn as `timed_out` (error + done events, epoch moved on).

        False when the turn is not running (finished, paused), a driver holds a live
        lease on it (one took it over since it was judged abandoned), or it moved meanwhile.
        """
        ...


class Canceller(Protocol):
    """Stop, from any process."""

    async def cancel(
        self, turn_id: TurnId, *, stopped_owner: str | None = None, by: str | None = None
    ) -> TurnStatus:
        """End a turn as `cancelled`, or ask its live driver to.

        A paused, queued or orphaned turn is ended here (a `done` event with status
        `cancelled`, its epoch moved on) and `cancelled` is returned. A turn with a live
        lease gets `cancel_requested` and `running` is returned: its driver stops at its
        next renewal, or at once where its process hears the Stop (`stop_signal`). A
        finished turn is left as it is and its status returned. A turn ended here stops
        the turns of the agents it asked as `commit`'s ending does.
        `stopped_owner`: that owner's drivers of the turn have stopped, so a lease it holds
        counts as lapsed. `by`: who pressed Stop; each request a paused turn waited on gets
        a `pauseAnswer` audit row (decision `stopped`) saying so.
        """
        ...

    async def asked_turns(self, turn_id: TurnId) -> list[TurnId]:
        """The unfinished turns of the agents `turn_id` asked as tools, oldest first.

        Those an ending of `turn_id` but its success stops (see `cancel`): read before a
        Stop, they name the drivers in this process to stop at once.
        """
        ...


class GuideFeed(Protocol):
    """Messages sent with `delivery=guide` to a running turn."""

    async def guided_inputs(
        self, turn_id: TurnId, *, after_input_seq: int
    ) -> list[tuple[int, str, str | None]]:
        """(input seq, content, request id) of guide messages for the turn, in order."""
        ...


class PauseBook(Protocol):
    """The requests paused turns wait on, and their answers."""

    async def answer_pause(
        self,
        turn_id: TurnId,
        request_id: str,
        answer: dict[str, JsonValue],
        *,
        by: str | None = None,
    ) -> PauseRequest:
        """Record the answer and make the turn runnable again, in one transaction.

        A `pauseAnswer` audit row says who (`by`, a principal id) answered, when and how.

        Raises `PauseNotFoundError` (no such request on this turn) or
        `PauseAnsweredError` (answered already); either way nothing changes.
        """
        ...

    async def pending_answer(self, turn_id: TurnId) -> dict[str, JsonValue] | None:
        """The newest answer the turn has not consumed yet (what the resumed run needs)."""
        ...

    async def get_pause(self, turn_id: TurnId, request_id: str) -> PauseRequest | None:
        """The turn's request `request_id`, as saved (answered or not); None: it has none."""
        ...

    async def open_pauses(
        self,
        session_id: SessionId | None = None,
        *,
        organisation: str | None = None,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
        asked: bool = True,
    ) -> list[tuple[TurnRecord, PauseRequest]]:
        """Paused turns, oldest first, each with the request it waits on.

        Approvals, questions and budgets; of one session, one organisation when given; at
        most `limit`; with `after` (a turn's `created_at` and id), the turns after it;
        `asked=False` leaves out those of agents asked as tools (sessions with a parent),
        whose requests their asking turns stand for.
        """
        ...

    async def budget_pauses(
        self, organisation: str | None = None
    ) -> list[tuple[TurnRecord, PauseRequest]]:
        """Turns paused `awaiting_budget`, oldest first, with the request each waits on."""
        ...


class Workspace(Protocol):
    """Files kept per session (`spec.md`, `plan.md`): written by tools, fetched by front ends.

    Paths follow `check_workspace_path`; content is UTF-8 text of at most 1,000,000
    characters. A bad path or content raises `InvalidInputError` and writes nothing.
    """

    async def write_file(
        self,
        session_id: SessionId,
        path: str,
        content: str,
        *,
        media_type: str | None = None,
        turn_id: TurnId | None = None,
    ) -> WorkspaceFile:
        """Create or replace a file in one transaction; return it as stored.

        `media_type` defaults to what the extension suggests (`.md` `text/markdown`,
        `.json` `application/json`, `.csv` `text/csv`, else `text/plain`). The version
        starts at 1 and grows by one per change; writing the same content and media type
        again changes nothing (not the version, time or turn), so a retried tool call is
        harmless. Raises `SessionNotFoundError` when the session does not exist.
        """
        ...

    async def read_file(self, session_id: SessionId, path: str) -> WorkspaceFile | None:
        """One file, or None (also for an unknown session); a bad path raises."""
        ...

    async def list_files(self, session_id: SessionId) -> list[WorkspaceFile]:
        """A session's files with their content, ordered by path (code point order)."""
        ...


class BudgetBook(Protocol):
    """Budget limits, what they have spent, and reservations for model calls in flight."""

    async def set_budget_limit(self, limit: BudgetLimit) -> None:
        """Create or replace a limit."""
        ...

    async def delete_budget_limit(
        self, scope: BudgetScope, organisation: str, key: str, period: BudgetPeriod
    ) -> bool:
        """Remove a limit; whether there was one."""
        ...

    async def budget_limits(self, organisation: str | None = None) -> list[BudgetLimit]:
        """Every limit (of one organisation when given)."""
        ...

    async def budget_report(self, organisation: str | None = None) -> list[BudgetUse]:
        """Every limit (of one organisation when given) with its current period's use."""
        ...

    async def budget_uses(self, subject: BudgetSubject) -> list[BudgetUse]:
        """Each limit covering `subject`, with its period's spend and reservations."""
        ...

    async def reserve_budget(
        self, subject: BudgetSubject, *, turn_id: TurnId, usd: float, tokens: int, ttl_s: float
    ) -> tuple[str | None, list[BudgetUse]]:
        """Check every covering limit and reserve, in one transaction (None: refused)."""
        ...

    async def release_budget(self, turn_id: TurnId) -> None:
        """Drop the turn's reservation (its calls' usage is recorded, or it ended)."""
        ...


class Store(
    BudgetBook,
    TurnLedger,
    RunQueue,
    SessionDirectory,
    Watchdog,
    Canceller,
    PauseBook,
    GuideFeed,
    Workspace,
    Retention,
    Protocol,
):
    """Durable turn storage (see `TurnLedger` and `RunQueue`). Safe for concurrent use."""

    async def get_turn(self, turn_id: TurnId) -> TurnRecord | None:
        """One turn, or None."""
        ...

    async def turn_progress(self, turn_id: TurnId) -> TurnProgress | None:
        """Where one turn stands, or None: `get_turn`'s status, seq and lease, cheaper.

        Many readers follow their turns at once; calls made together may be answered by
        one statement.
        """
        ...

    async def list_turns(self, session_id: SessionId) -> list[TurnRecord]:
        """A session's turns in the order their messages were committed (`input_seq`)."""
        ...

    async def close(self) -> None:
        """Release what the store owns; idempotent."""
        ...


def __getattr__(name: str) -> Any:
    if name == "SqlStore":
        from turnkit.store.sql import SqlStore

        return SqlStore
    raise AttributeError(name)
