"""Dispatch one batch of tool calls: validate, write ahead, run concurrently, record results."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import cast

from pydantic import JsonValue

from turnkit.audit import AuditPayloads, ToolFallbackStepPayload
from turnkit.blocks import ToolResultBlock, ToolUseBlock
from turnkit.errors import ErrorCode
from turnkit.events import (
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
)
from turnkit.ids import ToolCallId, derive_id
from turnkit.models import ToolCallPart
from turnkit.stages._types import StageContext, TranscriptMessage
from turnkit.tools import Tool, ToolArgumentsError, ToolContext

__all__ = ("dispatch_tools", "idempotency_key")


def idempotency_key(session_id: str, turn_id: str, tool_call_id: str) -> str:
    """Stable across retries and recovery: derived from ids the log already holds."""
    return derive_id("idem", session_id, turn_id, tool_call_id)


def _result_message(result: ToolResultBlock) -> TranscriptMessage:
    if result.is_error:
        content = f"Error: {result.error}"
    else:
        content = json.dumps(result.output, ensure_ascii=False, separators=(",", ":"))
    return {"role": "tool", "content": content, "tool_call_id": result.tool_call_id}


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
    truncated: bool,
    generation_id: str,
    known_errors: Mapping[str, str] | None = None,
) -> list[TranscriptMessage]:
    """Run a batch; one result message per call, in call order.

    `truncated` means the provider's output limit cut the response while the model was
    writing these calls: nothing runs, each call gets a failed result saying so. A call
    whose result is already committed (a recovered attempt) is not run again; a call that
    was written ahead but has no result runs again with the same idempotency key.
    """
    rec = ctx.recorder
    known = known_errors or {}
    plans: list[tuple[ToolCallPart, Tool | None, dict[str, JsonValue], str | None, ErrorCode]] = []
    for part in calls:
        args, problem = _parse(part)
        code: ErrorCode = "tool-arguments-invalid"
        tool = ctx.registry.get(part.name)
        if part.tool_call_id in known:
            problem = known[part.tool_call_id]
        elif truncated:
            problem = (
                "the output limit was reached while this call's arguments were being written; "
                "nothing ran. Write the call again, shorter if you can"
            )
        elif problem is None and tool is None:
            code = "tool-not-found"
            problem = f"there is no tool named {part.name!r}; available: {list(ctx.registry.names)}"
        rec.durable(
            ToolStartedEvent,
            "tool-loop",
            block=ToolUseBlock(
                tool_call_id=ToolCallId(part.tool_call_id),
                tool_name=part.name,
                arguments=args or {},
            ),
            generation_id=generation_id,
            idempotency_key=idempotency_key(rec.session_id, rec.turn_id, part.tool_call_id),
            arguments_error=problem,
        )
        plans.append((part, tool, args or {}, problem, code))
    rec.tool_calls += len(calls)
    await rec.flush()  # write ahead: every call is on record before any tool runs

    async def run(
        part: ToolCallPart,
        tool: Tool | None,
        args: Mapping[str, JsonValue],
        problem: str | None,
        code: ErrorCode,
    ) -> TranscriptMessage:
        started = time.perf_counter()
        call_id = ToolCallId(part.tool_call_id)
        done = rec.journal.results.get(call_id)
        if done is not None:  # committed by an earlier attempt: one result per call
            block, _ = done
            return _result_message(block)
        answered_by = part.name
        if problem is None and tool is not None:
            problem, code, output, answered_by = await _invoke(ctx, tool, part, args)
        else:
            output = None
        duration = (time.perf_counter() - started) * 1000
        rec.tool_timings.append((answered_by, duration))
        if problem is None:
            result = ToolResultBlock(tool_call_id=call_id, tool_name=part.name, output=output)
            rec.durable(
                ToolCompletedEvent,
                "tool-loop",
                tool_call_id=call_id,
                result=result,
                duration_ms=duration,
                tool_name=answered_by,
            )
        else:
            result = ToolResultBlock(
                tool_call_id=call_id, tool_name=part.name, is_error=True, error=problem
            )
            rec.durable(
                ToolFailedEvent,
                "tool-loop",
                tool_call_id=call_id,
                result=result,
                duration_ms=duration,
                code=code,
            )
        return _result_message(result)

    if len(plans) == 1:
        return [await run(*plans[0])]
    return list(await asyncio.gather(*(run(*plan) for plan in plans)))


async def _invoke(
    ctx: StageContext, tool: Tool, part: ToolCallPart, args: Mapping[str, JsonValue]
) -> tuple[str | None, ErrorCode, JsonValue, str]:
    rec = ctx.recorder
    call_id = ToolCallId(part.tool_call_id)
    job_id = derive_id("job", rec.turn_id, part.tool_call_id)
    dispatched = False

    async def progress(fraction: float | None, message: str | None) -> None:
        nonlocal dispatched
        if not dispatched:
            dispatched = True
            rec.durable(
                JobDispatchedEvent,
                "tool-loop",
                job_id=job_id,
                tool_call_id=call_id,
                tool_name=part.name,
            )
        await rec.ephemeral(
            JobProgressEvent,
            "tool-loop",
            job_id=job_id,
            tool_call_id=call_id,
            progress=fraction,
            message=message,
        )

    answered_by = part.name

    async def pivot(from_tool: str, to_tool: str | None, reason: str) -> None:
        nonlocal answered_by
        answered_by = to_tool or from_tool
        rec.audit(
            "tool-loop",
            call=None,
            payloads=AuditPayloads(
                toolFallbackStep=ToolFallbackStepPayload(
                    tool_call_id=call_id,
                    tool_class=tool.name,
                    from_tool=from_tool,
                    to_tool=to_tool,
                    reason=reason,
                )
            ),
        )

    tool_ctx = ToolContext(
        session_id=rec.session_id,
        turn_id=rec.turn_id,
        tool_call_id=call_id,
        idempotency_key=idempotency_key(rec.session_id, rec.turn_id, part.tool_call_id),
        _progress=progress,
        _pivot=pivot,
    )
    problem: str | None = None
    code: ErrorCode = "tool-failed"
    output: JsonValue = None
    try:
        output = await tool.invoke(args, tool_ctx)
    except ToolArgumentsError as exc:
        problem, code = f"{exc.reason}. Fix the arguments and call again", "tool-arguments-invalid"
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing tool is a result the model reads
        problem = f"the tool raised {type(exc).__name__}: {exc}"
    if dispatched:
        rec.durable(
            JobCompletedEvent,
            "tool-loop",
            job_id=job_id,
            tool_call_id=call_id,
            is_error=problem is not None,
        )
    return problem, code, output, answered_by
