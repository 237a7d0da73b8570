"""Resuming turns paused `awaiting_budget` once a limit leaves room for their next call.

Shared by `SessionRuntime.set_budget_limit`, the worker's sweep (a new period) and the
`turnkit budgets set` command: all it needs is a Store. A resumed turn is `running` and
unclaimed; a worker (or the runtime that resumed it) drives it, and it checks its budget
again before the call.
"""

from __future__ import annotations

from turnkit.errors import PauseAnsweredError, PauseNotFoundError
from turnkit.runtime._runner import Pinned
from turnkit.store import Store

__all__ = ("resume_budget_pauses",)


async def resume_budget_pauses(store: Store, organisation: str | None = None) -> list[str]:
    """Answer every budget pause whose next call now fits; the ids of the turns resumed."""
    resumed: list[str] = []
    for record, pause in await store.budget_pauses(organisation):
        subject = Pinned.of(record).budget_subject(record.session_id)
        usd, tokens = pause.payload.get("usd"), pause.payload.get("tokens")
        needs = (
            float(usd) if isinstance(usd, int | float) else 0.0,
            int(tokens) if isinstance(tokens, int) else 0,
        )
        if not all(use.fits(*needs) for use in await store.budget_uses(subject)):
            continue
        try:
            await store.answer_pause(record.turn_id, pause.request_id, {"kind": "budget-cleared"})
        except (PauseAnsweredError, PauseNotFoundError):
            continue  # another process resumed (or someone cancelled) it first
        resumed.append(record.turn_id)
    return resumed
