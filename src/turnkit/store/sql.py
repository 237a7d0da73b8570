"""`SqlStore`: the Store on SQLAlchemy Core (SQLite embedded default, PostgreSQL in production).

Tables are SQLModel classes (`_tables.py`); the hot path (appending events and audit rows)
uses Core statements on one connection per transaction, never an ORM session per row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, Literal, Self, TypeVar, cast

from pydantic import JsonValue
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    create_engine,
    event,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from turnkit.audit import AuditRow, UsageDelta
from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetSubject, BudgetUse
from turnkit.clock import Clock, SystemClock
from turnkit.errors import StaleEpochError, StoreError, StoreUnavailableError, TurnNotFoundError
from turnkit.events import DurableEvent, encode_event
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import (
    CommitResult,
    KeptTranscript,
    Lease,
    NewInput,
    RunSummary,
    SessionRecord,
    StoredEvent,
    Submission,
    TurnRecord,
    TurnTranscript,
    WorkspaceFile,
    _budgets_sql as budgets_sql,
    _pauses_sql as pauses_sql,
    _queue_sql as queue,
    _sessions_sql as sessions_sql,
    _sqlite as sqlite_conn,
    _transcripts_sql as transcripts_sql,
    _usage_sql as usage_sql,
    _workspace_sql as workspace_sql,
)
from turnkit.store._folds import WalFolds
from turnkit.store._schema import (
    SOURCES as _SOURCES,
    audit as _audit,
    events as _events,
    inputs as _inputs,
    turn_record as _turn_record,
    turns as _turns,
    usage as _usage,
)
from turnkit.store._usage import UsageLine
from turnkit.store._workspace import (
    check_workspace_content,
    check_workspace_path,
    workspace_media_type,
)
from turnkit.store.migrate import current_revision, upgrade

__all__ = ("SqlStore", "normalize_url")

T = TypeVar("T")
log = logging.getLogger(__name__)
_THREAD_WAIT_MS = 30_000
"""How long the store's thread waits for SQLite's write lock before giving up."""
_CHECKPOINT_EVERY = 256
"""Commits on the loop's connection between two WAL folds on the store's thread."""


def normalize_url(url: str) -> str:
    """The SQLAlchemy URL: SQLite as given (plain `sqlite3`), `postgresql://` → asyncpg."""
    if url.startswith("sqlite:///") or url == "sqlite://":
        return url
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    return url


class _HotStatements:
    """The statements of the append path, built once (SQLAlchemy then only looks them up)."""

    def __init__(self, insert: Any) -> None:
        last_seq = case(
            (_turns.c.last_seq < bindparam("k_top"), bindparam("k_top")),
            else_=_turns.c.last_seq,
        )
        fenced = (
            _turns.c.turn_id == bindparam("k_turn"),
            _turns.c.lease_epoch == bindparam("k_epoch"),
        )
        # Every commit also reports the newest guide message for the turn, so the driver
        # only asks for guides when one arrived (no extra query per model request).
        newest_guide = (
            select(func.max(_inputs.c.seq))
            .where(_inputs.c.turn_id == bindparam("k_turn"), _inputs.c.delivery == "guide")
            .scalar_subquery()
        )
        self.touch_turn = (
            update(_turns)
            .where(*fenced)
            .values(updated_at=bindparam("k_now"), last_seq=last_seq)
            .returning(newest_guide)
        )
        self.move_turn = {
            target: update(_turns)
            .where(*fenced, _turns.c.status.in_(sources))
            .values(
                updated_at=bindparam("k_now"),
                last_seq=last_seq,
                status=bindparam("k_status"),
                error_code=bindparam("k_error"),
            )
            .returning(newest_guide)
            for target, sources in _SOURCES.items()
        }
        self.insert_event = insert(_events).on_conflict_do_nothing()
        self.insert_audit = (
            insert(_audit).on_conflict_do_nothing().returning(_audit.c.seq_within_turn)
        )
        usage = insert(_usage)
        self.add_usage = usage.on_conflict_do_update(
            index_elements=["turn_id"],
            set_={
                name: getattr(_usage.c, name) + getattr(usage.excluded, name)
                for name in UsageDelta.model_fields
            },
        )


class SqlStore:
    """The Store on SQLAlchemy Core: SQLite (embedded default) or PostgreSQL (asyncpg).

    Every operation is one short transaction written as plain Core statements. On
    PostgreSQL it runs on the async engine; on SQLite it runs on a sync engine in one
    dedicated thread, so a transaction costs one thread hop instead of one per statement.
    `SqlStore.from_url(url)` owns its engine and disposes it on `close()`. Use as an async
    context manager, or call `setup()` (creates missing tables) and `close()` yourself.
    """

    def __init__(self, url: str, *, clock: Clock | None = None, schema: str | None = None) -> None:
        self.url = normalize_url(url)
        self.schema = schema
        self._clock = clock or SystemClock()
        self._thread: ThreadPoolExecutor | None = None
        self._migrator: Engine | None = None
        self._path: str | None = None
        self._on_thread: sqlite_conn.SqliteConnection | None = None
        self._on_loop: sqlite_conn.SqliteConnection | None = None
        self._loop_thread = 0
        self._closed = False
        self._conn_lock = threading.Lock()
        self._folds: WalFolds | None = None
        """WAL folds on the store's thread for the loop's connection (file databases)."""
        self._async_engine: AsyncEngine | None = None
        if self.url.startswith("sqlite"):
            sa_url = make_url(self.url).set(drivername="sqlite")  # whatever driver was named
            path = sa_url.database or ":memory:"
            self._path = path
            self._insert: Any = sqlite.insert
            # SQLAlchemy's engine only runs migrations; statements go through `_sqlite`.
            if path == ":memory:":
                # One connection holds the database, so everything runs on it, in place.
                shared = sqlite_conn.connect(path, busy_timeout_ms=0, autocheckpoint=True)
                self._on_loop = self._on_thread = shared
                self._migrator = create_engine(
                    "sqlite://", creator=lambda: shared.raw, poolclass=StaticPool
                )
            else:
                self._migrator = create_engine(
                    sa_url,
                    connect_args={"timeout": 30, "check_same_thread": False},
                )
                _tune_sqlite(self._migrator)
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnkit-sqlite")
                self._folds = WalFolds(self._thread, self._fold_wal, every=_CHECKPOINT_EVERY)
        elif self.url.startswith("postgresql"):
            connect_args: dict[str, Any] = {}
            if schema is not None:
                connect_args["server_settings"] = {"search_path": schema}
            self._async_engine = create_async_engine(
                self.url,
                pool_size=10,
                max_overflow=10,
                pool_pre_ping=True,
                connect_args=connect_args,
            )
            self._insert = postgresql.insert
        else:
            raise StoreError(f"SqlStore supports SQLite and PostgreSQL, not {url!r}")
        self._hot = _HotStatements(self._insert)

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock | None = None, schema: str | None = None
    ) -> SqlStore:
        """A store for `url` (`sqlite:///turnkit.db`, `postgresql://…`); it owns its engine.

        `schema` (PostgreSQL only) puts turnkit's tables in that schema.
        """
        return cls(url, clock=clock, schema=schema)

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return "sqlite" if self._path is not None else "postgresql"

    async def _tx(self, fn: Callable[..., T], *args: Any, write: bool = True) -> T:
        """Run `fn(conn, *args)` in one transaction (SQLite: on the store's thread)."""
        if self._closed:
            raise StoreError("the store is closed", url=self.url)
        if self._path == ":memory:":
            assert self._on_loop is not None
            with self._conn_lock, self._on_loop.transaction(write=write) as conn:  # one connection
                return fn(conn, *args)
        if self._thread is not None:

            def run() -> T:
                try:
                    with self._thread_conn().transaction(write=write) as conn:
                        return fn(conn, *args)
                except sqlite_conn.BusyError as exc:
                    raise StoreError(
                        f"the SQLite database {self._path!r} stayed locked by another "
                        f"connection for {_THREAD_WAIT_MS / 1000:g} s; nothing was written",
                        path=self._path,
                    ) from exc

            return await asyncio.get_running_loop().run_in_executor(self._thread, run)
        assert self._async_engine is not None
        try:
            async with self._async_engine.begin() as aconn:
                return await aconn.run_sync(fn, *args)
        except (DBAPIError, OSError) as exc:
            if _is_unreachable(exc):
                raise self._unavailable(exc) from exc
            raise

    def _thread_conn(self) -> sqlite_conn.SqliteConnection:
        """The store thread's connection (waits up to `_THREAD_WAIT_MS` for the write lock)."""
        if self._on_thread is None:
            assert self._path is not None
            self._on_thread = sqlite_conn.connect(
                self._path, busy_timeout_ms=_THREAD_WAIT_MS, autocheckpoint=True
            )
        return self._on_thread

    async def _hot_tx(self, fn: Callable[..., T], *args: Any, write: bool = True) -> T:
        """`_tx` for the per-turn path: on SQLite, run on the event loop if it need not wait.

        A short SQLite transaction costs tens of microseconds, less than the hop to a
        thread, so it runs in place — with a zero busy timeout, so the loop never waits
        for a lock: if another connection holds it, the transaction goes to the store's
        thread and waits there. Nothing was written by the attempt (BEGIN IMMEDIATE takes
        the lock before any statement runs). The connection belongs to the first thread
        that uses it; a store shared with another thread's loop sends that loop's
        transactions to the store's thread.
        """
        if self._thread is None or self._closed:
            return await self._tx(fn, *args, write=write)
        if self._on_loop is None:
            with self._conn_lock:
                if self._on_loop is None:
                    assert self._path is not None
                    self._loop_thread = threading.get_ident()
                    self._on_loop = sqlite_conn.connect(
                        self._path, busy_timeout_ms=0, autocheckpoint=False
                    )
        folds = self._folds
        assert folds is not None
        if write and folds.must_wait():
            return await self._tx(fn, *args, write=write)  # behind the fold, on the thread
        if self._loop_thread != threading.get_ident():
            return await self._tx(fn, *args, write=write)  # another thread's loop
        try:
            with self._on_loop.transaction(write=write) as conn:
                result = fn(conn, *args)
        except sqlite_conn.BusyError:
            return await self._tx(fn, *args, write=write)
        if write:
            folds.committed()
        return result

    def _fold_wal(self, second_pass: bool) -> None:
        """Checkpoint the WAL on the store's thread (scheduled by `WalFolds`)."""
        self._thread_conn().raw.execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    async def setup(self) -> None:
        """Bring the schema up to date (Alembic migrations; safe to run concurrently)."""

        def migrate(conn: Connection) -> None:
            if conn.dialect.name == "postgresql":
                # One migrator at a time across processes; released at commit.
                conn.execute(text("SELECT pg_advisory_xact_lock(7413620511)"))
                if self.schema is not None:
                    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
            upgrade(conn)

        await self._migrate(migrate)

    async def schema_revision(self) -> str | None:
        """The schema revision the database is at (None before the first upgrade)."""
        return await self._migrate(current_revision)

    async def _migrate(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` on a SQLAlchemy connection (Alembic needs one) in one transaction."""
        if self._migrator is not None:
            engine = self._migrator

            def run() -> T:
                with engine.begin() as conn:
                    return fn(conn)

            try:
                if self._thread is None:  # in memory: the one connection is used in place
                    return run()
                return await asyncio.get_running_loop().run_in_executor(self._thread, run)
            except DBAPIError as exc:
                reason = _first_line(exc.orig or exc)
                raise StoreError(
                    f"cannot use the SQLite database {self._path!r}: {reason} "
                    "(does its folder exist, and may this process write there?)",
                    path=self._path,
                ) from exc
        assert self._async_engine is not None
        try:
            async with self._async_engine.begin() as aconn:
                return await aconn.run_sync(fn)
        except (DBAPIError, OSError) as exc:
            if _is_unreachable(exc):
                raise self._unavailable(exc) from exc
            raise

    def _unavailable(self, exc: DBAPIError | OSError) -> StoreUnavailableError:
        """What a database out of reach raises (nothing was written)."""
        return StoreUnavailableError(
            f"the database cannot be reached ({type(exc).__name__}: {_first_line(exc)}); "
            "nothing was written, retry shortly",
            url=make_url(self.url).render_as_string(hide_password=True),
        )

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Dispose the engine and stop the SQLite thread (idempotent).

        Work already handed to the store's thread finishes first; calls after this raise
        `StoreError`.
        """
        self._closed = True
        if self._migrator is not None:
            engine, self._migrator = self._migrator, None
            on_loop, self._on_loop = self._on_loop, None
            if self._thread is None:  # in memory: one connection, closed with the engine
                self._on_thread = None
                engine.dispose()
                if on_loop is not None:
                    on_loop.close()
                return
            if self._folds is not None:
                await self._folds.wait()

            def dispose() -> None:
                # Runs after everything queued before it, so it closes whatever they opened.
                on_thread, self._on_thread = self._on_thread, None
                if on_thread is not None:
                    with contextlib.suppress(sqlite3.Error):
                        on_thread.raw.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    on_thread.close()
                engine.dispose()

            if on_loop is not None:
                on_loop.close()
            await asyncio.get_running_loop().run_in_executor(self._thread, dispose)
            self._thread.shutdown(wait=True)
        if self._async_engine is not None:
            engine_a, self._async_engine = self._async_engine, None
            await engine_a.dispose()

    # ── writes ──────────────────────────────────────────────────────────────────────

    async def submit(self, new: NewInput) -> Submission:
        """Commit a user message, its queued turn and `turn.started` in one transaction."""
        try:
            return await self._hot_tx(queue.submit, self._insert, new, self._clock.now())
        except IntegrityError:
            # A concurrent submit with the same request_id won the race: it answers.
            if new.request_id is None:
                raise
            return await self._hot_tx(queue.submit, self._insert, new, self._clock.now())

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
        return await self._hot_tx(
            lambda conn: queue.claim(
                conn,
                owner=owner,
                ttl_s=ttl_s,
                max_attempts=max_attempts,
                turn_id=turn_id,
                now=self._clock.now(),
                skip_locked=self.dialect == "postgresql",
                session_id=session_id,
            )
        )

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend the lease or raise `StaleEpochError`."""
        return await self._hot_tx(
            lambda conn: queue.renew(conn, lease, ttl_s=ttl_s, now=self._clock.now())
        )

    async def sweep(self, *, ceiling_s: float, max_attempts: int) -> list[TurnId]:
        """Time out orphaned running turns; returns the ones this call ended."""
        now = self._clock.now()
        rows = await self._tx(
            lambda conn: queue.sweepable(
                conn, now=now, ceiling_s=ceiling_s, max_attempts=max_attempts
            )
        )
        reason = (
            f"the run outlived its ceiling of {ceiling_s:g} s or ran out of attempts "
            "with no live driver; the sweep ended it"
        )
        ended: list[TurnId] = []
        for row in rows:
            if await self._tx(queue.sweep, row, now, reason):
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
    ) -> CommitResult:
        """Append events, audit rows (+ usage rollup) and a status move in one transaction."""
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
        return await self._hot_tx(
            self._commit,
            turn_id,
            epoch,
            event_rows,
            audit_rows,
            (session_id, usage),
            status,
            error_code,
            (
                summary.model_dump_json() if summary is not None else None,
                release,
                transcripts_sql.encoded(transcript) if transcript is not None else None,
            ),
            pause,
            guides_consumed_through,
        )

    def _commit(
        self,
        conn: Connection,
        turn_id: TurnId,
        epoch: int,
        event_rows: list[dict[str, Any]],
        audit_rows: list[dict[str, Any]],
        usage: tuple[str | None, dict[int, UsageDelta]],
        status: TurnStatus | None,
        error_code: str | None,
        settle: tuple[str | None, bool, dict[str, Any] | None] = (None, False, None),
        pause: PauseRequest | None = None,
        guides_consumed_through: int | None = None,
    ) -> CommitResult:
        top = max((r["seq"] for r in event_rows), default=0)
        params: dict[str, Any] = {
            "k_turn": turn_id,
            "k_epoch": epoch,
            "k_now": self._clock.now(),
            "k_top": top,
        }
        if status is None:
            statement = self._hot.touch_turn
        else:
            statement = self._hot.move_turn[status]
            params["k_status"] = status
            params["k_error"] = error_code
        moved = conn.execute(statement, params).first()
        if moved is None:
            _explain_refusal(conn, turn_id, epoch, status)
        newest_guide = int(moved[0] or 0) if moved is not None else 0
        requeued = 0
        summary_json, release, transcript = settle
        if summary_json is not None or release:
            conn.execute(
                _settle(summary=summary_json is not None, release=release),
                {"k_turn": turn_id, "k_epoch": epoch, "k_summary": summary_json},
            )
        if transcript is not None:
            transcripts_sql.keep(conn, self._insert, turn_id, transcript)
        if guides_consumed_through is not None and status in TERMINAL_STATES:
            requeued = queue.requeue_guides(
                conn, turn_id, guides_consumed_through, self._clock.now()
            )
        if pause is not None:
            session_id = conn.execute(_SESSION_OF, {"p_turn": turn_id}).scalar_one()
            pauses_sql.open_pause(conn, self._insert, turn_id, session_id, pause, self._clock.now())
        if event_rows:
            conn.execute(self._hot.insert_event, event_rows)
        if audit_rows:
            # Only rows this commit inserted count: re-appending a row repeats no usage.
            inserted = conn.execute(self._hot.insert_audit, audit_rows).scalars()
            session_id, per_row = usage
            delta = sum((per_row[seq] for seq in inserted), UsageDelta())
            if delta.model_calls or delta.cost_usd:
                conn.execute(
                    self._hot.add_usage,
                    {"turn_id": turn_id, "session_id": session_id, **delta.model_dump()},
                )
        return CommitResult(newest_guide_seq=newest_guide, requeued=requeued)

    async def cancel(self, turn_id: TurnId) -> TurnStatus:
        """Cancel a turn here, or flag it for its live driver (see `Canceller`)."""
        status = await self._tx(queue.cancel, turn_id, self._clock.now())
        if status is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return cast(TurnStatus, status)

    async def guided_inputs(
        self, turn_id: TurnId, *, after_input_seq: int
    ) -> list[tuple[int, str, str | None]]:
        """Guide messages attached to a running turn, after an input seq."""
        return await self._hot_tx(queue.guided_inputs, turn_id, after_input_seq, write=False)

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

    async def time_out(self, turn_id: TurnId, *, reason: str) -> bool:
        """End one running turn as `timed_out` (a reader found its driver gone)."""
        now = self._clock.now()

        def run(conn: Connection) -> bool:
            row = queue.orphan(conn, turn_id)
            return row is not None and queue.sweep(conn, row, now, reason)

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
        """Committed events after `after_seq`, in order, read in pages of `page_size`."""
        cursor = after_seq
        while True:
            rows = await self._tx(_event_page, turn_id, cursor, page_size, write=False)
            for seq, type_, data in rows:
                yield StoredEvent(turn_id=turn_id, seq=seq, type=type_, data=data)
            if len(rows) < page_size:
                return
            cursor = rows[-1][0]

    async def get_turn(self, turn_id: TurnId) -> TurnRecord | None:
        """One turn, or None."""
        return await self._hot_tx(_get_turn, turn_id, write=False)

    async def list_turns(self, session_id: SessionId) -> list[TurnRecord]:
        """A session's turns, oldest first."""
        return await self._hot_tx(_list_turns, session_id, write=False)

    async def read_audit(self, turn_id: TurnId) -> list[AuditRow]:
        """A turn's audit rows in order."""
        blobs = await self._tx(_audit_blobs, turn_id, write=False)
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
        return await self._tx(_read_usage, turn_id, write=False)

    async def kept_transcript(
        self, session_id: SessionId, *, before_input_seq: int, after: TurnId | None = None
    ) -> KeptTranscript:
        """What the session's earlier turns keep of its transcript (see `TurnLedger`)."""
        return await self._hot_tx(
            transcripts_sql.kept, session_id, before_input_seq, after, write=False
        )

    async def stuck(self, *, ceiling_s: float) -> list[tuple[TurnRecord, str]]:
        """Running turns an operator should look at, with why (`turnkit turns --stuck`).

        No live driver (claimed before, lease lapsed), past the ceiling, or with attempts
        that died before any progress.
        """
        now = self._clock.now()
        rows = await self._tx(_stuck_rows, now - timedelta(seconds=ceiling_s), now, write=False)
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


def _is_unreachable(exc: BaseException) -> bool:
    """A failure to reach the database (refused, reset, shutting down), not a bad statement."""
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    orig = getattr(exc, "orig", None)
    name = type(orig).__name__ if orig is not None else ""
    return isinstance(orig, OSError) or name in _UNREACHABLE_DRIVER_ERRORS


_UNREACHABLE_DRIVER_ERRORS = frozenset(
    {
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "AdminShutdownError",
        "CrashShutdownError",
        "InterfaceError",
    }
)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


@functools.cache
def _settle(*, summary: bool, release: bool) -> Any:
    """Record the run summary and/or release the lease (fenced on the epoch)."""
    values: dict[str, Any] = {}
    if summary:
        values["summary"] = bindparam("k_summary")
    if release:
        values["lease_owner"] = None
        values["lease_expires_at"] = None
    return (
        update(_turns)
        .where(
            _turns.c.turn_id == bindparam("k_turn"), _turns.c.lease_epoch == bindparam("k_epoch")
        )
        .values(**values)
    )


_SESSION_OF = select(_turns.c.session_id).where(_turns.c.turn_id == bindparam("p_turn"))


def _explain_refusal(
    conn: Connection, turn_id: TurnId, epoch: int, status: TurnStatus | None
) -> None:
    row = conn.execute(
        select(_turns.c.status, _turns.c.lease_epoch).where(_turns.c.turn_id == turn_id)
    ).first()
    if row is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    if row.lease_epoch != epoch:
        raise StaleEpochError(
            f"turn {turn_id!r} is leased at epoch {row.lease_epoch}, not {epoch}: "
            "another driver owns it now; this driver must stop",
            turn_id=turn_id,
            epoch=epoch,
            current_epoch=row.lease_epoch,
        )
    raise StoreError(
        f"turn {turn_id!r} cannot move from {row.status!r} to {status!r}",
        turn_id=turn_id,
        current=row.status,
        target=status,
    )


_EVENT_PAGE = (
    select(_events.c.seq, _events.c.type, _events.c.data)
    .where(_events.c.turn_id == bindparam("e_turn"), _events.c.seq > bindparam("e_after"))
    .order_by(_events.c.seq)
    .limit(bindparam("e_limit"))
)


def _event_page(
    conn: Connection, turn_id: TurnId, after: int, limit: int
) -> list[tuple[int, str, bytes]]:
    rows = conn.execute(_EVENT_PAGE, {"e_turn": turn_id, "e_after": after, "e_limit": limit}).all()
    return [(r.seq, r.type, bytes(r.data)) for r in rows]


def _get_turn(conn: Connection, turn_id: TurnId) -> TurnRecord | None:
    row = conn.execute(queue.TURN_BY_ID, {"t_id": turn_id}).first()
    return _turn_record(row) if row is not None else None


_TURNS_OF_SESSION = (
    select(_turns)
    .where(_turns.c.session_id == bindparam("l_session"))
    .order_by(_turns.c.created_at, _turns.c.turn_id)
)


def _list_turns(conn: Connection, session_id: SessionId) -> list[TurnRecord]:
    rows = conn.execute(_TURNS_OF_SESSION, {"l_session": session_id}).all()
    return [_turn_record(r) for r in rows]


def _audit_blobs(conn: Connection, turn_id: TurnId) -> list[bytes]:
    rows = conn.execute(
        select(_audit.c.data).where(_audit.c.turn_id == turn_id).order_by(_audit.c.seq_within_turn)
    ).all()
    return [bytes(r.data) for r in rows]


def _stuck_rows(conn: Connection, deadline: datetime, now: datetime) -> list[Any]:
    query = (
        select(_turns)
        .where(
            _turns.c.status == "running",
            or_(
                and_(_turns.c.started_at.is_not(None), _turns.c.started_at < deadline),
                and_(
                    _turns.c.attempts > 0,
                    or_(_turns.c.lease_owner.is_(None), _turns.c.lease_expires_at < now),
                ),
                _turns.c.spent_attempts > 0,
            ),
        )
        .order_by(_turns.c.created_at)
        .limit(1000)
    )
    return list(conn.execute(query).all())


def _read_usage(conn: Connection, turn_id: TurnId) -> UsageDelta:
    row = conn.execute(select(_usage).where(_usage.c.turn_id == turn_id)).first()
    if row is None:
        return UsageDelta()
    return UsageDelta.model_validate({name: getattr(row, name) for name in UsageDelta.model_fields})


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        sqlite_conn.tune(dbapi_conn, busy_timeout_ms=_THREAD_WAIT_MS)
