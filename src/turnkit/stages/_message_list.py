"""The message list: every hook that changes what a call sends, in one place and one order.

Before a reasoning request:
1. the guide reader appends what the person typed while the turn was working;
2. compaction replaces history with a summary when the call would fill 85% of the window;
3. picture release replaces pictures in old tool results when the call would carry > 20;
4. the prefix check compares the request with the session's previous one.

After the response: argument repair fixes almost-JSON arguments, and the recovery of a
call the model could not finish writing turns it into a failed result (see dispatch).
After the tools: a long result is sent as a preview plus a note.

Every hook only appends, except the two deliberate, audited rewrites (2 and 3).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from turnkit.audit import AuditPayloads, CacheBreakpointPayload, CompactionPayload
from turnkit.blocks import ToolResultBlock
from turnkit.context.compaction import (
    FALLBACK_TARGET,
    keep_newest,
    needs_compaction,
    split_for_summary,
    split_within_turn,
    summary_request,
    with_summary,
)
from turnkit.context.pictures import PICTURE_LIMIT, count_pictures, release_pictures
from turnkit.context.prefix import (
    PrefixReport,
    PreviousRequest,
    RequestView,
    check_prefix,
    stored,
    tools_digest,
    view_of,
)
from turnkit.context.results import READ_RESULT_TOOL, preview_result, repair_arguments
from turnkit.context.transcript import PartJson, current_opening
from turnkit.events import CompactionCompletedEvent, CompactionStartedEvent
from turnkit.ids import StageId
from turnkit.journal import CommittedGeneration
from turnkit.models import (
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolSpec,
    estimate_tokens,
    text_of,
)
from turnkit.models.family import ModelFamily
from turnkit.output import OutputShape
from turnkit.stages._calls import UTILITY_OUTAGES, CallResult, call_model
from turnkit.stages._guides import presented_guides, take_guides
from turnkit.stages._plugins import before_model_request as plugin_notes
from turnkit.stages._types import StageContext, TranscriptMessage, from_transcript

log = logging.getLogger(__name__)

__all__ = (
    "CUT_CALLS",
    "Prepared",
    "answered_request",
    "cache_breakpoint",
    "prepare_request",
    "repaired_calls",
    "result_message",
)

Purpose = Literal["tool-loop", "synthesize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A request ready to send, the transcript it was made of, and its prefix report."""

    transcript: list[TranscriptMessage]
    request: ModelRequest
    report: PrefixReport
    previous: PreviousRequest
    """This request, as the next one's previous."""


async def prepare_request(
    ctx: StageContext,
    stage_id: StageId,
    transcript: list[TranscriptMessage],
    previous: PreviousRequest | None,
    *,
    family: ModelFamily,
    specs: tuple[ToolSpec, ...],
    purpose: Purpose,
    block_key: str,
    closing: tuple[TranscriptMessage, ...] = (),
) -> Prepared:
    """Run the before-request hooks in order and check the prefix.

    `block_key`: the prepared call's own (a compaction before it takes its block from it).
    `closing` is appended last (a separate synthesis call's instruction).
    """
    guides = await take_guides(ctx, stage_id, transcript)
    notes = await plugin_notes(ctx, stage_id, [*transcript, *guides])
    transcript = [*transcript, *guides, *notes, *closing]
    deliberate: Literal["compaction", "picture-release"] | None = None
    compacted = await _compact(
        ctx, stage_id, transcript, family=family, specs=specs, block_key=block_key
    )
    if compacted is not None:
        transcript, deliberate = compacted, "compaction"
    known = ctx.recorder.notes.known
    if count_pictures(transcript, known) > PICTURE_LIMIT:
        transcript, released = release_pictures(transcript)
        if released:
            deliberate = deliberate or "picture-release"
    if deliberate is not None:
        ctx.recorder.notes.history_replaced = True
    request = ModelRequest(
        messages=from_transcript(transcript),
        tools=specs,
        tool_choice="none" if purpose == "synthesize" else "auto",
        thinking_budget=ctx.thinking_budget,
        purpose=purpose,
        settings=ctx.agent.settings,
        output=_answer_shape(ctx, purpose),
    )
    view = RequestView.of(transcript, tools_digest(specs), known)
    report = check_prefix(
        view_of(previous),
        view,
        deliberate=deliberate,
        between_turns=previous is not None and previous["between_turns"],
        known=known,
    )
    previous = ctx.recorder.notes.last_request = stored(view)
    ctx.recorder.notes.transcript = transcript  # what an ending during the call keeps
    return Prepared(transcript=transcript, request=request, report=report, previous=previous)


