"""`SqlStore`: the Store on SQLAlchemy Core (SQLite embedded default, PostgreSQL in production).

Tables are SQLModel classes (`_tables.py`); the hot path (appending events and audit rows)
uses Core statements on one connection per transaction, never an ORM session per row.
Engines, connections and transactions are `SqlEngine` (`_engine.py`); each operation's
statements live in a `_*_sql.py` module by concern (submit, lease, sweep, commit, turns…).
`SqlStore` is the turn ledger (commits and reads of a turn, pauses and guides) over three
bases of its own concern: `SqlQueue` (`_sql_queue.py`: submit, claim, renew, sweep, end),
`SqlSessions` (`_sql_sessions.py`: sessions, usage, files) and `SqlBudgets`
(`_sql_budgets.py`), each a `SqlEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from pydantic import JsonValue

from turnkit.audit import AuditRow, UsageDelta
from turnkit.clock import Clock
from turnkit.events import DurableEvent
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import (
    CommitResult,
    KeptTranscript,
    Rider,
    RunSummary,
    StoredEvent,
    TurnProgress,
    TurnRecord,
    TurnTranscript,
    _commit_pg as commit_pg,
    _commit_sql as commit_sql,
    _pauses_sql as pauses_sql,
    _submit_sql as submit_sql,
    _transcripts_sql as transcripts_sql,
    _turns_sql as turns_sql,
)
from turnkit.store._coalesce import Coalescer
from turnkit.store._engine import normalize_url
from turnkit.store._engine_pg import (
    RETIRE_INTERVAL_S,
    Retirements,
    database_refused,
    first_line,
    is_unreachable,
    reached_read_only,
    shown_url,
    tls_file_missing,
    tls_file_refused,
    tls_refused,
    unavailable,
    unresolved_host,
)
from turnkit.store._schema import SOURCES
from turnkit.store._sql_budgets import SqlBudgets
from turnkit.store._sql_queue import SqlQueue
from turnkit.store._sql_sessions import SqlSessions

__all__ = (
    "RETIRE_INTERVAL_S",
    "Retirements",
    "SqlStore",
    "database_refused",
    "first_line",
    "is_unreachable",
    "normalize_url",
    "reached_read_only",
    "shown_url",
    "tls_file_missing",
    "tls_file_refused",
    "tls_refused",
    "unavailable",
    "unresolved_host",
)

log = logging.getLogger(__name__)

IN_PLACE_PAGE = 16
"""Event pages of at most this many rows are read in place (see `SqlStore.read_events`)."""
_PROGRESS_BATCH = 256
"""Turns whose progress one read transaction answers (see `SqlStore.turn_progress`)."""


class SqlStore(SqlQueue, SqlSessions, SqlBudgets):
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

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock | None = None, schema: str | None = None
    ) -> SqlStore:
        """A store for `url` (`sqlite:///turnkit.db`, `postgresql://…`); it owns its engine.

        `schema` (PostgreSQL only) puts turnkit's tables in that schema.
        """
        return cls(url, clock=clock, schema=schema)

    # ── writes ──────────────────────────────────────────────────────────────────────

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
        event_rows, audit_rows, usage = commit_sql.commit_rows(turn_id, events, audit)
        summary_json = summary.model_dump_json() if summary is not None else None
        kept = transcripts_sql.encoded(transcript) if transcript is not None else None
        if self._async_engine is not None and pause is None:
            moves = (status, summary, transcript, guides_consumed_through)
            rows = (turn_id, epoch, self._clock.now(), event_rows, audit_rows, usage)
            done = None
            if not release and moves == (None,) * len(moves):
                done = await self._pg_driver(commit_pg.append, *rows, rider)
            elif release and status in TERMINAL_STATES:
                ending = (status, error_code, SOURCES[status])
                settle = (summary_json, kept, guides_consumed_through, rider)
                done = await self._pg_driver(commit_pg.end, *rows, ending, *settle)
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
            usage,
            status,
            error_code,
            (summary_json, release, kept),
            pause,
            guides_consumed_through,
        )

    async def guided_inputs(
        self, turn_id: TurnId, *, after_input_seq: int
    ) -> list[tuple[int, str, str | None]]:
        """Guide messages attached to a running turn, after an input seq."""
        return await self._hot_tx(submit_sql.guided_inputs, turn_id, after_input_seq, write=False)

    async def answer_pause(
        self,
        turn_id: TurnId,
        request_id: str,
        answer: dict[str, JsonValue],
        *,
        by: str | None = None,
    ) -> PauseRequest:
        """Record an answer and make the turn runnable again (one transaction)."""
        return await self._tx(pauses_sql.answer, turn_id, request_id, answer, self._clock.now(), by)

    async def budget_pauses(
        self, organisation: str | None = None
    ) -> list[tuple[TurnRecord, PauseRequest]]:
        """Turns paused `awaiting_budget`, oldest first, with their requests."""
        return await self._tx(pauses_sql.budget_pauses, organisation, write=False)

    async def open_pauses(
        self,
        session_id: SessionId | None = None,
        *,
        organisation: str | None = None,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
        asked: bool = True,
    ) -> list[tuple[TurnRecord, PauseRequest]]:
        """Paused turns, oldest first, with their open requests (see `Store`)."""
        return await self._tx(
            pauses_sql.open_pauses, session_id, organisation, limit, after, asked, write=False
        )

    async def pending_answer(self, turn_id: TurnId) -> dict[str, JsonValue] | None:
        """The newest answer not yet consumed by a resumed run."""
        return await self._tx(pauses_sql.pending_answer, turn_id, write=False)

    async def get_pause(self, turn_id: TurnId, request_id: str) -> PauseRequest | None:
        """The turn's request `request_id`, as saved (None: it has none)."""
        return await self._tx(pauses_sql.get_pause, turn_id, request_id, write=False)

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
