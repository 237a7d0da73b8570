"""Reads of turns and what they committed: records, event pages, audit rows, usage, stuck turns.

Each function runs inside one (read) transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, or_, select

from turnkit.audit import UsageDelta
from turnkit.ids import SessionId, TurnId
from turnkit.store import TurnRecord
from turnkit.store._schema import (
    audit as _audit,
    events as _events,
    turn_record as _turn_record,
    turns as _turns,
    usage as _usage,
)

__all__ = (
    "TURN_BY_ID",
    "audit_blobs",
    "event_page",
    "get_turn",
    "list_turns",
    "read_usage",
    "stuck_rows",
)

TURN_BY_ID = select(_turns).where(_turns.c.turn_id == bindparam("t_id"))


_EVENT_PAGE = (
    select(_events.c.seq, _events.c.type, _events.c.data)
    .where(_events.c.turn_id == bindparam("e_turn"), _events.c.seq > bindparam("e_after"))
    .order_by(_events.c.seq)
    .limit(bindparam("e_limit"))
)


def event_page(
    conn: Connection, turn_id: TurnId, after: int, limit: int
) -> list[tuple[int, str, bytes]]:
    rows = conn.execute(_EVENT_PAGE, {"e_turn": turn_id, "e_after": after, "e_limit": limit}).all()
    return [(r.seq, r.type, bytes(r.data)) for r in rows]


def get_turn(conn: Connection, turn_id: TurnId) -> TurnRecord | None:
    row = conn.execute(TURN_BY_ID, {"t_id": turn_id}).first()
    return _turn_record(row) if row is not None else None


_TURNS_OF_SESSION = (
    select(_turns)
    .where(_turns.c.session_id == bindparam("l_session"))
    .order_by(_turns.c.created_at, _turns.c.turn_id)
)


def list_turns(conn: Connection, session_id: SessionId) -> list[TurnRecord]:
    rows = conn.execute(_TURNS_OF_SESSION, {"l_session": session_id}).all()
    return [_turn_record(r) for r in rows]


def audit_blobs(conn: Connection, turn_id: TurnId) -> list[bytes]:
    rows = conn.execute(
        select(_audit.c.data).where(_audit.c.turn_id == turn_id).order_by(_audit.c.seq_within_turn)
    ).all()
    return [bytes(r.data) for r in rows]


def stuck_rows(conn: Connection, deadline: datetime, now: datetime) -> list[Any]:
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


def read_usage(conn: Connection, turn_id: TurnId) -> UsageDelta:
    row = conn.execute(select(_usage).where(_usage.c.turn_id == turn_id)).first()
    if row is None:
        return UsageDelta()
    return UsageDelta.model_validate({name: getattr(row, name) for name in UsageDelta.model_fields})
