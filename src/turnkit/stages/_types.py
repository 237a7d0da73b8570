"""What stages take and return; LangGraph never appears here (graph/ adapts these)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from pydantic import JsonValue

from turnkit.agent import Agent
from turnkit.models import ModelMessage, ToolCallPart
from turnkit.models.family import ModelFamily
from turnkit.telemetry import Recorder
from turnkit.tools import ToolRegistry

__all__ = (
    "Route",
    "StageContext",
    "StageOutcome",
    "TranscriptMessage",
    "from_transcript",
    "to_transcript",
)

Route = Literal["anchor-plan", "tool-loop", "synthesize", "post-turn", "end"]


class TranscriptToolCall(TypedDict):
    id: str
    name: str
    arguments: str


class TranscriptMessage(TypedDict):
    """A model message as plain JSON, so checkpoints need no custom serializer."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: NotRequired[list[TranscriptToolCall]]
    tool_call_id: NotRequired[str]
    input_seq: NotRequired[int]
    """Set on a guide message: the input it came from (never sent to the model)."""


def to_transcript(message: ModelMessage) -> TranscriptMessage:
    """A `ModelMessage` as plain JSON."""
    out: TranscriptMessage = {"role": message.role, "content": message.content}
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
            content=m["content"],
            tool_calls=tuple(
                ToolCallPart(tool_call_id=c["id"], name=c["name"], arguments=c["arguments"])
                for c in m.get("tool_calls", [])
            ),
            tool_call_id=m.get("tool_call_id"),
        )
        for m in messages
    )


def _no_pauses(value: JsonValue) -> JsonValue:
    raise RuntimeError("pausing needs the graph: run stages through turnkit.graph")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageContext:
    """What a stage may use: the recorder (its only way out), the agent and its models."""

    recorder: Recorder
    agent: Agent
    family: ModelFamily
    utility: ModelFamily | None
    registry: ToolRegistry
    thinking_budget: int
    interrupt: Callable[[JsonValue], JsonValue] = _no_pauses
    """Pause the turn here; returns the answer when the turn is resumed (LangGraph)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOutcome:
    """A stage's result: messages it appended and where the turn goes next."""

    appended: tuple[TranscriptMessage, ...] = ()
    route: Route
