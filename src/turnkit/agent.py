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

__all__ = ("DEFAULT_SYNTHESIS_INSTRUCTIONS", "Agent", "Effort", "SkippableStage", "load_agent")

Effort = Literal["off", "low", "medium", "high"]
SkippableStage = Literal["anchor-plan", "tool-loop"]

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
        utility_model: Cheaper model for anchor-plan; without one, anchor-plan plans
            without a model call.
        tools: What the model may call; names must be unique.
        effort: Thinking budget per call (off/low/medium/high = 0/1,024/4,096/16,384
            tokens), none for models without reasoning.
        skip_stages: Stages to leave out. The tool-loop is also skipped when the agent
            has no tools; synthesize and post-turn always run.
        synthesis_instructions: The closing instruction of the one synthesize call.
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
    synthesis_instructions: str = DEFAULT_SYNTHESIS_INSTRUCTIONS
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
