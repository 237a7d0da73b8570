"""synthesize: the turn's one answer-writing call, tools withheld."""

from __future__ import annotations

import hashlib

from turnkit.audit import AuditPayloads, SynthesisQualityPayload
from turnkit.blocks import TextBlock
from turnkit.errors import OutputLimitExceededError
from turnkit.events import MessageCompleteEvent
from turnkit.ids import derive_id
from turnkit.models import ModelRequest
from turnkit.stages._calls import call_model
from turnkit.stages._guides import take_guides
from turnkit.stages._types import StageContext, StageOutcome, TranscriptMessage, from_transcript

__all__ = ("run_synthesize", "synthesis_request")


def synthesis_request(
    ctx: StageContext, transcript: list[TranscriptMessage]
) -> tuple[TranscriptMessage, ...]:
    """Messages the synthesize call appends: the closing instruction, when work preceded it."""
    if transcript and transcript[-1]["role"] == "user":
        return ()  # nothing ran since the user spoke: answer the message itself
    return ({"role": "user", "content": ctx.agent.synthesis_instructions},)


async def run_synthesize(ctx: StageContext, transcript: list[TranscriptMessage]) -> StageOutcome:
    """Stream the answer; the audited string is the streamed string.

    The graph reaches this stage exactly once per turn (there is no edge back into it),
    so a turn has exactly one synthesize call and one `synthesisQuality` row.
    """
    rec = ctx.recorder
    appended = synthesis_request(ctx, transcript)
    generation = derive_id("gen", rec.turn_id, "synthesize")
    committed = rec.journal.generation(generation)
    if committed is not None:
        # The answer is already in the log (a previous attempt died after writing it):
        # never write, bill or stream it twice.
        text = committed.text
        rec.answer_block_id = committed.block_id
    else:
        guides = await take_guides(ctx, "synthesize", transcript)
        if guides:  # a late guide: present it, then the closing instruction again
            appended = (*guides, {"role": "user", "content": ctx.agent.synthesis_instructions})
        text = await _call(ctx, [*transcript, *appended], generation)
    rec.context_messages = len(transcript) + len(appended) + 1
    answer: TranscriptMessage = {"role": "assistant", "content": text}
    return StageOutcome(appended=(*appended, answer), route="post-turn")


async def _call(ctx: StageContext, messages: list[TranscriptMessage], generation: str) -> str:
    rec = ctx.recorder
    request = ModelRequest(
        messages=from_transcript(messages),
        thinking_budget=ctx.thinking_budget,
        purpose="synthesize",
    )
    result = await call_model(ctx, "synthesize", ctx.family, request, block_key="answer")
    response = result.response
    shape = result.shape
    if response.stop_reason == "max_tokens":
        shape = shape.model_copy(
            update={"outcome": "error", "error_code": "agent_output_limit_exceeded"}
        )
    rec.audit(
        "synthesize",
        call=shape,
        payloads=AuditPayloads(
            synthesisQuality=SynthesisQualityPayload(
                answer_chars=len(response.text),
                answer_sha256=hashlib.sha256(response.text.encode()).hexdigest(),
                stop_reason=response.stop_reason,
                tool_calls_in_turn=rec.tool_calls,
            ),
            providerCascade=result.cascade,
        ),
    )
    if response.stop_reason == "max_tokens":
        raise OutputLimitExceededError(
            "the provider's output limit was reached while writing the answer; ask for a "
            "shorter answer or use a model with a larger output capacity",
            answer_chars=len(response.text),
        )
    rec.answer_block_id = result.block_id
    rec.durable(
        MessageCompleteEvent,
        "synthesize",
        block=TextBlock(block_id=result.block_id, text=response.text, is_answer=True),
        generation_id=generation,
        input_seqs=rec.input_seqs,
    )
    return response.text
