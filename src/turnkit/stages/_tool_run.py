"""Run one tool call: its context, its job's reports, and the reconcile of one in doubt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from pydantic import JsonValue

from turnkit import otel
from turnkit.audit import AskedTurnPayload, AuditPayloads, ToolFallbackStepPayload
from turnkit.errors import ErrorCode, typed_message
from turnkit.events import (
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    ToolInDoubtEvent,
)
from turnkit.ids import ToolCallId, derive_id
from turnkit.journal import dedupe_key
from turnkit.models import ToolCallPart
from turnkit.stages._types import StageContext
from turnkit.tools import AskedAgentWaits, Tool, ToolArgumentsError, ToolContext
from turnkit.tools._errors import ToolResultError
from turnkit.tools._protocol import ReconcileMisfitError, ask_reconcile

__all__ = ("idempotency_key", "invoke_tool", "reconcile_call")

log = logging.getLogger("turnkit.tools")


def idempotency_key(session_id: str, turn_id: str, tool_call_id: str) -> str:
    """Stable across retries and recovery: derived from ids the log already holds."""
    return derive_id("idem", session_id, turn_id, tool_call_id)


def _tool_context(ctx: StageContext, part: ToolCallPart, reports: _Reports) -> ToolContext:
    """What the tool (or its reconcile hook) is handed; what it reports goes to `reports`."""
    rec = ctx.recorder
    return ToolContext(
        session_id=rec.session_id,
        turn_id=rec.turn_id,
        tool_call_id=reports.call_id,
        idempotency_key=idempotency_key(rec.session_id, rec.turn_id, part.tool_call_id),
        principal=ctx.principal,
        caller=ctx.caller,
        deps=ctx.deps,
        callback_token=ctx.callback_token,
        knowledge=tuple(ctx.agent.knowledge),
        memory=ctx.agent.memory,
        # Also a reconcile hook's: it may take a while (an agent asked as a tool joins the
        # turn it began), and its reports keep the turn's idle window open.
        _progress=reports.progress,
        _pivot=reports.pivot,  # a tool class's fallback steps: audited, the answerer moves
        _answered=reports.answered,  # the member of a tool class that answered
        _asked_spent=reports.asked_spent,  # an agent asked as a tool ended: what it spent
        _ask_agent=ctx.ask_agent,
    )


async def invoke_tool(
    ctx: StageContext, tool: Tool, part: ToolCallPart, args: Mapping[str, JsonValue]
) -> tuple[str | None, ErrorCode, JsonValue, str]:
    """Run the tool; a failure is a result the model reads (a problem and its code).

    Also returns the tool that answered (a tool class's fallback step moves it).
    """
    reports = _Reports(ctx, tool, part)
    tool_ctx = _tool_context(ctx, part, reports)
    problem: str | None = None
    code: ErrorCode = "tool-failed"
    output: JsonValue = None
    try:
        output = await tool.invoke(args, tool_ctx)
    except AskedAgentWaits:
        raise  # not a result: the turn waits with the agent
    except ToolArgumentsError as exc:
        problem, code = f"{exc.reason}. Fix the arguments and call again", "tool-arguments-invalid"
    except ToolResultError as exc:
        problem = str(exc)
    except asyncio.CancelledError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        # A failing tool is a result the model reads; `sys.exit()` in a tool (argparse,
        # click on bad input) too: escaping the task, it would end the whole process.
        problem = f"the tool raised {typed_message(exc)}"
    reports.ended(failed=problem is not None)
    return problem, code, output, reports.answered_by


class _Reports:
    """What a running tool reports: its job's progress, and a tool class's fallback steps."""

    def __init__(self, ctx: StageContext, tool: Tool, part: ToolCallPart) -> None:
        self._rec = ctx.recorder
        self._tool_class = tool.name
        self._tool_name = part.name
        self.call_id = ToolCallId(part.tool_call_id)
        self._job_id = derive_id("job", self._rec.turn_id, part.tool_call_id)
        # An earlier attempt may have dispatched it: then it is only completed here.
        self._dispatched = dedupe_key("job.dispatched", {"job_id": self._job_id}) in (
            self._rec.journal.keys
        )
        if self._dispatched:  # still open: this attempt's ending completes it if cut
            self._rec.notes.open_jobs[self._job_id] = self.call_id
        self.answered_by = part.name
        """The tool that answered (a fallback step moves it)."""

    async def progress(self, fraction: float | None, message: str | None) -> None:
        """`job.progress` to live readers; the first report stages `job.dispatched`."""
        rec = self._rec
        if not self._dispatched:
            self._dispatched = True
            rec.notes.open_jobs[self._job_id] = self.call_id  # completed by the ending if cut
            rec.durable(
                JobDispatchedEvent,
                "tool-loop",
                job_id=self._job_id,
                tool_call_id=self.call_id,
                tool_name=self._tool_name,
            )
        await rec.ephemeral(
            JobProgressEvent,
            "tool-loop",
            job_id=self._job_id,
            tool_call_id=self.call_id,
            progress=fraction,
            message=message,
        )

    async def pivot(self, from_tool: str, to_tool: str | None, reason: str) -> None:
        """A fallback step of the tool class: audited, traced, and the answering tool moves."""
        self.answered_by = to_tool or from_tool
        otel.tool_fallback(from_tool, to_tool, reason)
        self._rec.audit(
            "tool-loop",
            call=None,
            payloads=AuditPayloads(
                toolFallbackStep=ToolFallbackStepPayload(
                    tool_call_id=self.call_id,
                    tool_class=self._tool_class,
                    from_tool=from_tool,
                    to_tool=to_tool,
                    reason=reason,
                )
            ),
        )

    def answered(self, member: str) -> None:
        """The member of a tool class that returned the call's result."""
        self.answered_by = member

    def asked_spent(self, spent: AskedTurnPayload) -> None:
        """Audit what an agent asked by this call spent, once per asked turn.

        A call that runs again after a crash joins the turn it asked, which the audit rows
        read back already count: nothing is added twice.
        """
        rec = self._rec
        if spent.turn_id in rec.notes.asked_spent:
            return
        spent = spent.model_copy(update={"tool_call_id": self.call_id})
        rec.notes.asked_spent[spent.turn_id] = spent
        rec.audit("tool-loop", call=None, payloads=AuditPayloads(askedTurn=spent))

    def ended(self, *, failed: bool) -> None:
        """Stage `job.completed` for a job that reported progress."""
        if self._dispatched:
            self._rec.notes.open_jobs.pop(self._job_id, None)
            self._rec.durable(
                JobCompletedEvent,
                "tool-loop",
                job_id=self._job_id,
                tool_call_id=self.call_id,
                is_error=failed,
            )


async def reconcile_call(
    ctx: StageContext, tool: Tool, part: ToolCallPart, args: Mapping[str, JsonValue]
) -> tuple[bool, JsonValue, str | None]:
    """A call an earlier attempt started and never finished: did it take effect?

    The tool's reconcile hook answers (a tool without one, or whose hook raises, runs
    again, with the same idempotency key; one whose hook answers in a shape turnkit cannot
    read fails: the third item says why); the answer is committed as `tool.in_doubt`.
    """
    rec = ctx.recorder
    key = idempotency_key(rec.session_id, rec.turn_id, part.tool_call_id)
    hook = getattr(tool, "reconcile", None)
    applied, output, misfit = False, None, None
    reports = _Reports(ctx, tool, part)
    if hook is not None:
        tool_ctx = _tool_context(ctx, part, reports)
        try:
            applied, output = await ask_reconcile(hook, part.name, args, tool_ctx)
        except (asyncio.CancelledError, AskedAgentWaits):
            raise  # the agent it joined waits for a person: so does this turn
        except ReconcileMisfitError as exc:
            misfit = str(exc)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - "not known": run again
            log.warning("reconcile of %s (%s) failed: %s", part.name, part.tool_call_id, exc)
    rec.durable(
        ToolInDoubtEvent,
        "tool-loop",
        tool_call_id=ToolCallId(part.tool_call_id),
        tool_name=part.name,
        idempotency_key=key,
        resolution="failed" if misfit else "reconciled" if applied else "rerun",
    )
    if misfit or applied:  # it does not run again: its job, if it had one, is over
        reports.ended(failed=misfit is not None)
    await rec.flush()  # on record before the call runs again: readers see why it restarted
    return applied, output, misfit
