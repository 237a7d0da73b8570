"""Hooks on what a model call produced and what its tools answered.

- `repair_arguments`: fix a tool call's argument text that is almost JSON (code fences,
  trailing commas, nothing at all) before the call is appended; never a truncated one.
- `preview_result`: a long tool result is sent as a preview plus a note that the whole
  result can be read again with the built-in `read_tool_result` tool.
"""

from __future__ import annotations

import json
import re
from typing import Final

from turnkit.models import ToolSpec

__all__ = (
    "READ_RESULT_TOOL",
    "preview_result",
    "read_result_spec",
    "repair_arguments",
)

READ_RESULT_TOOL: Final = "read_tool_result"

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def repair_arguments(raw: str) -> str:
    """The argument text with harmless damage repaired; unchanged when it cannot be."""
    text = raw.strip()
    if not text:
        return "{}"
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    for candidate in (text, _TRAILING_COMMA.sub(r"\1", text)):
        try:
            json.loads(candidate)
        except json.JSONDecodeError:
            continue
        return candidate
    return raw


def preview_result(content: str, *, limit: int, tool_call_id: str) -> str:
    """`content` itself when short, else its first `limit` characters and a note."""
    if len(content) <= limit:
        return content
    return (
        f"{content[:limit]}\n[{len(content) - limit} more characters not shown. The whole "
        f"result is kept: call `{READ_RESULT_TOOL}` with tool_call_id={tool_call_id!r} and "
        f"offset={limit} to read on]"
    )


def read_result_spec() -> ToolSpec:
    """The built-in tool that reads a long tool result again, a window at a time."""
    return ToolSpec(
        name=READ_RESULT_TOOL,
        description="Read on in a tool result shown as a preview.",
        parameters={
            "type": "object",
            "properties": {
                "tool_call_id": {"type": "string"},
                "offset": {"type": "integer"},
                "limit": {"type": "integer"},
            },
            "required": ["tool_call_id"],
        },
    )
