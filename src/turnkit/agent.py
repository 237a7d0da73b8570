"""`Agent`: the per-invocation configuration bundle.

An agent is plain data. A runtime hosts many by name and rebuilds the one a turn was
pinned to on every driver; creating, editing or dropping one deploys nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import JsonValue

from turnkit.context.results import READ_RESULT_TOOL
from turnkit.errors import ConfigurationError, DuplicateToolError
from turnkit.models import ModelClient, ModelSettings
from turnkit.output import OutputCheck, check_retries
from turnkit.pauses import (
    CLARIFY_TOOL,
    ApprovalPolicy,
    check_approval_policy,
    check_approver_role,
)
from turnkit.plugins import Plugin, validate_plugins
from turnkit.tools import AgentTool, Tool, ToolClass, ToolRegistry

__all__ = (
    "DEFAULT_SYNTHESIS_INSTRUCTIONS",
    "PLANNING_TOOL_NAMES",
    "Agent",
    "Effort",
    "SkippableStage",
    "Synthesis",
    "Visibility",
    "load_agent",
    "load_agents",
)

_ROUNDS_ONCE_DEFAULT: Final = 50
"""What `Agent.max_tool_rounds` was unless set, in turnkit releases before it had no bound:
versions hashed then left it out when it was this (see `Agent.earlier_versions`)."""

PLANNING_TOOL_NAMES: Final = ("update_tasks", "write_file", "read_file", "list_files")
"""The built-in tools an agent with `planning=True` is offered."""

Effort = Literal["off", "low", "medium", "high"]
SkippableStage = Literal["anchor-plan", "tool-loop"]
Synthesis = Literal["terminal", "separate"]
Visibility = Literal["private", "department", "organisation"]

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
            thinking summary, compacts history and names the session (unless the
            organisation names its own `background_model`). Without one, anchor-plan
            plans by a heuristic, there is no thinking summary, and compaction drops old
            turns.
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
        output_type: The answer's shape (a pydantic model, a dataclass, a TypedDict, or
            a union or list of them; one that is not a JSON object is asked for wrapped):
            the answering call asks its provider for that JSON, and an answer that does
            not validate is sent back with what is wrong, up to `output_retries` times,
            before the turn fails with `output-invalid`. None: the answer is free text.
        output_retries: How many times an answer that does not validate is asked again.
        tool_result_preview_chars: A longer tool result is sent to the model as a
            preview of this many characters plus a note; the model reads on with the
            built-in `read_tool_result` tool. None sends results whole.
        max_tool_rounds: The most tool-loop rounds (reasoning calls that may use tools) a
            turn makes; the model then writes its answer from what it has, in one more
            call that offers the same tools but lets it call none (`tool_choice="none"`).
            None (the default): no bound; the loop ends when the model answers, and a
            runaway one at the turn's ceiling (`RuntimeConfig.ceiling_s`), a budget
            limit or a Stop.
        plugins: Post-turn enrichment and other hooks, validated here and run by `order`.
        approval: When a tool call waits for a person: `never`, `always` ("Ask before each
            action") or a function of (tool name, arguments), or of (tool name,
            arguments, `ApprovalContext`). A tool's own `approval`
            (`@tool(approval=...)`) takes precedence.
        approver_role: Who answers this agent's approvals over HTTP: None (the default)
            for the session's owner; a role name for a principal holding that role (or
            `admin`) in the turn's organisation, and not the owner unless they hold it.
            A tool's own `approver_role` wins.
        clarifications: Offer the model the built-in `ask_user` tool, which pauses the
            turn until the person answers its question.
        planning: Plan by tier (none, a task list, or spec → plan → task list) and offer
            the built-in `update_tasks`, `write_file`, `read_file` and `list_files` tools
            (the task list and the session workspace).
        settings: Sampling settings (temperature, top_p, max_tokens, seed, ...) of the
            reasoning calls; a message may override them field by field.
        skills: Skill references the agent may use (`builtin:<slug>` or the app's own).
        knowledge: Knowledge base ids; never sent to the model. The app's search tools
            read them from `ToolContext.knowledge` for each search.
        memory: Whether the app's memory tools may keep facts across sessions (they read
            it from `ToolContext.memory`).
        visibility: Who may pick the agent: `private` (its owner), `department` or
            `organisation`.
        owner: The principal id a `private` agent belongs to.
        department: The department a `department` agent belongs to (None: the
            organisation's default department).
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
    output_type: object | None = None
    output_retries: int = 1
    tool_result_preview_chars: int | None = 16_000
    max_tool_rounds: int | None = None
    plugins: Sequence[Plugin] = ()
    approval: ApprovalPolicy = "never"
    approver_role: str | None = None
    clarifications: bool = False
    planning: bool = False
    settings: ModelSettings = field(default_factory=ModelSettings)
    skills: Sequence[str] = ()
    knowledge: Sequence[str] = ()
    memory: bool = False
    visibility: Visibility = "organisation"
    owner: str | None = None
    department: str | None = None

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigurationError("an agent needs a non-empty `name`")
        if self.visibility not in ("private", "department", "organisation"):
            raise ConfigurationError(
                f"visibility {self.visibility!r} is not 'private', 'department' or 'organisation'"
            )
        if not isinstance(self.settings, ModelSettings):
            raise ConfigurationError("`settings` must be a turnkit.ModelSettings")
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
        if self.max_tool_rounds is not None and (
            isinstance(self.max_tool_rounds, bool)
            or not isinstance(self.max_tool_rounds, int)
            or self.max_tool_rounds < 1
        ):
            raise ConfigurationError(
                f"`max_tool_rounds` must be a whole number of 1 or more (or None), not "
                f"{self.max_tool_rounds!r}"
            )
        if self.tool_result_preview_chars is not None and self.tool_result_preview_chars < 200:
            raise ConfigurationError(
                "`tool_result_preview_chars` must be at least 200 (or None to send results "
                f"whole), not {self.tool_result_preview_chars}"
            )
        _check_model("model", self.model)
        for name in ("utility_model", "synthesis_model"):
            if getattr(self, name) is not None:
                _check_model(name, getattr(self, name))
        _check_tools(self.tools)
        check_approval_policy(self.approval, f"the agent {self.name!r}")
        check_approver_role(self.approver_role, f"the agent {self.name!r}")
        self._check_builtin_names()
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "skills", tuple(self.skills))
        object.__setattr__(self, "knowledge", tuple(self.knowledge))
        object.__setattr__(self, "plugins", validate_plugins(self.plugins))
        check_retries(self.output_retries)
        output = (
            None
            if self.output_type is None
            else OutputCheck.of(self.output_type, self.output_retries)
        )
        object.__setattr__(self, "_output", output)
        # Built once (duplicate tool names fail here, at construction); an Agent is frozen.
        object.__setattr__(self, "_registry", ToolRegistry(self.tools))
        object.__setattr__(self, "_version", None)
        object.__setattr__(self, "_earlier", None)

    def _check_builtin_names(self) -> None:
        """No tool of the agent's may have the name of a built-in tool it is offered."""
        builtins: dict[str, str] = {}
        if self.clarifications:
            builtins[CLARIFY_TOOL] = "clarifications=True"
        if self.planning:
            builtins.update(dict.fromkeys(PLANNING_TOOL_NAMES, "planning=True"))
        if self.tools and self.tool_result_preview_chars is not None:
            builtins[READ_RESULT_TOOL] = "tool_result_preview_chars"
        for item in self.tools:
            if item.name in builtins:
                raise DuplicateToolError(
                    f"the tool {item.name!r} has the name of a built-in tool this agent is "
                    f"offered ({builtins[item.name]}): rename it",
                    tool=item.name,
                )

    @property
    def output(self) -> OutputCheck | None:
        """The check of the answer's shape (`output_type`), or None for free text."""
        check: OutputCheck | None = self._output  # type: ignore[attr-defined]
        return check

    def registry(self) -> ToolRegistry:
        """The agent's tools by name."""
        registry: ToolRegistry = self._registry  # type: ignore[attr-defined]
        return registry

    @property
    def version(self) -> str:
        """A content hash of the bundle: 16 hex digits, equal across processes.

        It covers the instructions, models (by name and endpoint, never by key), settings,
        tools (name, description, argument schema, own approval policy), skills, knowledge,
        flags and visibility. A turn is pinned to it: every driver rebuilds exactly this bundle.
        """
        cached: str | None = self._version  # type: ignore[attr-defined]
        if cached is None:
            cached = _hashed(self.describe())
            object.__setattr__(self, "_version", cached)
        return cached

    @property
    def earlier_versions(self) -> tuple[str, ...]:
        """Versions this same bundle had under an older turnkit, which turns may be pinned to.

        Before tools' own approval policies counted, a bundle with such a tool hashed
        without them; while `max_tool_rounds` defaulted to 50, a bundle that set 50 hashed
        without it and one that set None with it. A turn paused then still resumes with
        this agent after the upgrade.
        """
        cached: tuple[str, ...] | None = self._earlier  # type: ignore[attr-defined]
        if cached is None:  # asked each time a turn is driven: hashed once
            own = any(getattr(t, "approval", None) is not None for t in self.registry())
            approvals = (True, False) if own else (True,)
            rounds = self.max_tool_rounds in (None, _ROUNDS_ONCE_DEFAULT)
            found = (
                _hashed(self.describe(tools_approval=approval, rounds_before=before))
                for before in ((False, True) if rounds else (False,))
                for approval in approvals
            )
            cached = tuple(dict.fromkeys(v for v in found if v != self.version))
            object.__setattr__(self, "_earlier", cached)
        return cached

    def _rounds_described(self, before: bool) -> dict[str, object]:
        """`max_tool_rounds` as the version hashes it: left out when None (the default).

        `before`: as turnkit hashed it while the default was 50 (left out when 50, kept
        when None).
        """
        rounds = self.max_tool_rounds
        if before:
            return {"max_tool_rounds": rounds} if rounds != _ROUNDS_ONCE_DEFAULT else {}
        return {"max_tool_rounds": rounds} if rounds is not None else {}

    def describe(
        self, *, tools_approval: bool = True, rounds_before: bool = False
    ) -> dict[str, object]:
        """The bundle as plain JSON (what `version` hashes); functions by qualified name.

        `tools_approval=False` and `rounds_before=True` describe it as older turnkit
        releases did (see `earlier_versions`).
        """
        return {
            "name": self.name,
            "instructions": self.instructions,
            "model": describe_model(self.model),
            "utility_model": describe_model(self.utility_model),
            "synthesis_model": describe_model(self.synthesis_model),
            "tools": [_tool_version(t, approval=tools_approval) for t in self.registry()],
            "effort": self.effort,
            "skip_stages": sorted(self.skip_stages),
            "synthesis": self.synthesis,
            "synthesis_instructions": self.synthesis_instructions,
            "tool_result_preview_chars": self.tool_result_preview_chars,
            # Only when set: agents that keep the default keep the version they had.
            **self._rounds_described(rounds_before),
            **({"output": self.output.describe()} if self.output is not None else {}),
            "plugins": [_plugin_version(p) for p in self.plugins],
            "approval": self.approval
            if isinstance(self.approval, str)
            else _qualname(self.approval),
            **({"approver_role": self.approver_role} if self.approver_role else {}),
            "clarifications": self.clarifications,
            "planning": self.planning,
            "settings": self.settings.model_dump(exclude_none=True, mode="json"),
            "skills": list(self.skills),
            "knowledge": list(self.knowledge),
            "memory": self.memory,
            "visibility": self.visibility,
            "owner": self.owner,
            "department": self.department,
        }

    def with_overrides(
        self, *, model: str | None = None, settings: ModelSettings | None = None
    ) -> Agent:
        """This agent with a message's model and settings (merged over its own) applied."""
        changes: dict[str, object] = {}
        if model is not None:
            changes["model"] = model
        if settings is not None:
            changes["settings"] = self.settings.merged(settings)
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[arg-type]

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        approval: ApprovalPolicy | None = None,
        approver_role: str | None = None,
        timeout_s: float | None = None,
    ) -> AgentTool:
        """This agent as a tool another agent may call: each call is a turn of this agent.

        The calling model sends a `message`; this agent answers it in a durable turn of
        its own (in a session whose parent is the asking session) and its answer, text or
        its `output_type`'s JSON, is the call's result. A runtime hosting the asking agent
        hosts this one too. When this agent waits for a person (an approval, a question),
        the asking turn waits with the same request, answered there.

        Args:
            name: The tool's name (default: the agent's name).
            description: What the model reads to choose it (default: says whom it asks).
            approval: A person approves each delegation first (`always`, or a policy of
                the message); None: the asking agent's policy.
            approver_role: Who approves it over HTTP (see `Agent.approver_role`).
            timeout_s: Seconds this agent has to answer a call; then its turn is stopped
                and the call fails (None: no limit but the turn's own deadlines).

        Raises:
            ConfigurationError: `approval`, `approver_role` or `timeout_s` is not valid.
        """
        return AgentTool.of(
            self,
            name=name,
            description=description,
            approval=approval,
            approver_role=approver_role,
            timeout_s=timeout_s,
        )


