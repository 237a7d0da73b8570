"""The model-facing transcript as plain JSON: what checkpoints and the Store keep.

A turn's messages are kept exactly as they were sent, so the next request can start with
the same bytes (the provider's prompt cache matches on that prefix).
"""

from __future__ import annotations

import json
from typing import Literal, NotRequired, TypedDict

from pydantic import TypeAdapter

from turnkit.blocks import ContentPart
from turnkit.models import Content, ModelMessage, ToolCallPart

__all__ = (
    "PRIVATE_KEYS",
    "PartJson",
    "TranscriptMessage",
    "TranscriptToolCall",
    "content_json",
    "from_transcript",
    "picture_parts",
    "sent_bytes",
    "to_transcript",
)

PartJson = dict[str, str]
"""A content part as JSON: `{"kind": "text", "text": …}` or `{"kind": "image", …}`."""

_PART: TypeAdapter[ContentPart] = TypeAdapter(ContentPart)


class TranscriptToolCall(TypedDict):
    """A tool call inside an assistant message, as plain JSON."""

    id: str
    name: str
    arguments: str


class TranscriptMessage(TypedDict):
    """A model message as plain JSON, so checkpoints need no custom serializer."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[PartJson]
    tool_calls: NotRequired[list[TranscriptToolCall]]
    tool_call_id: NotRequired[str]
    input_seq: NotRequired[int]
    """Set on a user message: the input it came from (never sent to the model)."""
    opens_turn: NotRequired[bool]
    """Set on the user message that opened a turn (never sent to the model)."""


PRIVATE_KEYS = frozenset({"input_seq", "opens_turn"})
"""Transcript keys turnkit keeps for itself; they never reach the model."""


def content_json(content: Content) -> str | list[PartJson]:
    """Message content as JSON (text stays a plain string)."""
    if isinstance(content, str):
        return content
    return [
        {k: str(v) for k, v in part.model_dump(mode="json", exclude_none=True).items()}
        for part in content
    ]


def _content(value: str | list[PartJson]) -> Content:
    if isinstance(value, str):
        return value
    return tuple(_PART.validate_python(part) for part in value)


def to_transcript(message: ModelMessage) -> TranscriptMessage:
    """A `ModelMessage` as plain JSON."""
    out: TranscriptMessage = {"role": message.role, "content": content_json(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.tool_call_id, "name": c.name, "arguments": c.arguments}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def from_transcript(messages: list[TranscriptMessage]) -> tuple[ModelMessage, ...]:
    """Plain JSON back into `ModelMessage`s."""
    return tuple(
        ModelMessage(
            role=m["role"],
            content=_content(m["content"]),
            tool_calls=tuple(
                ToolCallPart(tool_call_id=c["id"], name=c["name"], arguments=c["arguments"])
                for c in m.get("tool_calls", [])
            ),
            tool_call_id=m.get("tool_call_id"),
        )
        for m in messages
    )


def sent_bytes(message: TranscriptMessage) -> bytes:
    """The bytes of a message as the model receives it (turnkit's own keys left out)."""
    public = {k: v for k, v in message.items() if k not in PRIVATE_KEYS}
    return json.dumps(public, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def picture_parts(message: TranscriptMessage) -> int:
    """How many pictures the message carries."""
    content = message["content"]
    return 0 if isinstance(content, str) else sum(1 for p in content if p.get("kind") == "image")
