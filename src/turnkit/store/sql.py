"""`SqlStore`: the Store on SQLAlchemy Core (SQLite embedded default, PostgreSQL in production).

Tables are SQLModel classes (`_tables.py`); the hot path (appending events and audit rows)
uses Core statements on one connection per transaction, never an ORM session per row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, Self, cast

from sqlalchemy import case, event, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from turnkit.audit import AuditRow, UsageDelta
from turnkit.clock import Clock, SystemClock
from turnkit.errors import StaleEpochError, StoreError, TurnNotFoundError
from turnkit.events import DurableEvent, encode_event
from turnkit.ids import SessionId, TurnId
from turnkit.states import TRANSITIONS, TurnStatus
from turnkit.store import NewTurn, StoredEvent, TurnRecord
from turnkit.store._tables import (
    AuditRowTable,
    EventRow,
    SessionRow,
    TurnRow,
    UsageRollupRow,
    metadata,
)

__all__ = ("SqlStore", "normalize_url")

_sessions = SessionRow.__table__  # type: ignore[attr-defined]
_turns = TurnRow.__table__  # type: ignore[attr-defined]
_events = EventRow.__table__  # type: ignore[attr-defined]
_audit = AuditRowTable.__table__  # type: ignore[attr-defined]
_usage = UsageRollupRow.__table__  # type: ignore[attr-defined]

_SOURCES: dict[TurnStatus, tuple[TurnStatus, ...]] = {
    target: tuple(s for s, targets in TRANSITIONS.items() if target in targets)
    for target in TRANSITIONS
}


def normalize_url(url: str) -> str:
    """Pick the async driver: `sqlite:///x.db` → aiosqlite, `postgresql://` → asyncpg."""
    if url.startswith("sqlite:///") or url == "sqlite://":
        return "sqlite+aiosqlite" + url[len("sqlite") :]
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    return url


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _turn_record(row: Any) -> TurnRecord:
    return TurnRecord(
        turn_id=TurnId(row.turn_id),
        session_id=SessionId(row.session_id),
        status=cast(TurnStatus, row.status),
        content=row.content,
        request_id=row.request_id,
        agent=row.agent,
        model=row.model,
        error_code=row.error_code,
        last_seq=row.last_seq,
        lease_epoch=row.lease_epoch,
        created_at=_aware(row.created_at),
        updated_at=_aware(row.updated_at),
    )


class SqlStore:
    """The Store on a SQLAlchemy async engine.

    `SqlStore.from_url(url)` owns its engine and disposes it on `close()`;
    `SqlStore(engine)` borrows one and never closes it. Use as an async context manager,
    or call `setup()` (creates missing tables) and `close()` yourself.
    """

    def __init__(
        self, engine: AsyncEngine, *, owns_engine: bool = False, clock: Clock | None = None
    ) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        self._clock = clock or SystemClock()
        name = engine.dialect.name
        if name == "sqlite":
            self._insert: Any = sqlite.insert
        elif name == "postgresql":
            self._insert = postgresql.insert
        else:
            raise StoreError(f"SqlStore supports SQLite and PostgreSQL, not {name!r}")

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> SqlStore:
        """A store that owns an engine made from `url` (`sqlite:///turnkit.db`, `postgresql://…`)."""
        full = normalize_url(url)
        if full.startswith("sqlite"):
            engine = create_async_engine(full, connect_args={"timeout": 30})
            _tune_sqlite(engine)
        else:
            engine = create_async_engine(full, pool_size=10, max_overflow=10, pool_pre_ping=True)
        return cls(engine, owns_engine=True, clock=clock)

    async def setup(self) -> None:
        """Create missing tables."""
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Dispose the engine if this store created it."""
        if self._owns_engine:
            self._owns_engine = False
            await self.engine.dispose()

    # ── writes ──────────────────────────────────────────────────────────────────────

    async def start_turn(self, turn: NewTurn) -> tuple[TurnRecord, bool]:
        """Write the session (if new) and the turn; a reused `request_id` returns the old turn."""
        now = self._clock.now()
        try:
            async with self.engine.begin() as conn:
                if turn.request_id is not None:
                    existing = await self._turn_by_request(conn, turn)
                    if existing is not None:
                        return existing, False
                await conn.execute(
                    self._insert(_sessions)
                    .values(session_id=turn.session_id, created_at=now, updated_at=now)
                    .on_conflict_do_nothing(index_elements=["session_id"])
                )
                await conn.execute(
                    _turns.insert().values(
                        turn_id=turn.turn_id,
                        session_id=turn.session_id,
                        status="running",
                        content=turn.content,
                        request_id=turn.request_id,
                        agent=turn.agent,
                        model=turn.model,
                        last_seq=0,
                        lease_epoch=1,
                        created_at=now,
                        updated_at=now,
                    )
                )
        except IntegrityError:
            # A concurrent request with the same request_id won the race: answer with its turn.
            async with self.engine.connect() as conn:
                existing = await self._turn_by_request(conn, turn)
            if existing is None:
                raise
            return existing, False
        record = await self.get_turn(turn.turn_id)
        assert record is not None
        return record, True

    async def _turn_by_request(self, conn: AsyncConnection, turn: NewTurn) -> TurnRecord | None:
        row = (
            await conn.execute(
                select(_turns).where(
                    _turns.c.session_id == turn.session_id,
                    _turns.c.request_id == turn.request_id,
                )
            )
        ).first()
        return _turn_record(row) if row is not None else None

    async def commit(
        self,
        turn_id: TurnId,
        *,
        epoch: int,
        events: Sequence[DurableEvent] = (),
        audit: Sequence[AuditRow] = (),
        status: TurnStatus | None = None,
        error_code: str | None = None,
    ) -> None:
        """Append events, audit rows (+ usage rollup) and a status move in one transaction."""
        top = max((e.seq for e in events), default=0)
        values: dict[str, Any] = {"updated_at": self._clock.now()}
        if top:
            values["last_seq"] = case((_turns.c.last_seq < top, top), else_=_turns.c.last_seq)
        condition = [_turns.c.turn_id == turn_id, _turns.c.lease_epoch == epoch]
        if status is not None:
            values["status"] = status
            values["error_code"] = error_code
            condition.append(_turns.c.status.in_(_SOURCES[status]))
        async with self.engine.begin() as conn:
            result = await conn.execute(update(_turns).where(*condition).values(**values))
            if result.rowcount != 1:
                await self._explain_refusal(conn, turn_id, epoch, status)
            if events:
                await conn.execute(
                    self._insert(_events).on_conflict_do_nothing(),
                    [
                        {"turn_id": turn_id, "seq": e.seq, "type": e.type, "data": encode_event(e)}  # type: ignore[attr-defined]
                        for e in events
                    ],
                )
            if audit:
                await self._write_audit(conn, turn_id, audit)

    async def _explain_refusal(
        self, conn: AsyncConnection, turn_id: TurnId, epoch: int, status: TurnStatus | None
    ) -> None:
        row = (
            await conn.execute(
                select(_turns.c.status, _turns.c.lease_epoch).where(_turns.c.turn_id == turn_id)
            )
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

    async def _write_audit(
        self, conn: AsyncConnection, turn_id: TurnId, audit: Sequence[AuditRow]
    ) -> None:
        await conn.execute(
            self._insert(_audit).on_conflict_do_nothing(),
            [
                {
                    "turn_id": turn_id,
                    "seq_within_turn": row.identity.seq_within_turn,
                    "session_id": row.identity.session_id,
                    "stage_id": row.identity.stage_id,
                    "data": row.model_dump_json(by_alias=True).encode(),
                }
                for row in audit
            ],
        )
        total = UsageDelta()
        for row in audit:
            delta = UsageDelta.of(row.call)
            total = UsageDelta(
                model_calls=total.model_calls + delta.model_calls,
                input_tokens=total.input_tokens + delta.input_tokens,
                output_tokens=total.output_tokens + delta.output_tokens,
                cached_tokens=total.cached_tokens + delta.cached_tokens,
                cost_usd=total.cost_usd + delta.cost_usd,
            )
        stmt = self._insert(_usage).values(
            turn_id=turn_id, session_id=audit[0].identity.session_id, **total.model_dump()
        )
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["turn_id"],
                set_={
                    name: getattr(_usage.c, name) + getattr(stmt.excluded, name)
                    for name in UsageDelta.model_fields
                },
            )
        )

    # ── reads ───────────────────────────────────────────────────────────────────────

    async def read_events(
        self, turn_id: TurnId, *, after_seq: int = 0, page_size: int = 500
    ) -> AsyncIterator[StoredEvent]:
        """Committed events after `after_seq`, in order, read in pages of `page_size`."""
        cursor = after_seq
        while True:
            async with self.engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(_events.c.seq, _events.c.type, _events.c.data)
                        .where(_events.c.turn_id == turn_id, _events.c.seq > cursor)
                        .order_by(_events.c.seq)
                        .limit(page_size)
                    )
                ).all()
            for row in rows:
                yield StoredEvent(turn_id=turn_id, seq=row.seq, type=row.type, data=bytes(row.data))
            if len(rows) < page_size:
                return
            cursor = rows[-1].seq

    async def get_turn(self, turn_id: TurnId) -> TurnRecord | None:
        """One turn, or None."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(_turns).where(_turns.c.turn_id == turn_id))).first()
        return _turn_record(row) if row is not None else None

    async def list_turns(self, session_id: SessionId) -> list[TurnRecord]:
        """A session's turns, oldest first."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(_turns)
                    .where(_turns.c.session_id == session_id)
                    .order_by(_turns.c.created_at, _turns.c.turn_id)
                )
            ).all()
        return [_turn_record(r) for r in rows]

    async def read_audit(self, turn_id: TurnId) -> list[AuditRow]:
        """A turn's audit rows in order."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(_audit.c.data)
                    .where(_audit.c.turn_id == turn_id)
                    .order_by(_audit.c.seq_within_turn)
                )
            ).all()
        return [AuditRow.model_validate_json(bytes(r.data)) for r in rows]

    async def read_usage(self, turn_id: TurnId) -> UsageDelta:
        """The turn's usage rollup (zeros when it made no call)."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(_usage).where(_usage.c.turn_id == turn_id))).first()
        if row is None:
            return UsageDelta()
        return UsageDelta.model_validate(
            {name: getattr(row, name) for name in UsageDelta.model_fields}
        )


def _tune_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()
