"""The Store port: where turns, durable events, audit rows and usage live.

The Store is the source of truth. Durable events are committed here before anyone sees
them; `(turn_id, seq)` is unique, so re-appending an event changes nothing. Audit rows
are written in the same transaction as the usage rollup, with no foreign key into the
chat tables. Adapters: `SqlStore` (SQLite embedded default; PostgreSQL in production).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from turnkit.audit import AuditRow, UnreadableReason, UsageDelta
from turnkit.blocks import ImagePart
from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetSubject, BudgetUse
from turnkit.events import DurableEvent, StreamEvent, TurnStartedEvent, decode_event
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TurnStatus
from turnkit.store._retention import IdleSession, Retention
from turnkit.store._usage import UsageLine
from turnkit.store._workspace import WorkspaceFile, check_workspace_path

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


log = logging.getLogger("turnkit.store")

Delivery = Literal["queue", "guide"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewInput:
    """A user message to commit, and the turn it opens (edge class: no lease)."""

    session_id: SessionId
    turn_id: TurnId
    content: str
    request_id: str | None
    delivery: Delivery
    agent: str
    model: str
    effort: Literal["off", "low", "medium", "high"]
    pinned: dict[str, JsonValue]
    """The configuration the run is pinned to (model, effort, tools), kept for audit."""
    principal: str | None = None
    organisation: str | None = None
    department: str | None = None
    """Who the turn spends for (budgets, usage by department)."""
    attachments: tuple[ImagePart, ...] = ()
    """Pictures attached to the message."""
    create_session: bool = True
    """Create the session if it does not exist (otherwise: `SessionNotFoundError`)."""
    claim_for: ClaimRequest | None = None
    """Claim the new turn in the same transaction, when its session lets it run now."""
    title: str | None = None
    """The name an unnamed session takes with its first message, in the same transaction."""
    anonymous_caller: bool = False
    """Sent by a caller nobody signed in (not the app's own code): with no principal it
    goes only into a session nobody owns, checked in the same transaction that writes it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Who claims, for how long, with how many attempts."""

    owner: str
    ttl_s: float
    max_attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """A session: who owns it and what it is called."""

    session_id: SessionId
    principal: str | None
    title: str | None
    last_input_seq: int
    created_at: datetime
    updated_at: datetime
    organisation: str | None = None
    """The owner's organisation (None: no owner, or a session from before it was kept)."""

    def visible_to(self, principal: str | None, organisation: str | None) -> bool:
        """Whether the caller `principal` of `organisation` may see the session.

        A session nobody owns is everyone's; an owned one is its principal's, in its
        organisation (two callers with one id in two organisations are two callers).
        """
        if self.principal is None:
            return True
        return self.principal == principal and self.organisation in (None, organisation)


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """What committing an input did. A retried `request_id` returns the first submission."""

    session_id: SessionId
    turn_id: TurnId
    input_seq: int
    delivery: Delivery
    requested_delivery: Delivery
    is_new: bool
    guided: bool = False
    """The message joined a running turn (`turn_id`) instead of opening one."""
    lease: Lease | None = None
    """Set when `NewInput.claim_for` claimed the new turn in the same transaction."""
    record: TurnRecord | None = None
    """The turn as committed, when it was claimed here."""
    started: TurnStartedEvent | None = None
    """The committed first event of a new turn."""


class TurnTranscript(BaseModel):
    """What a turn added to its session's model-facing transcript, kept exactly as sent.

    The next turn's first request starts with the session's transcript, so it repeats
    the bytes of this turn's last request (the provider's prompt cache matches on them).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    messages: tuple[dict[str, JsonValue], ...]
    """The messages, in order: the turn's own, or the whole list when `replaces_history`."""
    replaces_history: bool = False
    """Compaction or picture release rewrote history: `messages` is the whole list."""
    last_request: dict[str, JsonValue] | None = None
    """Digests of the turn's last reasoning request (for the next turn's prefix check).

    Stores keep it for the session's newest turn only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTurn:
    """One earlier turn's part of its session's transcript, as the Store keeps it."""

    turn_id: TurnId
    input_seq: int
    transcript: TurnTranscript | None
    """What the turn stored as it ended (None: it stored nothing, see `record`)."""
    record: TurnRecord | None = None
    """The turn, when it stored no transcript: it ended without a driver (a sweep, or
    Stop before it ran) or before transcripts were kept."""
    answer: str | None = None
    """Its answer text, when it stored no transcript and wrote one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTranscript:
    """What a turn's starting transcript is built from (`TurnLedger.kept_transcript`)."""

    turns: tuple[KeptTurn, ...]
    continues: bool = False
    """The turns follow the caller's `after` turn (False: they are the whole history)."""
    last_request: dict[str, JsonValue] | None = None
    """The newest last request among the turns (None: none kept one, or, when
    `continues`, the newest is at or before `after`)."""


class RunSummary(BaseModel):
    """The attempt's own account, written when the run settles (as `run.finished`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    status: TurnStatus
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    tool_timings: tuple[tuple[str, float], ...] = ()
    """(tool name, duration in ms) per tool call, in order."""
    context_messages: int = 0
    context_tokens: int = 0
    """Input plus output tokens of the turn's latest call on its own model."""
    stop_reason: str | None = None
    error_code: str | None = None
    duration_ms: float = 0.0
    model: str = ""
    attempt: int = 1
    skipped_events: int = 0
    """Committed events of the turn this attempt could not decode and went on without."""
    recoveries: int = 0
    """Takeovers of the turn after its driver died (`turn.recovering` events)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """A turn as the Store holds it."""

    turn_id: TurnId
    session_id: SessionId
    input_seq: int
    status: TurnStatus
    content: str
    request_id: str | None
    agent: str
    model: str
    error_code: str | None
    last_seq: int
    lease_epoch: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempts: int
    pinned: dict[str, JsonValue]
    summary: RunSummary | None
    started_at: datetime | None
    created_at: datetime
    updated_at: datetime
    attachments: tuple[ImagePart, ...] = ()
    """Pictures attached to the opening message."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnProgress:
    """Where a turn stands: the part of its record a reader follows (cheap to read)."""

    turn_id: TurnId
    status: TurnStatus
    last_seq: int
    attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None

    @classmethod
    def of(cls, record: TurnRecord) -> TurnProgress:
        """The progress part of a full record."""
        return cls(
            turn_id=record.turn_id,
            status=record.status,
            last_seq=record.last_seq,
            attempts=record.attempts,
            lease_owner=record.lease_owner,
            lease_expires_at=record.lease_expires_at,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """The right to drive one turn: every commit carries `epoch` (the fencing token)."""

    turn_id: TurnId
    session_id: SessionId
    owner: str
    epoch: int
    expires_at: datetime
    attempt: int
    """1 for the first attempt; higher after a takeover."""
    took_over: bool
    """Whether this claim took over an expired one (the previous driver died)."""
    last_seq: int
    started_at: datetime
    cancel_requested: bool = False
    """Someone pressed Stop: the driver ends the turn `cancelled` at its next renewal."""
    record: TurnRecord | None = field(default=None, compare=False, repr=False)
    """The turn as the claim left it, where the claim read it anyway (PostgreSQL), so
    its driver starts without reading it again; None: read it with `get_turn`."""

    @property
    def token(self) -> str:
        """`owner@epoch`."""
        return f"{self.owner}@{self.epoch}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitResult:
    """What a commit learned on the way."""

    newest_guide_seq: int = 0
    """The newest guide message attached to the turn (0: none)."""
    requeued: int = 0
    """Guide messages re-queued as turns of their own by this (terminal) commit."""
    carried: bool = False
    """The commit's `rider` was written in the same statement (see `Rider`)."""


@dataclass(frozen=True, slots=True)
class Rider:
    """More writes for a commit to carry in its own statement, under its lease fence.

    PostgreSQL only (elsewhere a rider is never carried): `ctes` are data-modifying
    common table expressions (`name AS (...), ...`) appended to the commit's statement,
    each writing only `WHERE EXISTS (SELECT FROM fence)`, so a stale lease writes
    neither the commit nor its rider. Their parameters are written `{0}`, `{1}`, ... and
    take `args` in that order. A checkpoint rides with its super-step's events this way:
    one round trip, and never one without the other.
    """

    ctes: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """A committed durable event: its position and the exact bytes clients receive."""

    turn_id: TurnId
    seq: int
    type: str
    data: bytes

    def decode(self) -> StreamEvent:
        """The typed event."""
        return decode_event(self.data)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadableEvent:
    """A committed event this version could not decode: where it sits and why (no bytes)."""

    turn_id: TurnId
    seq: int
    type: str
    """The type its row was stored under."""
    reason: UnreadableReason
    size_bytes: int


async def decode_events(
    stored: AsyncIterator[StoredEvent],
) -> tuple[list[StreamEvent], list[UnreadableEvent]]:
    """Decode committed events; those this version cannot read are set aside (logged).

    A payload written by a newer version (an event type this one does not know) or
    damaged in storage must not fail a run or a history read: it is left out with a
    warning on `turnkit.store`, the events around it are kept, and it is returned beside
    them so a driver can count and audit it.
    """
    events: list[StreamEvent] = []
    skipped: list[UnreadableEvent] = []
    async for item in stored:
        try:
            events.append(item.decode())
        except ValueError as exc:
            reason = _unreadable_reason(exc)
            log.warning(
                "skipped unreadable event seq %d (%s) of turn %s: %s",
                item.seq,
                item.type,
                item.turn_id,
                reason,
            )
            skipped.append(
                UnreadableEvent(
                    turn_id=item.turn_id,
                    seq=item.seq,
                    type=item.type,
                    reason=reason,
                    size_bytes=len(item.data),
                )
            )
    return events, skipped


async def readable_events(stored: AsyncIterator[StoredEvent]) -> list[StreamEvent]:
    """The committed events this version can read (see `decode_events`)."""
    events, _ = await decode_events(stored)
    return events


def _unreadable_reason(exc: ValueError) -> UnreadableReason:
    errors = {e["type"] for e in exc.errors()} if isinstance(exc, ValidationError) else set()
    if "json_invalid" in errors or not errors:
        return "invalid-json"
    if "union_tag_invalid" in errors:
        return "unknown-type"
    return "invalid-fields"


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
    ) -> SessionRecord:
        """Create a session owned by `principal` of `organisation` (idempotent)."""
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
        `organisation` when it is given alone; else every session.
        """
        ...

    async def rename_session(self, session_id: SessionId, title: str) -> SessionRecord:
        """Set a session's title."""
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

    async def delete_session(self, session_id: SessionId) -> bool:
        """Delete a session with its inputs, turns, events and files (audit rows stay)."""
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

        False when the turn is not running (finished, paused) or moved meanwhile.
        """
        ...


class Canceller(Protocol):
    """Stop, from any process."""

    async def cancel(self, turn_id: TurnId, *, stopped_owner: str | None = None) -> TurnStatus:
        """End a turn as `cancelled`, or ask its live driver to.

        A paused, queued or orphaned turn is ended here (a `done` event with status
        `cancelled`, its epoch moved on) and `cancelled` is returned. A turn with a live
        lease gets `cancel_requested` and `running` is returned: its driver stops at its
        next renewal. A finished turn is left as it is and its status returned.
        `stopped_owner`: that owner's drivers of the turn have stopped, so a lease it holds
        counts as lapsed.
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
        self, turn_id: TurnId, request_id: str, answer: dict[str, JsonValue]
    ) -> PauseRequest:
        """Record the answer and make the turn runnable again, in one transaction.

        Raises `PauseNotFoundError` (no such request on this turn) or
        `PauseAnsweredError` (answered already); either way nothing changes.
        """
        ...

    async def pending_answer(self, turn_id: TurnId) -> dict[str, JsonValue] | None:
        """The newest answer the turn has not consumed yet (what the resumed run needs)."""
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
        """A session's turns, oldest first."""
        ...

    async def close(self) -> None:
        """Release what the store owns; idempotent."""
        ...


def __getattr__(name: str) -> Any:
    if name == "SqlStore":
        from turnkit.store.sql import SqlStore

        return SqlStore
    raise AttributeError(name)
