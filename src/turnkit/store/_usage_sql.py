"""Usage reports: the per-turn rollup grouped by session, principal or day."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from sqlalchemy import Connection, func, select

from turnkit.store._schema import sessions, turns, usage
from turnkit.store._usage import UsageLine
from turnkit.tenancy import DEFAULT_DEPARTMENT, DEFAULT_ORGANISATION

__all__ = ("report",)

GroupBy = Literal["session", "principal", "department", "day"]


def report(
    conn: Connection,
    by: GroupBy,
    principal: str | None,
    anonymous: bool,
    since: datetime | None,
    until: datetime | None,
    organisation: str | None = None,
) -> list[UsageLine]:
    """Sum the rollup of turns created in [since, until), for one principal or organisation."""
    key = {
        "session": usage.c.session_id,
        "principal": func.coalesce(sessions.c.principal, ""),
        "department": func.coalesce(turns.c.department, DEFAULT_DEPARTMENT),
        "day": func.date(turns.c.created_at),
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
            usage.join(turns, turns.c.turn_id == usage.c.turn_id).join(
                sessions, sessions.c.session_id == usage.c.session_id
            )
        )
        .group_by(key)
        .order_by(key)
    )
    if principal is not None:
        query = query.where(sessions.c.principal == principal)
    elif anonymous:
        query = query.where(sessions.c.principal.is_(None))
    if organisation is not None:
        query = query.where(
            func.coalesce(turns.c.organisation, DEFAULT_ORGANISATION) == organisation
        )
    if since is not None:
        query = query.where(turns.c.created_at >= since)
    if until is not None:
        query = query.where(turns.c.created_at < until)
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
