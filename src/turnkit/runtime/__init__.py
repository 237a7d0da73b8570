"""`SessionRuntime`: the facade an app holds — execute a message, read history and audit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

from turnkit.agent import Agent, Effort
from turnkit.audit import AuditRow
from turnkit.clock import Clock, SystemClock
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    ConfigurationError,
    ContentTooLargeError,
    EmptyContentError,
    InvalidSessionIdError,
    SessionNotFoundError,
    TurnNotFoundError,
)
from turnkit.events import DurableEvent, EphemeralEvent, StreamEvent
from turnkit.graph import TurnGraph, compile_turn_graph, open_checkpointer
from turnkit.ids import SessionId, TurnId, is_valid_session_id, new_turn_id
from turnkit.models.family import ModelFamily, resolve_family
from turnkit.runtime._cancel import CancelToken
from turnkit.runtime._history import TurnHistory, blocks_of
from turnkit.runtime.driver import TurnDriver
from turnkit.stages import StageContext
from turnkit.stages._types import Route, TranscriptMessage
from turnkit.store import NewTurn, Store, TurnRecord
from turnkit.store.sql import SqlStore
from turnkit.telemetry import Recorder

__all__ = ("CancelToken", "SessionRuntime", "TurnHistory", "TurnRequest")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRequest:
    """One validated request to run a turn (built by `execute_message` and the HTTP route)."""

    session_id: SessionId
    content: str
    agent: Agent
    request_id: str | None = None
    effort: Effort | None = None


class SessionRuntime:
    """Runs turns durably for one app: one compiled graph, one Store, one checkpointer.

    Use as an async context manager (it opens the database and compiles the graph):

    ```python
    async with SessionRuntime(agent=Agent(model=ScriptedModel([...]))) as runtime:
        async for event in runtime.execute_message("s1", "hello"):
            print(event.type)
    ```
    """

    def __init__(
        self,
        *,
        agent: Agent,
        config: RuntimeConfig | None = None,
        store: Store | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.agent = agent
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self._store = store
        self._owns_store = store is None
        self._graph: TurnGraph | None = None
        self._close_checkpointer: Callable[[], Awaitable[None]] | None = None
        self._families: dict[int, ModelFamily] = {}
        self._family(agent.model)  # an unresolvable model string fails here, not mid-turn

    @property
    def store(self) -> Store:
        """The Store turns are written to."""
        if self._store is None:
            raise ConfigurationError(
                "the runtime is not open: use `async with SessionRuntime(...)`"
            )
        return self._store

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the Store and checkpointer and compile the graph (idempotent)."""
        if self._graph is not None:
            return
        if self._store is None:
            store = SqlStore.from_url(self.config.database_url, clock=self.clock)
            await store.setup()
            self._store = store
        saver, self._close_checkpointer = await open_checkpointer(self.config.database_url)
        self._graph = compile_turn_graph(saver)

    async def close(self) -> None:
        """Close what the runtime opened."""
        if self._close_checkpointer is not None:
            await self._close_checkpointer()
            self._close_checkpointer = None
        if self._owns_store and self._store is not None:
            await self._store.close()
            self._store = None
        self._graph = None

    def _family(self, spec: str | Any) -> ModelFamily:
        key = id(spec) if not isinstance(spec, str) else hash(spec)
        family = self._families.get(key)
        if family is None:
            family = resolve_family(spec)
            self._families[key] = family
        return family

    def _validate(
        self,
        session_id: str,
        content: str,
        agent: Agent,
        request_id: str | None,
        effort: Effort | None,
    ) -> TurnRequest:
        if not is_valid_session_id(session_id):
            raise InvalidSessionIdError(
                f"session id {session_id!r} has an unknown format: use 1-128 letters, digits "
                "or `_ . : -`, starting with a letter or digit",
                session_id=session_id,
            )
        if not content.strip():
            raise EmptyContentError("the message is empty: send some text", session_id=session_id)
        if len(content) > self.config.max_content_chars:
            raise ContentTooLargeError(
                f"the message has {len(content)} characters; the limit is "
                f"{self.config.max_content_chars} (`RuntimeConfig.max_content_chars`)",
                chars=len(content),
                limit=self.config.max_content_chars,
            )
        if request_id is not None and not 0 < len(request_id) <= 128:
            raise InvalidSessionIdError("request_id must be 1-128 characters")
        return TurnRequest(
            session_id=SessionId(session_id),
            content=content,
            agent=agent,
            request_id=request_id,
            effort=effort,
        )

    async def execute_message(
        self,
        session_id: str,
        content: str,
        *,
        agent: Agent | None = None,
        request_id: str | None = None,
        effort: Effort | None = None,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[DurableEvent | EphemeralEvent]:
        """Run one turn and stream its events.

        Every durable event is committed to the Store before it is yielded. Closing the
        generator (or `cancel.cancel()`) aborts the turn: the model call is cancelled, the
        abort is audited as `user-aborted`, and the turn ends `cancelled`. A `request_id`
        already used in the session replays that turn's committed events instead of
        running it again.

        Raises:
            InvalidInputError: bad session id, empty or oversized content (nothing written).
            UnknownModelError: the agent's model string does not resolve.
        """
        turn_agent = agent or self.agent
        request = self._validate(session_id, content, turn_agent, request_id, effort)
        family = self._family(turn_agent.model)
        utility = (
            self._family(turn_agent.utility_model) if turn_agent.utility_model is not None else None
        )
        if self._graph is None:
            await self.open()
        graph = self._graph
        assert graph is not None
        prior = await self.store.list_turns(request.session_id)
        record, is_new = await self.store.start_turn(
            NewTurn(
                turn_id=new_turn_id(),
                session_id=request.session_id,
                content=request.content,
                request_id=request.request_id,
                agent=turn_agent.name,
                model=family.name,
            )
        )
        if not is_new:
            async for stored in self.store.read_events(record.turn_id):
                yield stored.decode()
            return
        drive = self._drive(request, record, graph, family, utility, prior, cancel)
        async with contextlib.aclosing(drive):  # closing this stream must reach the driver
            async for event in drive:
                yield event

    async def _drive(
        self,
        request: TurnRequest,
        record: TurnRecord,
        graph: TurnGraph,
        family: ModelFamily,
        utility: ModelFamily | None,
        prior: list[TurnRecord],
        cancel: CancelToken | None,
    ) -> AsyncGenerator[DurableEvent | EphemeralEvent, None]:
        agent = request.agent
        effort = request.effort or agent.effort
        budget = _thinking_budget(effort, family)
        registry = agent.registry()

        def ctx_factory(recorder: Recorder) -> StageContext:
            return StageContext(
                recorder=recorder,
                agent=agent,
                family=family,
                utility=utility,
                registry=registry,
                config=self.config,
                thinking_budget=budget,
            )

        queue: asyncio.Queue[DurableEvent | EphemeralEvent | None] = asyncio.Queue()
        driver = TurnDriver(
            graph=graph,
            store=self.store,
            clock=self.clock,
            record=record,
            ctx_factory=ctx_factory,
            transcript=await self._transcript(agent, prior, request.content),
            entry=_entry(agent, registry_size=len(registry)),
            effort=effort,
            durability=self.config.checkpoint_durability,
            sink=queue.put_nowait,
        )
        task = asyncio.create_task(driver.run(), name=f"turnkit-turn-{record.turn_id}")
        watcher = (
            asyncio.create_task(_cancel_when(cancel, task), name="turnkit-cancel-watch")
            if cancel is not None
            else None
        )
        try:
            while (event := await queue.get()) is not None:
                yield event
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            if watcher is not None:
                watcher.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _transcript(
        self, agent: Agent, prior: list[TurnRecord], content: str
    ) -> list[TranscriptMessage]:
        messages: list[TranscriptMessage] = [{"role": "system", "content": agent.instructions}]
        for turn in prior:
            messages.append({"role": "user", "content": turn.content})
            history = await self._turn_history(turn)
            if history.answer is not None:
                messages.append({"role": "assistant", "content": history.answer})
        messages.append({"role": "user", "content": content})
        return messages

    async def _turn_history(self, turn: TurnRecord) -> TurnHistory:
        events: list[StreamEvent] = [e.decode() async for e in self.store.read_events(turn.turn_id)]
        return TurnHistory(turn_id=turn.turn_id, status=turn.status, blocks=blocks_of(events))

    async def history(self, session_id: str) -> list[TurnHistory]:
        """A session's turns, oldest first, each with its committed blocks.

        Raises:
            SessionNotFoundError: the session has no turns.
        """
        turns = await self.store.list_turns(SessionId(session_id))
        if not turns:
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return [await self._turn_history(t) for t in turns]

    async def events(self, turn_id: str, *, after_seq: int = 0) -> AsyncIterator[StreamEvent]:
        """A turn's committed events after `after_seq`, in order."""
        if await self.store.get_turn(TurnId(turn_id)) is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        async for stored in self.store.read_events(TurnId(turn_id), after_seq=after_seq):
            yield stored.decode()

    async def audit(self, turn_id: str) -> list[AuditRow]:
        """A turn's audit rows, in order."""
        if await self.store.get_turn(TurnId(turn_id)) is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return await self.store.read_audit(TurnId(turn_id))

    async def turn(self, turn_id: str) -> TurnRecord:
        """A turn's record (status, last seq, …)."""
        record = await self.store.get_turn(TurnId(turn_id))
        if record is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return record


async def _cancel_when(token: CancelToken, task: asyncio.Task[None]) -> None:
    await token.wait()
    task.cancel()


def _entry(agent: Agent, *, registry_size: int) -> Route:
    if "anchor-plan" not in agent.skip_stages:
        return "anchor-plan"
    if "tool-loop" in agent.skip_stages or registry_size == 0:
        return "synthesize"
    return "tool-loop"


def _thinking_budget(effort: Effort, family: ModelFamily) -> int:
    if effort == "off" or family.provider == "scripted":
        return 0
    from turnkit.models.catalog import model_facts, thinking_budget

    return min(thinking_budget(effort, model_facts(rung.model)) for rung in family.rungs)
