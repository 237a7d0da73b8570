"""tool-loop: one reasoning call per iteration, then the tool batch it asked for.

A call that names no tool has finished: by default its text is the turn's answer (it
streamed once, as written, and synthesize finalizes it with no further call). With a
separate synthesis call configured, that text is narration instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pydantic import JsonValue

from turnkit.audit import AuditPayloads, ToolCallRef, ToolSelectionPayload
from turnkit.blocks import TextBlock
from turnkit.context.prefix import PreviousRequest
from turnkit.errors import (
    ContentFilteredError,
    OutputLimitExceededError,
    ToolCallError,
    TurnError,
)
from turnkit.events import MessageCompleteEvent
from turnkit.ids import ToolCallId, derive_id
from turnkit.journal import CommittedGeneration
from turnkit.models import ModelMessage, ModelResponse, ToolCallPart, Usage
from turnkit.stages._answer_check import asked_again, check_answer, commit_failed, out_of_retries
from turnkit.stages._budget import take_budget_answers
from turnkit.stages._call_ids import call_namer, unique_ids
from turnkit.stages._calls import CallResult, call_model
from turnkit.stages._dispatch import dispatch_tools
from turnkit.stages._message_list import (
    CUT_CALLS,
    Prepared,
    answered_request,
    cache_breakpoint,
    prepare_request,
    repaired_calls,
)
from turnkit.stages._offered import offered_tools
from turnkit.stages._plugins import after_model_response
from turnkit.stages._thinking import ANSWER_UNDER_WAY_CHARS, ThinkingSummary, thinking_of
from turnkit.stages._tool_pauses import with_arguments_run
from turnkit.stages._types import (
    PendingAnswer,
    StageContext,
    StageOutcome,
    TranscriptMessage,
    reply_messages,
    shown,
    to_transcript,
)

__all__ = ("content_filtered", "run_tool_loop")

log = logging.getLogger("turnkit.runtime")


async def run_tool_loop(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    iteration: int,
    previous: PreviousRequest | None,
) -> StageOutcome:
    """One iteration: a call with tools offered; its tool calls run; loop or move on.

    Text written in a pass that goes on to use a tool stays its own block. A response
    cut by the output limit while writing tool calls gets failed results and the loop
    goes on; one cut with no call named is fatal (there is no answer to finish with).
    """
    rec = ctx.recorder
    rounds = ctx.agent.max_tool_rounds
    if rounds is not None and iteration > rounds:
        # Enough rounds: the answer is written from what the turn has, with no tool callable.
        log.info("turn %s: %d tool rounds, the most its agent allows", rec.turn_id, rounds)
        return StageOutcome(transcript=transcript, route="synthesize", previous=previous)
    generation = derive_id("gen", rec.turn_id, "tool-loop", iteration)
    committed = rec.journal.generation(generation)
    thinking = thinking_of(ctx) if ctx.synthesis is None else None
    if committed is not None:
        # A previous attempt already called the model for this iteration and committed
        # what it said: reuse it rather than pay for (and diverge on) a second call.
        take_budget_answers(ctx, "tool-loop", f"loop-{iteration}")  # in the node's order
        # The turn goes on from the request that answer was given (its guides and notes).
        transcript, previous = await answered_request(
            ctx, "tool-loop", transcript, committed, specs=offered_tools(ctx)
        )
        response = committed_response(committed)
        block_id = committed.block_id or derive_id("blk", rec.turn_id, f"loop-{iteration}", 0)
        calls = response.tool_calls
        fatal = _fatal(response, calls)
    else:
        called = await _call(ctx, transcript, previous, iteration, thinking)
        response, block_id = called.result.response, called.result.block_id
        transcript, previous = called.prepared.transcript, called.prepared.previous
        calls = unique_ids(repaired_calls(response), transcript, iteration)
        fatal = _fatal(response, calls)
        _audit_call(ctx, called, calls, iteration, fatal)
    cut = CUT_CALLS.get(response.stop_reason)
    if not calls:
        if fatal is not None:
            raise fatal
        refused = await _refused(ctx, response.text, transcript, block_id, generation, committed)
        if refused is not None:  # not the answer after all: the model is told why
            return StageOutcome(transcript=refused, route="tool-loop", previous=previous)
        return _answered(ctx, response, transcript, previous, block_id, generation)
    if thinking is not None:
        await thinking.discard()  # it was not the answer after all
    _narration(ctx, response.text, block_id, generation)
    if fatal is not None:
        raise fatal
    asked = to_transcript(ModelMessage(role="assistant", content=response.text, tool_calls=calls))
    rec.notes.transcript = [*transcript, asked]  # what an ending now (or a pause) keeps
    results = await dispatch_tools(
        ctx,
        calls,
        cut=cut,
        generation_id=generation,
        known_errors=_known_errors(committed),
    )
    ran = (rec.notes.results.get(c.tool_call_id) for c in calls)  # this batch's, not the turn's
    ran_with: dict[str, dict[str, JsonValue]] = {
        r.tool_call_id: r.arguments for r in ran if r is not None and r.arguments is not None
    }
    assistant = with_arguments_run(asked, ran_with)  # a person's changes, as they ran
    return StageOutcome(
        transcript=[*transcript, assistant, *results], route="tool-loop", previous=previous
    )


@dataclass(frozen=True, slots=True)
class _Called:
    """An iteration's fresh call: the request as prepared, and how the call went."""

    prepared: Prepared
    result: CallResult


