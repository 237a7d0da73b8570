"""Budget limits, what each has spent this period, and reservations for calls in flight."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, and_, delete, func, or_, select, text

from turnkit.budgets import (
    SCOPES,
    BudgetLimit,
    BudgetPeriod,
    BudgetScope,
    BudgetSubject,
    BudgetUse,
    period_start as window_start,
)
from turnkit.ids import uuid7
from turnkit.store._pauses_sql import SPENT_WHEN_ANSWERED
from turnkit.store._schema import aware, budget_limits, pauses, reservations, turns, usage
from turnkit.store._sessions_sql import asking, with_delegated
from turnkit.store._usage_sql import (
    attributed,
    spent_at,
    spent_by,
    spent_in,
    spent_organisation,
    turn_spend,
    with_turns,
)

__all__ = ("delete_limit", "limits", "release", "report", "reserve", "set_limit", "uses")


def set_limit(conn: Connection, insert: Any, limit: BudgetLimit, now: datetime) -> None:
    """Create or replace a limit."""
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
    query = select(budget_limits).order_by(
        budget_limits.c.organisation, budget_limits.c.scope, budget_limits.c.key
    )
    if organisation is not None:
        query = query.where(budget_limits.c.organisation == organisation)
    return [_limit(row) for row in conn.execute(query)]


def uses(conn: Connection, subject: BudgetSubject, now: datetime) -> list[BudgetUse]:
    """Each limit covering `subject`, with what its period has spent and holds reserved."""
    return [_use(conn, limit, now) for limit in _covering(conn, subject)]


def report(conn: Connection, organisation: str | None, now: datetime) -> list[BudgetUse]:
    """Every limit (of one organisation when given) with its current period's use."""
    return [_use(conn, limit, now) for limit in limits(conn, organisation)]


