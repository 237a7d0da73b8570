"""The session directory side of `SqlStore` (each function runs in one transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)

from turnkit.errors import SessionNotFoundError
from turnkit.ids import SessionId
from turnkit.store import SessionRecord
from turnkit.store._schema import (
    Fields,
    aware,
    budget_limits,
    events,
    inputs,
    pauses,
    reservations,
    sessions,
    transcripts,
    turns,
    usage,
    workspace_files,
)

__all__ = (
    "DELEGATION_DEPTH",
    "create",
    "delegated",
    "get",
    "get_pg",
    "list_",
    "remove",
    "remove_many",
    "rename",
    "visible",
    "with_delegated",
)


def _record(row: Any) -> SessionRecord:
    created, updated = aware(row.created_at), aware(row.updated_at)
    assert created is not None
    assert updated is not None
    return SessionRecord(
        session_id=SessionId(row.session_id),
        principal=row.principal,
        organisation=row.organisation,
        parent_session=row.parent_session,
        title=row.title,
        last_input_seq=row.last_input_seq,
        created_at=created,
        updated_at=updated,
    )


_SESSION = select(sessions).where(sessions.c.session_id == bindparam("s_id"))


def get(conn: Connection, session_id: SessionId) -> SessionRecord | None:
    """One session."""
    row = conn.execute(_SESSION, {"s_id": session_id}).first()
    return _record(row) if row is not None else None


async def get_pg(conn: Any, session_id: SessionId) -> SessionRecord | None:
    """`get` on PostgreSQL as one prepared statement on an asyncpg connection."""
    row = await conn.fetchrow("SELECT * FROM tk_sessions WHERE session_id = $1", session_id)
    return _record(Fields(row)) if row is not None else None


def create(
    conn: Connection,
    insert: Any,
    session_id: SessionId,
    owner: tuple[str | None, str | None],
    title: str | None,
    now: datetime,
    parent: SessionId | None = None,
) -> SessionRecord:
    """Insert if missing; return the session (`is_new`: this call inserted it).

    `owner`: its principal and organisation.
    """
    inserted = conn.execute(
        insert(sessions)
        .values(
            session_id=session_id,
            principal=owner[0],
            organisation=owner[1],
            parent_session=parent,
            title=title,
            last_input_seq=0,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["session_id"])
    )
    found = get(conn, session_id)
    assert found is not None
    return replace(found, is_new=inserted.rowcount == 1)


def list_(
    conn: Connection, owner: tuple[str | None, str | None], anonymous: bool, limit: int
) -> list[SessionRecord]:
    """Newest first; `owner`'s (a principal and, when given, its organisation) only.

    An organisation with no principal: the sessions owned in that organisation. A
    delegated agent's session (one with a parent) is not listed.
    """
    principal, organisation = owner
    query = (
        select(sessions)
        .where(sessions.c.parent_session.is_(None))
        .order_by(sessions.c.updated_at.desc())
        .limit(limit)
    )
    if principal is not None:
        query = query.where(sessions.c.principal == principal)
        if organisation is not None:
            query = query.where(
                or_(sessions.c.organisation.is_(None), sessions.c.organisation == organisation)
            )
    elif anonymous:
        query = query.where(sessions.c.principal.is_(None))
    elif organisation is not None:
        query = query.where(sessions.c.organisation == organisation)
    return [_record(r) for r in conn.execute(query).all()]


def visible(caller: tuple[str | None, str | None]) -> ColumnElement[bool]:
    """The sessions `caller` (a principal and its organisation) may see, as a condition.

    The same rule as `SessionRecord.visible_to`: nobody's, or the principal's in its
    organisation (or in none).
    """
    principal, organisation = caller
    if principal is None:
        return sessions.c.principal.is_(None)
    in_organisation: ColumnElement[bool] = sessions.c.organisation.is_(None)
    if organisation is not None:
        in_organisation = or_(in_organisation, sessions.c.organisation == organisation)
    return or_(
        sessions.c.principal.is_(None),
        and_(sessions.c.principal == principal, in_organisation),
    )


def rename(
    conn: Connection,
    session_id: SessionId,
    title: str,
    now: datetime,
    caller: tuple[str | None, str | None] | None = None,
) -> SessionRecord:
    """Set the title; only if `caller` may see the session, when given (in this statement)."""
    query = update(sessions).where(sessions.c.session_id == session_id)
    if caller is not None:
        query = query.where(visible(caller))
    done = conn.execute(query.values(title=title, updated_at=now))
    if done.rowcount != 1:
        raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
    found = get(conn, session_id)
    assert found is not None
    return found


def name_if(
    conn: Connection, session_id: SessionId, title: str, current: str | None, now: datetime
) -> bool:
    """Set the title only while it is still `current` (None: unnamed); whether it did."""
    params: dict[str, object] = {"n_session": session_id, "title": title, "updated_at": now}
    if current is None:
        done = conn.execute(_NAME_UNNAMED, params)
    else:
        done = conn.execute(_RENAME_FROM, {**params, "n_current": current})
    return bool(done.rowcount == 1)


# Built once (bound parameters): a statement per call would be compiled every time.
_NAMED = update(sessions).where(sessions.c.session_id == bindparam("n_session"))
_NAME_UNNAMED = _NAMED.where(sessions.c.title.is_(None))
_RENAME_FROM = _NAMED.where(sessions.c.title == bindparam("n_current"))


def _of_turn(column: Any) -> Any:
    return select(column).where(turns.c.turn_id == usage.c.turn_id).scalar_subquery()


def _spent_for() -> Any:
    """Who a deleted turn spent for in usage reports.

    Its principal, else its session's owner, as `_usage_sql.report` reads it while the
    session is there.
    """
    owner = (
        select(sessions.c.principal)
        .where(sessions.c.session_id == turns.c.session_id)
        .scalar_subquery()
    )
    return (
        select(func.coalesce(turns.c.principal, owner))
        .where(turns.c.turn_id == usage.c.turn_id)
        .scalar_subquery()
    )


def _keep_attribution(session_ids: Sequence[str]) -> Any:
    """The sessions' usage rows take over who spent and when from their turns, before those go.

    Only rows whose turns go now: those of an earlier session by the same id keep theirs.
    """
    return (
        update(usage)
        .where(
            usage.c.turn_id.in_(select(turns.c.turn_id).where(turns.c.session_id.in_(session_ids)))
        )
        .values(
            {
                **{
                    name: _of_turn(getattr(turns.c, name))
                    for name in ("organisation", "department", "created_at")
                },
                "principal": _spent_for(),
            }
        )
    )


DELEGATION_DEPTH: Final = 16
"""How deep delegated sessions are followed: when their asking session is deleted, and up
to the limits of the sessions that asked (budgets)."""


def delegated(conn: Connection, session_id: SessionId) -> list[SessionId]:
    """The sessions delegated agents answered in for `session_id`, up to 16 levels deep."""
    return [SessionId(s) for s in with_delegated(conn, [session_id])[1:]]


@lru_cache(maxsize=32)
def _children(parents: int) -> Select[Any]:
    """The sessions whose agents `parents` sessions asked (built once per count)."""
    parent = sessions.c.parent_session
    return select(sessions.c.session_id).where(
        parent.in_([bindparam(f"p{i}") for i in range(parents)])
    )


def with_delegated(conn: Connection, ids: list[str]) -> list[str]:
    """`ids` and the sessions delegated agents answered in for them, up to 16 levels deep."""
    found, frontier = list(ids), ids
    for _ in range(DELEGATION_DEPTH):
        values = {f"p{i}": parent for i, parent in enumerate(frontier)}
        frontier = [row.session_id for row in conn.execute(_children(len(frontier)), values)]
        if not frontier:
            break
        found.extend(frontier)
    return found


def remove(
    conn: Connection,
    session_id: SessionId,
    caller: tuple[str | None, str | None] | None = None,
) -> bool:
    """Delete the session, its chat data and files; audit rows have their own retention.

    The session's row is locked first (PostgreSQL), as retention does: a message committed
    meanwhile either lands before the delete reads the session's turns (and goes with
    them) or waits for it and then opens the session anew. Never a turn left without its
    session. With `caller`, nothing is deleted (False) unless it may see the session, as
    the locked row says.
    """
    query = select(sessions.c.session_id).where(sessions.c.session_id == session_id)
    if caller is not None:
        query = query.where(visible(caller))
    if not conn.execute(query.with_for_update(of=sessions)).all() and caller is not None:
        return False
    return remove_many(conn, [session_id]) == 1


def remove_many(conn: Connection, session_ids: Sequence[str]) -> int:
    """`remove` for many sessions at once; how many sessions were there to delete."""
    if not session_ids:
        return 0
    ids = with_delegated(conn, list(session_ids))
    turn_ids = select(turns.c.turn_id).where(turns.c.session_id.in_(ids))
    # The turns' rows first (PostgreSQL), as every writer of a turn takes them: an answer
    # holds its turn's row and then updates its pause, so a delete that took the pause
    # first deadlocked with it.
    conn.execute(turn_ids.order_by(turns.c.turn_id).with_for_update(of=turns)).all()
    conn.execute(_keep_attribution(ids))
    # Their spend leaves their session limits' counts (a reused id starts afresh).
    conn.execute(
        update(budget_limits)
        .where(budget_limits.c.scope == "session", budget_limits.c.key.in_(ids))
        .values(spent_usd=0.0, spent_tokens=0)
    )
    conn.execute(delete(events).where(events.c.turn_id.in_(turn_ids)))
    # A dead driver's reservation would outlive its turn until it expires (the ceiling).
    conn.execute(delete(reservations).where(reservations.c.turn_id.in_(turn_ids)))
    conn.execute(delete(pauses).where(pauses.c.session_id.in_(ids)))
    conn.execute(delete(transcripts).where(transcripts.c.session_id.in_(ids)))
    conn.execute(delete(turns).where(turns.c.session_id.in_(ids)))
    conn.execute(delete(inputs).where(inputs.c.session_id.in_(ids)))
    conn.execute(delete(workspace_files).where(workspace_files.c.session_id.in_(ids)))
    gone = conn.execute(delete(sessions).where(sessions.c.session_id.in_(ids[: len(session_ids)])))
    conn.execute(delete(sessions).where(sessions.c.session_id.in_(ids[len(session_ids) :])))
    return int(gone.rowcount)
