"""synthesize: finalize the turn's one answer.

By default the answer is the text of the tool-loop call that named no tool: it already
streamed, and this stage commits it as the answer with no further model call. A turn
that skipped the tool loop, or an agent with `synthesis="separate"`, makes the one
answer-writing call here instead (tools still offered, so the prompt prefix holds, but
not usable). Either way the graph enters this stage exactly once per turn (no edge leads
back into it), so a turn has one answer and one `synthesisQuality` row, and the audited
string is the rendered string.

A provider may name tools there anyway: they are never run. Text written beside them is the
answer. A free-text answer with no text (the loop's last reply or this stage's call; empty,
blank, or only tools no call can use) is never the answer: it is kept as narration and the
model is asked once more, told that no tool can be called now, and the turn fails
(`answer-missing`) if that call writes no text either. An answer the provider's content
filter stopped before any text fails the turn (`content-filtered`); one it cut after some
text is the answer, marked as cut: its block is `filtered`, its `synthesisQuality.stop_reason`
says `content_filter`, and the session's next turn reads a note that it was cut.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Literal

from turnkit.audit import (
    AuditPayloads,
    CallShape,
    SynthesisQualityPayload,
    ToolCallRef,
    ToolSelectionPayload,
)
from turnkit.blocks import TextBlock
from turnkit.context.prefix import PreviousRequest
from turnkit.errors import AnswerMissingError, OutputLimitExceededError
from turnkit.events import MessageCompleteEvent
from turnkit.ids import ToolCallId, derive_id
from turnkit.journal import CommittedGeneration
from turnkit.models import ToolCallPart, ToolSpec
from turnkit.output import MAX_PROBLEMS, OutputCheck
from turnkit.stages._answer_check import (
    Checked,
    asked_again,
    check_answer,
    failed_answers,
    out_of_retries,
)
from turnkit.stages._budget import take_budget_answers
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
    reply_messages,
    shown,
)
from turnkit.stages.tool_loop import content_filtered

__all__ = ("run_synthesize", "synthesis_request")

log = logging.getLogger("turnkit.runtime")

_NO_TOOLS = "no tool can be used now: answer with the JSON object alone"
"""Told a model that called tools where none were usable, when its answer failed."""
_ANSWER_NOW = "No tool can be called now: answer from what you have, in text."
"""Asks a free-text agent again whose answer had no text (empty, or only named tools)."""


def synthesis_request(
    ctx: StageContext, transcript: list[TranscriptMessage]
) -> tuple[TranscriptMessage, ...]:
    """Messages a synthesis call appends: the closing instruction, when work preceded it."""
    if transcript and transcript[-1]["role"] == "user":
        return ()  # nothing ran since the user spoke: answer the message itself
    return ({"role": "user", "content": ctx.agent.synthesis_instructions},)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Written:
    """An answer a call wrote, not yet committed (as the answer, or as narration).

    It is committed as narration when it fails the agent's `output_type` check.
    """

    answer: PendingAnswer
    source: Literal["tool-loop", "synthesize"]
    logged: CommittedGeneration | None
    """What an earlier attempt committed of it (and billed, and streamed); None: new."""
    call: CallShape | None = None
    payloads: AuditPayloads = field(default_factory=AuditPayloads)
    called_tools: bool = False
    """The model named tools, which this call could not use (they were left out)."""


async def run_synthesize(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    answer: PendingAnswer | None,
) -> StageOutcome:
    """Commit the answer: the loop's terminal text (`answer`), or one call's text.

    With the agent's `output_type`, an answer this stage writes that does not validate
    is kept as narration and asked for again before the turn fails (the loop's own
    terminal text was checked in the loop).
    """
    rec = ctx.recorder
    check = ctx.agent.output
    if answer is not None:  # the transcript already ends with it (when it has text)
        logged = rec.journal.generation(answer["generation_id"])
        written = _Written(answer=answer, source="tool-loop", logged=logged)
        if check is None:
            written, transcript, previous = await _in_text(ctx, written, transcript, previous)
        else:  # checked in the loop, an empty answer included
            verdict = Checked(failed_answers(ctx, logged), ())
            await _commit(ctx, written, is_answer=True, first=True, checked=verdict)
    else:
        written, transcript, previous = await _write(
            ctx, transcript, previous, attempt=0, closing=synthesis_request(ctx, transcript)
        )
        if check is None:
            written, transcript, previous = await _in_text(ctx, written, transcript, previous)
        else:
            written, transcript, previous = await _checked(
                ctx, check, written, transcript, previous
            )
    rec.notes.answer_block_id = written.answer["block_id"]
    rec.notes.answer_filtered = written.answer["stop_reason"] == "content_filter"
    rec.notes.context_messages = len(transcript)
    if written.answer is answer:  # the loop's own answer: the transcript has it already
        return StageOutcome(route="post-turn")
    return StageOutcome(transcript=transcript, route="post-turn", previous=previous)


async def _checked(
    ctx: StageContext,
    check: OutputCheck,
    written: _Written,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
) -> tuple[_Written, list[TranscriptMessage], PreviousRequest | None]:
    """The first answer that matches the agent's `output_type`, asking again as allowed.

    Each answer that fails is committed as narration with its `outputCheck` row, and the
    model reads what was wrong. `transcript` ends with `written`'s answer (when it has text).
    """
    first = True
    while True:
        text, generation = written.answer["text"], written.answer["generation_id"]
        checked = check_answer(ctx, check, text, generation, written.logged)
        if written.called_tools and checked.problems:
            told = (_NO_TOOLS, *checked.problems)[:MAX_PROBLEMS]
            checked = dataclasses.replace(checked, problems=told)
        await _commit(ctx, written, is_answer=not checked.problems, first=first, checked=checked)
        if not checked.problems:
            return written, transcript, previous
        error = out_of_retries(ctx, check, checked, transcript)
        if error is not None:
            raise error
        written, transcript, previous = await _write(
            ctx,
            transcript,
            previous,
            attempt=checked.attempt + 1,
            closing=(asked_again(checked),),
        )
        first = False


async def _in_text(
    ctx: StageContext,
    written: _Written,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
) -> tuple[_Written, list[TranscriptMessage], PreviousRequest | None]:
    """A free-text answer, asked for once more when it has no text.

    An answer with no text (an empty reply, or one that only named tools it could not use)
    is committed as narration, and the model is asked again in a user message after the
    request that reply answered (the empty reply itself is not sent back: some providers
    refuse an empty assistant message), told that no tool can be called now; an answer
    asked again that writes no text fails the turn. `transcript` ends with `written`'s
    answer (an answer with no text is never in it: `reply_messages`).
    """
    if _has_text(written):
        await _commit(ctx, written, is_answer=True, first=True)
        return written, transcript, previous
    await _commit(ctx, written, is_answer=False, first=True)
    closing: TranscriptMessage = {"role": "user", "content": _ANSWER_NOW}
    written, transcript, previous = await _write(
        ctx, transcript, previous, attempt=1, closing=(closing,)
    )
    if not written.answer["text"].strip():  # never in the log: a blank answer is not committed
        if written.call is not None:
            update = {"outcome": "error", "error_code": AnswerMissingError.code}
            call = written.call.model_copy(update=update)
            ctx.recorder.audit("synthesize", call=call, payloads=written.payloads)
        ctx.recorder.notes.transcript = transcript  # the request: an empty answer is not in it
        raise AnswerMissingError(
            "the model wrote no answer: its reply was empty (or only named tools where no "
            "tool can be called), and it wrote no text when asked once more; retry the turn, "
            'or use a model or server that answers in text and honours tool_choice "none"'
        )
    await _commit(ctx, written, is_answer=True, first=False)
    return written, transcript, previous


def _has_text(written: _Written) -> bool:
    """Whether a free-text answer has text: blank counts as none.

    Servers often write a line break before a call, and a model may end its turn with
    nothing at all. For an answer in the log: it was committed as the answer, not as
    narration.
    """
    if written.logged is not None:
        return written.logged.is_answer
    return bool(written.answer["text"].strip())


async def _write(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    *,
    attempt: int,
    closing: tuple[TranscriptMessage, ...],
) -> tuple[_Written, list[TranscriptMessage], PreviousRequest | None]:
    """One answer-writing call, or the answer an earlier attempt committed for it.

    `attempt` 0 is the synthesis call; n the n-th answer asked again. The transcript
    comes back ending with the answer, unless it has no text (`reply_messages`).
    """
    rec = ctx.recorder
    if attempt == 0:
        generation, block_key = derive_id("gen", rec.turn_id, "synthesize"), "answer"
    else:
        generation = derive_id("gen", rec.turn_id, "synthesize", "output", attempt)
        block_key = f"answer-again-{attempt}"
    committed = rec.journal.generation(generation)
    if committed is not None:
        # The answer is already in the log (a previous attempt died after writing it):
        # never write, bill or stream it twice. The transcript keeps the request it answered.
        take_budget_answers(ctx, "synthesize", block_key)  # in the node's order
        transcript, previous = await answered_request(
            ctx, "synthesize", transcript, committed, specs=_specs(ctx), closing=closing
        )
        written = _Written(
            answer={
                "text": committed.text,
                "block_id": committed.block_id,
                "generation_id": generation,
                "stop_reason": "content_filter" if committed.filtered else "end_turn",
            },
            source="synthesize",
            logged=committed,
        )
    else:
        written, transcript, previous = await _call(
            ctx,
            transcript,
            previous,
            generation,
            block_key=block_key,
            closing=closing,
            first=attempt == 0,
        )
    return written, [*transcript, *reply_messages(written.answer["text"])], previous


async def _call(
    ctx: StageContext,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    generation: str,
    *,
    block_key: str,
    closing: tuple[TranscriptMessage, ...],
    first: bool,
) -> tuple[_Written, list[TranscriptMessage], PreviousRequest]:
    family = ctx.synthesis or ctx.family
    thinking = thinking_of(ctx) if first else None
    prepared = await prepare_request(
        ctx,
        "synthesize",
        transcript,
        previous,
        family=family,
        specs=_specs(ctx),
        purpose="synthesize",
        block_key=block_key,
        closing=closing,
    )
    result = await call_model(
        ctx,
        "synthesize",
        family,
        prepared.request,
        block_key=block_key,
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
    filtered = response.stop_reason == "content_filter" and not response.text.strip()
    if filtered:
        shape = shape.model_copy(update={"outcome": "error", "error_code": "content-filtered"})
    pending: PendingAnswer = {
        "text": response.text,
        "block_id": result.block_id,
        "generation_id": generation,
        "stop_reason": response.stop_reason,
    }
    payloads = AuditPayloads(
        cacheBreakpoint=cache_breakpoint(prepared, response, None),
        toolSelection=_dropped(ctx, prepared.request.tools, response.tool_calls),
        providerCascade=result.cascade,
    )
    if response.stop_reason == "max_tokens":
        quality = _quality(ctx, pending, "synthesize")
        ctx.recorder.audit(
            "synthesize",
            call=shape,
            payloads=payloads.model_copy(update={"synthesis_quality": quality}),
        )
        raise OutputLimitExceededError(
            "the provider's output limit was reached while writing the answer; ask for a "
            "shorter answer or use a model with a larger output capacity",
            answer_chars=len(response.text),
        )
    if filtered:  # asked again, the same model would refuse again
        ctx.recorder.audit("synthesize", call=shape, payloads=payloads)
        raise content_filtered(response.refusal)
    shown(ctx.recorder, "synthesize", pending)
    written = _Written(
        answer=pending,
        source="synthesize",
        logged=None,
        call=shape,
        payloads=payloads,
        called_tools=bool(response.tool_calls),
    )
    return written, prepared.transcript, prepared.previous


def _dropped(
    ctx: StageContext, offered: tuple[ToolSpec, ...], calls: tuple[ToolCallPart, ...]
) -> ToolSelectionPayload | None:
    """Tools an answer call named where none can be called: noted, never run."""
    if not calls:
        return None
    names = ", ".join(c.name for c in calls)
    log.warning(
        "turn %s: the answer call named %s, but no tool can be called there "
        '(tool_choice "none"): dropped, never run',
        ctx.recorder.turn_id,
        names,
    )
    return ToolSelectionPayload(
        offered=tuple(s.name for s in offered),
        selected=tuple(
            ToolCallRef(tool_call_id=ToolCallId(c.tool_call_id), tool_name=c.name) for c in calls
        ),
    )


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


async def _commit(
    ctx: StageContext,
    written: _Written,
    *,
    is_answer: bool,
    first: bool,
    checked: Checked | None = None,
) -> None:
    """A written answer's audit row and `message.complete`, staged together.

    As the turn's answer, or as narration when it failed its check; nothing when an
    earlier attempt committed it. Both go in one transaction.
    """
    rec = ctx.recorder
    if is_answer:  # a Stop from now on leaves it the turn's answer (`end_aborted`)
        shown(rec, written.source, written.answer)
        rec.notes.answer_kept = True
    if written.logged is not None:
        return
    thinking = thinking_of(ctx)
    if first and thinking is not None:
        await thinking.commit("synthesize")  # the summary goes before the answer
    answer = written.answer
    payloads = written.payloads.model_copy(
        update={
            "synthesis_quality": _quality(ctx, answer, written.source) if is_answer else None,
            "output_check": None if checked is None else checked.payload(answer["generation_id"]),
        }
    )
    if written.call is not None or payloads.kinds():  # the loop's call has its own row
        rec.audit("synthesize", call=written.call, payloads=payloads)
    filtered = answer["stop_reason"] == "content_filter"
    if is_answer and filtered:
        log.warning(
            "turn %s: the provider's content filter cut the answer after %d characters; "
            "kept as the answer (its synthesisQuality row says content_filter)",
            rec.turn_id,
            len(answer["text"]),
        )
    rec.durable(
        MessageCompleteEvent,
        "synthesize",
        block=TextBlock(
            block_id=answer["block_id"], text=answer["text"], is_answer=is_answer, filtered=filtered
        ),
        generation_id=answer["generation_id"],
        input_seqs=rec.notes.input_seqs,
    )
    if not is_answer:
        rec.notes.failed_answers += 1


def _specs(ctx: StageContext) -> tuple[ToolSpec, ...]:
    """The tools the loop offered stay in the prompt (its cached prefix), not to be used."""
    return offered_tools(ctx) if _loop_offered_tools(ctx) else ()
