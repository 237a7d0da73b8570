"""post-turn: usage totals and durable flush. No model calls here."""

from __future__ import annotations

from turnkit.events import UsageEvent
from turnkit.stages._types import StageContext, StageOutcome

__all__ = ("run_post_turn",)


async def run_post_turn(ctx: StageContext) -> StageOutcome:
    """Record the turn's usage; the driver then writes `checkpoint.created` and `done`."""
    usage = ctx.recorder.usage
    ctx.recorder.durable(
        UsageEvent,
        "post-turn",
        model_calls=usage.model_calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        cost_usd=usage.cost_usd,
    )
    return StageOutcome(route="end")
