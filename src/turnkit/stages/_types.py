"""What stages take and return; LangGraph never appears here (graph/ adapts these)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypedDict

from pydantic import JsonValue

from turnkit.agent import Agent
from turnkit.context.prefix import PreviousRequest
from turnkit.context.transcript import (
    TranscriptMessage,
    from_transcript,
    to_transcript,
)
from turnkit.ids import StageId
from turnkit.models import ModelRequest
from turnkit.models.family import ModelFamily
from turnkit.plugins import Plugin
from turnkit.skills import Skill
from turnkit.telemetry import Recorder, ShownAnswer
from turnkit.tenancy import Principal
from turnkit.tools import ToolRegistry
from turnkit.tools._context import AskAgent

__all__ = (
    "BudgetCheck",
    "PendingAnswer",
    "PreviousRequest",
    "Route",
    "StageContext",
    "StageOutcome",
    "TranscriptMessage",
    "from_transcript",
    "reply_messages",
    "shown",
    "to_transcript",
)

Route = Literal["anchor-plan", "tool-loop", "synthesize", "post-turn", "end"]


class PendingAnswer(TypedDict):
    """The tool-loop call that named no tool: its text is the turn's answer."""

    text: str
    block_id: str
    generation_id: str
    stop_reason: str


def reply_messages(text: str) -> list[TranscriptMessage]:
    """What a reply that named no tool adds to the transcript: nothing when it has no text.

    An empty or blank reply is never sent back to the model (it is narration the model
    is asked past): some providers refuse an empty assistant message, and litellm puts a
    placeholder text in its place for Anthropic, which the session would then keep.
    """
    return [{"role": "assistant", "content": text}] if text.strip() else []


def shown(rec: Recorder, stage_id: StageId, answer: PendingAnswer) -> None:
    """Note the answer a call streamed to the person in full (see `TurnNotes.shown_answer`)."""
    if answer["text"].strip():
        rec.notes.shown_answer = ShownAnswer(
            stage_id=stage_id,
            block_id=answer["block_id"],
            generation_id=answer["generation_id"],
            text=answer["text"],
        )


class BudgetCheck(Protocol):
    """Budgets inside a turn (`turnkit.stages._budget.BudgetGate`)."""

    async def reserve(
        self,
        ctx: StageContext,
        stage_id: StageId,
        request: ModelRequest,
        *,
        key: str,
        answered: int,
    ) -> None:
        """Reserve a model call, pausing the turn until a limit leaves room for it.

        `answered`: budget pauses the call made in earlier attempts, answered already.
        """
        ...

    async def has_room(self, request: ModelRequest) -> bool:
        """Whether a background call fits (it is skipped when not)."""
        ...


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
    synthesis: ModelFamily | None = None
    """The family of a separate synthesis call; None: the loop's terminal text answers."""
    naming: ModelFamily | None = None
    """The background model that names a session after its opening turn: the
    organisation's `background_model`, else the agent's utility model (None: no naming)."""
    principal: str | None = None
    """Who sent the message; tools see it in `ToolContext.principal`."""
    caller: Principal | None = None
    """The same, whole (organisation, department, roles): `ToolContext.caller`."""
    deps: object = None
    """The app's dependencies for this turn; tools see them in `ToolContext.deps`."""
    plugins: tuple[Plugin, ...] = ()
    """The agent's plugins and the runtime's, validated together, in run order."""
    skills: tuple[Skill, ...] = ()
    """The skills a message may pick with `/slug` (the app's the caller may see, builtin)."""
    interrupt: Callable[[JsonValue], JsonValue] = _no_pauses
    """Pause the turn here; returns the answer when the turn is resumed (LangGraph)."""
    callback_token: str | None = None
    """The turn's callback token, for tools that hand work to another process."""
    budget: BudgetCheck | None = None
    """Budgets enforced: every model call reserves first (None: budgets are off)."""
    ask_agent: AskAgent | None = None
    """Runs an agent offered as a tool (`Agent.as_tool`) for a call: the runtime's."""
    scratch: dict[str, object] = field(default_factory=dict[str, object])
    """Per-attempt helpers shared across stages (the thinking summary in flight)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOutcome:
    """A stage's result: the transcript after it and where the turn goes next."""

    transcript: list[TranscriptMessage] | None = None
    """The whole transcript after the stage (None: unchanged)."""
    route: Route
    previous: PreviousRequest | None = None
    """The last reasoning request this stage made (None: it made none)."""
    answer: PendingAnswer | None = None