def _answer_shape(ctx: StageContext, purpose: Purpose) -> OutputShape | None:
    """The answer's JSON shape, for a call whose text may be the answer (None: free text).

    The separate synthesis call writes the answer; without one, any tool-loop call may.
    """
    check = ctx.agent.output
    if check is None:
        return None
    answers = purpose == "synthesize" or (purpose == "tool-loop" and ctx.synthesis is None)
    return check.shape if answers else None


async def answered_request(
    ctx: StageContext,
    stage_id: StageId,
    transcript: list[TranscriptMessage],
    generation: CommittedGeneration,
    *,
    specs: tuple[ToolSpec, ...],
    closing: tuple[TranscriptMessage, ...] = (),
) -> tuple[list[TranscriptMessage], PreviousRequest]:
    """The request an earlier attempt's committed answer was given, rebuilt without a call.

    Its guides come from the log; its notes from the plugins, asked again with the same
    messages (what they audit or emit then was written the first time, and is not written
    again); `closing` as `prepare_request` takes it. What the turn goes on from, so the
    next request extends this one. A compaction the request had is not made again here:
    the next request makes it if it still needs it.
    """
    guides = await presented_guides(ctx, stage_id, transcript, generation)
    notes = await plugin_notes(ctx, stage_id, [*transcript, *guides], replaying=True)
    transcript = [*transcript, *guides, *notes, *closing]
    previous = stored(RequestView.of(transcript, tools_digest(specs), ctx.recorder.notes.known))
    ctx.recorder.notes.last_request = previous
    ctx.recorder.notes.transcript = transcript
    return transcript, previous


def cache_breakpoint(
    prepared: Prepared, response: ModelResponse, iteration: int | None
) -> CacheBreakpointPayload:
    """The call's `cacheBreakpoint` payload."""
    report = prepared.report
    return CacheBreakpointPayload(
        iteration=iteration,
        prefix_messages=report.shared,
        request_messages=len(prepared.transcript),
        cached_tokens=response.usage.cached_tokens,
        prefix_sha256=report.prefix_sha256,
        broken_region=report.broken,
        break_reason=report.reason,
    )


async def _compact(
    ctx: StageContext,
    stage_id: StageId,
    transcript: list[TranscriptMessage],
    *,
    family: ModelFamily,
    specs: tuple[ToolSpec, ...],
    block_key: str,
) -> list[TranscriptMessage] | None:
    """The compacted transcript, or None when the call fits below 85% of the window."""
    window = family.context_window()
    if window is None:
        return None

    def tokens(messages: list[TranscriptMessage]) -> int:
        return family.count_tokens(ModelRequest(messages=from_transcript(messages), tools=specs))

    probe = ModelRequest(messages=from_transcript(transcript), tools=specs)
    # Far from the line even at a token per byte of UTF-8 (no tokenizer packs more: a
    # Chinese character may take three, an emoji or a rare script's character four): skip
    # the exact count. The estimate assumes four characters a token, which such text is not.
    bound = estimate_tokens(probe) * 4
    if bound < window * 0.4 and bound + _wide_bytes(probe) < window * 0.4:
        return None
    before = family.count_tokens(probe)
    if not needs_compaction(before, window):
        return None
    split = split_for_summary(transcript)
    if split.tail and needs_compaction(tokens([*split.head, *split.tail]), window):
        split = split_within_turn(transcript)  # without earlier turns it would not fit
    if split.tail and needs_compaction(tokens([*split.head, *split.tail]), window):
        split = split_within_turn(transcript, keep_newest_round=False)  # nor with its newest
    if not split.middle:
        return None
    rec = ctx.recorder
    await rec.ephemeral(CompactionStartedEvent, stage_id)
    opening = current_opening(transcript)
    asked = ""
    if opening < len(transcript):
        asked = text_of(from_transcript(transcript[opening : opening + 1])[0].content)
    summarize = ModelRequest(messages=summary_request(split.middle, asked=asked), purpose="utility")
    result, failed = await _summary(ctx, stage_id, summarize, block_key)
    if result is not None:
        compacted = with_summary(split, result.response.text)
        call, model, strategy = result.shape, result.shape.model, "summary"
    else:
        compacted = keep_newest(split, lambda m: tokens(m) <= FALLBACK_TARGET * window)
        call, model, strategy = None, None, "keep-newest"
    after = tokens(compacted)
    rec.audit(
        stage_id,
        call=call,
        payloads=AuditPayloads(
            compaction=CompactionPayload(
                strategy=strategy,
                tokens_before=before,
                tokens_after=after,
                messages_before=len(transcript),
                messages_after=len(compacted),
                context_window=window,
                model=model,
                utility_error=failed,
            )
        ),
    )
    rec.durable(
        CompactionCompletedEvent,
        stage_id,
        # keep-newest leaves the newest of the middle in place, behind one note
        summarized_messages=len(split.middle)
        if strategy == "summary"
        else len(transcript) - len(compacted) + 1,
        tokens_before=before,
        tokens_after=after,
        strategy=strategy,
        model=model,
    )
    return compacted


