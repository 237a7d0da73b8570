"""`TurnRunner`: turns a claimed lease into a `TurnDriver` (in-process and in workers)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from turnkit import otel
from turnkit.agent import Agent, Effort
from turnkit.audit import AgentRepinnedPayload
from turnkit.budgets import BudgetSubject
from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    AdmissionRefusedError,
    AgentNotFoundError,
    TurnNotFoundError,
    UnknownModelError,
)
from turnkit.graph import TurnGraph, latest_checkpoint_id, pause_here
from turnkit.ids import TurnId
from turnkit.models import ModelSettings
from turnkit.models.family import ModelFamily, resolve_family
from turnkit.plugins import Plugin, merge_plugins, overrides
from turnkit.runtime._aftermath import Aftermath
from turnkit.runtime._held import HeldTranscripts
from turnkit.runtime._transcript import session_transcript
from turnkit.runtime.admission import Admission
from turnkit.runtime.agents import AgentCatalog, ToolAccess, allowed_tools
from turnkit.runtime.callbacks import callback_token
from turnkit.runtime.deps import NO_DEPS, DepsFactory, DepsScope, build_deps
from turnkit.runtime.driver import DriveSetup, Sink, StopAsked, TurnDriver
from turnkit.skills import Skill, SkillSource, skills_for
from turnkit.stages import StageContext
from turnkit.stages._budget import BudgetGate
from turnkit.stages._types import Route
from turnkit.store import Lease, Store, TurnRecord
from turnkit.telemetry import Recorder
from turnkit.tenancy import DEFAULT_DEPARTMENT, DEFAULT_ORGANISATION, Principal
from turnkit.tools._context import AskAgent

__all__ = ("Driving", "TurnRunner", "pinned_config")

Driving = weakref.WeakValueDictionary[TurnId, TurnDriver]
"""A process's turn drivers by turn id (a driver is forgotten once nothing holds it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pinned:
    """What a turn was pinned to at submit, read back from its record."""

    agent: str
    version: str | None
    model: str | None
    settings: ModelSettings | None
    effort: Effort | None
    principal: str | None
    tools: tuple[str, ...] | None
    organisation: str = DEFAULT_ORGANISATION
    department: str | None = None
    roles: frozenset[str] = frozenset()
    documents: tuple[str, ...] = ()
    traceparent: str | None = None
    """The W3C trace context every attempt of the turn joins (see `turnkit.otel`)."""

    @staticmethod
    def new_trace(*, session_id: str, agent: str) -> dict[str, Any]:
        """The trace context to pin a turn submitted now to (the current span's, if any)."""
        return otel.submit_trace(session_id=session_id, agent=agent)

    @property
    def caller(self) -> Principal | None:
        """Who sent the message, re-derived from the turn (None: anonymous)."""
        if self.principal is None:
            return None
        return Principal(
            id=self.principal,
            organisation=self.organisation,
            department=self.department,
            roles=self.roles,
        )

    def budget_subject(self, session_id: str) -> BudgetSubject:
        """Who the turn spends for (its department as pinned, else the default one)."""
        return BudgetSubject(
            organisation=self.organisation,
            department=self.department or DEFAULT_DEPARTMENT,
            principal=self.principal,
            session_id=session_id,
        )

    @classmethod
    def of(cls, record: TurnRecord) -> Pinned:
        """The record's pinned configuration (older records: what they hold)."""
        pinned = record.pinned
        overrides = pinned.get("overrides")
        overrides = overrides if isinstance(overrides, dict) else {}
        model, settings = overrides.get("model"), overrides.get("settings")
        version, effort = pinned.get("agent_version"), pinned.get("effort")
        principal, tools = pinned.get("principal"), pinned.get("tools")
        return cls(
            agent=str(pinned.get("agent") or record.agent),
            version=version if isinstance(version, str) else None,
            model=model if isinstance(model, str) else None,
            settings=ModelSettings.model_validate(settings) if settings else None,
            effort=cast(Effort, effort) if effort in ("off", "low", "medium", "high") else None,
            principal=principal if isinstance(principal, str) else None,
            tools=tuple(str(t) for t in tools) if isinstance(tools, list) else None,
            organisation=_text(pinned.get("organisation")) or DEFAULT_ORGANISATION,
            department=_text(pinned.get("department")),
            roles=frozenset(_texts(pinned.get("roles"))),
            documents=_texts(pinned.get("documents")),
            traceparent=_text(pinned.get("traceparent")),
        )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def pinned_config(
    agent: Agent,
    family: ModelFamily,
    effort: Effort,
    *,
    version: str,
    overrides: dict[str, Any],
    tools: Sequence[str],
    principal: str | None,
    trace: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a turn is pinned to at submit: every driver rebuilds exactly this.

    `agent` and `version` name the bundle, `overrides` the message's model and settings;
    `tools` are the agent's tools the caller may use; `trace` the trace every attempt
    joins (`Pinned.new_trace`). The rest is kept for audit.
    """
    return {
        "agent": agent.name,
        "agent_version": version,
        "overrides": overrides,
        "principal": principal,
        "settings": agent.settings.model_dump(exclude_none=True, mode="json"),
        "family": family.name,
        "rungs": [r.model for r in family.rungs],
        "utility_model": agent.utility_model
        if isinstance(agent.utility_model, str)
        else getattr(agent.utility_model, "model", None),
        "effort": effort,
        "tools": list(tools),
        "skip_stages": sorted(agent.skip_stages),
        "synthesis": agent.synthesis,
        **(trace or {}),
    }


class TurnRunner:
    """Builds drivers: resolves the agent's models, the transcript and the stage context."""

    def __init__(
        self,
        *,
        agents: AgentCatalog,
        store: Store,
        graph: TurnGraph,
        config: RuntimeConfig,
        clock: Clock,
        family: Callable[[Any], ModelFamily] = resolve_family,
        deps: DepsFactory | None = None,
        skills: SkillSource | None = None,
        plugins: Sequence[Plugin] = (),
        held: HeldTranscripts | None = None,
        aftermath: Aftermath | None = None,
        driving: Driving | None = None,
        ask_agent: AskAgent | None = None,
        stop_asked: StopAsked | None = None,
        admission: Admission | None = None,
        tool_access: ToolAccess | None = None,
    ) -> None:
        self.agents = agents
        self.admission = admission
        """The checks a turn re-pinned before it started passes again (None: none is)."""
        self.tool_access = tool_access
        self.ask_agent = ask_agent
        """Runs an agent a tool call asks (`Agent.as_tool`); None: such calls fail."""
        self.stop_asked = stop_asked
        """Stops the asked agents' turns whose requests a turn that ended waited on."""
        self.aftermath = aftermath
        """Where drivers leave work for after a turn's ending (None: it is dropped)."""
        self.held = held
        """Sessions' transcripts held across turns (None: each turn reads its whole history)."""
        self.deps_factory = deps
        self.skills = skills
        self.plugins = tuple(plugins)
        self.store = store
        self.graph = graph
        self.config = config
        self.clock = clock
        self.family = family
        self._driving: Driving = driving if driving is not None else weakref.WeakValueDictionary()
        """The process's drivers by turn (each forgotten once nothing holds it)."""

    async def driver(
        self,
        lease: Lease,
        *,
        sink: Sink,
        agent: Agent | None = None,
        record: TurnRecord | None = None,
        deps: Any = NO_DEPS,
    ) -> TurnDriver:
        """A driver for a claimed turn, from `record` or the lease's if either read it.

        `agent` is the bundle the caller already holds (used when it is the pinned
        version); otherwise the driver looks the pinned agent up when it starts.
        """
        record = record or lease.record or await self.store.get_turn(lease.turn_id)
        if record is None:
            raise TurnNotFoundError(f"no turn {lease.turn_id!r}", turn_id=lease.turn_id)
        turn, pinned = record, Pinned.of(record)  # read once per attempt

        async def setup() -> DriveSetup:
            return await self._setup(turn, pinned, agent, deps, lease)

        driver = self._driving[lease.turn_id] = TurnDriver(
            graph=self.graph,
            store=self.store,
            clock=self.clock,
            config=self.config,
            lease=lease,
            record=record,
            setup=setup,
            sink=sink,
            traceparent=pinned.traceparent,
            aftermath=self.aftermath,
            stop_asked=self.stop_asked,
        )
        return driver

    async def pinned_agent(self, record: TurnRecord, held: Agent | None = None) -> Agent:
        """The agent `record` is pinned to, with the message's overrides applied.

        Raises:
            AgentNotFoundError: the pinned agent (at its version) is gone from this host.
        """
        return await self._agent_of(Pinned.of(record), held)

    async def _agent_of(self, pinned: Pinned, held: Agent | None) -> Agent:
        if (
            held is not None
            and held.name == pinned.agent
            and pinned.version in (None, held.version, *held.earlier_versions)
        ):
            base = held
        else:
            base = await self.agents.get(pinned.agent, pinned.version)
        return base.with_overrides(model=pinned.model, settings=pinned.settings)

    def _background_model(self, organisation: str) -> ModelFamily | None:
        """The organisation's background model, if it names one."""
        served = self.admission.tenancy.organisation(organisation) if self.admission else None
        if served is None or served.background_model is None:
            return None
        return self.family(served.background_model)

    async def _setup(
        self, record: TurnRecord, pinned: Pinned, held: Agent | None, deps: Any, lease: Lease
    ) -> DriveSetup:
        repinned: AgentRepinnedPayload | None = None
        try:
            agent = await self._agent_of(pinned, held)
        except AgentNotFoundError:
            again = await self._repin(record, pinned, lease)
            if again is None:
                raise
            record, pinned, repinned, base = again
            agent = base.with_overrides(model=pinned.model, settings=pinned.settings)
        else:
            repinned = await self._repin_unsaid(record, pinned, lease)
        try:
            family = self.family(agent.model)
            utility = self.family(agent.utility_model) if agent.utility_model is not None else None
            naming = self._background_model(pinned.organisation) or utility
            synthesis = (
                self.family(agent.synthesis_model or agent.model)
                if agent.synthesis == "separate"
                else None
            )
        except UnknownModelError as exc:  # admitted where it resolves, driven where it does not
            raise UnknownModelError(
                f"{exc.message} (the process driving the turn does not serve it: give every "
                "process that drives turns the same models=, e.g. turnkit worker --runtime)"
            ) from exc
        effort: Effort = pinned.effort or agent.effort
        budget = _thinking_budget(effort, family)
        registry = agent.registry()
        if pinned.tools is not None:  # the caller's tool access, settled at submit
            registry = registry.only(pinned.tools)
        principal = pinned.principal
        if deps is NO_DEPS:
            scope = DepsScope(
                principal=principal,
                session_id=record.session_id,
                turn_id=record.turn_id,
                agent=agent.name,
                caller=pinned.caller,
            )
            deps = await build_deps(self.deps_factory, scope)
        plugins = merge_plugins(agent.plugins, self.plugins)
        skills = await self._skills(agent, pinned.caller)
        gate = self._budget_gate(pinned, record, family)

        def ctx_factory(recorder: Recorder) -> StageContext:
            return StageContext(
                recorder=recorder,
                agent=agent,
                family=family,
                utility=utility,
                registry=registry,
                thinking_budget=budget,
                synthesis=synthesis,
                naming=naming,
                principal=principal,
                caller=pinned.caller,
                deps=deps,
                skills=skills,
                plugins=plugins,
                interrupt=pause_here,
                budget=gate,
                ask_agent=self.ask_agent,
                callback_token=(
                    callback_token(self.config.callback_secret, record.turn_id)
                    if self.config.callback_secret
                    else None
                ),
            )

        transcript, previous, known = await session_transcript(
            self.store,
            agent,
            record,
            self.held,
            guarded=any(overrides(p, "check_input") for p in plugins),
            system_prompt=self.config.system_prompt(agent.instructions),
        )
        return DriveSetup(
            ctx_factory=ctx_factory,
            transcript=transcript,
            previous=previous,
            known=known,
            entry=_entry(
                agent,
                registry_size=len(registry) + int(agent.clarifications) + int(agent.planning),
            ),
            repinned=repinned,
            record=record,
        )

    async def _repin(
        self, record: TurnRecord, pinned: Pinned, lease: Lease
    ) -> tuple[TurnRecord, Pinned, AgentRepinnedPayload, Agent] | None:
        """Pin a turn that has not started to its agent's current version (None: it stays).

        Only a turn whose pinned version is gone and that holds nothing but what submit
        wrote: its `turn.started`, no audit row (but an earlier re-pin's), no checkpoint (a
        claim that died before its first commit did nothing either). The checks that
        depend on the agent run again for the new version, as the caller (one that refuses
        raises its error); the new pin is written on the turn record, fenced on the lease
        and on its log.
        """
        if self.admission is None or pinned.version is None or lease.last_seq > 1:
            return None
        try:
            current = await self.agents.get(pinned.agent)
        except AgentNotFoundError:
            return None  # gone altogether: nothing to run it on
        turn_id = record.turn_id
        if current.version == pinned.version:
            return None
        # Its own `agentRepinned` row (an attempt that re-pinned it and died) is no work.
        rows = await self.store.read_audit(turn_id)
        if any(row.payloads.agent_repinned is None for row in rows):
            return None
        if await latest_checkpoint_id(self.graph, turn_id) is not None:
            return None
        try:
            model = await self.admission.recheck(
                current,
                session_id=record.session_id,
                content=record.content,
                principal=pinned.caller,
                organisation=pinned.organisation,
                department=pinned.department,
                model=pinned.model,
            )
        except (AdmissionRefusedError, AgentNotFoundError) as exc:
            exc.message = (
                f"{exc.message} (the turn had not started; its agent {current.name!r} is no "
                f"longer at version {pinned.version}, and version {current.version} was "
                "checked instead)"
            )
            exc.args = (exc.message,)
            raise
        turn_agent = current.with_overrides(model=model, settings=pinned.settings)
        family = self.family(turn_agent.model)
        if turn_agent.utility_model is not None:
            self.family(turn_agent.utility_model)
        tools = await allowed_tools(
            self.tool_access, turn_agent, principal=pinned.principal, session_id=record.session_id
        )
        overrides = dict(_dict(record.pinned.get("overrides")))
        overrides.pop("model", None)
        if model is not None:
            overrides["model"] = model
        fresh = pinned_config(
            turn_agent,
            family,
            pinned.effort or current.effort,
            version=current.version,
            overrides=overrides,
            tools=tools,
            principal=pinned.principal,
        )
        now = record.pinned | fresh | {"repinned_from": pinned.version}
        await self.store.repin(lease, pinned=now, model=family.name)
        record = replace(record, pinned=now, model=family.name)
        payload = AgentRepinnedPayload(
            agent=current.name, from_version=pinned.version, to_version=current.version
        )
        return record, Pinned.of(record), payload, current

    async def _repin_unsaid(
        self, record: TurnRecord, pinned: Pinned, lease: Lease
    ) -> AgentRepinnedPayload | None:
        """The re-pin an attempt that died wrote without its `agentRepinned` row, if any.

        The new pin (`Store.repin`) and the row (the driver's first commit) are two
        commits. A turn that holds nothing but its `turn.started` yet was re-pinned to
        the version it is pinned to, with no row saying so, gets the row from this attempt.
        """
        earlier = record.pinned.get("repinned_from")
        if not isinstance(earlier, str) or pinned.version is None or lease.last_seq > 1:
            return None
        rows = await self.store.read_audit(record.turn_id)
        said = (row.payloads.agent_repinned for row in rows)
        if any(p is not None and p.to_version == pinned.version for p in said):
            return None
        return AgentRepinnedPayload(
            agent=pinned.agent, from_version=earlier, to_version=pinned.version
        )

    async def _skills(self, agent: Agent, principal: Principal | None) -> tuple[Skill, ...]:
        """The skills the turn may use: the caller's, narrowed to those the agent names."""
        skills = await skills_for(self.skills, principal)
        if agent.skills:
            skills = tuple(s for s in skills if s.ref in agent.skills or s.slug in agent.skills)
        return skills

    def _budget_gate(
        self, pinned: Pinned, record: TurnRecord, family: ModelFamily
    ) -> BudgetGate | None:
        """What checks each model call against the budgets (None: budgets are off)."""
        if self.config.budgets != "enforce":
            return None
        return BudgetGate(
            book=self.store,
            subject=pinned.budget_subject(record.session_id),
            reserve_tokens=self.config.budget_reserve_tokens,
            ttl_s=self.config.ceiling_s,
            list_price=_dearest_price(family),
        )


def _entry(agent: Agent, *, registry_size: int) -> Route:
    if "anchor-plan" not in agent.skip_stages:
        return "anchor-plan"
    if "tool-loop" in agent.skip_stages or registry_size == 0:
        return "synthesize"
    return "tool-loop"


def _dearest_price(family: ModelFamily) -> tuple[float, float]:
    """The highest input and output list prices (USD per token) among the family's rungs."""
    from turnkit.models.litellm import list_price_of

    prices = [p for rung in family.rungs if (p := list_price_of(rung)) is not None]
    return (max((p[0] for p in prices), default=0.0), max((p[1] for p in prices), default=0.0))


def _thinking_budget(effort: Effort, family: ModelFamily) -> int:
    """Thinking tokens per call: the smallest any rung allows (0 for non-litellm clients)."""
    if effort == "off":
        return 0
    from turnkit.models.litellm import LiteLLMClient

    if not all(isinstance(rung, LiteLLMClient) for rung in family.rungs):
        return 0
    from turnkit.models.catalog import model_facts, thinking_budget

    return min(thinking_budget(effort, model_facts(rung.model)) for rung in family.rungs)
