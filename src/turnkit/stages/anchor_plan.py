"""anchor-plan: classify intent and decide how much planning the turn needs (seed 002)."""

from __future__ import annotations

import json
import re
from typing import Literal, cast

from turnkit.audit import AuditPayloads, PlanGenerationPayload
from turnkit.models import ModelMessage, ModelRequest
from turnkit.stages._calls import call_model
from turnkit.stages._types import StageContext, StageOutcome, TranscriptMessage

__all__ = ("PLAN_PROMPT", "run_anchor_plan")

Depth = Literal["none", "task_list", "spec_plan_tasks"]

PLAN_PROMPT = (
    "Classify the user's last message for an assistant that has tools. Answer with JSON only: "
    '{"intent": "<a few words>", "depth": "none" | "task_list" | "spec_plan_tasks", '
    '"tasks": ["<step>", ...]}. depth is none when one or two lookups answer it, task_list '
    "for clear work of three to five steps, spec_plan_tasks for large or vague work."
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

    A plan with tasks is appended to the transcript as a system note, so every later call
    carries it (append-only: no earlier byte changes).
    """
    if ctx.utility is None:
        plan = _heuristic(content)
        ctx.recorder.audit("anchor-plan", call=None, payloads=AuditPayloads(planGeneration=plan))
    else:
        request = ModelRequest(
            messages=(
                ModelMessage(role="system", content=PLAN_PROMPT),
                ModelMessage(role="user", content=content),
            ),
            purpose="plan",
        )
        result = await call_model(
            ctx, "anchor-plan", ctx.utility, request, block_key="plan", stream_text=False
        )
        plan = _parse(result.response.text, content)
        ctx.recorder.audit(
            "anchor-plan",
            call=result.shape,
            payloads=AuditPayloads(planGeneration=plan, providerCascade=result.cascade),
        )
    if plan.tasks:
        steps = "\n".join(f"{i}. {task}" for i, task in enumerate(plan.tasks, 1))
        transcript = [
            *transcript,
            {"role": "system", "content": f"Plan for this request:\n{steps}"},
        ]
    no_tools = not len(ctx.registry) and not ctx.agent.clarifications
    skip_tools = "tool-loop" in ctx.agent.skip_stages or no_tools
    return StageOutcome(transcript=transcript, route="synthesize" if skip_tools else "tool-loop")
