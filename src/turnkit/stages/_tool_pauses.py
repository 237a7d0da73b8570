"""Pauses for a person: before a call runs, or while the agent a call asked waits for one.

Before a call runs: the agent's question, or a call to approve. While it runs: an agent
asked as a tool waits for a person, and its request is handed to this turn. A call that
needs a person raises out of the node (LangGraph's interrupt); on resume the same code
runs again and the interrupt returns the person's answer, so the call is settled exactly
once however often the node is replayed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import JsonValue

from turnkit.context.transcript import TranscriptToolCall
from turnkit.errors import ErrorCode
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    AskedPause,
    ClarificationRequestedEvent,
)
from turnkit.ids import ToolCallId, derive_id
from turnkit.models import ToolCallPart
from turnkit.pauses import (
    CLARIFY_TOOL,
    RESOLUTION_ADAPTER,
    Answer,
    ApprovalContext,
    ApprovalPolicy,
    Approve,
    Deny,
    PauseRequest,
    Resolution,
    call_request_id,
    needs_approval,
    summarize_call,
)
from turnkit.stages._types import StageContext, TranscriptMessage
from turnkit.tools import AskedAgentWaits, Tool, ToolArgumentsError, ToolClass, validated_arguments

__all__ = (
    "Edited",
    "Settled",
    "MAX_HANDED",
    "hand_over_pause",
    "handed_over",
    "is_clarify",
    "pause_key",
    "settle_pause",
    "take_asked_answers",
    "with_arguments_run",
)

log = logging.getLogger("turnkit.tools")

Settled = tuple[str | None, ErrorCode, JsonValue]
"""A call answered without running it: (problem, its code, output)."""

MAX_HANDED: Final = 64
"""Pauses one call hands over at most (a runaway asked agent stops being followed)."""


@dataclass(frozen=True, slots=True)
class Edited:
    """An approved call that runs with the arguments the person gave instead."""

    arguments: dict[str, JsonValue]


def with_arguments_run(
    asked: TranscriptMessage, edited: Mapping[str, Mapping[str, JsonValue]]
) -> TranscriptMessage:
    """`asked` with the arguments a person gave at approval (by call id), as they ran.

    The model then reads its calls with them, as if it had written them.
    """
    if not edited:
        return asked
    calls: list[TranscriptToolCall] = [
        {**c, "arguments": json.dumps(edited[c["id"]], ensure_ascii=False)}
        if c["id"] in edited
        else c
        for c in asked.get("tool_calls", [])
    ]
    return {**asked, "tool_calls": calls}


def is_clarify(ctx: StageContext, part: ToolCallPart) -> bool:
    """Whether the call is the agent's question to the person (when it may ask one)."""
    return ctx.agent.clarifications and part.name == CLARIFY_TOOL


def settle_pause(
    ctx: StageContext,
    part: ToolCallPart,
    tool: Tool | None,
    args: Mapping[str, JsonValue],
    *,
    asked: bool | None = None,
) -> Settled | Edited | None:
    """Pause for a question or an approval if this call needs one; the settled outcome.

    Returns None when the call should simply run, `Edited` when it runs with the
    arguments the approving person gave. Pausing raises out of the node (the LangGraph
    interrupt); on resume the same code runs again and the interrupt returns the
    person's answer. `asked`: whether the call asked in an earlier run of this batch
    (None: it was not reached then, so its policy decides now). LangGraph hands answers
    to the node's interrupts in order, so a call decided before must decide the same.
    """
    rec = ctx.recorder
    call_id = ToolCallId(part.tool_call_id)
    request_id = call_request_id(rec.turn_id, part.tool_call_id)
    if is_clarify(ctx, part):
        question = str(args.get("question") or "")
        raw_choices = args.get("choices") or []
        choices = tuple(str(c) for c in raw_choices) if isinstance(raw_choices, list) else ()
        rec.durable(
            ClarificationRequestedEvent,
            "tool-loop",
            request_id=request_id,
            question=question,
            choices=choices,
            tool_call_id=ToolCallId(part.tool_call_id),
        )
        payload: dict[str, JsonValue] = {"question": question, "choices": list(choices)}
        resolution = _wait(ctx, request_id, "clarification", part, payload)
        if not isinstance(resolution, Answer):
            return ("the question was not answered", "tool-failed", None)
        return (None, "tool-failed", {"answer": resolution.text})
    if tool is None:
        return None
    if asked is None:
        asks = _approval(ctx, tool, part.name, args)
    else:  # decided in an earlier run: the person's answer (or its absence) stands,
        asks = _Asks(_role(ctx, tool)) if asked else None  # whatever the policy says now
    if asks is None:
        return None
    summary = summarize_call(part.name, args)
    rec.durable(
        ApprovalRequestedEvent,
        "tool-loop",
        request_id=request_id,
        tool_call_id=call_id,
        tool_name=part.name,
        arguments=dict(args),
        summary=summary,
        approver_role=asks.role,
    )
    payload = {
        "tool_name": part.name,
        "arguments": dict(args),
        "summary": summary,
    }
    if asks.role is not None:
        payload["approver_role"] = asks.role
    resolution = _wait(ctx, request_id, "approval", part, payload)
    if isinstance(resolution, Approve | Deny):
        rec.durable(
            ApprovalAnsweredEvent,
            "tool-loop",
            request_id=request_id,
            tool_call_id=call_id,
            tool_name=part.name,
            decision=resolution.kind,
            note=resolution.note,
            arguments=resolution.arguments if isinstance(resolution, Approve) else None,
        )
    if isinstance(resolution, Deny):
        note = f": {resolution.note}" if resolution.note else ""
        return (f"the person denied this call{note}. Do not retry it as is", "tool-denied", None)
    if isinstance(resolution, Approve) and resolution.arguments is not None:
        return Edited(resolution.arguments)
    return None  # approved: run it


