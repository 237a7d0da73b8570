"""Dispatch one batch of tool calls: validate, write ahead, run concurrently, record results."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any, cast

from pydantic import JsonValue

from turnkit import otel
from turnkit.blocks import ToolResultBlock, ToolUseBlock
from turnkit.context.results import READ_RESULT_TOOL
from turnkit.errors import ErrorCode
from turnkit.events import (
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
)
from turnkit.ids import ToolCallId
from turnkit.models import ToolCallPart
from turnkit.plugins import ToolCall
from turnkit.stages._message_list import preview_chars, result_message, result_text
from turnkit.stages._offered import offered_tools
from turnkit.stages._planning import is_planning_tool, run_planning_tool
from turnkit.stages._plugins import after_tool_call, before_tool_call, guard
from turnkit.stages._tool_pauses import (
    MAX_HANDED,
    Edited,
    Settled,
    hand_over_pause,
    handed_over,
    is_clarify,
    pause_key,
    settle_pause,
    take_asked_answers,
    with_arguments_run,
)
from turnkit.stages._tool_run import idempotency_key, invoke_tool, reconcile_call
from turnkit.stages._types import StageContext, TranscriptMessage
from turnkit.telemetry import Recorder
from turnkit.tools import AgentTool, AskedAgentWaits, Tool
from turnkit.tools._storable import storable

__all__ = ("dispatch_tools",)

log = logging.getLogger("turnkit.tools")


def _parse(part: ToolCallPart) -> tuple[dict[str, JsonValue] | None, str | None]:
    try:
        value = json.loads(part.arguments or "{}")
    except json.JSONDecodeError as exc:
        return (
            None,
            f"the arguments are not valid JSON ({exc.msg} at char {exc.pos}); write the call again",
        )
    if not isinstance(value, dict):
        return None, "the arguments must be a JSON object; write the call again"
    return cast(dict[str, JsonValue], value), None


async def dispatch_tools(
    ctx: StageContext,
    calls: tuple[ToolCallPart, ...],
    *,
    cut: str | None,
    generation_id: str,
    known_errors: Mapping[str, str] | None = None,
) -> list[TranscriptMessage]:
    """Run a batch; one result message per call, in call order.

    `cut` says why the response stopped while the model was writing these calls (the
    provider's output limit, its content filter): nothing runs, each call gets a failed
    result saying so. A call
    whose result is already committed (a recovered attempt) is not run again; a call that
    was written ahead but has no result runs again with the same idempotency key. A call
    whose asked agent waits for a person hands its request to this turn, which then waits
    (after the batch's other calls end) and follows the agent again once it is answered.
    """
    rec = ctx.recorder
    plans, in_doubt = _write_ahead(ctx, calls, cut, generation_id, known_errors or {})
    await rec.flush()  # write ahead: every call is on record before any tool runs
    # Approvals and questions come first, in call order: nothing runs until all are settled.
    settled, edited = await _settle_pauses(ctx, plans)
    handed = take_asked_answers(ctx, [plan[0] for plan in plans])
    if handed:  # the answers are on record before the asked agents go on
        await rec.flush()
    waiting: dict[str, AskedAgentWaits] = {}

    async def run(
        part: ToolCallPart,
        tool: Tool | None,
        args: Mapping[str, JsonValue],
        problem: str | None,
        code: ErrorCode,
    ) -> TranscriptMessage | None:
        started = time.perf_counter()
        call_id = ToolCallId(part.tool_call_id)
        done = rec.journal.results.get(call_id)
        if done is not None:  # committed by an earlier attempt: one result per call
            block, _ = done
            return _remember(ctx, block)
        answered_by = part.name
        output: JsonValue = None
        args = edited.get(part.tool_call_id, args)
        view = ToolCall(tool_call_id=part.tool_call_id, name=part.name, arguments=dict(args))
        if part.tool_call_id in settled:
            problem, code, output = settled[part.tool_call_id]
            if problem is None and tool is not None:
                output = await _guard_output(ctx, view, output)
        elif problem is None:
            # A call that handed a request over follows its agent again: not in doubt.
            doubt = part.tool_call_id in in_doubt and part.tool_call_id not in handed
            try:
                with rec.notes.waiting_on(f"tool {part.name!r}"):
                    problem, code, output, answered_by = await otel.traced_tool(
                        rec,
                        part,
                        _run_guarded(ctx, part, tool, args, view, in_doubt=doubt),
                        in_doubt=doubt,
                    )
            except AskedAgentWaits as waits:
                if handed_over(ctx, part) < MAX_HANDED:
                    waiting[part.tool_call_id] = waits
                    return None  # no result: the turn waits with the agent (below)
                problem, code = (
                    f"the agent {waits.agent!r} asked for a person too often",
                    "tool-failed",
                )
        duration = (time.perf_counter() - started) * 1000
        rec.notes.tool_timings.append((answered_by, duration))
        result = _record_result(
            ctx, part, answered_by, output, problem, code, duration, edited.get(call_id)
        )
        message = _remember(ctx, result)  # an ending from here on keeps it
        if batch:  # committed as it comes in: a crash now does not run it again
            await rec.flush()
        await after_tool_call(ctx, view, result)
        return message

    batch = len(plans) > 1
    if batch:
        messages = await _all_or_none([run(*plan) for plan in plans])
    else:
        messages = [await run(*plans[0])]
    _wait_with_asked(ctx, plans, waiting)
    return [m for m in messages if m is not None]  # all of them: none waits


async def _all_or_none(
    runs: list[Coroutine[Any, Any, TranscriptMessage | None]],
) -> list[TranscriptMessage | None]:
    """Await the batch's calls together; when one raises (the turn ends), stop the others.

    A bare `gather` would leave them running past the turn's end, no longer anyone's.
    """
    tasks = [asyncio.ensure_future(one) for one in runs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _wait_with_asked(
    ctx: StageContext, plans: list[Plan], waiting: Mapping[str, AskedAgentWaits]
) -> None:
    """Pause with the request of the first call (in call order) whose asked agent waits.

    The next one's is handed over once this one is answered (its call then finds its
    agent still waiting). Raises out of the node (LangGraph's interrupt).
    """
    for part, *_ in plans:
        if part.tool_call_id in waiting:
            hand_over_pause(ctx, part, waiting[part.tool_call_id])


def _keep_edits(rec: Recorder, edited: Mapping[str, dict[str, JsonValue]]) -> None:
    """An ending from here on keeps the calls as they run: with the person's arguments."""
    if edited:
        shown = rec.notes.transcript
        rec.notes.transcript = [*shown[:-1], with_arguments_run(shown[-1], edited)]


def _record_result(
    ctx: StageContext,
    part: ToolCallPart,
    answered_by: str,
    output: JsonValue,
    problem: str | None,
    code: ErrorCode,
    duration_ms: float,
    edited: dict[str, JsonValue] | None,
) -> ToolResultBlock:
    """Stage the call's `tool.completed` (or `tool.failed`, with `problem`); its result.

    `edited`: the arguments the approving person gave, which the call ran with.
    """
    call_id = ToolCallId(part.tool_call_id)
    if problem is None:
        output = storable(output)
        result = ToolResultBlock(
            tool_call_id=call_id, tool_name=part.name, output=output, arguments=edited
        )
        ctx.recorder.durable(
            ToolCompletedEvent,
            "tool-loop",
            tool_call_id=call_id,
            result=result,
            duration_ms=duration_ms,
            tool_name=answered_by,
        )
        return result
    result = ToolResultBlock(
        tool_call_id=call_id,
        tool_name=part.name,
        is_error=True,
        error=str(storable(problem)),
        arguments=edited,
    )
    ctx.recorder.durable(
        ToolFailedEvent,
        "tool-loop",
        tool_call_id=call_id,
        result=result,
        duration_ms=duration_ms,
        code=code,
    )
    return result


async def _run_guarded(
    ctx: StageContext,
    part: ToolCallPart,
    tool: Tool | None,
    args: Mapping[str, JsonValue],
    view: ToolCall,
    *,
    in_doubt: bool,
) -> tuple[str | None, ErrorCode, JsonValue, str]:
    """Run a call, then its result through the tool-result guardrails (one trace span).

    A failed call's problem is a result the model reads too (a tool's exception may quote
    what it looked up): it goes through them as well.
    """
    problem, code, output, answered_by = await _run_one(ctx, part, tool, args, in_doubt=in_doubt)
    if problem is None and tool is not None:
        output = await _guard_output(ctx, view, output)
    elif problem is not None and tool is not None and ctx.plugins:
        problem = await guard(
            ctx, "tool-loop", "tool_result", problem, subject=f"result of {part.name}", call=view
        )
    return problem, code, output, answered_by


async def _run_one(
    ctx: StageContext,
    part: ToolCallPart,
    tool: Tool | None,
    args: Mapping[str, JsonValue],
    *,
    in_doubt: bool,
) -> tuple[str | None, ErrorCode, JsonValue, str]:
    """Run a call that may run: a built-in, or the tool (reconciled if in doubt)."""
    if tool is None and is_planning_tool(ctx, part.name):
        problem, output = await run_planning_tool(ctx, part, args)
        return problem, "tool-arguments-invalid", output, part.name
    if part.name == READ_RESULT_TOOL or tool is None:
        problem, output = _read_result(ctx, args)
        return problem, "tool-arguments-invalid", output, part.name
    if in_doubt:
        applied, output, misfit = await reconcile_call(ctx, tool, part, args)
        if misfit is not None:  # whether it took effect is not known: it must not run again
            return misfit, "tool-failed", None, part.name
        if applied:
            return None, "tool-failed", output, part.name
    denied = await before_tool_call(
        ctx, ToolCall(tool_call_id=part.tool_call_id, name=part.name, arguments=dict(args))
    )
    if denied is not None:
        return f"{denied}. Do not retry it as is", "tool-denied", None, part.name
    return await invoke_tool(ctx, tool, part, args)


async def _settle_pauses(
    ctx: StageContext, plans: list[Plan]
) -> tuple[dict[str, Settled], dict[str, dict[str, JsonValue]]]:
    """Settle the batch's approvals and questions, in call order (a pause raises out).

    Returns the calls answered without running and the calls approved with the person's
    arguments. A run resumed by an answer commits how it was answered before any call runs.
    A call whose result is committed (an attempt recovered mid-batch) takes its answer
    again all the same: LangGraph hands a node's answers to its interrupts in order.
    """
    rec = ctx.recorder
    settled: dict[str, Settled] = {}
    edited: dict[str, dict[str, JsonValue]] = {}
    asked = [pause_key(rec.turn_id, plan[0].tool_call_id) in rec.journal.keys for plan in plans]
    last_asked = max((at for at, was in enumerate(asked) if was), default=-1)
    if any(handed_over(ctx, plan[0]) for plan in plans):
        # A call handed its agent's request over after the whole batch was decided (its
        # answer comes after theirs): every call keeps the decision it made then.
        last_asked = len(plans) - 1
    for at, (part, tool, args, problem, _) in enumerate(plans):
        done = part.tool_call_id in rec.journal.results
        if problem is not None or (done and not asked[at]):
            continue
        decided = asked[at] if at <= last_asked else None  # as in the run that paused
        outcome = settle_pause(ctx, part, tool, args, asked=decided)
        if done:  # its answer taken again, in order (the next call's is the next one)
            continue
        if isinstance(outcome, Edited):
            edited[part.tool_call_id] = outcome.arguments
        elif outcome is not None:
            settled[part.tool_call_id] = outcome
    _keep_edits(rec, edited)
    if last_asked >= 0:  # resumed by an answer: readers see it before the calls run
        await rec.flush()
    return settled, edited


async def _guard_output(ctx: StageContext, call: ToolCall, output: JsonValue) -> JsonValue:
    """The result after the tool-result guardrails.

    A structured result is checked as its JSON text; a redaction that leaves that text
    JSON of the same shape keeps the result structured (`{"email": "[email]"}`), one that
    does not replaces it with the redacted text.
    """
    if not ctx.plugins:
        return output
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    checked = await guard(
        ctx, "tool-loop", "tool_result", text, subject=f"result of {call.name}", call=call
    )
    if checked == text:
        return output
    if isinstance(output, str):
        return checked
    try:
        redacted: JsonValue = json.loads(checked)
    except ValueError:
        return checked
    return redacted if type(redacted) is type(output) else checked


def _remember(ctx: StageContext, result: ToolResultBlock) -> TranscriptMessage:
    """Keep the whole result for `read_tool_result`; the model gets the message."""
    notes = ctx.recorder.notes
    notes.full_results[result.tool_call_id] = result_text(result)
    notes.results[result.tool_call_id] = result
    message = notes.result_messages[result.tool_call_id] = result_message(ctx, result)
    return message


def _read_result(ctx: StageContext, args: Mapping[str, JsonValue]) -> tuple[str | None, JsonValue]:
    """The built-in `read_tool_result`: a window of a whole result of this turn."""
    call_id = str(args.get("tool_call_id") or "")
    full = ctx.recorder.notes.full_results.get(call_id)
    if full is None:
        known = list(ctx.recorder.notes.full_results)
        return f"no result of this turn has tool_call_id {call_id!r}; known: {known}", None
    offset = args.get("offset") or 0
    most = preview_chars(ctx) or len(full)
    limit = args.get("limit") or most
    if not isinstance(offset, int) or not isinstance(limit, int) or offset < 0 or limit < 1:
        return "offset must be a whole number >= 0 and limit one >= 1", None
    limit = min(limit, most)  # a window is never longer than a preview
    window = _fitting(full[offset : offset + limit], most - 64)  # its JSON within it too
    rest = max(0, len(full) - offset - len(window))
    return None, {"text": window, "offset": offset, "remaining_chars": rest}


def _fitting(window: str, most: int) -> str:
    """`window`, shortened until its JSON (escapes and all) is at most `most` characters."""
    for _ in range(8):  # each pass cuts in proportion: two or three are enough
        sent = len(json.dumps(window, ensure_ascii=False))
        if sent <= most or len(window) <= 1:
            break
        window = window[: max(1, len(window) * most // sent - 1)]
    return window


def _is_read_result(ctx: StageContext, part: ToolCallPart) -> bool:
    return ctx.agent.tool_result_preview_chars is not None and part.name == READ_RESULT_TOOL


Plan = tuple[ToolCallPart, Tool | None, dict[str, JsonValue], str | None, ErrorCode]


def _write_ahead(
    ctx: StageContext,
    calls: tuple[ToolCallPart, ...],
    cut: str | None,
    generation_id: str,
    known: Mapping[str, str],
) -> tuple[list[Plan], set[str]]:
    """Stage a `tool.started` per call (with why it will not run, if it will not).

    Also returns the calls in doubt: started by an earlier attempt, with no result, in a
    batch that either paused for no one or whose pause an earlier attempt already resumed
    from (such a call may have run before that attempt died). No call of a batch still
    waiting for an answer had run; once a resumed attempt dies, any may have.
    """
    rec = ctx.recorder
    plans: list[Plan] = []
    in_doubt: set[str] = set()
    # Nothing of a batch runs before all its pauses are settled: a batch that paused, and
    # was not yet resumed by an attempt that died, has no call that may have run.
    paused = any(pause_key(rec.turn_id, c.tool_call_id) in rec.journal.keys for c in calls)
    doubtful = rec.notes.answered_before or not paused
    for part in calls:
        args, problem = _parse(part)
        code: ErrorCode = "tool-arguments-invalid"
        tool = ctx.registry.get(part.name)
        if part.tool_call_id in known:
            problem = known[part.tool_call_id]
        elif cut is not None:
            problem = cut
        elif (
            problem is None
            and tool is None
            and not is_clarify(ctx, part)
            and not _is_read_result(ctx, part)
            and not is_planning_tool(ctx, part.name)
        ):
            code = "tool-not-found"
            offered = [spec.name for spec in offered_tools(ctx)]
            problem = f"there is no tool named {part.name!r}; available: {offered}"
        key = idempotency_key(rec.session_id, rec.turn_id, part.tool_call_id)
        started = rec.durable(
            ToolStartedEvent,
            "tool-loop",
            block=ToolUseBlock(
                tool_call_id=ToolCallId(part.tool_call_id),
                tool_name=part.name,
                arguments=args or {},
            ),
            generation_id=generation_id,
            idempotency_key=key,
            arguments_error=problem,
            asked_session_id=tool.session_for(key) if isinstance(tool, AgentTool) else None,
        )
        rec.notes.call_arguments[part.tool_call_id] = dict(args or {})
        if started is not None:  # not already in the log from an earlier attempt
            rec.notes.tool_calls += 1
        elif part.tool_call_id not in rec.journal.results and doubtful:
            in_doubt.add(part.tool_call_id)
        plans.append((part, tool, args or {}, problem, code))
    return plans, in_doubt
