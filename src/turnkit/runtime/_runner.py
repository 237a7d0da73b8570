"""`TurnRunner`: turns a claimed lease into a `TurnDriver` (in-process and in workers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnkit.agent import Agent, Effort
from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.errors import TurnNotFoundError
from turnkit.graph import TurnGraph, pause_here
from turnkit.models.family import ModelFamily, resolve_family
from turnkit.runtime._history import TurnHistory, blocks_of
from turnkit.runtime._transcript import session_transcript
from turnkit.runtime.driver import Sink, TurnDriver
from turnkit.stages import StageContext
from turnkit.stages._types import Route
from turnkit.store import Lease, Store, TurnRecord, readable_events
from turnkit.telemetry import Recorder

__all__ = ("TurnRunner", "pinned_config", "turn_history")


def pinned_config(agent: Agent, family: ModelFamily, effort: Effort) -> dict[str, Any]:
    """What a run is pinned to, recorded on the run row for audit (seed 001 ⑦)."""
    return {
        "agent": agent.name,
        "family": family.name,
        "rungs": [r.model for r in family.rungs],
        "utility_model": agent.utility_model
        if isinstance(agent.utility_model, str)
        else getattr(agent.utility_model, "model", None),
        "effort": effort,
        "tools": list(agent.registry().names),
        "skip_stages": sorted(agent.skip_stages),
        "synthesis": agent.synthesis,
    }


async def turn_history(store: Store, turn: TurnRecord) -> TurnHistory:
    """A turn's committed blocks."""
    events = await readable_events(store.read_events(turn.turn_id))
    return TurnHistory(turn_id=turn.turn_id, status=turn.status, blocks=blocks_of(events))


class TurnRunner:
    """Builds drivers: resolves the agent's models, the transcript and the stage context."""

    def __init__(
        self,
        *,
        agent: Agent,
        store: Store,
        graph: TurnGraph,
        config: RuntimeConfig,
        clock: Clock,
        family: Callable[[Any], ModelFamily] = resolve_family,
    ) -> None:
        self.agent = agent
        self.store = store
        self.graph = graph
        self.config = config
        self.clock = clock
        self.family = family

    async def driver(
        self,
        lease: Lease,
        *,
        sink: Sink,
        agent: Agent | None = None,
        record: TurnRecord | None = None,
    ) -> TurnDriver:
        """A driver for a claimed turn (`record`: the turn as claimed, if already read)."""
        record = record or await self.store.get_turn(lease.turn_id)
        if record is None:
            raise TurnNotFoundError(f"no turn {lease.turn_id!r}", turn_id=lease.turn_id)
        agent = agent or self.agent
        family = self.family(agent.model)
        utility = self.family(agent.utility_model) if agent.utility_model is not None else None
        synthesis = (
            self.family(agent.synthesis_model or agent.model)
            if agent.synthesis == "separate"
            else None
        )
        effort: Effort = record.pinned.get("effort", agent.effort)  # type: ignore[assignment]
        budget = _thinking_budget(effort, family)
        registry = agent.registry()

        def ctx_factory(recorder: Recorder) -> StageContext:
            return StageContext(
                recorder=recorder,
                agent=agent,
                family=family,
                utility=utility,
                registry=registry,
                thinking_budget=budget,
                synthesis=synthesis,
                interrupt=pause_here,
            )

        transcript, previous = await session_transcript(self.store, agent, record)
        return TurnDriver(
            graph=self.graph,
            store=self.store,
            clock=self.clock,
            config=self.config,
            lease=lease,
            record=record,
            ctx_factory=ctx_factory,
            transcript=transcript,
            previous=previous,
            entry=_entry(agent, registry_size=len(registry) + int(agent.clarifications)),
            sink=sink,
        )


def _entry(agent: Agent, *, registry_size: int) -> Route:
    if "anchor-plan" not in agent.skip_stages:
        return "anchor-plan"
    if "tool-loop" in agent.skip_stages or registry_size == 0:
        return "synthesize"
    return "tool-loop"


def _thinking_budget(effort: Effort, family: ModelFamily) -> int:
    """Thinking tokens per call: the smallest any rung allows (0 for non-litellm clients)."""
    if effort == "off":
        return 0
    from turnkit.models.litellm import LiteLLMClient

    if not all(isinstance(rung, LiteLLMClient) for rung in family.rungs):
        return 0
    from turnkit.models.catalog import model_facts, thinking_budget

    return min(thinking_budget(effort, model_facts(rung.model)) for rung in family.rungs)