@dataclass(frozen=True, slots=True)
class _Asks:
    """A call needs a person's approval; `role` answers it (None: the session's owner)."""

    role: str | None


def _approval(
    ctx: StageContext, tool: Tool, called: str, args: Mapping[str, JsonValue]
) -> _Asks | None:
    """Whether a person must approve the call (to `called`, the name the model used) first.

    Every policy is asked about the name the model called, with the arguments the tool
    would run with (validated and converted: `"80"` is `80`); a policy that raises asks.
    A call the tool refuses never runs, so it needs no approval. A `ToolClass` (nested
    ones too) asks when any member would: its first member failing must not open a way
    past a later member's policy; arguments its first member refuses run nowhere (the
    cascade does not retry them), and a later member that refuses them is passed over.
    """
    members = _members(tool)
    policies = [getattr(m, "approval", None) or ctx.agent.approval for m in members]
    if all(policy == "never" for policy in policies):
        return None  # most calls: no arguments checked here, the tool checks them
    first = _checked(members[0], args)
    if first is None:
        return None
    for at, (member, policy) in enumerate(zip(members, policies, strict=True)):
        if policy == "never":
            continue
        checked = first if at == 0 else _checked(member, args)
        if checked is not None and _asks(ctx, policy, called, checked):
            return _Asks(_role(ctx, tool))
    return None


def _members(tool: Tool) -> tuple[Tool, ...]:
    """The tools a call may end up running, in the order they are tried."""
    return tool.leaves() if isinstance(tool, ToolClass) else (tool,)


def _role(ctx: StageContext, tool: Tool) -> str | None:
    """Who answers the call's approval: the role its tool names, else the agent's.

    A tool class's members name one role at most (checked when it is made): whoever
    approves may approve the member that ends up running.
    """
    named = (getattr(member, "approver_role", None) for member in _members(tool))
    return next((role for role in named if role is not None), ctx.agent.approver_role)


def _checked(tool: Tool, args: Mapping[str, JsonValue]) -> Mapping[str, Any] | None:
    """The arguments as `tool` would run with them; None when it refuses them."""
    try:
        return validated_arguments(tool, args)
    except ToolArgumentsError:
        return None


def _asks(
    ctx: StageContext, policy: ApprovalPolicy, called: str, checked: Mapping[str, Any]
) -> bool:
    """Whether `policy` asks about a call with the `checked` arguments (raising: it asks)."""
    if policy in ("never", "always"):
        return policy == "always"
    rec = ctx.recorder
    context = ApprovalContext(
        caller=ctx.caller, deps=ctx.deps, session_id=rec.session_id, turn_id=rec.turn_id
    )
    try:
        return needs_approval(policy, called, checked, context)
    except Exception as exc:  # noqa: BLE001 - an app's policy: fail closed, say so
        log.warning(
            "the approval policy of %r raised %s (%s): the call waits for a person",
            called,
            type(exc).__name__,
            exc,
        )
        return True


def _wait(
    ctx: StageContext,
    request_id: str,
    kind: Literal["approval", "clarification"],
    part: ToolCallPart,
    payload: dict[str, JsonValue],
) -> Resolution:
    rec = ctx.recorder
    rec.notes.pending_pause = PauseRequest(
        request_id=request_id, kind=kind, tool_call_id=part.tool_call_id, payload=payload
    )
    answer = ctx.interrupt({"request_id": request_id, "kind": kind})
    rec.notes.pending_pause = None
    return RESOLUTION_ADAPTER.validate_python(answer)


def pause_key(turn_id: str, tool_call_id: str) -> str:
    """The journal key of the pause a call asked for (see `dedupe_key`)."""
    return f"pause:{call_request_id(turn_id, tool_call_id)}"


