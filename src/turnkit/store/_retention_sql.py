"""Retention's statements: idle sessions found and deleted (each function is one transaction).

A session is idle since a cutoff when its row (every message, a rename) and each of its
turns (every commit, an ending, a Stop) last changed before the cutoff and no turn is
unfinished: running, queued or paused. A paused turn waits for a person, however long.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from turnkit.ids import SessionId, TurnId
from turnkit.store._retention import IdleSession
from turnkit.store._schema import UNFINISHED, aware, sessions, turns
from turnkit.store._sessions_sql import remove_many

__all__ = ("existing_turns", "idle", "remove_idle")


def _is_idle(idle_before: datetime) -> Any:
    """The condition on `tk_sessions` rows: idle since before `idle_before`."""
    busy = (
        select(turns.c.turn_id)
        .where(
            turns.c.session_id == sessions.c.session_id,
            or_(turns.c.status.in_(UNFINISHED), turns.c.updated_at >= idle_before),
        )
        .exists()
    )
    # A session an agent asked as a tool answered in goes with the session that asked it
    # (`remove_many`), never on its own: a session limit of that session counts its spend.
    asking = sessions.alias("asking")
    orphan = (
        ~select(asking.c.session_id)
        .where(asking.c.session_id == sessions.c.parent_session)
        .exists()
    )
    own = or_(sessions.c.parent_session.is_(None), orphan)
    return and_(sessions.c.updated_at < idle_before, ~busy, own)


def idle(
    conn: Connection, idle_before: datetime, limit: int, after: IdleSession | None
) -> list[IdleSession]:
    """Idle sessions, oldest `updated_at` first, past `after`, with their turns."""
    query = select(sessions.c.session_id, sessions.c.updated_at).where(_is_idle(idle_before))
    if after is not None:
        query = query.where(
            or_(
                sessions.c.updated_at > after.updated_at,
                and_(
                    sessions.c.updated_at == after.updated_at,
                    sessions.c.session_id > after.session_id,
                ),
            )
        )
    found = conn.execute(
        query.order_by(sessions.c.updated_at, sessions.c.session_id).limit(limit)
    ).all()
    if not found:
        return []
    ids = [row.session_id for row in found]
    owned: dict[str, list[tuple[str, datetime]]] = {sid: [] for sid in ids}
    for turn in conn.execute(
        select(turns.c.session_id, turns.c.turn_id, turns.c.updated_at)
        .where(turns.c.session_id.in_(ids))
        .order_by(turns.c.session_id, turns.c.input_seq, turns.c.created_at)
    ).all():
        owned[turn.session_id].append((turn.turn_id, _utc(turn.updated_at)))
    idle_sessions = []
    for row in found:
        updated = _utc(row.updated_at)
        its = owned[row.session_id]
        idle_sessions.append(
            IdleSession(
                session_id=SessionId(row.session_id),
                updated_at=updated,
                last_active=max([updated, *(at for _, at in its)]),
                turn_ids=tuple(TurnId(turn_id) for turn_id, _ in its),
            )
        )
    return idle_sessions


def remove_idle(
    conn: Connection, session_ids: Sequence[SessionId], idle_before: datetime
) -> list[SessionId]:
    """Delete those of `session_ids` still idle; the ones deleted.

    The sessions' rows are locked first (PostgreSQL), so a message committed meanwhile
    either lands before the check (its session is no longer idle: kept) or waits for
    this transaction and then opens the session anew.
    """
    if not session_ids:
        return []
    still = conn.execute(
        select(sessions.c.session_id)
        .where(sessions.c.session_id.in_(list(session_ids)), _is_idle(idle_before))
        .with_for_update(of=sessions)
    ).all()
    ids = [SessionId(row.session_id) for row in still]
    remove_many(conn, ids)
    return ids


def existing_turns(conn: Connection, turn_ids: Sequence[TurnId]) -> set[TurnId]:
    """Those of `turn_ids` that have a row."""
    if not turn_ids:
        return set()
    rows = conn.execute(select(turns.c.turn_id).where(turns.c.turn_id.in_(list(turn_ids))))
    return {TurnId(row.turn_id) for row in rows}


def _utc(value: datetime) -> datetime:
    found = aware(value)
    assert found is not None
    return found