def describe_model(model: object) -> object:
    """A model string, client or family as plain JSON: names and endpoints, never keys."""
    if model is None or isinstance(model, str):
        return model
    rungs = getattr(model, "rungs", None)
    if rungs is not None:
        return {"family": getattr(model, "name", None), "rungs": [describe_model(r) for r in rungs]}
    out: dict[str, object] = {"client": type(model).__qualname__}
    for attr in ("model", "api_base"):
        value = getattr(model, attr, None)
        if isinstance(value, str):
            out[attr] = value
    return out


def _hashed(described: dict[str, object]) -> str:
    canonical = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _tool_version(tool: Tool, *, approval: bool = True) -> dict[str, object]:
    """A tool as the agent's version sees it; its own approval policy only when it has one."""
    spec = tool.spec()
    out: dict[str, object] = {
        "name": spec.name, "description": spec.description, "parameters": spec.parameters
    }  # fmt: skip
    policy = getattr(tool, "approval", None)
    if approval and policy is not None:  # a tool on the agent's policy keeps its version
        out["approval"] = policy if isinstance(policy, str) else _qualname(policy)
    if role := getattr(tool, "approver_role", None):
        out["approver_role"] = role
    if isinstance(tool, AgentTool):  # the agent it asks is part of what the tool does
        out["agent"] = {"name": tool.agent.name, "version": tool.agent.version}
    return out


