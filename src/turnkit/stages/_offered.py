"""The tools a reasoning call offers: the agent's own and the built-ins it enables."""

from __future__ import annotations

from turnkit.context.results import read_result_spec
from turnkit.models import ToolSpec
from turnkit.stages._planning import planning_specs
from turnkit.stages._types import StageContext
from turnkit.tools import clarify_spec

__all__ = ("offered_tools",)


def offered_tools(ctx: StageContext) -> tuple[ToolSpec, ...]:
    """What every reasoning call of the agent offers.

    The same on every call: the tools are part of the prompt prefix the cache matches.
    """
    specs = ctx.registry.specs()
    if ctx.agent.clarifications:
        specs += (clarify_spec(),)
    if ctx.agent.planning:
        specs += planning_specs()
    if specs and ctx.agent.tool_result_preview_chars is not None:
        specs += (read_result_spec(),)
    return specs
