"""What each budget limit's current period has spent, counted on the limit's row.

A model call's commit adds its spend to every limit covering its turn (`ADD_SPEND`, or
the `counted` step of the PostgreSQL commit statement), dated by the call, not by its
turn's start: checking a limit reads one row however long the history, and a turn that
goes on past midnight spends in the new day. A limit's count is `NULL` until a write
transaction first needs it (`_budgets_sql._start_count`, from a scan of the usage
rollup); commits leave a `NULL` count alone and readers scan instead.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import text

from turnkit.budgets import BudgetPeriod, period_start
from turnkit.store._sessions_sql import DELEGATION_DEPTH
from turnkit.tenancy import DEFAULT_DEPARTMENT, DEFAULT_ORGANISATION

__all__ = ("CHAIN_PG", "COUNTED_PG", "ADD_SPEND", "period_key", "spend_params")


def period_key(period: BudgetPeriod, now: datetime) -> str:
    """The period containing `now` as a count names it (`2026-12-06`, `2026-12`, `total`)."""
    start = period_start(period, now)
    if start is None:
        return "total"
    return start.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def _chain(turn: str) -> str:
    """The turn's session and those whose agents asked it, 16 levels up, in SQL."""
    return f"""chain(session_id, depth) AS (
    SELECT session_id, 0 FROM tk_turns WHERE turn_id = {turn}
    UNION ALL
    SELECT s.parent_session, c.depth + 1
    FROM tk_sessions s JOIN chain c ON s.session_id = c.session_id
    WHERE s.parent_session IS NOT NULL AND c.depth < {DELEGATION_DEPTH}
)"""


def _update(turn: str, usd: str, tokens: str, day: str, month: str, source: str) -> str:
    """Add `usd` and `tokens` to each counted limit covering `turn`, rolling periods over.

    Only forward: a process whose clock is a little behind (still before midnight, when
    another's count is of the new day) adds to the newer count instead of starting the
    old period's again (period keys sort as they follow each other).
    """
    now = f"CASE period WHEN 'day' THEN {day} WHEN 'month' THEN {month} ELSE 'total' END"
    return f"""UPDATE tk_budget_limits SET
    spent_usd = CASE WHEN spent_period IS NULL THEN spent_usd
        WHEN spent_period >= {now} THEN spent_usd + {usd} ELSE {usd} END,
    spent_tokens = CASE WHEN spent_period IS NULL THEN spent_tokens
        WHEN spent_period >= {now} THEN spent_tokens + {tokens} ELSE {tokens} END,
    spent_period = CASE WHEN spent_period IS NULL OR spent_period >= {now} THEN spent_period
        ELSE {now} END
{source}
WHERE t.turn_id = {turn}
    AND tk_budget_limits.organisation = COALESCE(t.organisation, '{DEFAULT_ORGANISATION}')
    AND (tk_budget_limits.scope = 'organisation'
        OR tk_budget_limits.scope = 'department'
            AND tk_budget_limits.key = COALESCE(t.department, '{DEFAULT_DEPARTMENT}')
        OR tk_budget_limits.scope = 'principal' AND tk_budget_limits.key = t.principal
        OR tk_budget_limits.scope = 'session'
            AND tk_budget_limits.key IN (SELECT session_id FROM chain))"""


ADD_SPEND = text(
    f"WITH RECURSIVE {_chain(':c_turn')}\n"
    + _update(":c_turn", ":c_usd", ":c_tokens", ":c_day", ":c_month", "FROM tk_turns t")
)
"""One call's spend (`c_usd`, `c_tokens`) added to the counts of the limits covering
its turn (`c_turn`) in the periods of `c_day` and `c_month` (`spend_params`)."""

CHAIN_PG: Final = _chain("$1")
"""The PostgreSQL commit statement's delegation chain of its turn (`WITH RECURSIVE`)."""

COUNTED_PG: Final = _update(
    "$1",
    "d.usd",
    "d.tokens",
    "to_char($3::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "to_char($3::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM')",
    "FROM tk_turns t, spent d",
)
"""The PostgreSQL commit statement's step adding what its rows `spent` to the counts."""


def spend_params(turn_id: str, usd: float, tokens: int, now: datetime) -> dict[str, Any]:
    """`ADD_SPEND`'s parameters for one commit's spend at `now`."""
    return {
        "c_turn": turn_id,
        "c_usd": usd,
        "c_tokens": tokens,
        "c_day": period_key("day", now),
        "c_month": period_key("month", now),
    }