def _wide_bytes(request: ModelRequest) -> int:
    """The UTF-8 bytes of `request`'s text beyond one a character (none for ASCII)."""
    texts = [text_of(m.content) for m in request.messages]
    texts += [c.arguments for m in request.messages for c in m.tool_calls]
    return sum(len(text.encode()) - len(text) for text in texts if not text.isascii())


async def _summary(
    ctx: StageContext, stage_id: StageId, summarize: ModelRequest, block_key: str
) -> tuple[CallResult | None, str | None]:
    """The utility model's summary call, or None and why there is none.

    No utility model, or a summary request too long for its window: no call. A call that
    fails on every rung: its error code (the summary is help; the turn keeps its newest
    turns instead).
    """
    if ctx.utility is None or not _fits_utility(ctx.utility, summarize):
        return None, None
    try:
        result = await call_model(
            ctx,
            stage_id,
            ctx.utility,
            summarize,
            block_key=f"compaction-{block_key}",
            stream_text=False,
        )
    except UTILITY_OUTAGES as exc:
        log.warning("turn %s compacts without its utility model: %s", ctx.recorder.turn_id, exc)
        return None, exc.code
    return result, None


def _fits_utility(utility: ModelFamily, request: ModelRequest) -> bool:
    """Whether the summary request fits the utility model's own window (else: keep-newest)."""
    window = utility.context_window()
    return window is None or not needs_compaction(utility.count_tokens(request), window)


CUT_CALLS: Final[Mapping[str, str]] = {
    "max_tokens": "the output limit was reached while this call's arguments were being "
    "written; nothing ran. Write the call again, shorter if you can",
    "content_filter": "the provider's content filter stopped the response while this call "
    "was being written; nothing ran",
}
"""Stop reasons whose response's tool calls never run, and the failed result each gets."""


def repaired_calls(response: ModelResponse) -> tuple[ToolCallPart, ...]:
    """The response's tool calls with almost-JSON arguments repaired.

    A response cut by the output limit or the content filter is left alone: its arguments
    are never trusted (none of its calls runs).
    """
    if response.stop_reason in CUT_CALLS:
        return response.tool_calls
    return tuple(
        ToolCallPart(
            tool_call_id=c.tool_call_id, name=c.name, arguments=repair_arguments(c.arguments)
        )
        for c in response.tool_calls
    )


def result_text(result: ToolResultBlock) -> str:
    """A tool result as the model reads it, in full: a string as written, else its JSON."""
    if result.is_error:
        return f"Error: {result.error}"
    if isinstance(result.output, str):
        return result.output
    return json.dumps(_without_pictures(result.output), ensure_ascii=False, separators=(",", ":"))


PREVIEW_SHARE = 0.25
"""The most of the context window a result's preview takes (at four characters a token)."""


def preview_chars(ctx: StageContext) -> int | None:
    """How much of a long result the model gets at once.

    The agent's setting, within a quarter of the model's window: a small window still
    shows the preview and the note saying how to read on, instead of compacting them
    away at once.
    """
    limit = ctx.agent.tool_result_preview_chars
    window = ctx.family.context_window()
    if limit is None or window is None:
        return limit
    return max(200, min(limit, int(window * 4 * PREVIEW_SHARE)))


def result_message(ctx: StageContext, result: ToolResultBlock) -> TranscriptMessage:
    """The tool message for `result`: a preview when long, its pictures as parts."""
    text = result_text(result)
    limit = preview_chars(ctx)
    if limit is not None and result.tool_name != READ_RESULT_TOOL:  # a window is bounded
        text = preview_result(text, limit=limit, tool_call_id=result.tool_call_id)
    pictures = [] if result.is_error else _pictures(result.output)
    content: str | list[PartJson] = (
        [{"kind": "text", "text": text}, *pictures] if pictures else text
    )
    return {"role": "tool", "content": content, "tool_call_id": result.tool_call_id}


def _is_picture(value: object) -> bool:
    return isinstance(value, dict) and value.get("kind") == "image"


def _pictures(output: object) -> list[PartJson]:
    items = output if isinstance(output, list) else [output]
    return [
        {k: str(v) for k, v in item.items() if v is not None}
        for item in items
        if isinstance(item, dict) and _is_picture(item)
    ]


def _without_pictures(output: object) -> object:
    if _is_picture(output):
        return "[picture]"
    if isinstance(output, list):
        return ["[picture]" if _is_picture(item) else item for item in output]
    return output
