"""Budget limits, what each has spent this period, and reservations for calls in flight."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import Connection, bindparam, delete, func, select, text, update

from turnkit.budgets import (
    BudgetLimit,
    BudgetPeriod,
    BudgetScope,
    BudgetSubject,
    BudgetUse,
    period_start as window_start,
)
from turnkit.ids import uuid7
from turnkit.store._budget_counts import period_key
from turnkit.store._budget_uses_sql import covering, reported
from turnkit.store._schema import budget_limits, reservations, turns, usage
from turnkit.store._sessions_sql import with_delegated
from turnkit.store._usage_sql import (
    attributed,
    spent_at,
    spent_by,
    spent_in,
    spent_organisation,
    with_turns,
)

__all__ = (
    "CountNeeded",
    "delete_limit",
    "limits",
    "release",
    "report",
    "reserve",
    "set_limit",
    "uses",
)


class CountNeeded(Exception):
    """A covering limit counts nothing yet, and the caller asked not to scan for it.

    Starting a count sums the period's history: not something to do on the event loop.
    """


def set_limit(conn: Connection, insert: Any, limit: BudgetLimit, now: datetime) -> None:
    """Create or replace a limit."""
    found = conn.execute(select(budget_limits.c.spent_period).where(*_key(limit))).first()
    if found is not None and found.spent_period is None:
        _hold_usage(conn)  # before the upsert locks a row a commit may be waiting for
    values = {
        "scope": limit.scope,
        "organisation": limit.organisation,
        "key": limit.key,
        "period": limit.period,
        "usd": limit.usd,
        "tokens": limit.tokens,
        "updated_at": now,
    }
    conn.execute(
        insert(budget_limits)
        .values(**values)
        .on_conflict_do_update(
            index_elements=["scope", "organisation", "key", "period"],
            set_={"usd": limit.usd, "tokens": limit.tokens, "updated_at": now},
        )
    )
    _start_count(conn, limit, now)


def delete_limit(
    conn: Connection, scope: BudgetScope, organisation: str, key: str, period: BudgetPeriod
) -> bool:
    """Remove a limit; whether there was one."""
    result = conn.execute(
        delete(budget_limits).where(
            budget_limits.c.scope == scope,
            budget_limits.c.organisation == organisation,
            budget_limits.c.key == (organisation if scope == "organisation" else key),
            budget_limits.c.period == period,
        )
    )
    return bool(result.rowcount)


def limits(conn: Connection, organisation: str | None) -> list[BudgetLimit]:
    """Every limit (of one organisation when given)."""
    return [_limit(row) for row in _rows(conn, organisation)]


def uses(
    conn: Connection, subject: BudgetSubject, now: datetime, *, scan: bool = True
) -> list[BudgetUse]:
    """Each limit covering `subject`, with what its period has spent and holds reserved.

    `scan=False`: raise `CountNeeded` rather than sum the history of an uncounted limit.
    """
    return [_use(conn, row, now) for row in _counted(covering(conn, subject, now), scan)]


def report(conn: Connection, organisation: str | None, now: datetime) -> list[BudgetUse]:
    """Every limit (of one organisation when given) with its current period's use."""
    return [_use(conn, row, now) for row in reported(conn, organisation, now)]


def _rows(conn: Connection, organisation: str | None) -> list[Any]:
    query = select(budget_limits).order_by(
        budget_limits.c.organisation, budget_limits.c.scope, budget_limits.c.key
    )
    if organisation is not None:
        query = query.where(budget_limits.c.organisation == organisation)
    return list(conn.execute(query))


