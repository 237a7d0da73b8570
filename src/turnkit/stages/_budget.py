"""Budgets inside a turn: a model call reserves what it may cost before it starts.

A call whose reservation would cross a limit covering the turn does not start. The turn
commits `budget.paused` and pauses `awaiting_budget` (durable, no task, no lease) and
resumes the same turn when an administrator raises the limit or the period rolls over;
the check runs again then, so a limit raised too little pauses it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from turnkit.audit import UsageDelta
from turnkit.budgets import BudgetSubject, BudgetUse
from turnkit.events import BudgetPausedEvent
from turnkit.ids import StageId, derive_id
from turnkit.models import ModelRequest
from turnkit.pauses import PauseRequest
from turnkit.stages._types import StageContext
from turnkit.store import BudgetBook

__all__ = (
    "BudgetGate",
    "estimate_tokens",
    "price_per_token",
    "prompt_tokens",
    "take_budget_answers",
    "text_tokens",
)

_CHARS_PER_TOKEN: Final = 4
_MESSAGE_OVERHEAD: Final = 8
_MAX_PAUSES_PER_CALL: Final = 64
"""A call re-checked after this many resumes that still cannot start fails the turn."""


def prompt_tokens(request: ModelRequest) -> int:
    """About how many tokens a request sends (four characters a token)."""
    prompt = sum(
        len(str(m.content)) + sum(len(c.arguments) for c in m.tool_calls) + _MESSAGE_OVERHEAD
        for m in request.messages
    )
    tools = sum(len(t.description) + len(str(t.parameters)) for t in request.tools)
    return (prompt + tools) // _CHARS_PER_TOKEN


def text_tokens(text: str) -> int:
    """About how many tokens `text` is (four characters a token, rounded up)."""
    return -(-len(text) // _CHARS_PER_TOKEN)


def estimate_tokens(request: ModelRequest, reserve_output: int) -> int:
    """What a call may use: its prompt plus its output cap (else `reserve_output`)."""
    return prompt_tokens(request) + (request.output_cap() or reserve_output)


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetGate:
    """Reserves each model call of one turn against the limits covering it."""

    book: BudgetBook
    subject: BudgetSubject
    reserve_tokens: int
    ttl_s: float
    list_price: tuple[float, float] = (0.0, 0.0)
    """The dearest `(input, output)` USD per token of the turn's model rungs (litellm's
    price map): what a call reserves in USD before the turn has paid for any call."""

    async def reserve(
        self,
        ctx: StageContext,
        stage_id: StageId,
        request: ModelRequest,
        *,
        key: str,
        answered: int,
    ) -> None:
        """Reserve the call, pausing the turn until a limit leaves room for it.

        Pausing raises out of the node (the LangGraph interrupt); on resume the node runs
        again, and this check with it. `answered`: the pauses the call made in earlier
        attempts, whose answers the caller took (`take_budget_answers`).
        """
        rec = ctx.recorder
        tokens = estimate_tokens(request, self.reserve_tokens)
        usd = self.reserve_usd(request, rec.usage)
        for waited in range(answered, _MAX_PAUSES_PER_CALL):
            reservation, uses = await self.book.reserve_budget(
                self.subject, turn_id=rec.turn_id, usd=usd, tokens=tokens, ttl_s=self.ttl_s
            )
            if reservation is not None:
                return
            blocking = next(u for u in uses if not u.fits(usd, tokens))
            request_id = derive_id("bud", rec.turn_id, stage_id, key, waited)
            _pause(ctx, stage_id, request_id, blocking, usd=usd, tokens=tokens)
        raise RuntimeError(f"a model call found no budget after {_MAX_PAUSES_PER_CALL} resumes")

    def reserve_usd(self, request: ModelRequest, usage: UsageDelta) -> float:
        """What a call reserves in USD: never less than its model's list price.

        At the price the turn paid so far, or its list price if higher, so a turn's first
        call (which has paid nothing yet) reserves too and turns starting at once cannot
        overspend a USD limit together.
        """
        price_in, price_out = self.list_price
        listed = (
            prompt_tokens(request) * price_in
            + (request.output_cap() or self.reserve_tokens) * price_out
        )
        return max(estimate_tokens(request, self.reserve_tokens) * price_per_token(usage), listed)

    async def has_room(self, request: ModelRequest) -> bool:
        """Whether a background call (naming, a summary) fits; it is skipped when not."""
        tokens = estimate_tokens(request, self.reserve_tokens)
        return all(use.fits(0.0, tokens) for use in await self.book.budget_uses(self.subject))


def price_per_token(usage: UsageDelta) -> float:
    """What the turn's calls so far paid per token (0: nothing priced yet)."""
    tokens = usage.input_tokens + usage.output_tokens
    return usage.cost_usd / tokens if tokens else 0.0


def _pause(
    ctx: StageContext,
    stage_id: StageId,
    request_id: str,
    blocking: BudgetUse,
    *,
    usd: float,
    tokens: int,
) -> None:
    rec = ctx.recorder
    limit = blocking.limit
    needs = f"{tokens} tokens" + (f" (${usd:.4f})" if usd > 0 else "")
    reason = f"{blocking.describe()}; the next model call needs about {needs}"
    rec.durable(
        BudgetPausedEvent,
        stage_id,
        request_id=request_id,
        scope=limit.scope,
        key=limit.key,
        period=limit.period,
        reason=reason,
    )
    _wait(ctx, request_id, {"usd": usd, "tokens": tokens, "reason": reason})


def take_budget_answers(ctx: StageContext, stage_id: StageId, key: str) -> int:
    """Take the answers to the budget pauses the call `key` made before; how many it made.

    LangGraph hands a node's resume values to its interrupts in the order they are called.
    A call that paused for its budget in an earlier attempt (its `budget.paused` is in the
    log, and the turn runs again only once that pause is answered) must take the answer
    again when its node runs again, even if the budget now has room or the call's response
    is in the log and is not asked for again: else an approval or question later in the
    node would get it.
    """
    rec = ctx.recorder
    for waited in range(_MAX_PAUSES_PER_CALL):
        request_id = derive_id("bud", rec.turn_id, stage_id, key, waited)
        if f"pause:{request_id}" not in rec.journal.keys:
            return waited
        reason = "the turn waits for its budget"  # only if it was never answered: not seen
        _wait(ctx, request_id, {"usd": 0.0, "tokens": 0, "reason": reason})
    return _MAX_PAUSES_PER_CALL


def _wait(ctx: StageContext, request_id: str, payload: dict[str, JsonValue]) -> None:
    rec = ctx.recorder
    rec.notes.pending_pause = PauseRequest(
        request_id=request_id, kind="budget", tool_call_id="", payload=payload
    )
    ctx.interrupt({"request_id": request_id, "kind": "budget"})
    rec.notes.pending_pause = None
