"""Agents by name: the catalog a runtime hosts, bundles kept as data, and tool access.

A turn is pinned at submit to its agent's name and version (a content hash); every driver
looks the agent up here again. A pinned agent that is gone, or no longer at that version,
ends the turn `agent-not-found` — never silently with another agent — unless the turn had
not started: then it is re-pinned to the current version, once the checks that depend on
the agent pass for it (see `TurnRunner`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnkit.agent import Agent, Effort, Synthesis, Visibility
from turnkit.errors import AgentNotFoundError, ConfigurationError
from turnkit.ids import SessionId
from turnkit.models import ModelClient, ModelSettings
from turnkit.models.family import ModelFamily
from turnkit.models.litellm import ModelEndpoint
from turnkit.tools import AgentTool, Tool

__all__ = (
    "AgentCatalog",
    "AgentData",
    "AgentLoader",
    "ToolAccess",
    "ToolAccessRequest",
)

log = logging.getLogger("turnkit.agents")

ModelData = str | ModelEndpoint | list[str | ModelEndpoint]


class AgentData(BaseModel):
    """An agent bundle as stored data (a row in the app's database), built into an `Agent`.

    Tools are named, not defined: `build` takes them from the host's tools. Models are
    litellm strings or endpoints; a list is a family whose rungs are tried in order.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    instructions: str = "You are a helpful assistant."
    model: ModelData
    utility_model: ModelData | None = None
    tools: list[str] = Field(default_factory=list)
    effort: Effort = "off"
    settings: ModelSettings = Field(default_factory=ModelSettings)
    synthesis: Synthesis = "terminal"
    approval: Literal["never", "always"] = "never"
    approver_role: str | None = None
    clarifications: bool = False
    skills: list[str] = Field(default_factory=list)
    knowledge: list[str] = Field(default_factory=list)
    memory: bool = False
    visibility: Visibility = "organisation"
    owner: str | None = None
    department: str | None = None

    def build(self, tools: Mapping[str, Tool] | Sequence[Tool]) -> Agent:
        """The `Agent` this data describes, with its tools taken from `tools` by name.

        `tools`: the host's tools, by name or as a list (as `AgentCatalog` takes them).

        Raises:
            ConfigurationError: a named tool the host does not have.
        """
        if not isinstance(tools, Mapping):
            tools = {item.name: item for item in tools}
        unknown = [t for t in self.tools if t not in tools]
        if unknown:
            raise ConfigurationError(
                f"agent {self.name!r} names tools this host does not have: {unknown!r} "
                f"(host tools: {sorted(tools)!r})",
                agent=self.name,
            )
        return Agent(
            name=self.name,
            instructions=self.instructions,
            model=_model(self.model, self.name),
            utility_model=_model(self.utility_model, f"{self.name}-utility")
            if self.utility_model is not None
            else None,
            tools=[tools[t] for t in self.tools],
            effort=self.effort,
            settings=self.settings,
            synthesis=self.synthesis,
            approval=self.approval,
            approver_role=self.approver_role,
            clarifications=self.clarifications,
            skills=self.skills,
            knowledge=self.knowledge,
            memory=self.memory,
            visibility=self.visibility,
            owner=self.owner,
            department=self.department,
        )


def _model(data: ModelData, name: str) -> str | ModelClient:
    if isinstance(data, str):
        return data
    if isinstance(data, ModelEndpoint):
        return data.client()
    rungs = [ModelEndpoint(model=r).client() if isinstance(r, str) else r.client() for r in data]
    return ModelFamily(name, rungs)


AgentLoader = Callable[[str], Awaitable[Agent | AgentData | Mapping[str, Any] | None]]
"""Looks an agent up by name in the app's own store: an `Agent`, its data, or None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolAccessRequest:
    """What a tool-access policy decides on: who asks, in which session, with which agent."""

    principal: str | None
    session_id: SessionId
    agent: str
    tools: tuple[str, ...]
    """The agent's own tool names (its allowlist)."""


ToolAccess = Callable[[ToolAccessRequest], Collection[str] | Awaitable[Collection[str]]]
"""The caller's effective tool access: the names they may use. The agent's allowlist is
intersected with it at submit; a tool it does not name is never advertised."""


class AgentCatalog:
    """The agents a runtime hosts, by name, each at every version registered here.

    Args:
        agents: Agents defined in code.
        loader: Looks up agents kept as data (the app's database); asked on every lookup,
            so an edited bundle takes effect with the next message.
        tools: The host's tools, which data bundles name.
    """

    def __init__(
        self,
        agents: Iterable[Agent] = (),
        *,
        loader: AgentLoader | None = None,
        tools: Sequence[Tool] = (),
    ) -> None:
        self._versions: dict[str, dict[str, Agent]] = {}
        self._current: dict[str, Agent] = {}
        self._asked_only: set[str] = set()
        """Names hosted only because a tool asks them (`Agent.as_tool`): not for callers."""
        self._asked: set[tuple[str, str]] = set()
        """(name, version) of every agent a hosted tool asks, also one listed in its own right."""
        self.loader = loader
        self.tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self.tools:
                raise ConfigurationError(f"two host tools are named {item.name!r}")
            self.tools[item.name] = item
        listed = list(agents)
        for agent in listed:
            if agent.name in self._current and self._current[agent.name] != agent:
                raise ConfigurationError(f"two agents are named {agent.name!r}")
            self.add(agent)
        for agent in listed:  # an agent a tool asks (`as_tool`) took a listed one's name
            if self._current[agent.name] != agent:
                raise ConfigurationError(
                    f"two agents are named {agent.name!r}: one is asked by another agent's "
                    "tool (Agent.as_tool); rename one"
                )
        for item in self.tools.values():  # agents that bundles kept as data may ask
            if isinstance(item, AgentTool):
                self._host_asked(item.agent)

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the agents defined in code (the loader's are not listed)."""
        return tuple(self._current)

    def hosted(self) -> tuple[Agent, ...]:
        """The current version of every agent defined in code, in registration order."""
        return tuple(self._current.values())

    def add(self, agent: Agent, *, asked: bool = False) -> None:
        """Host `agent` (it becomes its name's current version; older ones stay usable).

        The agents its tools ask (`Agent.as_tool`) are hosted too, so any process hosting
        `agent` can drive their turns; unless hosted in their own right as well, a message
        cannot name them (`asked_only`): only the tool that asks them runs them.
        """
        if not asked:
            self._asked_only.discard(agent.name)
        elif agent.name not in self._current or agent.name in self._asked_only:
            self._asked_only.add(agent.name)
        versions = self._versions.setdefault(agent.name, {})
        versions[agent.version] = agent
        for earlier in agent.earlier_versions:  # turns pinned before an upgrade of turnkit
            versions.setdefault(earlier, agent)
        self._current[agent.name] = agent
        for other in _asked_agents(agent):
            self._host_asked(other)

    def _host_asked(self, agent: Agent) -> None:
        """Host an agent a tool asks: only for that tool, unless hosted in its own right."""
        self._asked.add((agent.name, agent.version))
        if agent.version not in self._versions.get(agent.name, {}):
            self.add(agent, asked=True)

    def asked_only(self, name: str) -> bool:
        """Whether `name` is hosted only because an agent's tool asks it (`Agent.as_tool`)."""
        return name in self._asked_only

    def is_asked(self, agent: Agent) -> bool:
        """Whether a hosted agent's tool asks `agent` (this very version): a delegation."""
        return (agent.name, agent.version) in self._asked

    async def get(self, name: str, version: str | None = None) -> Agent:
        """The agent called `name` (at `version`, when given).

        Raises:
            AgentNotFoundError: no such agent, or it is no longer at `version`.
        """
        known = self._versions.get(name, {})
        if version is not None and version in known:
            return known[version]
        agent = await self._load(name) if self.loader is not None else None
        if agent is not None:  # the agents it asks: hosted for its tools only
            for other in _asked_agents(agent):
                self._host_asked(other)
        if agent is None:
            agent = self._current.get(name)
        if agent is None:
            raise AgentNotFoundError(f"no agent named {name!r} on this host", agent=name)
        if version is not None and version not in (agent.version, *agent.earlier_versions):
            raise AgentNotFoundError(
                f"agent {name!r} is no longer at version {version} (the turn was pinned to "
                f"it; the host now has {agent.version}): keep the old version registered "
                "to let pinned turns finish",
                agent=name,
                version=version,
            )
        return agent

    async def _load(self, name: str) -> Agent | None:
        assert self.loader is not None
        found = await self.loader(name)
        if found is None or isinstance(found, Agent):
            return found
        try:
            data = found if isinstance(found, AgentData) else AgentData.model_validate(found)
        except ValidationError as exc:
            raise ConfigurationError(f"the stored agent {name!r} is not valid: {exc}") from exc
        return data.build(self.tools)


def _asked_agents(agent: Agent) -> list[Agent]:
    """The agents `agent`'s tools ask (`Agent.as_tool`)."""
    return [t.agent for t in agent.registry() if isinstance(t, AgentTool)]


async def allowed_tools(
    policy: ToolAccess | None,
    agent: Agent,
    *,
    principal: str | None,
    session_id: SessionId,
) -> tuple[str, ...]:
    """The agent's tools the caller may use, in the agent's order.

    A policy that fails leaves the turn with no optional tools (logged), never with more.
    """
    names = agent.registry().names
    if policy is None:
        return names
    request = ToolAccessRequest(
        principal=principal, session_id=session_id, agent=agent.name, tools=names
    )
    try:
        granted = policy(request)
        if inspect.isawaitable(granted):
            granted = await granted
    except Exception as exc:  # noqa: BLE001 - a failing policy grants no optional tools
        log.warning("the tool access policy failed (%s): the turn runs without tools", exc)
        return ()
    allowed = set(granted)
    return tuple(n for n in names if n in allowed)
