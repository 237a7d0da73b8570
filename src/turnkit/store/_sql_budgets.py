"""`SqlBudgets`: `SqlStore`'s budget limits, reports and reservations.

A base of `SqlStore`: the `BudgetBook` methods, on the statements of `_budgets_sql`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetSubject, BudgetUse
from turnkit.ids import TurnId
from turnkit.store import _budgets_sql as budgets_sql
from turnkit.store._engine import SqlEngine

__all__ = ("SqlBudgets",)

T = TypeVar("T")


class SqlBudgets(SqlEngine):
    """Set, delete, list and report budget limits; reserve and release a turn's budget."""

    async def set_budget_limit(self, limit: BudgetLimit) -> None:
        """Create or replace a budget limit."""
        await self._tx(budgets_sql.set_limit, self._insert, limit, self._clock.now())

    async def delete_budget_limit(
        self, scope: BudgetScope, organisation: str, key: str, period: BudgetPeriod
    ) -> bool:
        """Remove a budget limit; whether there was one."""
        return await self._tx(budgets_sql.delete_limit, scope, organisation, key, period)

    async def budget_limits(self, organisation: str | None = None) -> list[BudgetLimit]:
        """Every budget limit (of one organisation when given)."""
        return await self._tx(budgets_sql.limits, organisation, write=False)

    async def budget_report(self, organisation: str | None = None) -> list[BudgetUse]:
        """Every budget limit (of one organisation when given) with its period's use."""
        return await self._tx(budgets_sql.report, organisation, self._clock.now(), write=False)

    async def budget_uses(self, subject: BudgetSubject) -> list[BudgetUse]:
        """Each limit covering `subject` with what its period has spent and holds reserved."""
        uses = functools.partial(budgets_sql.uses, subject=subject, now=self._clock.now())
        return await self._counted(uses, write=False)

    async def reserve_budget(
        self, subject: BudgetSubject, *, turn_id: TurnId, usd: float, tokens: int, ttl_s: float
    ) -> tuple[str | None, list[BudgetUse]]:
        """Check and reserve in one transaction; the reservation id, or None when refused."""
        reserve = functools.partial(
            budgets_sql.reserve,
            subject=subject,
            turn_id=turn_id,
            usd=usd,
            tokens=tokens,
            ttl_s=ttl_s,
            now=self._clock.now(),
        )
        return await self._counted(reserve)

    async def release_budget(self, turn_id: TurnId) -> None:
        """Drop the turn's reservation (its calls' usage is recorded, or it ended)."""
        await self._hot_tx(budgets_sql.release, turn_id)

    async def _counted(self, check: Callable[..., T], *, write: bool = True) -> T:
        """`check(conn, scan=...)` in place where it can (a check reads a few rows).

        A limit whose count must start (summing its history) goes to the store's thread.
        """
        try:
            return await self._hot_tx(functools.partial(check, scan=False), write=write)
        except budgets_sql.CountNeeded:
            return await self._tx(check, write=write)
