"""tool-loop: one reasoning call per iteration, then the tool batch it asked for."""

from __future__ import annotations

import json

from turnkit.audit import AuditPayloads, CacheBreakpointPayload, ToolCallRef, ToolSelectionPayload
from turnkit.blocks import TextBlock
from turnkit.errors import OutputLimitExceededError, ToolCallError
from turnkit.events import MessageCompleteEvent
from turnkit.ids import ToolCallId, derive_id
from turnkit.journal import CommittedGeneration
from turnkit.models import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, Usage
from turnkit.stages._calls import call_model
from turnkit.stages._dispatch import dispatch_tools
from turnkit.stages._guides import take_guides
from turnkit.stages._types import (
    StageContext,
    StageOutcome,
    TranscriptMessage,
    from_transcript,
    to_transcript,
)
from turnkit.tools import clarify_spec

__all__ = ("run_tool_loop", "shared_prefix")


def shared_prefix(previous: list[TranscriptMessage], current: list[TranscriptMessage]) -> int:
    """How many leading messages of `current` repeat `previous` exactly."""
    count = 0
    for old, new in zip(previous, current, strict=False):
        if old != new:
            break
        count += 1
    return count


async def run_tool_loop(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    iteration: int,
    previous_request: list[TranscriptMessage],
) -> StageOutcome:
    """One iteration: a call with tools offered; its tool calls run; loop or move on.

    Text written in a pass that goes on to use a tool stays its own block. A response
    cut by the output limit while writing tool calls gets failed results and the loop
    goes on; one cut with no call named is fatal (seed 002 "Finishing").
    """
    rec = ctx.recorder
    specs = ctx.registry.specs() + ((clarify_spec(),) if ctx.agent.clarifications else ())
    generation = derive_id("gen", rec.turn_id, "tool-loop", iteration)
    committed = rec.journal.generation(generation)
    guides: tuple[TranscriptMessage, ...] = ()
    if committed is not None:
        # A previous attempt already called the model for this iteration and committed
        # what it said: reuse it rather than pay for (and diverge on) a second call.
        response = committed_response(committed)
        block_id = derive_id("blk", rec.turn_id, f"loop-{iteration}", 0)
    else:
        guides = await take_guides(ctx, "tool-loop", transcript)
        transcript = [*transcript, *guides]
        request = ModelRequest(
            messages=from_transcript(transcript),
            tools=specs,
            thinking_budget=ctx.thinking_budget,
            purpose="tool-loop",
        )
        result = await call_model(
            ctx, "tool-loop", ctx.family, request, block_key=f"loop-{iteration}"
        )
        response, block_id = result.response, result.block_id
        selected = tuple(
            ToolCallRef(tool_call_id=ToolCallId(c.tool_call_id), tool_name=c.name)
            for c in response.tool_calls
        )
        rec.audit(
            "tool-loop",
            call=result.shape,
            payloads=AuditPayloads(
                cacheBreakpoint=CacheBreakpointPayload(
                    iteration=iteration,
                    prefix_messages=shared_prefix(previous_request, transcript),
                    request_messages=len(transcript),
                    cached_tokens=response.usage.cached_tokens,
                ),
                toolSelection=ToolSelectionPayload(
                    offered=tuple(s.name for s in specs), selected=selected
                )
                if selected
                else None,
                providerCascade=result.cascade,
            ),
        )
    if response.text:
        rec.durable(
            MessageCompleteEvent,
            "tool-loop",
            block=TextBlock(block_id=block_id, text=response.text),
            generation_id=generation,
            input_seqs=rec.input_seqs,
        )
    truncated = response.stop_reason == "max_tokens"
    if not response.tool_calls:
        if truncated:
            raise OutputLimitExceededError(
                "the output limit was reached before the model finished, and no tool call "
                "was named: the cut text cannot stand as the answer",
                stop_reason=response.stop_reason,
            )
        closing = (
            (to_transcript(ModelMessage(role="assistant", content=response.text)),)
            if response.text
            else ()
        )
        return StageOutcome(appended=(*guides, *closing), route="synthesize")
    if any(not c.name for c in response.tool_calls):
        raise ToolCallError(
            "the model wrote a tool call without a tool name; the response cannot be trusted",
            stop_reason=response.stop_reason,
        )
    assistant = to_transcript(
        ModelMessage(role="assistant", content=response.text, tool_calls=response.tool_calls)
    )
    results = await dispatch_tools(
        ctx,
        response.tool_calls,
        truncated=truncated,
        generation_id=generation,
        known_errors=_known_errors(committed),
    )
    return StageOutcome(appended=(*guides, assistant, *results), route="tool-loop")


def committed_response(committed: CommittedGeneration) -> ModelResponse:
    """A response rebuilt from what a previous attempt committed."""
    calls = tuple(
        ToolCallPart(tool_call_id=c.tool_call_id, name=c.name, arguments=json.dumps(c.arguments))
        for c in committed.calls
    )
    return ModelResponse(
        text=committed.text,
        thinking=committed.thinking,
        tool_calls=calls,
        stop_reason="tool_use" if calls else "end_turn",
        usage=Usage(),
    )


def _known_errors(committed: CommittedGeneration | None) -> dict[str, str]:
    if committed is None:
        return {}
    return {c.tool_call_id: c.arguments_error for c in committed.calls if c.arguments_error}
