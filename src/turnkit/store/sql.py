"""`SqlStore`: the Store on SQLAlchemy Core (SQLite embedded default, PostgreSQL in production).

Tables are SQLModel classes (`_tables.py`); the hot path (appending events and audit rows)
uses Core statements on one connection per transaction, never an ORM session per row.
Engines, connections and transactions are `SqlEngine` (`_engine.py`); each operation's
statements live in a `_*_sql.py` module by concern (submit, lease, sweep, commit, turns…).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from pydantic import JsonValue
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from turnkit.audit import AuditRow, UsageDelta
from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetSubject, BudgetUse
from turnkit.clock import Clock
from turnkit.errors import TurnNotFoundError
from turnkit.events import DurableEvent, encode_event
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import (
    CommitResult,
    KeptTranscript,
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
    WorkspaceFile,
    _budgets_sql as budgets_sql,
    _cancel_sql as cancel_sql,
    _commit_pg as commit_pg,
    _commit_sql as commit_sql,
    _lease_sql as lease_sql,
    _pauses_sql as pauses_sql,
    _sessions_sql as sessions_sql,
    _submit_pg as submit_pg,
    _submit_sql as submit_sql,
    _sweep_sql as sweep_sql,
    _transcripts_sql as transcripts_sql,
    _turns_sql as turns_sql,
    _usage_sql as usage_sql,
    _workspace_sql as workspace_sql,
)
from turnkit.store._coalesce import Coalescer
from turnkit.store._engine import SqlEngine, normalize_url
from turnkit.store._schema import SOURCES, turn_record as _turn_record
from turnkit.store._usage import UsageLine
from turnkit.store._workspace import (
    check_workspace_content,
    check_workspace_path,
    workspace_media_type,
)

__all__ = ("SqlStore", "normalize_url")

log = logging.getLogger(__name__)
_UNIQUE_VIOLATION = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""

IN_PLACE_PAGE = 16
"""Event pages of at most this many rows are read in place (see `SqlStore.read_events`)."""
_PROGRESS_BATCH = 256
"""Turns whose progress one read transaction answers (see `SqlStore.turn_progress`)."""
_RENEW_BATCH = 256
"""Leases one renewal transaction extends (see `SqlStore.renew`)."""


class SqlStore(SqlEngine):
    """The Store on SQLAlchemy Core: SQLite (embedded default) or PostgreSQL (asyncpg).

    Every operation is one short transaction written as plain Core statements. On
    PostgreSQL it runs on the async engine; on SQLite it runs on a sync engine in one
    dedicated thread, so a transaction costs one thread hop instead of one per statement.
    `SqlStore.from_url(url)` owns its engine and disposes it on `close()`. Use as an async
    context manager, or call `setup()` (creates missing tables) and `close()` yourself.
    """

    def __init__(self, url: str, *, clock: Clock | None = None, schema: str | None = None) -> None:
        super().__init__(url, clock=clock, schema=schema)
        self._progress = Coalescer(self._read_progress, most=_PROGRESS_BATCH)
        self._renewals = Coalescer(self._renew_many, most=_RENEW_BATCH)

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock | None = None, schema: str | None = None
    ) -> SqlStore:
        """A store for `url` (`sqlite:///turnkit.db`, `postgresql://…`); it owns its engine.

        `schema` (PostgreSQL only) puts turnkit's tables in that schema.
        """
        return cls(url, clock=clock, schema=schema)

    # ── writes ──────────────────────────────────────────────────────────────────────

    async def submit(self, new: NewInput) -> Submission:
        """Commit a user message, its queued turn and `turn.started` in one transaction."""
        if self._async_engine is not None and submit_pg.can_submit(new):
            try:
                done = await self._pg_driver(submit_pg.submit, new, self._clock.now())
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != _UNIQUE_VIOLATION:
                    raise
                done = None  # a concurrent retry of the same request: the first answers
            if done is not None:
                return done
        now = self._clock.now()
        try:  # a new message waits behind the writes of running turns (group commit)
            return await self._hot_tx(submit_sql.submit, self._insert, new, now, behind=True)
        except IntegrityError:
            # A concurrent submit with the same request_id won the race: it answers.
            if new.request_id is None:
                raise
            return await self._hot_tx(submit_sql.submit, self._insert, new, self._clock.now())

    async def claim(
        self,
        owner: str,
        *,
        ttl_s: float,
        max_attempts: int,
        turn_id: TurnId | None = None,
        session_id: SessionId | None = None,
    ) -> Lease | None:
        """Claim the next runnable turn (or `turn_id`, or one of `session_id`) for `owner`."""
        asked: dict[str, Any] = {
            "owner": owner,
            "ttl_s": ttl_s,
            "max_attempts": max_attempts,
            "turn_id": turn_id,
            "session_id": session_id,
            "clock": self._clock.now,
        }
        if self._async_engine is None:
            return await self._hot_tx(functools.partial(lease_sql.claim, **asked))
        return await self._pg_driver(functools.partial(lease_sql.claim_pg, **asked))

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend the lease or raise `StaleEpochError`; renewals asked together share one."""
        outcome = await self._renewals.get((lease, ttl_s))
        if isinstance(outcome, Exception):
            raise outcome
        assert outcome is not None  # every asked renewal gets an outcome
        return outcome

    async def _renew_many(
        self, asked: Sequence[lease_sql.Renewal]
    ) -> dict[lease_sql.Renewal, Lease | lease_sql.Refusal]:
        if self._async_engine is None:
            return await self._hot_tx(lease_sql.renew_many, asked, self._clock.now)
        return await self._pg_driver(lease_sql.renew_many_pg, asked, self._clock.now)

    async def sweep(self, *, ceiling_s: float, max_attempts: int) -> list[TurnId]:
        """Time out orphaned running turns; returns the ones this call ended."""
        now = self._clock.now()
        rows = await self._tx(
            lambda conn: sweep_sql.sweepable(
                conn, now=now, ceiling_s=ceiling_s, max_attempts=max_attempts
            )
        )
        reason = (
            f"the run outlived its ceiling of {ceiling_s:g} s or ran out of attempts "
            "with no live driver; the sweep ended it"
        )
        ended: list[TurnId] = []
        for row in rows:
            if await self._tx(sweep_sql.sweep, row, now, reason):
                ended.append(TurnId(row.turn_id))
        return ended

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
        """Append events, audit rows (+ usage rollup) and a status move in one transaction.

        A `rider` goes in the statement of a plain append or a turn's ending on
        PostgreSQL; anything else leaves it (`carried` is False) for the caller to write.
        """
        event_rows = [
            {"turn_id": turn_id, "seq": e.seq, "type": e.type, "data": encode_event(e)}  # type: ignore[attr-defined]
            for e in events
        ]
        audit_rows = [
            {
                "turn_id": turn_id,
                "seq_within_turn": row.identity.seq_within_turn,
                "session_id": row.identity.session_id,
                "stage_id": row.identity.stage_id,
                "data": row.model_dump_json(by_alias=True).encode(),
            }
            for row in audit
        ]
        usage = {row.identity.seq_within_turn: UsageDelta.of(row.call) for row in audit}
        session_id = audit[0].identity.session_id if audit else None
        summary_json = summary.model_dump_json() if summary is not None else None
        kept = transcripts_sql.encoded(transcript) if transcript is not None else None
        if self._async_engine is not None and pause is None:
            moves = (status, summary, transcript, guides_consumed_through)
            rows = (turn_id, epoch, self._clock.now(), event_rows, audit_rows, (session_id, usage))
            done = None
            if not release and moves == (None,) * len(moves):
                done = await self._pg_driver(commit_pg.append, *rows, rider)
            elif release and status in TERMINAL_STATES:
                ending = (status, error_code, SOURCES[status])
                done = await self._pg_driver(
                    commit_pg.end,
                    *rows,
                    ending,
                    summary_json,
                    kept,
                    guides_consumed_through,
                    rider,
                )
            if done is not None:
                return done
            # Nothing was written: the fence refused, and the transaction below says why
            # (or re-queues the guides the turn never presented).
        return await self._hot_tx(
            commit_sql.commit,
            self._hot,
            self._insert,
            self._clock,
            turn_id,
            epoch,
            event_rows,
            audit_rows,
            (session_id, usage),
            status,
            error_code,
            (summary_json, release, kept),
            pause,
            guides_consumed_through,
        )

    async def cancel(self, turn_id: TurnId, *, stopped_owner: str | None = None) -> TurnStatus:
        """Cancel a turn here, or flag it for its live driver (see `Canceller`)."""
        status = await self._tx(cancel_sql.cancel, turn_id, self._clock.now(), stopped_owner)
        if status is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return cast(TurnStatus, status)

    async def guided_inputs(
        self, turn_id: TurnId, *, after_input_seq: int
    ) -> list[tuple[int, str, str | None]]:
        """Guide messages attached to a running turn, after an input seq."""
        return await self._hot_tx(submit_sql.guided_inputs, turn_id, after_input_seq, write=False)

    async def answer_pause(
        self, turn_id: TurnId, request_id: str, answer: dict[str, JsonValue]
    ) -> PauseRequest:
        """Record an answer and make the turn runnable again (one transaction)."""
        return await self._tx(pauses_sql.answer, turn_id, request_id, answer, self._clock.now())

    async def budget_pauses(
        self, organisation: str | None = None
    ) -> list[tuple[TurnRecord, PauseRequest]]:
        """Turns paused `awaiting_budget`, oldest first, with their requests."""
        return await self._tx(pauses_sql.budget_pauses, organisation, write=False)

    async def pending_answer(self, turn_id: TurnId) -> dict[str, JsonValue] | None:
        """The newest answer not yet consumed by a resumed run."""
        return await self._tx(pauses_sql.pending_answer, turn_id, write=False)

    async def note_activity(self, turn_id: TurnId) -> None:
        """Stamp a running turn's `updated_at` (see `Watchdog.note_activity`)."""
        await self._tx(turns_sql.note_activity, turn_id, self._clock.now())

    async def time_out(self, turn_id: TurnId, *, reason: str) -> bool:
        """End one running turn as `timed_out` (a reader found its driver gone)."""
        now = self._clock.now()

        def run(conn: Connection) -> bool:
            row = sweep_sql.orphan(conn, turn_id)
            return row is not None and sweep_sql.sweep(conn, row, now, reason)

        return await self._tx(run)

    # ── sessions ────────────────────────────────────────────────────────────────────

    async def create_session(
        self, session_id: SessionId, *, principal: str | None = None, title: str | None = None
    ) -> SessionRecord:
        """Create a session if it does not exist; return it."""
        return await self._tx(
            sessions_sql.create, self._insert, session_id, principal, title, self._clock.now()
        )

    async def get_session(self, session_id: SessionId) -> SessionRecord | None:
        """One session, or None."""
        if self._async_engine is not None:
            return await self._pg_driver(sessions_sql.get_pg, session_id)
        return await self._hot_tx(sessions_sql.get, session_id, write=False)

    async def list_sessions(
        self, *, principal: str | None = None, anonymous: bool = False, limit: int = 100
    ) -> list[SessionRecord]:
        """Sessions, most recently active first (see `SessionDirectory.list_sessions`)."""
        return await self._tx(sessions_sql.list_, principal, anonymous, limit, write=False)

    async def rename_session(self, session_id: SessionId, title: str) -> SessionRecord:
        """Set a session's title (`SessionNotFoundError` if there is none)."""
        return await self._tx(sessions_sql.rename, session_id, title, self._clock.now())

    async def name_session(
        self, session_id: SessionId, title: str, *, current: str | None = None
    ) -> bool:
        """Name a session only while its title is still `current` (see `SessionDirectory`)."""
        return await self._tx(sessions_sql.name_if, session_id, title, current, self._clock.now())

    async def delete_session(self, session_id: SessionId) -> bool:
        """Delete a session's chat data and files (audit rows stay); False if it did not exist."""
        return await self._tx(sessions_sql.remove, session_id)

    # ── workspace files ─────────────────────────────────────────────────────────────

    async def write_file(
        self,
        session_id: SessionId,
        path: str,
        content: str,
        *,
        media_type: str | None = None,
        turn_id: TurnId | None = None,
    ) -> WorkspaceFile:
        """Create or replace a session file; the same content again changes nothing."""
        checked = check_workspace_path(path)
        size = check_workspace_content(content)
        kind = workspace_media_type(checked, media_type)
        return await self._tx(
            lambda conn: workspace_sql.write(
                conn,
                self._insert,
                session_id=session_id,
                path=checked,
                content=content,
                media_type=kind,
                size=size,
                turn_id=turn_id,
                now=self._clock.now(),
            )
        )

    async def read_file(self, session_id: SessionId, path: str) -> WorkspaceFile | None:
        """One session file, or None."""
        checked = check_workspace_path(path)
        return await self._tx(workspace_sql.read, session_id, checked, write=False)

    async def list_files(self, session_id: SessionId) -> list[WorkspaceFile]:
        """A session's files, ordered by path."""
        return await self._tx(workspace_sql.list_, session_id, write=False)

    # ── reads ───────────────────────────────────────────────────────────────────────

    async def read_events(
        self, turn_id: TurnId, *, after_seq: int = 0, page_size: int = 500
    ) -> AsyncIterator[StoredEvent]:
        """Committed events after `after_seq`, in order, read in pages of `page_size`.

        A small page (at most `IN_PLACE_PAGE` rows, such as a stream's first event) is read
        in place on SQLite, like a turn's own writes; larger ones on the store's thread.
        """
        cursor = after_seq
        read = self._hot_tx if page_size <= IN_PLACE_PAGE else self._tx
        while True:
            rows = await read(turns_sql.event_page, turn_id, cursor, page_size, write=False)
            for seq, type_, data in rows:
                yield StoredEvent(turn_id=turn_id, seq=seq, type=type_, data=data)
            if len(rows) < page_size:
                return
            cursor = rows[-1][0]

    async def get_turn(self, turn_id: TurnId) -> TurnRecord | None:
        """One turn, or None."""
        if self._async_engine is not None:
            return await self._pg_driver(turns_sql.get_turn_pg, turn_id)
        return await self._hot_tx(turns_sql.get_turn, turn_id, write=False)

    async def turn_progress(self, turn_id: TurnId) -> TurnProgress | None:
        """Where one turn stands; calls made in the same loop iteration share a read."""
        return await self._progress.get(turn_id)

    async def _read_progress(self, turn_ids: Sequence[TurnId]) -> dict[TurnId, TurnProgress]:
        if self._async_engine is not None:
            return await self._pg_driver(turns_sql.progress_pg, turn_ids)
        return await self._hot_tx(turns_sql.progress_of, turn_ids, write=False)

    async def list_turns(self, session_id: SessionId) -> list[TurnRecord]:
        """A session's turns, oldest first."""
        return await self._hot_tx(turns_sql.list_turns, session_id, write=False)

    async def read_audit(self, turn_id: TurnId) -> list[AuditRow]:
        """A turn's audit rows in order."""
        blobs = await self._tx(turns_sql.audit_blobs, turn_id, write=False)
        return [AuditRow.model_validate_json(b) for b in blobs]

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
        """Tokens, calls and USD summed by session, principal, department or day."""
        return await self._tx(
            usage_sql.report, by, principal, anonymous, since, until, organisation, write=False
        )

    # ── budgets ─────────────────────────────────────────────────────────────────────

    async def set_budget_limit(self, limit: BudgetLimit) -> None:
        """Create or replace a budget limit."""
        await self._tx(budgets_sql.set_limit, self._insert, limit, self._clock.now())

    async def delete_budget_limit(
        self, scope: BudgetScope, organisation: str, key: str, period: BudgetPeriod
    ) -> bool:
        """Remove a budget limit; whether there was one."""
        return await self._tx(budgets_sql.delete_limit, scope, organisation, key, period)

    async def budget_limits(self, organisation: str | None = None) -> list[BudgetLimit]:
        """Every budget limit (of one organisation when given)."""
        return await self._tx(budgets_sql.limits, organisation, write=False)

    async def budget_report(self, organisation: str | None = None) -> list[BudgetUse]:
        """Every budget limit (of one organisation when given) with its period's use."""
        return await self._tx(budgets_sql.report, organisation, self._clock.now(), write=False)

    async def budget_uses(self, subject: BudgetSubject) -> list[BudgetUse]:
        """Each limit covering `subject` with what its period has spent and holds reserved."""
        return await self._tx(budgets_sql.uses, subject, self._clock.now(), write=False)

    async def reserve_budget(
        self, subject: BudgetSubject, *, turn_id: TurnId, usd: float, tokens: int, ttl_s: float
    ) -> tuple[str | None, list[BudgetUse]]:
        """Check and reserve in one transaction; the reservation id, or None when refused."""
        return await self._tx(
            lambda conn: budgets_sql.reserve(
                conn, subject, turn_id=turn_id, usd=usd, tokens=tokens, ttl_s=ttl_s,
                now=self._clock.now(),
            )
        )  # fmt: skip

    async def release_budget(self, turn_id: TurnId) -> None:
        """Drop the turn's reservation (its calls' usage is recorded, or it ended)."""
        await self._tx(budgets_sql.release, turn_id)

    async def read_usage(self, turn_id: TurnId) -> UsageDelta:
        """The turn's usage rollup (zeros when it made no call)."""
        return await self._tx(turns_sql.read_usage, turn_id, write=False)

    async def kept_transcript(
        self, session_id: SessionId, *, before_input_seq: int, after: TurnId | None = None
    ) -> KeptTranscript:
        """What the session's earlier turns keep of its transcript (see `TurnLedger`)."""
        if self._async_engine is not None:
            found = await self._pg_driver(
                transcripts_sql.kept_pg, session_id, before_input_seq, after
            )
            if found is not None:
                return found
        return await self._hot_tx(
            transcripts_sql.kept, session_id, before_input_seq, after, write=False
        )

    async def stuck(self, *, ceiling_s: float) -> list[tuple[TurnRecord, str]]:
        """Running turns an operator should look at, with why (`turnkit turns --stuck`).

        No live driver (claimed before, lease lapsed), past the ceiling, or with attempts
        that died before any progress.
        """
        now = self._clock.now()
        rows = await self._tx(
            turns_sql.stuck_rows, now - timedelta(seconds=ceiling_s), now, write=False
        )
        found: list[tuple[TurnRecord, str]] = []
        for row in rows:
            record = _turn_record(row)
            reasons = []
            if record.started_at is not None and record.started_at < now - timedelta(
                seconds=ceiling_s
            ):
                reasons.append("past the ceiling")
            if record.attempts and (
                record.lease_expires_at is None or record.lease_expires_at < now
            ):
                reasons.append("no live driver")
            if row.spent_attempts:
                reasons.append(f"{row.spent_attempts} attempt(s) died without progress")
            found.append((record, "; ".join(reasons)))
        return found
