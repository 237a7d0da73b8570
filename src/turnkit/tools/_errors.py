"""What a tool call raises besides its result, below the tools and `ToolClass` alike.

`ToolClass` re-raises `ToolArgumentsError` and `AskedAgentWaits` instead of pivoting to
its next member; keeping them here means `cascade` need not import `_function`, which
builds a `ToolClass` for `@tool(fallbacks=...)`.
"""

from __future__ import annotations

from turnkit.events import ApprovalRequestedEvent, ClarificationRequestedEvent

__all__ = ("AskedAgentWaits", "ToolArgumentsError", "ToolResultError", "ToolTimeoutError")


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


class AskedAgentWaits(Exception):
    """An agent asked as a tool waits for a person: the asking turn waits with it.

    Not a result: the asking turn pauses with the same approval or question, and the
    answer given there goes on to the asked turn; the call then follows it again.
    """

    def __init__(
        self, agent: str, pause: ApprovalRequestedEvent | ClarificationRequestedEvent
    ) -> None:
        super().__init__(f"the agent {agent!r} waits for a person ({pause.request_id})")
        self.agent = agent
        """The asked agent's name."""
        self.pause = pause
        """What its turn waits for."""
