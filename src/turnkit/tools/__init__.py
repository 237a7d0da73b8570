"""Tools: the `Tool` port, the `@tool` decorator, `ToolContext` and the registry.

A tool's JSON schema comes from its signature; its arguments are validated with pydantic
before it runs, and a validation failure becomes a failed result the model can read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from turnkit.errors import DuplicateToolError
from turnkit.models import ToolSpec
from turnkit.pauses import CLARIFY_TOOL
from turnkit.tools._agent_tool import (
    DELEGATED_SESSION_PREFIX,
    AgentTool,
    AgentToolError,
    delegated_session_id,
)
from turnkit.tools._context import ToolContext
from turnkit.tools._errors import AskedAgentWaits, ToolArgumentsError
from turnkit.tools._function import NOT_APPLIED, FunctionTool, tool
from turnkit.tools._protocol import Tool
from turnkit.tools.cascade import ToolClass, validated_arguments

__all__ = (
    "DELEGATED_SESSION_PREFIX",
    "NOT_APPLIED",
    "AgentTool",
    "AgentToolError",
    "AskedAgentWaits",
    "FunctionTool",
    "clarify_spec",
    "delegated_session_id",
    "Tool",
    "ToolArgumentsError",
    "ToolClass",
    "ToolContext",
    "ToolRegistry",
    "tool",
    "validated_arguments",
)


class ToolRegistry:
    """The tools of one agent, by name. Two tools of one name are a configuration error."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self._tools:
                raise DuplicateToolError(
                    f"two tools are named {item.name!r}; give each tool of an agent its own "
                    "name (`@tool(name=...)`), or group alternatives in a `ToolClass`",
                    tool_name=item.name,
                )
            self._tools[item.name] = item

    def get(self, name: str) -> Tool | None:
        """The tool called `name`, if any."""
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Tool names in registration order."""
        return tuple(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model is offered."""
        return tuple(t.spec() for t in self._tools.values())

    def only(self, names: Iterable[str]) -> ToolRegistry:
        """The tools whose names are in `names`, in registration order."""
        allowed = set(names)
        return ToolRegistry(t for n, t in self._tools.items() if n in allowed)

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        """The tools in registration order."""
        return iter(self._tools.values())


def clarify_spec() -> ToolSpec:
    """The built-in tool the model calls to ask the person a question."""
    return ToolSpec(
        name=CLARIFY_TOOL,
        description=(
            "Ask the person a question when the answer would change what you deliver. "
            "The turn pauses until they answer; their answer is this tool's result."
        ),
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question to ask."},
                "choices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Answers to offer, if the question has a few.",
                },
            },
            "required": ["question"],
            "additionalProperties": False,
        },
    )
