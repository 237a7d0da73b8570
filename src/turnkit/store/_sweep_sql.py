"""The sweep: end running turns no driver will finish (past the ceiling, out of attempts).

Each function runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, or_, select, update

from turnkit.events import DoneEvent, ErrorEvent
from turnkit.ids import TurnId
from turnkit.store._budgets_sql import release
from turnkit.store._cancel_sql import stop_asked
from turnkit.store._jobs_sql import cut_jobs
from turnkit.store._lease_sql import spent_after_claim
from turnkit.store._schema import event_values, events, turns

__all__ = ("Orphan", "orphan", "sweep", "sweepable")


@dataclass(frozen=True, slots=True)
class Orphan:
    """A running turn the sweep may end, as it was when found."""

    turn_id: str
    session_id: str
    lease_epoch: int
    last_seq: int
    past_ceiling: bool = False
    """Ended whoever holds it; otherwise only while no driver holds a live lease."""


def sweepable(
    conn: Connection, *, now: datetime, ceiling_s: float, max_attempts: int
) -> list[Orphan]:
    """Running turns nobody can finish: past the ceiling, or out of attempts and unleased."""
    deadline = now - timedelta(seconds=ceiling_s)
    past = and_(turns.c.started_at.is_not(None), turns.c.started_at < deadline)
    rows = conn.execute(
        select(
            turns.c.turn_id, turns.c.session_id, turns.c.lease_epoch, turns.c.last_seq, past
        ).where(
            turns.c.status == "running",
            or_(
                and_(turns.c.started_at.is_not(None), turns.c.started_at < deadline),
                and_(
                    spent_after_claim() >= max_attempts,
                    or_(turns.c.lease_owner.is_(None), turns.c.lease_expires_at < now),
                ),
            ),
        )
    ).all()
    return [Orphan(r.turn_id, r.session_id, r.lease_epoch, r.last_seq, bool(r[4])) for r in rows]


def orphan(conn: Connection, turn_id: TurnId) -> Orphan | None:
    """The turn as the sweep needs it, if it is running."""
    r = conn.execute(
        select(turns.c.turn_id, turns.c.session_id, turns.c.lease_epoch, turns.c.last_seq).where(
            turns.c.turn_id == turn_id, turns.c.status == "running"
        )
    ).first()
    return Orphan(r.turn_id, r.session_id, r.lease_epoch, r.last_seq) if r is not None else None


def sweep(conn: Connection, row: Orphan, now: datetime, reason: str) -> bool:
    """Time one orphaned turn out: bump its epoch, append `error` + `done`. False if it moved.

    A job its dead driver left running is completed first, as an error; the turns of the
    agents it asked as tools are stopped (`stop_asked`).
    """
    common: dict[str, Any] = {
        "session_id": row.session_id,
        "turn_id": row.turn_id,
        "ts": now,
    }
    jobs = cut_jobs(conn, TurnId(row.turn_id), row.last_seq + 1, common)
    seq = row.last_seq + 1 + len(jobs)
    won = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == row.turn_id,
            turns.c.lease_epoch == row.lease_epoch,
            turns.c.last_seq == row.last_seq,
            turns.c.status == "running",
            # Judged in an earlier transaction (or by a reader): a driver that renewed or
            # took the turn over since then holds a live lease, and keeps the turn.
            *(
                ()
                if row.past_ceiling
                else (or_(turns.c.lease_owner.is_(None), turns.c.lease_expires_at <= now),)
            ),
        )
        .values(
            status="timed_out",
            error_code="deadline-exceeded",
            lease_epoch=row.lease_epoch + 1,
            lease_owner=None,
            last_seq=seq + 1,
            updated_at=now,
        )
    )
    if won.rowcount != 1:
        return False
    release(conn, row.turn_id)  # its driver is gone: its last call's hold would stay
    common["stage_id"] = "runtime"
    error = ErrorEvent(seq=seq, code="deadline-exceeded", message=reason, **common)
    done = DoneEvent(seq=seq + 1, status="timed_out", error_code="deadline-exceeded", **common)
    conn.execute(events.insert(), [event_values(row.turn_id, e) for e in (*jobs, error, done)])
    stop_asked(conn, TurnId(row.turn_id), now)
    return True