def _qualname(fn: object) -> str:
    """A function by its qualified name, the same in every process.

    A `functools.partial` names its function; any other callable object its class (their
    `repr` holds a memory address, which would make a new version in every process).
    """
    if isinstance(fn, functools.partial):
        return f"partial({_qualname(fn.func)})"
    if not hasattr(fn, "__qualname__"):
        fn = type(fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def import_object(spec: str, named: str) -> object:
    """Import `package.module:name`; `named` says what it is in errors (`the agent 'x'`).

    The current directory is importable, as with `uvicorn module:app`.

    Raises:
        ConfigurationError: `spec` is not of that form, or cannot be imported.
    """
    import importlib
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"{named} must look like `package.module:name`")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {named}: {exc}") from exc


def load_agent(spec: str) -> Agent:
    """Import an agent by `package.module:name` (an `Agent`, or a function returning one).

    The current directory is importable, as with `uvicorn module:app`.
    """
    target = import_object(spec, f"the agent {spec!r}")
    agent = target() if callable(target) and not isinstance(target, Agent) else target
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"{spec!r} is not a turnkit.Agent (or a function returning one)")
    return agent


def load_agents(specs: str | Sequence[str]) -> tuple[Agent, ...]:
    """Import agents by `module:name` (a comma-separated string, or a list); first = default."""
    items = [
        part for spec in ([specs] if isinstance(specs, str) else specs) for part in spec.split(",")
    ]
    agents = tuple(load_agent(item.strip()) for item in items if item.strip())
    if not agents:
        raise ConfigurationError("name at least one agent as `package.module:name`")
    return agents


