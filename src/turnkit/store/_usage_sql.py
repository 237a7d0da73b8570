"""Usage reports: the per-turn rollup grouped by session, principal or day."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from sqlalchemy import ColumnElement, Connection, func, or_, select

from turnkit.store._schema import sessions, turns, usage
from turnkit.store._usage import UsageLine
from turnkit.tenancy import DEFAULT_DEPARTMENT, DEFAULT_ORGANISATION

__all__ = (
    "attributed",
    "spent_at",
    "spent_by",
    "spent_in",
    "spent_organisation",
    "report",
    "with_turns",
)

# Who spent a rollup row and when: its turn's row, or, once a session is deleted with its
# turns, the copy its usage rows kept (see `_sessions_sql.remove`).
with_turns = usage.outerjoin(turns, turns.c.turn_id == usage.c.turn_id)
spent_organisation = func.coalesce(turns.c.organisation, usage.c.organisation, DEFAULT_ORGANISATION)
spent_in = func.coalesce(turns.c.department, usage.c.department, DEFAULT_DEPARTMENT)
spent_by = func.coalesce(turns.c.principal, usage.c.principal)
spent_at: ColumnElement[datetime] = func.coalesce(turns.c.created_at, usage.c.created_at)
attributed = or_(turns.c.turn_id.is_not(None), usage.c.created_at.is_not(None))
"""Rollups of sessions deleted before usage rows kept who spent say nothing: left out."""

GroupBy = Literal["session", "principal", "department", "day"]


def _in_utc(conn: Connection, moment: ColumnElement[datetime]) -> ColumnElement[datetime]:
    """`moment` as a UTC wall-clock time (SQLite stores UTC already).

    PostgreSQL's `date()` of a `timestamptz` takes the session's TimeZone (a server or
    database default), not UTC.
    """
    if conn.dialect.name == "postgresql":
        return func.timezone("UTC", moment)
    return moment


def report(
    conn: Connection,
    by: GroupBy,
    principal: str | None,
    anonymous: bool,
    since: datetime | None,
    until: datetime | None,
    organisation: str | None = None,
) -> list[UsageLine]:
    """Sum the rollup of turns created in [since, until), for one principal or organisation.

    A turn counts for the principal it ran for, as in budgets (a turn with none: for its
    session's owner); with `principal` and `organisation` both given, only that
    organisation's principal of that id.
    """
    owner = func.coalesce(spent_by, sessions.c.principal)
    key = {
        "session": usage.c.session_id,
        "principal": func.coalesce(owner, ""),
        "department": spent_in,
        "day": func.date(_in_utc(conn, spent_at)),
    }[by]
    query = (
        select(
            key.label("key"),
            func.count(usage.c.turn_id),
            func.sum(usage.c.model_calls),
            func.sum(usage.c.input_tokens),
            func.sum(usage.c.output_tokens),
            func.sum(usage.c.cached_tokens),
            func.sum(usage.c.cost_usd),
        )
        .select_from(
            # Through the turn: a deleted session's id may name a new session now.
            with_turns.outerjoin(sessions, sessions.c.session_id == turns.c.session_id)
        )
        .where(attributed)
        .group_by(key)
        .order_by(key)
    )
    if principal is not None:
        query = query.where(owner == principal)
    elif anonymous:
        query = query.where(owner.is_(None))
    if organisation is not None:
        query = query.where(spent_organisation == organisation)
    if since is not None:
        query = query.where(spent_at >= since)
    if until is not None:
        query = query.where(spent_at < until)
    return [
        UsageLine(
            key=row[0].isoformat() if isinstance(row[0], date) else str(row[0]),
            turns=int(row[1] or 0),
            model_calls=int(row[2] or 0),
            input_tokens=int(row[3] or 0),
            output_tokens=int(row[4] or 0),
            cached_tokens=int(row[5] or 0),
            cost_usd=float(row[6] or 0.0),
        )
        for row in conn.execute(query)
    ]