async def _call(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    iteration: int,
    thinking: ThinkingSummary | None,
) -> _Called:
    """Ask the model, tools offered, for the iteration's step."""
    block_key = f"loop-{iteration}"
    prepared = await prepare_request(
        ctx,
        "tool-loop",
        transcript,
        previous,
        family=ctx.family,
        specs=offered_tools(ctx),
        purpose="tool-loop",
        block_key=block_key,
    )
    result = await call_model(
        ctx,
        "tool-loop",
        ctx.family,
        prepared.request,
        block_key=block_key,
        on_answer=(lambda seen: thinking.start("tool-loop", seen)) if thinking else None,
        answer_after_chars=ANSWER_UNDER_WAY_CHARS,
        call_id=call_namer(prepared.transcript, iteration),
    )
    await after_model_response(ctx, "tool-loop", prepared.request, result.response)
    ctx.recorder.notes.reasoning.append(result.response.thinking)  # read only by the summary
    return _Called(prepared, result)


def _fatal(response: ModelResponse, calls: tuple[ToolCallPart, ...]) -> TurnError | None:
    """The error a response ends the turn with (audited as such), if it does."""
    if not calls and response.stop_reason == "max_tokens":
        return OutputLimitExceededError(
            "the output limit was reached before the model finished, and no tool call "
            "was named: the cut text cannot stand as the answer",
            stop_reason=response.stop_reason,
        )
    if not calls and response.stop_reason == "content_filter" and not response.text.strip():
        return content_filtered(response.refusal)
    if any(not c.name for c in calls):
        return ToolCallError(
            "the model wrote a tool call without a tool name; the response cannot be trusted",
            stop_reason=response.stop_reason,
        )
    return None


_REFUSAL_SHOWN = 500
"""Characters of a refusal's words the error message quotes (`refusal` has them all)."""


def content_filtered(refusal: str = "") -> ContentFilteredError:
    """The error of an answer the provider's content filter stopped before any text.

    `refusal`: the words the model declined with (OpenAI's `refusal`), quoted in the message
    and kept whole in the error's `refusal`; they are never the answer.
    """
    if not refusal.strip():
        return ContentFilteredError(
            "the provider's content filter stopped the answer before it wrote any text "
            "(finish reason `content_filter`: a refusal or a safety block); rephrase the "
            "message, or use a model or deployment with another content policy",
            stop_reason="content_filter",
        )
    said = refusal.strip()
    if len(said) > _REFUSAL_SHOWN:
        said = said[:_REFUSAL_SHOWN] + "…"
    return ContentFilteredError(
        f'the model refused to answer: "{said}" (a refusal is not kept as an answer); '
        "rephrase the message, or use a model or deployment with another content policy",
        stop_reason="content_filter",
        refusal=refusal,
    )


