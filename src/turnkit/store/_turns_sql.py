"""Reads of turns and what they committed: records, event pages, audit rows, usage, stuck turns.

Each function runs inside one (read) transaction on a sync `Connection` (see `SqlStore._tx`),
but `note_activity`: the stamp progress reported from outside a turn's driver leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, and_, bindparam, or_, select, update

from turnkit.audit import UsageDelta
from turnkit.ids import SessionId, TurnId
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import TurnProgress, TurnRecord
from turnkit.store._schema import (
    Fields,
    audit as _audit,
    aware as _aware,
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
    "get_turn_pg",
    "list_turns",
    "note_activity",
    "progress_of",
    "progress_pg",
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


_NOTE_ACTIVITY = (
    update(_turns)
    .where(_turns.c.turn_id == bindparam("a_turn"), _turns.c.status == "running")
    .values(updated_at=bindparam("a_now"))
)


def note_activity(conn: Connection, turn_id: TurnId, now: datetime) -> None:
    """Stamp a running turn's `updated_at` (a turn that is not running is left alone)."""
    conn.execute(_NOTE_ACTIVITY, {"a_turn": turn_id, "a_now": now})


def get_turn(conn: Connection, turn_id: TurnId) -> TurnRecord | None:
    row = conn.execute(TURN_BY_ID, {"t_id": turn_id}).first()
    return _turn_record(row) if row is not None else None


async def get_turn_pg(conn: Any, turn_id: TurnId) -> TurnRecord | None:
    """`get_turn` on PostgreSQL as one prepared statement on an asyncpg connection."""
    row = await conn.fetchrow("SELECT * FROM tk_turns WHERE turn_id = $1", turn_id)
    return _turn_record(Fields(row)) if row is not None else None


_PROGRESS_SLOTS = 32
"""Turns one progress statement reads (fewer are padded by repeating one)."""
_PROGRESS_KEYS = tuple(f"p{i}" for i in range(_PROGRESS_SLOTS))
_PROGRESS = select(
    _turns.c.turn_id,
    _turns.c.status,
    _turns.c.last_seq,
    _turns.c.attempts,
    _turns.c.lease_owner,
    _turns.c.lease_expires_at,
).where(_turns.c.turn_id.in_([bindparam(key) for key in _PROGRESS_KEYS]))


def progress_of(conn: Connection, turn_ids: Sequence[TurnId]) -> dict[TurnId, TurnProgress]:
    """Where each turn stands (unknown ones are left out), `_PROGRESS_SLOTS` a statement."""
    found: dict[TurnId, TurnProgress] = {}
    for start in range(0, len(turn_ids), _PROGRESS_SLOTS):
        chunk = turn_ids[start : start + _PROGRESS_SLOTS]
        params = {key: chunk[min(i, len(chunk) - 1)] for i, key in enumerate(_PROGRESS_KEYS)}
        for row in conn.execute(_PROGRESS, params):
            progress = _progress(*row)
            found[progress.turn_id] = progress
    return found


_PROGRESS_PG = """
SELECT turn_id, status, last_seq, attempts, lease_owner, lease_expires_at
FROM tk_turns WHERE turn_id = ANY($1::varchar[])
"""


async def progress_pg(conn: Any, turn_ids: Sequence[TurnId]) -> dict[TurnId, TurnProgress]:
    """`progress_of` on PostgreSQL as one prepared statement on an asyncpg connection."""
    rows = await conn.fetch(_PROGRESS_PG, list(turn_ids))
    return {progress.turn_id: progress for progress in (_progress(*row) for row in rows)}


def _progress(
    turn_id: str,
    status: str,
    last_seq: int,
    attempts: int,
    owner: str | None,
    expires: datetime | None,
) -> TurnProgress:
    return TurnProgress(
        turn_id=TurnId(turn_id),
        status=cast(TurnStatus, status),
        last_seq=last_seq,
        attempts=attempts,
        lease_owner=owner,
        lease_expires_at=_aware(expires),
    )


_TURNS_OF_SESSION = (
    select(_turns)
    .where(_turns.c.session_id == bindparam("l_session"))
    # The order the messages were committed in (the one turns are claimed in), not their
    # clocks': two processes, or two sends racing, may stamp a later message earlier.
    .order_by(_turns.c.input_seq, _turns.c.turn_id)
)


def list_turns(conn: Connection, session_id: SessionId) -> list[TurnRecord]:
    rows = conn.execute(_TURNS_OF_SESSION, {"l_session": session_id}).all()
    return [_turn_record(r) for r in rows]


def audit_blobs(conn: Connection, turn_id: TurnId) -> list[bytes]:
    rows = conn.execute(
        select(_audit.c.data).where(_audit.c.turn_id == turn_id).order_by(_audit.c.seq_within_turn)
    ).all()
    return [bytes(r.data) for r in rows]


def stuck_rows(
    conn: Connection, deadline: datetime, now: datetime, unclaimed_since: datetime
) -> list[Any]:
    """Running turns an operator should look at (see `stuck`).

    Past the ceiling, with no live driver, with attempts that died, or next in their
    session and left unclaimed since `unclaimed_since` (no worker runs).
    """
    before = _turns.alias("before")
    waits_behind = (
        select(before.c.turn_id)
        .where(
            before.c.session_id == _turns.c.session_id,
            before.c.input_seq < _turns.c.input_seq,  # the order turns are claimed in
            before.c.status.not_in(TERMINAL_STATES),
        )
        .exists()
    )
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
                and_(
                    _turns.c.attempts == 0,
                    _turns.c.updated_at < unclaimed_since,  # queued, or resumed, since
                    ~waits_behind,
                ),
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
