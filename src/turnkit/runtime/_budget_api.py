"""A runtime's budget limits: setting them, reading what is used, resuming budget pauses."""

from __future__ import annotations

from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetUse
from turnkit.errors import InvalidInputError
from turnkit.ids import TurnId
from turnkit.runtime._core import RuntimeCore
from turnkit.runtime._validate import check_session_id
from turnkit.runtime.budget_pauses import resume_budget_pauses
from turnkit.tenancy import DEFAULT_ORGANISATION, Principal

__all__ = ("RuntimeBudgets",)


class RuntimeBudgets(RuntimeCore):
    """`SessionRuntime`'s budget methods (limits live in the Store: any process sees them)."""

    async def set_budget_limit(self, limit: BudgetLimit) -> list[str]:
        """Create or replace a budget limit (from any process: limits live in the Store).

        Turns paused `awaiting_budget` that the new limit leaves room for resume; returns
        their ids.

        Raises:
            InvalidInputError: a department limit names a department the organisation
                (one this runtime serves) does not have.
        """
        served = self.tenancy.organisation(limit.organisation)
        if limit.scope == "department" and served and not served.department(limit.key):
            names = ", ".join(d.name for d in served.departments)
            raise InvalidInputError(
                f"organisation {limit.organisation!r} has no department {limit.key!r} "
                f"(its departments: {names})",
                department=limit.key,
            )
        await self.ensure_open()
        await self.store.set_budget_limit(limit)
        return await self.resume_budget_pauses(limit.organisation)

    async def delete_budget_limit(
        self,
        scope: BudgetScope,
        *,
        organisation: str = DEFAULT_ORGANISATION,
        key: str = "",
        period: BudgetPeriod = "month",
    ) -> bool:
        """Remove a budget limit; whether there was one."""
        await self.ensure_open()
        return await self.store.delete_budget_limit(scope, organisation, key, period)

    async def resume_budget_pauses(self, organisation: str | None = None) -> list[str]:
        """Resume the turns paused `awaiting_budget` whose next call now fits; their ids.

        `set_budget_limit` calls it, and workers (and in-process recovery) call it on
        their sweep, so a turn also resumes when its budget period rolls over. Each turn
        checks its budget again before the call: one still short pauses again.
        """
        await self.ensure_open()
        resumed = await resume_budget_pauses(self.store, organisation)
        if self.config.run_in_process:
            for turn_id in resumed:
                self.host.detach(TurnId(turn_id), then_next=True)
        return resumed

    async def budget_limits(self, organisation: str | None = None) -> list[BudgetLimit]:
        """Every budget limit (of one organisation when given)."""
        await self.ensure_open()
        return await self.store.budget_limits(organisation)

    async def budget_uses(
        self, principal: Principal | str | None, session_id: str
    ) -> list[BudgetUse]:
        """Each limit a message of `principal` in `session_id` would spend against, as used."""
        await self.ensure_open()
        caller = Principal.of(principal)
        return await self.admission.budget_uses(caller, check_session_id(session_id))