def reserve(
    conn: Connection,
    subject: BudgetSubject,
    *,
    turn_id: str,
    usd: float,
    tokens: int,
    ttl_s: float,
    now: datetime,
    scan: bool = True,
) -> tuple[str | None, list[BudgetUse]]:
    """Reserve `usd` and `tokens` against every covering limit, or refuse.

    The check and the reservation are one transaction, serialised per organisation (an
    advisory lock on PostgreSQL; SQLite serialises writers), so turns running at once
    cannot overspend together. Returns the reservation id (None: refused) and the uses.
    `scan=False`: raise `CountNeeded` rather than start a limit's count.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(_ORGANISATION_LOCK, {"org": f"turnkit-budget:{subject.organisation}"})
    # The turn's previous call is in the rollup by now: its reservation goes.
    release(conn, turn_id)
    rows = _counted(covering(conn, subject, now), scan)
    if any(row.spent_period is None for row in rows):
        for row in rows:
            _start_count(conn, row, now)
        rows = covering(conn, subject, now)  # with the counts just started
    found = [_use(conn, row, now) for row in rows]
    if not all(use.fits(usd, tokens) for use in found):
        return None, found
    reservation_id = f"res_{uuid7()}"
    conn.execute(
        _RESERVE,
        {
            "reservation_id": reservation_id,
            "turn_id": turn_id,
            "organisation": subject.organisation,
            "department": subject.department,
            "principal": subject.principal,
            "session_id": subject.session_id,
            "usd": usd,
            "tokens": tokens,
            "expires_at": now + timedelta(seconds=ttl_s),
        },
    )
    return reservation_id, found


def release(conn: Connection, turn_id: str) -> None:
    """Drop a turn's reservation (its calls' usage is in the rollup now)."""
    conn.execute(_RELEASE, {"turn_id": turn_id})


# The statements a check before every model call runs are built once, their values bound:
# building and compiling them afresh cost more than running them.
_ORGANISATION_LOCK: Final = text("SELECT pg_advisory_xact_lock(hashtext(:org))")
_RESERVE: Final = reservations.insert()
_RELEASE: Final = delete(reservations).where(reservations.c.turn_id == bindparam("turn_id"))


def _counted(rows: list[Any], scan: bool) -> list[Any]:
    if not scan and any(row.spent_period is None for row in rows):
        raise CountNeeded
    return rows


def _use(conn: Connection, row: Any, now: datetime) -> BudgetUse:
    """`row`'s limit with what its current period spent (its count, else a scan)."""
    limit = _limit(row)
    if row.spent_period is None:
        spent_usd, spent_tokens = _scan(conn, limit, now)
    elif row.spent_period >= period_key(limit.period, now):  # a clock ahead counts too
        spent_usd, spent_tokens = row.spent_usd, row.spent_tokens
    else:
        spent_usd, spent_tokens = 0.0, 0  # a new period: nothing counted in it yet
    return BudgetUse(
        limit=limit,
        spent_usd=float(spent_usd),
        spent_tokens=int(spent_tokens),
        reserved_usd=float(row.held_usd),
        reserved_tokens=int(row.held_tokens),
    )


def _members(conn: Connection, limit: BudgetLimit) -> list[str]:
    # A session spends with the agents its turns asked (in sessions of their own).
    return with_delegated(conn, [limit.key]) if limit.scope == "session" else [limit.key]


def _scan(conn: Connection, limit: BudgetLimit, now: datetime) -> tuple[float, int]:
    """What the rollup says `limit`'s current period spent (each turn dated by its start)."""
    start = window_start(limit.period, now)
    keys = _members(conn, limit)
    member = {
        "organisation": spent_organisation,
        "department": spent_in,
        "principal": spent_by,
        "session": turns.c.session_id,  # a session deleted is gone: its id may be reused
    }[limit.scope]
    spent_q = (
        select(
            func.coalesce(func.sum(usage.c.cost_usd), 0.0),
            func.coalesce(func.sum(usage.c.input_tokens + usage.c.output_tokens), 0),
        )
        .select_from(with_turns)
        .where(spent_organisation == limit.organisation, member.in_(keys), attributed)
    )
    if start is not None:
        spent_q = spent_q.where(spent_at >= start)
    spent_usd, spent_tokens = conn.execute(spent_q).one()
    return float(spent_usd), int(spent_tokens)


def _start_count(conn: Connection, row: Any, now: datetime) -> None:
    """Count what `row`'s limit spent this period, so commits add to it from now on.

    `row` is a limit's row or a `BudgetLimit`; a limit counting already is left. On
    PostgreSQL commits recording usage are held off first (`_hold_usage`), then the row
    is locked: each call is in the scan or adds to the count, never both or neither.
    """
    key = _key(row)
    found = conn.execute(select(budget_limits.c.spent_period).where(*key)).first()
    if found is None or found.spent_period is not None:
        return  # deleted meanwhile, or counting already
    _hold_usage(conn)
    locked = conn.execute(select(budget_limits).where(*key).with_for_update()).first()
    if locked is None or locked.spent_period is not None:
        return  # deleted meanwhile, or another process counted it
    limit = _limit(locked)
    usd, tokens = _scan(conn, limit, now)
    conn.execute(
        update(budget_limits)
        .where(*key)
        .values(spent_usd=usd, spent_tokens=tokens, spent_period=period_key(limit.period, now))
    )


def _hold_usage(conn: Connection) -> None:
    """Wait for every commit writing usage to end, and hold new ones off (PostgreSQL).

    A commit in flight may have taken its snapshot before a new limit's row was written:
    its count step does not see the row, so the limit's first scan must see its usage.
    Under READ COMMITTED the scan only sees committed rows: this lock (it conflicts with
    the commit's, taken before its snapshot) makes the scan come after every such commit,
    and any later commit take its snapshot after the row is in.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE tk_usage IN SHARE MODE"))


def _key(row: Any) -> tuple[Any, ...]:
    column = budget_limits.c
    return (
        column.scope == row.scope,
        column.organisation == row.organisation,
        column.key == row.key,
        column.period == row.period,
    )


def _limit(row: Any) -> BudgetLimit:
    # As stored: a row an older turnkit let past today's checks still reads.
    return BudgetLimit.model_construct(
        scope=cast(BudgetScope, row.scope),
        organisation=row.organisation,
        key=row.key,
        period=cast(BudgetPeriod, row.period),
        usd=row.usd,
        tokens=row.tokens,
    )