def reserve(
    conn: Connection,
    subject: BudgetSubject,
    *,
    turn_id: str,
    usd: float,
    tokens: int,
    ttl_s: float,
    now: datetime,
) -> tuple[str | None, list[BudgetUse]]:
    """Reserve `usd` and `tokens` against every covering limit, or refuse.

    The check and the reservation are one transaction, serialised per organisation (an
    advisory lock on PostgreSQL; SQLite serialises writers), so turns running at once
    cannot overspend together. Returns the reservation id (None: refused) and the uses.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:org))"),
            {"org": f"turnkit-budget:{subject.organisation}"},
        )
    # The turn's previous call is in the rollup by now: its reservation goes.
    release(conn, turn_id)
    found = _with_own_spend(conn, turn_id, uses(conn, subject, now), now)
    if not all(use.fits(usd, tokens) for use in found):
        return None, found
    reservation_id = f"res_{uuid7()}"
    conn.execute(
        reservations.insert().values(
            reservation_id=reservation_id,
            turn_id=turn_id,
            organisation=subject.organisation,
            department=subject.department,
            principal=subject.principal,
            session_id=subject.session_id,
            usd=usd,
            tokens=tokens,
            expires_at=now + timedelta(seconds=ttl_s),
        )
    )
    return reservation_id, found


def release(conn: Connection, turn_id: str) -> None:
    """Drop a turn's reservation (its calls' usage is in the rollup now)."""
    conn.execute(delete(reservations).where(reservations.c.turn_id == turn_id))


def _with_own_spend(
    conn: Connection, turn_id: str, found: list[BudgetUse], now: datetime
) -> list[BudgetUse]:
    """`found`, each counting what the turn spent in that limit's period.

    A turn's spend is dated by its start, yet one started before the period began (it
    waited for a person or a budget across midnight) spends in it too. Once a request of
    the turn was answered in the period, every use of the limit counts that (`_carried`);
    until then all of the turn's spend counts, and only in its own check.
    """
    row = conn.execute(select(turns.c.created_at).where(turns.c.turn_id == turn_id)).first()
    started = aware(row.created_at) if row is not None else None
    starts = [window_start(use.limit.period, now) for use in found]
    if started is None or not any(s is not None and started < s for s in starts):
        return found  # most calls: the turn began in every period that counts it
    total = turn_spend(conn, turn_id)
    if total is None:
        return found
    answers = [
        row.answered_at
        for row in conn.execute(
            select(pauses.c.answered_at).where(
                pauses.c.turn_id == turn_id, pauses.c.answered_at.is_not(None)
            )
        ).all()
    ]
    counted: list[BudgetUse] = []
    for use, start in zip(found, starts, strict=True):
        if start is None or started >= start or _answered_in(answers, start):
            counted.append(use)  # answered in the period: `_use` counted it (`_carried`)
            continue
        counted.append(
            replace(
                use, spent_usd=use.spent_usd + total[0], spent_tokens=use.spent_tokens + total[1]
            )
        )
    return counted


def _answered_in(answers: Sequence[Any], since: datetime) -> bool:
    """Whether a request of the turn was answered since `since`."""
    return any((at := aware(answered_at)) is not None and at >= since for answered_at in answers)


def _carried(
    conn: Connection, limit: BudgetLimit, member: Any, keys: list[str], start: datetime
) -> tuple[float, int]:
    """What turns begun before `start` spent in the period, counted from an answer.

    From the first answer to a request of theirs in the period: what each had spent then
    is in that answer's payload. Only a request asked before the period began says what a
    turn had spent by its start (it spent nothing while it waited); one asked in the
    period came after the turn spent in it, so all of that turn's spend counts, as for a
    turn never answered in it.
    """
    rows = conn.execute(
        select(
            usage.c.turn_id,
            usage.c.cost_usd,
            usage.c.input_tokens + usage.c.output_tokens,
            pauses.c.payload,
            pauses.c.created_at,
        )
        .select_from(with_turns.join(pauses, pauses.c.turn_id == usage.c.turn_id))
        .where(
            spent_organisation == limit.organisation,
            member.in_(keys),
            attributed,
            spent_at < start,
            pauses.c.answered_at >= start,
        )
        .order_by(usage.c.turn_id, pauses.c.answered_at)
    ).all()
    usd, tokens, seen = 0.0, 0, set()
    for turn_id, cost, total, payload_json, asked_at in rows:
        if turn_id in seen:
            continue  # its first answer in the period counts
        seen.add(turn_id)
        asked = aware(asked_at)
        waited = asked is not None and asked < start  # it waited from before the period
        spent = (json.loads(payload_json).get(SPENT_WHEN_ANSWERED) or {}) if waited else {}
        usd += max(0.0, float(cost) - float(spent.get("usd", 0.0)))
        tokens += max(0, int(total) - int(spent.get("tokens", 0)))
    return usd, tokens


def _covering(conn: Connection, subject: BudgetSubject) -> list[BudgetLimit]:
    # An agent asked as a tool spends within the limits of the sessions that asked it.
    members = [
        and_(budget_limits.c.scope == scope, budget_limits.c.key.in_(keys))
        for scope in SCOPES
        if (key := subject.key(scope)) is not None
        for keys in [asking(conn, key) if scope == "session" else [key]]
    ]
    query = select(budget_limits).where(
        budget_limits.c.organisation == subject.organisation, or_(*members)
    )
    return [_limit(row) for row in conn.execute(query)]


def _use(conn: Connection, limit: BudgetLimit, now: datetime) -> BudgetUse:
    start = window_start(limit.period, now)
    # A session spends with the agents its turns asked (in sessions of their own).
    keys = with_delegated(conn, [limit.key]) if limit.scope == "session" else [limit.key]
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
    if start is not None:  # turns begun before the period that went on in it spend in it too
        carried_usd, carried_tokens = _carried(conn, limit, member, keys, start)
        spent_usd, spent_tokens = spent_usd + carried_usd, spent_tokens + carried_tokens
    held = {
        "organisation": reservations.c.organisation,
        "department": reservations.c.department,
        "principal": reservations.c.principal,
        "session": reservations.c.session_id,
    }[limit.scope]
    held_usd, held_tokens = conn.execute(
        select(
            func.coalesce(func.sum(reservations.c.usd), 0.0),
            func.coalesce(func.sum(reservations.c.tokens), 0),
        ).where(
            reservations.c.organisation == limit.organisation,
            held.in_(keys),
            reservations.c.expires_at > now,
        )
    ).one()
    return BudgetUse(
        limit=limit,
        spent_usd=float(spent_usd),
        spent_tokens=int(spent_tokens),
        reserved_usd=float(held_usd),
        reserved_tokens=int(held_tokens),
    )


def _limit(row: Any) -> BudgetLimit:
    return BudgetLimit(
        scope=cast(BudgetScope, row.scope),
        organisation=row.organisation,
        key=row.key,
        period=cast(BudgetPeriod, row.period),
        usd=row.usd,
        tokens=row.tokens,
    )
