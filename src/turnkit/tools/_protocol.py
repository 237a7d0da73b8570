"""The `Tool` port, below `ToolClass` (a tool made of tools) and the package's registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from pydantic import JsonValue

from turnkit.models import ToolSpec
from turnkit.tools._context import ToolContext

__all__ = ("Tool",)


@runtime_checkable
class Tool(Protocol):
    """Something the model can call.

    `invoke` validates `arguments` (raising `ToolArgumentsError` when they do not fit),
    runs, and returns a JSON value. Any other exception is a failed call the model reads;
    cancellation propagates.
    """

    @property
    def name(self) -> str:
        """The name the model calls."""
        ...

    def spec(self) -> ToolSpec:
        """Name, description and argument schema as offered to the model."""
        ...

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        """Run the tool."""
        ...
