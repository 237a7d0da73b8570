"""Typed turn blocks: what a turn leaves behind, in order (seed 002 "A message is typed blocks")."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from turnkit.ids import ToolCallId

__all__ = (
    "BLOCK_ADAPTER",
    "Block",
    "TextBlock",
    "ThinkingSummaryBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UserBlock",
)

_CONFIG = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class UserBlock(BaseModel):
    """The user's message that opened the turn."""

    model_config = _CONFIG
    kind: Literal["user"] = "user"
    text: str


class TextBlock(BaseModel):
    """Assistant text: narration written in a tool-using pass, or the answer."""

    model_config = _CONFIG
    kind: Literal["text"] = "text"
    block_id: str
    """Stable id of the block; deltas of the same block carry it."""
    text: str
    is_answer: bool = False
    """True only for the one block the synthesize stage wrote."""


class ThinkingSummaryBlock(BaseModel):
    """A safe summary of what the model considered; raw reasoning never leaves the runtime."""

    model_config = _CONFIG
    kind: Literal["thinking"] = "thinking"
    block_id: str
    summary: str


class ToolUseBlock(BaseModel):
    """A tool call the model made; `arguments` is `{}` when they were not a JSON object."""

    model_config = _CONFIG
    kind: Literal["tool_use"] = "tool_use"
    tool_call_id: ToolCallId
    tool_name: str
    arguments: dict[str, JsonValue]


class ToolResultBlock(BaseModel):
    """What a tool answered, or why it failed; the model reads both."""

    model_config = _CONFIG
    kind: Literal["tool_result"] = "tool_result"
    tool_call_id: ToolCallId
    tool_name: str
    output: JsonValue = None
    """The tool's return value as JSON (None when it failed)."""
    is_error: bool = False
    error: str | None = None
    """Why the call failed, written for the model to read."""


Block = Annotated[
    UserBlock | TextBlock | ThinkingSummaryBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="kind"),
]
BLOCK_ADAPTER: TypeAdapter[Block] = TypeAdapter(Block)
