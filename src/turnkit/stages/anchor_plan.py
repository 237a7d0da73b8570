"""anchor-plan: classify intent and decide how much planning the turn needs."""

from __future__ import annotations

import json
import logging
import re
from typing import Literal, cast

from turnkit.audit import AuditPayloads, PlanGenerationPayload
from turnkit.models import ModelMessage, ModelRequest
from turnkit.skills import picked_skill
from turnkit.stages._calls import UTILITY_OUTAGES, call_model
from turnkit.stages._planning import plan_notes
from turnkit.stages._plugins import after_model_response, before_model_request
from turnkit.stages._types import StageContext, StageOutcome, TranscriptMessage

__all__ = ("PLAN_PROMPT", "run_anchor_plan")

log = logging.getLogger(__name__)

Depth = Literal["none", "task_list", "spec_plan_tasks"]

PLAN_PROMPT = (
    "Classify the user's last message for an assistant that has tools. Answer with JSON only: "
    '{"intent": "<a few words>", "depth": "none" | "task_list" | "spec_plan_tasks", '
    '"tasks": ["<step>", ...]}. depth is none when one or two lookups answer it, task_list '
    "for clear work of three to five steps, spec_plan_tasks for large or vague work."
)


def _note(text: str) -> TranscriptMessage:
    return {"role": "system", "content": text, "standing": True}  # compaction keeps it


async def _plan_request(ctx: StageContext, content: str) -> ModelRequest:
    """The planning call, with the notes plugins append to it.

    Their notes go to this call only: the turn's own calls ask the plugins again.
    """
    asked: list[TranscriptMessage] = [
        {"role": "system", "content": PLAN_PROMPT},
        {"role": "user", "content": content},
    ]
    notes = await before_model_request(ctx, "anchor-plan", asked)
    return ModelRequest(
        messages=(
            ModelMessage(role="system", content=PLAN_PROMPT),
            ModelMessage(role="user", content=content),
            *(ModelMessage(role="system", content=str(n["content"])) for n in notes),
        ),
        purpose="plan",
    )


def _heuristic(content: str) -> PlanGenerationPayload:
    words = len(content.split())
    depth: Depth = "none" if words < 60 else "task_list"
    return PlanGenerationPayload(intent="answer", depth=depth)


def _parse(text: str, content: str) -> PlanGenerationPayload:
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return _heuristic(content)
    depth = data.get("depth")
    if depth not in ("none", "task_list", "spec_plan_tasks"):
        depth = "none"
    tasks = data.get("tasks") if isinstance(data.get("tasks"), list) else []
    return PlanGenerationPayload(
        intent=str(data.get("intent") or "answer")[:200],
        depth=cast(Depth, depth),
        tasks=tuple(str(t)[:500] for t in cast(list[object], tasks)[:20]),
    )


async def run_anchor_plan(
    ctx: StageContext, content: str, transcript: list[TranscriptMessage]
) -> StageOutcome:
    """Plan with the utility model if the agent has one, else by a cheap heuristic.

    A utility model that fails on every rung leaves the plan to the heuristic: planning
    helps the turn, it is not the turn.

    The tier's notes (the plan's tasks, or the spec → plan → tasks instructions for an
    agent with `planning`, and the instructions of a skill the message picked with
    `/slug`) are appended to the transcript as system notes, so every later call carries
    them (append-only: no earlier byte changes).
    """
    result = None
    if ctx.utility is None:
        plan = _heuristic(content)
    else:
        request = await _plan_request(ctx, content)
        try:
            result = await call_model(
                ctx, "anchor-plan", ctx.utility, request, block_key="plan", stream_text=False
            )
        except UTILITY_OUTAGES as exc:  # the plan is help, not the turn
            log.warning("turn %s plans without its utility model: %s", ctx.recorder.turn_id, exc)
            plan = _heuristic(content).model_copy(update={"utility_error": exc.code})
        else:
            await after_model_response(ctx, "anchor-plan", request, result.response)
            plan = _parse(result.response.text, content)
    picked = picked_skill(content, ctx.skills)
    if picked is not None:
        plan = plan.model_copy(update={"skill": picked.ref})
    notes = plan_notes(ctx, plan, picked)
    ctx.recorder.audit(
        "anchor-plan",
        call=result.shape if result is not None else None,
        payloads=AuditPayloads(
            planGeneration=plan, providerCascade=result.cascade if result is not None else None
        ),
    )
    transcript = [*transcript, *(_note(n) for n in notes)]
    no_tools = not len(ctx.registry) and not ctx.agent.clarifications and not ctx.agent.planning
    skip_tools = "tool-loop" in ctx.agent.skip_stages or no_tools
    return StageOutcome(transcript=transcript, route="synthesize" if skip_tools else "tool-loop")
