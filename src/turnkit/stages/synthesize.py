"""synthesize: finalize the turn's one answer.

By default the answer is the text of the tool-loop call that named no tool: it already
streamed, and this stage commits it as the answer with no further model call. A turn
that skipped the tool loop, or an agent with `synthesis="separate"`, makes the one
answer-writing call here instead (tools still offered, so the prompt prefix holds, but
not usable). Either way the graph enters this stage exactly once per turn (no edge leads
back into it), so a turn has one answer and one `synthesisQuality` row, and the audited
string is the rendered string.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from turnkit.audit import AuditPayloads, CallShape, SynthesisQualityPayload
from turnkit.blocks import TextBlock
from turnkit.context.prefix import PreviousRequest
from turnkit.errors import OutputLimitExceededError
from turnkit.events import MessageCompleteEvent
from turnkit.ids import derive_id
from turnkit.models import ToolSpec
from turnkit.stages._calls import call_model
from turnkit.stages._message_list import answered_request, cache_breakpoint, prepare_request
from turnkit.stages._offered import offered_tools
from turnkit.stages._plugins import after_model_response
from turnkit.stages._thinking import thinking_of
from turnkit.stages._types import (
    PendingAnswer,
    StageContext,
    StageOutcome,
    TranscriptMessage,
)

__all__ = ("run_synthesize", "synthesis_request")


def synthesis_request(
    ctx: StageContext, transcript: list[TranscriptMessage]
) -> tuple[TranscriptMessage, ...]:
    """Messages a synthesis call appends: the closing instruction, when work preceded it."""
    if transcript and transcript[-1]["role"] == "user":
        return ()  # nothing ran since the user spoke: answer the message itself
    return ({"role": "user", "content": ctx.agent.synthesis_instructions},)


async def run_synthesize(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    answer: PendingAnswer | None,
) -> StageOutcome:
    """Commit the answer: the loop's terminal text (`answer`), or one call's text."""
    rec = ctx.recorder
    thinking = thinking_of(ctx)
    if answer is not None:
        if rec.journal.generation(answer["generation_id"]) is None:
            if thinking is not None:
                await thinking.commit("synthesize")
            quality = _quality(ctx, answer, "tool-loop")
            _commit(ctx, answer, call=None, payloads=AuditPayloads(synthesisQuality=quality))
        rec.notes.answer_block_id = answer["block_id"]
        rec.notes.context_messages = len(transcript)
        return StageOutcome(route="post-turn")
    generation = derive_id("gen", rec.turn_id, "synthesize")
    committed = rec.journal.generation(generation)
    if committed is not None:
        # The answer is already in the log (a previous attempt died after writing it):
        # never write, bill or stream it twice. The transcript keeps the request it answered.
        rec.notes.answer_block_id = committed.block_id
        text = committed.text
        transcript, previous = await answered_request(
            ctx,
            "synthesize",
            transcript,
            committed,
            specs=_specs(ctx),
            closing=synthesis_request(ctx, transcript),
        )
    else:
        text, transcript, previous = await _call(ctx, transcript, previous, generation)
    transcript = [*transcript, {"role": "assistant", "content": text}]
    rec.notes.context_messages = len(transcript)
    return StageOutcome(transcript=transcript, route="post-turn", previous=previous)


async def _call(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    generation: str,
) -> tuple[str, list[TranscriptMessage], PreviousRequest]:
    family = ctx.synthesis or ctx.family
    thinking = thinking_of(ctx)
    prepared = await prepare_request(
        ctx,
        "synthesize",
        transcript,
        previous,
        family=family,
        specs=_specs(ctx),
        purpose="synthesize",
        block_key="answer",
        closing=synthesis_request(ctx, transcript),
    )
    result = await call_model(
        ctx,
        "synthesize",
        family,
        prepared.request,
        block_key="answer",
        # the summary is written while the answer arrives
        on_answer=(lambda seen: thinking.start("synthesize", seen)) if thinking else None,
    )
    response = result.response
    await after_model_response(ctx, "synthesize", prepared.request, response)
    ctx.recorder.notes.reasoning.append(response.thinking)  # read only by the thinking summary
    shape = result.shape
    if response.stop_reason == "max_tokens":
        shape = shape.model_copy(
            update={"outcome": "error", "error_code": "agent_output_limit_exceeded"}
        )
    pending: PendingAnswer = {
        "text": response.text,
        "block_id": result.block_id,
        "generation_id": generation,
        "stop_reason": response.stop_reason,
    }
    payloads = AuditPayloads(
        cacheBreakpoint=cache_breakpoint(prepared, response, None),
        synthesisQuality=_quality(ctx, pending, "synthesize"),
        providerCascade=result.cascade,
    )
    if response.stop_reason == "max_tokens":
        ctx.recorder.audit("synthesize", call=shape, payloads=payloads)
        raise OutputLimitExceededError(
            "the provider's output limit was reached while writing the answer; ask for a "
            "shorter answer or use a model with a larger output capacity",
            answer_chars=len(response.text),
        )
    if thinking is not None:
        await thinking.commit("synthesize")
    _commit(ctx, pending, call=shape, payloads=payloads)
    return response.text, prepared.transcript, prepared.previous


def _loop_offered_tools(ctx: StageContext) -> bool:
    """Whether this turn's requests offered the agent's tools before this call.

    A separate synthesis call follows the loop's calls; a terminal one follows them only
    when the loop ran out of rounds (`Agent.max_tool_rounds`), else the loop answered.
    """
    return ctx.synthesis is not None or "tool-loop" not in ctx.agent.skip_stages


def _quality(
    ctx: StageContext, answer: PendingAnswer, source: Literal["tool-loop", "synthesize"]
) -> SynthesisQualityPayload:
    text = answer["text"]
    return SynthesisQualityPayload(
        answer_chars=len(text),
        answer_sha256=hashlib.sha256(text.encode()).hexdigest(),
        stop_reason=answer["stop_reason"],
        tool_calls_in_turn=ctx.recorder.notes.tool_calls,
        source=source,
        generation_id=answer["generation_id"],
    )


def _commit(
    ctx: StageContext, answer: PendingAnswer, *, call: CallShape | None, payloads: AuditPayloads
) -> None:
    """The answer's audit row and `message.complete`, staged together (one transaction)."""
    rec = ctx.recorder
    rec.audit("synthesize", call=call, payloads=payloads)
    rec.notes.answer_block_id = answer["block_id"]
    rec.durable(
        MessageCompleteEvent,
        "synthesize",
        block=TextBlock(block_id=answer["block_id"], text=answer["text"], is_answer=True),
        generation_id=answer["generation_id"],
        input_seqs=rec.notes.input_seqs,
    )


def _specs(ctx: StageContext) -> tuple[ToolSpec, ...]:
    """The tools the loop offered stay in the prompt (its cached prefix), not to be used."""
    return offered_tools(ctx) if _loop_offered_tools(ctx) else ()
