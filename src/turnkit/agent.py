"""`Agent`: the per-invocation configuration bundle (seed 002 "One host, many agents").

An agent is plain data. The runtime loads it on every `execute_message` call; creating,
editing or dropping one deploys nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from turnkit.errors import ConfigurationError
from turnkit.models import ModelClient
from turnkit.pauses import ApprovalPolicy
from turnkit.plugins import Plugin, validate_plugins
from turnkit.tools import Tool, ToolRegistry

__all__ = (
    "DEFAULT_SYNTHESIS_INSTRUCTIONS",
    "Agent",
    "Effort",
    "SkippableStage",
    "Synthesis",
    "load_agent",
)

Effort = Literal["off", "low", "medium", "high"]
SkippableStage = Literal["anchor-plan", "tool-loop"]
Synthesis = Literal["terminal", "separate"]

DEFAULT_SYNTHESIS_INSTRUCTIONS: Final = (
    "Write the final answer to the user's last message now, using what the conversation "
    "and the tool results above established. Do not call tools."
)


@dataclass(frozen=True, kw_only=True)
class Agent:
    """Who answers a turn: instructions, models, tools and effort.

    Attributes:
        name: Shown in `turn.started` and audit rows.
        instructions: The system prompt.
        model: A litellm model string (`"openai/gpt-4o-mini"`), a `ModelClient`, or a
            `ModelFamily` whose rungs are tried in order.
        utility_model: The background model: plans in anchor-plan, writes the turn's
            thinking summary and compacts history. Without one, anchor-plan plans by a
            heuristic, there is no thinking summary, and compaction drops old turns.
        tools: What the model may call; names must be unique.
        effort: Thinking budget per call (off/low/medium/high = 0/1,024/4,096/16,384
            tokens), none for models without reasoning.
        skip_stages: Stages to leave out. The tool-loop is also skipped when the agent
            has no tools; synthesize and post-turn always run.
        synthesis: `terminal` (default): the text of the tool-loop call that names no
            tool is the answer, streamed once, with no further call. `separate`: one more
            call writes the answer from the loop's work (then the loop's last text is
            narration).
        synthesis_model: The model of the separate synthesis call (default: `model`);
            only with `synthesis="separate"`.
        synthesis_instructions: The closing instruction of a separate synthesis call.
        tool_result_preview_chars: A longer tool result is sent to the model as a
            preview of this many characters plus a note; the model reads on with the
            built-in `read_tool_result` tool. None sends results whole.
        plugins: Post-turn enrichment and other hooks, validated here and run by `order`.
        approval: When a tool call waits for a person: `never`, `always` ("Ask before each
            action") or a function of (tool name, arguments). A tool's own `approval`
            (`@tool(approval=...)`) takes precedence.
        clarifications: Offer the model the built-in `ask_user` tool, which pauses the
            turn until the person answers its question.
    """

    name: str = "assistant"
    instructions: str = "You are a helpful assistant."
    model: str | ModelClient
    utility_model: str | ModelClient | None = None
    tools: Sequence[Tool] = ()
    effort: Effort = "off"
    skip_stages: frozenset[SkippableStage] = field(default_factory=frozenset[SkippableStage])
    synthesis: Synthesis = "terminal"
    synthesis_model: str | ModelClient | None = None
    synthesis_instructions: str = DEFAULT_SYNTHESIS_INSTRUCTIONS
    tool_result_preview_chars: int | None = 16_000
    plugins: Sequence[Plugin] = ()
    approval: ApprovalPolicy = "never"
    clarifications: bool = False

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigurationError("an agent needs a non-empty `name`")
        if self.effort not in ("off", "low", "medium", "high"):
            raise ConfigurationError(
                f"effort {self.effort!r} is not one of 'off', 'low', 'medium', 'high'"
            )
        unknown = set(self.skip_stages) - {"anchor-plan", "tool-loop"}
        if unknown:
            raise ConfigurationError(
                f"cannot skip {sorted(unknown)!r}: only 'anchor-plan' and 'tool-loop' may be "
                "skipped; synthesize and post-turn always run"
            )
        if self.synthesis not in ("terminal", "separate"):
            raise ConfigurationError(
                f"synthesis {self.synthesis!r} is not 'terminal' or 'separate'"
            )
        if self.synthesis_model is not None and self.synthesis != "separate":
            raise ConfigurationError(
                "`synthesis_model` writes a separate synthesis call: set "
                "`synthesis='separate'` too (the default answers with the loop's own text)"
            )
        if self.tool_result_preview_chars is not None and self.tool_result_preview_chars < 200:
            raise ConfigurationError(
                "`tool_result_preview_chars` must be at least 200 (or None to send results "
                f"whole), not {self.tool_result_preview_chars}"
            )
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "plugins", validate_plugins(self.plugins))
        # Built once (duplicate tool names fail here, at construction); an Agent is frozen.
        object.__setattr__(self, "_registry", ToolRegistry(self.tools))

    def registry(self) -> ToolRegistry:
        """The agent's tools by name."""
        registry: ToolRegistry = self._registry  # type: ignore[attr-defined]
        return registry


def load_agent(spec: str) -> Agent:
    """Import an agent by `package.module:name` (an `Agent`, or a function returning one)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"agent {spec!r} must look like `package.module:name`")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load the agent {spec!r}: {exc}") from exc
    agent = target() if callable(target) and not isinstance(target, Agent) else target
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"{spec!r} is not a turnkit.Agent (or a function returning one)")
    return agent
