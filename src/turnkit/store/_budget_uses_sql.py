"""Budget limits with what calls in flight hold against them, each list in one statement.

A check before a model call reads the limits covering its turn, each limit's count, and
the reservations of calls in flight that count against it. One statement reads them all,
so one snapshot sees a call committed meanwhile either in the count or as held, never in
both or neither (its commit adds to the count and releases its reservation together), and
PostgreSQL pays one round trip instead of one per limit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    CTE,
    Connection,
    Select,
    String,
    and_,
    bindparam,
    cast,
    func,
    literal,
    or_,
    select,
)

from turnkit.budgets import BudgetSubject
from turnkit.store._schema import budget_limits, reservations, sessions
from turnkit.store._sessions_sql import DELEGATION_DEPTH

__all__ = ("covering", "reported")


def covering(conn: Connection, subject: BudgetSubject, now: datetime) -> list[Any]:
    """The limits covering `subject`'s turn, with `held_usd` and `held_tokens`.

    An agent asked as a tool spends within the limits of the sessions that asked it.
    """
    values = {
        "org": subject.organisation,
        "department": subject.department,
        "principal": subject.principal,
        "session": subject.session_id,
        "now": now,
    }
    return list(conn.execute(_COVERING, values))


def reported(conn: Connection, organisation: str | None, now: datetime) -> list[Any]:
    """Every limit (of one organisation when given), with `held_usd` and `held_tokens`."""
    if organisation is None:
        return list(conn.execute(_EVERY, {"now": now}))
    return list(conn.execute(_OF_ORGANISATION, {"org": organisation, "now": now}))


def _asking_chain() -> CTE:
    """The subject's session and the sessions whose agents asked it, 16 levels up.

    Session ids are cast to one type: PostgreSQL wants a recursive term's columns typed
    as its first term's.
    """
    anchor = select(cast(bindparam("session"), String).label("sid"), literal(0).label("depth")).cte(
        "chain", recursive=True
    )
    up = select(cast(sessions.c.parent_session, String), anchor.c.depth + 1).where(
        sessions.c.session_id == anchor.c.sid,
        sessions.c.parent_session.is_not(None),
        anchor.c.depth < DELEGATION_DEPTH,
    )
    return anchor.union(up)


def _covering_limits() -> CTE:
    column = budget_limits.c
    chain = _asking_chain()
    return (
        select(budget_limits)
        .where(
            column.organisation == bindparam("org"),
            or_(
                and_(column.scope == "organisation", column.key == bindparam("org")),
                and_(column.scope == "department", column.key == bindparam("department")),
                and_(column.scope == "principal", column.key == bindparam("principal")),
                and_(column.scope == "session", column.key.in_(select(chain.c.sid))),
            ),
        )
        .cte("lim")
    )


def _with_held(lim: CTE) -> Select[Any]:
    """`lim`'s rows with what unexpired reservations hold against each, oldest key first.

    A session limit holds its session's reservations and those of the sessions its
    agents asked (in sessions of their own), 16 levels down.
    """
    anchor = (
        select(
            lim.c.key.label("root"), cast(lim.c.key, String).label("sid"), literal(0).label("depth")
        )
        .where(lim.c.scope == "session")
        .cte("delegated", recursive=True)
    )
    tree = anchor.union_all(
        select(anchor.c.root, cast(sessions.c.session_id, String), anchor.c.depth + 1).where(
            sessions.c.parent_session == anchor.c.sid, anchor.c.depth < DELEGATION_DEPTH
        )
    )
    held = reservations.c
    member = or_(
        and_(lim.c.scope == "organisation", held.organisation == lim.c.key),
        and_(lim.c.scope == "department", held.department == lim.c.key),
        and_(lim.c.scope == "principal", held.principal == lim.c.key),
        and_(
            lim.c.scope == "session",
            held.session_id.in_(select(tree.c.sid).where(tree.c.root == lim.c.key).correlate(lim)),
        ),
    )

    def total(column: Any, zero: Any) -> Any:
        return (
            select(func.coalesce(func.sum(column), zero))
            .where(
                held.organisation == lim.c.organisation,
                held.expires_at > bindparam("now"),
                member,
            )
            .scalar_subquery()
        )

    return select(
        lim,
        total(held.usd, 0.0).label("held_usd"),
        total(held.tokens, 0).label("held_tokens"),
    ).order_by(lim.c.organisation, lim.c.scope, lim.c.key)


# Built once, their values bound: building and compiling them cost more than running them.
_COVERING: Final = _with_held(_covering_limits())
_EVERY: Final = _with_held(select(budget_limits).cte("lim"))
_OF_ORGANISATION: Final = _with_held(
    select(budget_limits).where(budget_limits.c.organisation == bindparam("org")).cte("lim")
)