def _check_model(field_name: str, model: object) -> None:
    """A model string or a ModelClient (anything with `stream`)."""
    if isinstance(model, str) or callable(getattr(model, "stream", None)):
        return
    raise ConfigurationError(
        f"`{field_name}` is a model string ('openai/gpt-4o-mini') or a ModelClient, not "
        f"{type(model).__name__}"
    )


def _check_tools(tools: object) -> None:
    """A sequence of tools, each made with `@tool` (or a `Tool` of the app's own)."""
    if isinstance(tools, Tool) or not isinstance(tools, Sequence) or isinstance(tools, str):
        raise ConfigurationError(
            f"`tools` is a list of tools (tools=[add]), not {type(tools).__name__}"
        )
    for at, item in enumerate(tools):
        if not isinstance(item, Tool):
            hint = ": decorate it with @tool" if callable(item) else ""
            raise ConfigurationError(
                f"tools[{at}] is {getattr(item, '__name__', type(item).__name__)!r}, not a "
                f"tool{hint}"
            )
        _check_own_approval(item)


def _check_own_approval(tool: Tool) -> None:
    """Refuse a hand-written tool's own bad `approval` or `approver_role` here.

    A tool class's members' too: `@tool` refuses its own where it is given.
    """
    for member in tool.leaves() if isinstance(tool, ToolClass) else (tool,):
        where = f"the tool {member.name!r}"
        policy = getattr(member, "approval", None)
        if policy is not None:
            check_approval_policy(policy, where)
        check_approver_role(getattr(member, "approver_role", None), where)


def _plugin_version(plugin: Plugin) -> JsonValue:
    """A plugin as the agent's version sees it: its name, and its settings when it has any.

    A plugin on its defaults keeps the version agents had before settings counted.
    """
    settings = dict(plugin.settings())
    return {"name": type(plugin).name, "settings": settings} if settings else type(plugin).name