def hand_over_pause(ctx: StageContext, part: ToolCallPart, waits: AskedAgentWaits) -> None:
    """Pause this turn with the request an agent asked by the call `part` waits on.

    The approval (or question) is committed here, naming the asked turn and its request
    (`asked`), and the turn waits as for its own; the answer goes on to the asked turn
    (`SessionRuntime.resume`), and the call follows it again when this turn resumes.
    Raises out of the node (LangGraph's interrupt), like every pause.
    """
    rec = ctx.recorder
    request_id = _handed_id(rec.turn_id, part, handed_over(ctx, part))
    pause = waits.pause
    asked = AskedPause(
        agent=waits.agent,
        session_id=pause.session_id,
        turn_id=pause.turn_id,
        request_id=pause.request_id,
    )
    if isinstance(pause, ApprovalRequestedEvent):
        event: ApprovalRequestedEvent | ClarificationRequestedEvent | None = rec.durable(
            ApprovalRequestedEvent,
            "tool-loop",
            request_id=request_id,
            tool_call_id=ToolCallId(part.tool_call_id),
            tool_name=pause.tool_name,
            arguments=pause.arguments,
            summary=f"{waits.agent}: {pause.summary}",
            approver_role=pause.approver_role,
            asked=asked,
        )
    else:
        event = rec.durable(
            ClarificationRequestedEvent,
            "tool-loop",
            request_id=request_id,
            question=pause.question,
            choices=pause.choices,
            asked=asked,
            tool_call_id=ToolCallId(part.tool_call_id),
        )
    if event is None:  # the log holds it already (cannot happen: its id is new)
        raise RuntimeError(f"the request {request_id} was handed over before")
    _wait(ctx, request_id, _kind(event), part, _payload(event))


def take_asked_answers(ctx: StageContext, parts: Sequence[ToolCallPart]) -> set[str]:
    """Take the answers to the requests the batch's agent tools handed over before.

    In call order, for every call (those with a result too): LangGraph hands a node's
    resume values to its interrupts in the order they are called, so each request handed
    over must take its answer again whenever the node runs. An answered approval is on
    the stream (`approval.answered`, once). Returns the calls that handed one over: they
    follow their asked turn again (they were not cut off by a crash).
    """
    rec = ctx.recorder
    handed: set[str] = set()
    if not rec.journal.asked:  # most turns: no agent of theirs waited for a person
        return handed
    for part in parts:
        for n in range(MAX_HANDED):
            request_id = _handed_id(rec.turn_id, part, n)
            pause = rec.journal.asked.get(request_id)
            if pause is None:
                break
            handed.add(part.tool_call_id)
            resolution = _wait(ctx, request_id, _kind(pause), part, _payload(pause))
            if isinstance(pause, ApprovalRequestedEvent) and isinstance(resolution, Approve | Deny):
                rec.durable(
                    ApprovalAnsweredEvent,
                    "tool-loop",
                    request_id=request_id,
                    tool_call_id=pause.tool_call_id,
                    tool_name=pause.tool_name,
                    decision=resolution.kind,
                    note=resolution.note,
                    arguments=resolution.arguments if isinstance(resolution, Approve) else None,
                )
    return handed


def handed_over(ctx: StageContext, part: ToolCallPart) -> int:
    """How many requests the call handed over before (at most `MAX_HANDED`)."""
    journal, turn_id = ctx.recorder.journal, ctx.recorder.turn_id
    if not journal.asked:  # most turns: no agent of theirs waited for a person
        return 0
    for n in range(MAX_HANDED):  # numbered from 0 in the order they were handed over
        if _handed_id(turn_id, part, n) not in journal.asked:
            return n
    return MAX_HANDED


def _handed_id(turn_id: str, part: ToolCallPart, n: int) -> str:
    return derive_id("req", turn_id, part.tool_call_id, "asked", n)


def _kind(
    event: ApprovalRequestedEvent | ClarificationRequestedEvent,
) -> Literal["approval", "clarification"]:
    return "approval" if isinstance(event, ApprovalRequestedEvent) else "clarification"


def _payload(event: ApprovalRequestedEvent | ClarificationRequestedEvent) -> dict[str, JsonValue]:
    """The saved request of a handed-over pause (what the inbox and the CLI read)."""
    asked: JsonValue = event.asked.model_dump(mode="json") if event.asked is not None else None
    if isinstance(event, ClarificationRequestedEvent):
        return {"question": event.question, "choices": list(event.choices), "asked": asked}
    payload: dict[str, JsonValue] = {
        "tool_name": event.tool_name,
        "arguments": dict(event.arguments),
        "summary": event.summary,
        "asked": asked,
    }
    if event.approver_role is not None:
        payload["approver_role"] = event.approver_role
    return payload