def _audit_call(
    ctx: StageContext,
    called: _Called,
    calls: tuple[ToolCallPart, ...],
    iteration: int,
    fatal: TurnError | None,
) -> None:
    """The call's audit row: its shape, the cache breakpoint, the tools it picked.

    A response the turn fails on (`fatal`) is audited as an error with its code.
    """
    selected = tuple(
        ToolCallRef(tool_call_id=ToolCallId(c.tool_call_id), tool_name=c.name) for c in calls
    )
    shape = called.result.shape
    if fatal is not None:
        shape = shape.model_copy(update={"outcome": "error", "error_code": fatal.code})
    ctx.recorder.audit(
        "tool-loop",
        call=shape,
        payloads=AuditPayloads(
            cacheBreakpoint=cache_breakpoint(called.prepared, called.result.response, iteration),
            toolSelection=ToolSelectionPayload(
                offered=tuple(s.name for s in called.prepared.request.tools), selected=selected
            )
            if selected
            else None,
            providerCascade=called.result.cascade,
        ),
    )


def _answered(
    ctx: StageContext,
    response: ModelResponse,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    block_id: str,
    generation: str,
) -> StageOutcome:
    """A call that named no tool: its text is the answer (or narration before synthesis).

    A reply with no text is not added to the transcript (`reply_messages`): synthesize
    asks for the answer after the request that reply answered.
    """
    closing = reply_messages(response.text)
    if ctx.synthesis is not None:
        _narration(ctx, response.text, block_id, generation)
        return StageOutcome(
            transcript=[*transcript, *closing], route="synthesize", previous=previous
        )
    answer: PendingAnswer = {
        "text": response.text,
        "block_id": block_id,
        "generation_id": generation,
        "stop_reason": response.stop_reason,
    }
    shown(ctx.recorder, "tool-loop", answer)
    return StageOutcome(
        transcript=[*transcript, *closing], route="synthesize", previous=previous, answer=answer
    )


async def _refused(
    ctx: StageContext,
    text: str,
    transcript: list[TranscriptMessage],
    block_id: str,
    generation: str,
    committed: CommittedGeneration | None,
) -> list[TranscriptMessage] | None:
    """A terminal text that fails the agent's `output_type`: the transcript asking again.

    None when it is the answer (or nothing checks it). The failed answer is committed as
    narration with its `outputCheck` row; the next round may use tools before answering.
    """
    check = ctx.agent.output
    if check is None or ctx.synthesis is not None:
        return None
    checked = check_answer(ctx, check, text, generation, committed)
    if not checked.problems:
        return None
    thinking = thinking_of(ctx)
    if thinking is not None:
        await thinking.discard()  # it was not the answer after all
    failed = [*transcript, *reply_messages(text)]  # an empty answer is not sent back
    if committed is None:
        commit_failed(
            ctx, "tool-loop", checked, text=text, block_id=block_id, generation_id=generation
        )
    error = out_of_retries(ctx, check, checked, failed)
    if error is not None:
        raise error
    return [*failed, asked_again(checked)]


def _narration(ctx: StageContext, text: str, block_id: str, generation: str) -> None:
    """Text of a pass that goes on to use a tool (or precedes a separate synthesis)."""
    if text:
        ctx.recorder.durable(
            MessageCompleteEvent,
            "tool-loop",
            block=TextBlock(block_id=block_id, text=text),
            generation_id=generation,
            input_seqs=ctx.recorder.notes.input_seqs,
        )


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
        stop_reason="tool_use" if calls else "content_filter" if committed.filtered else "end_turn",
        usage=Usage(),
    )


def _known_errors(committed: CommittedGeneration | None) -> dict[str, str]:
    if committed is None:
        return {}
    return {c.tool_call_id: c.arguments_error for c in committed.calls if c.arguments_error}
