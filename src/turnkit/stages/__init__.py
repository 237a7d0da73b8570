"""The four stages as plain async functions; `turnkit.graph` adapts them to LangGraph."""

from turnkit.stages._types import StageContext, StageOutcome
from turnkit.stages.anchor_plan import run_anchor_plan
from turnkit.stages.post_turn import run_post_turn
from turnkit.stages.synthesize import run_synthesize
from turnkit.stages.tool_loop import run_tool_loop

__all__ = (
    "StageContext",
    "StageOutcome",
    "run_anchor_plan",
    "run_post_turn",
    "run_synthesize",
    "run_tool_loop",
)
