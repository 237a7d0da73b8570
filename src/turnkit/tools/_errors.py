"""`ToolArgumentsError`, below both `FunctionTool` (which raises it) and `ToolClass`.

`ToolClass` re-raises it instead of pivoting; keeping it here means `cascade` need not
import `_function`, which builds a `ToolClass` for `@tool(fallbacks=...)`.
"""

from __future__ import annotations

__all__ = ("ToolArgumentsError", "ToolResultError", "ToolTimeoutError")


class ToolArgumentsError(Exception):
    """A tool call's arguments do not fit the tool's schema; the model reads `reason`."""

    def __init__(self, tool_name: str, reason: str) -> None:
        super().__init__(f"invalid arguments for tool {tool_name!r}: {reason}")
        self.tool_name = tool_name
        self.reason = reason


class ToolResultError(Exception):
    """A tool returned a value that cannot be sent as JSON; the model reads the message."""


class ToolTimeoutError(ToolResultError):
    """A tool ran past its `timeout_s` and was stopped; the model reads the message."""
