"""post-turn: enrichment plugins and usage totals. No model calls here."""

from __future__ import annotations

import logging

from turnkit.audit import asked_usage
from turnkit.blocks import TextBlock
from turnkit.events import MessageCitationsEvent, MessageEntitiesEvent, UsageEvent
from turnkit.plugins import Enrichment
from turnkit.stages._plugins import call_hook as plugin_hook
from turnkit.stages._types import StageContext, StageOutcome, TranscriptMessage

__all__ = ("run_post_turn",)

log = logging.getLogger("turnkit.plugins")


async def run_post_turn(ctx: StageContext, transcript: list[TranscriptMessage]) -> StageOutcome:
    """Run enrichment plugins on the answer, then record the turn's usage.

    The driver writes `checkpoint.created` and `done` after this stage's checkpoint lands
    (and then, in a session's opening turn, asks for the session's name). A plugin that
    raises is recorded (audit row + log) and the turn goes on, unless it is `required`.
    """
    rec = ctx.recorder
    answer = next((m["content"] for m in reversed(transcript) if m["role"] == "assistant"), None)
    if answer is not None and ctx.plugins:
        block = TextBlock(block_id=rec.notes.answer_block_id, text=answer, is_answer=True)
        sources = {call_id: result for call_id, (result, _) in rec.journal.results.items()}
        sources.update(rec.notes.results)
        for _, found in await plugin_hook(
            ctx, "post-turn", "enrich_message", block, tuple(sources.values())
        ):
            if not isinstance(found, Enrichment):
                continue
            if found.citations:
                rec.durable(
                    MessageCitationsEvent,
                    "post-turn",
                    block_id=block.block_id,
                    citations=found.citations,
                )
            if found.entities:
                rec.durable(
                    MessageEntitiesEvent,
                    "post-turn",
                    block_id=block.block_id,
                    entities=found.entities,
                )
    usage = rec.usage
    rec.durable(
        UsageEvent,
        "post-turn",
        model_calls=usage.model_calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        cost_usd=usage.cost_usd,
        asked=asked_usage(rec.notes.asked_spent.values()),
    )
    return StageOutcome(route="end")
