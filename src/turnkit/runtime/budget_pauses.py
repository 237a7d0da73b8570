"""Resuming turns paused `awaiting_budget` once a limit leaves room for their next call.

Shared by `SessionRuntime.set_budget_limit`, the worker's sweep (a new period) and the
`turnkit budgets set` command: all it needs is a Store. A resumed turn is `running` and
unclaimed; a worker (or the runtime that resumed it) drives it, and it checks its budget
again before the call.
"""

from __future__ import annotations

from turnkit.budgets import BudgetUse
from turnkit.errors import PauseAnsweredError, PauseNotFoundError
from turnkit.runtime._runner import Pinned
from turnkit.store import Store

__all__ = ("resume_budget_pauses",)


async def resume_budget_pauses(store: Store, organisation: str | None = None) -> list[str]:
    """Answer every budget pause whose next call now fits; the ids of the turns resumed.

    The turns resumed earlier in the same pass have not reserved yet: what their next
    calls need is counted as held, so a limit with room for one call resumes one turn,
    not every turn waiting on it (the rest would only pause again, once per sweep).
    """
    resumed: list[str] = []
    held: dict[tuple[str, str, str, str], tuple[float, int]] = {}
    for record, pause in await store.budget_pauses(organisation):
        subject = Pinned.of(record).budget_subject(record.session_id)
        usd, tokens = pause.payload.get("usd"), pause.payload.get("tokens")
        needs = (
            float(usd) if isinstance(usd, int | float) else 0.0,
            int(tokens) if isinstance(tokens, int) else 0,
        )
        uses = await store.budget_uses(subject)
        if not all(
            use.fits(
                needs[0] + held.get(_key(use), (0.0, 0))[0],
                needs[1] + held.get(_key(use), (0.0, 0))[1],
            )
            for use in uses
        ):
            continue
        try:
            await store.answer_pause(record.turn_id, pause.request_id, {"kind": "budget-cleared"})
        except (PauseAnsweredError, PauseNotFoundError):
            continue  # another process resumed (or someone cancelled) it first
        resumed.append(record.turn_id)
        for use in uses:
            usd_held, tokens_held = held.get(_key(use), (0.0, 0))
            held[_key(use)] = (usd_held + needs[0], tokens_held + needs[1])
    return resumed


def _key(use: BudgetUse) -> tuple[str, str, str, str]:
    limit = use.limit
    return (limit.scope, limit.organisation, limit.key, limit.period)
