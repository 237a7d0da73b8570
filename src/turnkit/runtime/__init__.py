"""`SessionRuntime`: the facade an app holds — execute a message, read history and audit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from turnkit.agent import Agent, Effort
from turnkit.blocks import TextPart
from turnkit.budgets import BudgetLimit, BudgetPeriod, BudgetScope, BudgetUse
from turnkit.clock import Clock, SystemClock
from turnkit.config import RuntimeConfig
from turnkit.errors import ConfigurationError, InvalidInputError
from turnkit.events import DurableEvent, EphemeralEvent
from turnkit.graph import TurnGraph, compile_turn_graph, open_checkpointer
from turnkit.ids import TurnId, uuid7
from turnkit.models import ModelClient, ModelSettings
from turnkit.models.litellm import ModelEndpoint
from turnkit.pauses import Resolution
from turnkit.plugins import Plugin, discover_plugins, validate_plugins
from turnkit.replay import ReplayBuffer
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime._aftermath import Aftermath
from turnkit.runtime._callback_reports import callback_scope, publish_job_progress
from turnkit.runtime._cancel import CancelToken
from turnkit.runtime._families import ModelFamilies
from turnkit.runtime._follow import follow_submission
from turnkit.runtime._held import HeldTranscripts
from turnkit.runtime._history import TurnHistory
from turnkit.runtime._host import TurnHost
from turnkit.runtime._opening import open_store
from turnkit.runtime._reads import RuntimeReads
from turnkit.runtime._runner import Pinned, TurnRunner
from turnkit.runtime._slots import Slot
from turnkit.runtime._submit import new_input
from turnkit.runtime._validate import (
    MessageContent,
    TurnRequest,
    check_session_id,
    check_text,
    validate_request,
)
from turnkit.runtime.admission import Admission, AdmissionCheck, DocumentResolver
from turnkit.runtime.agents import AgentCatalog, ToolAccess, allowed_tools
from turnkit.runtime.budget_pauses import resume_budget_pauses
from turnkit.runtime.callbacks import CallbackScope, callback_token
from turnkit.runtime.deps import NO_DEPS, DepsFactory
from turnkit.runtime.reader import TurnReader
from turnkit.skills import Skill, SkillSource, skills_for
from turnkit.states import TurnStatus
from turnkit.store import Delivery, SessionRecord, Store, Submission
from turnkit.tenancy import DEFAULT_ORGANISATION, Organisation, Principal, Tenancy
from turnkit.tools import Tool

if TYPE_CHECKING:
    from turnkit.runtime.worker import Worker

__all__ = ("CancelToken", "MessageContent", "SessionRuntime", "TurnHistory", "TurnRequest")

log = logging.getLogger("turnkit.runtime")


class SessionRuntime(RuntimeReads):
    """Runs turns durably for one app: one compiled graph, one Store, one checkpointer.

    Use as an async context manager (it opens the database and compiles the graph):

    ```python
    async with SessionRuntime(agent=Agent(model=ScriptedModel([...]))) as runtime:
        async for event in runtime.execute_message("s1", "hello"):
            print(event.type)
    ```

    Args:
        agent: The default agent (a message that names none gets it).
        agents: More agents hosted by name, or an `AgentCatalog` (with a loader for
            bundles kept in the app's database). Without `agent`, the first is the default.
        tools: The host's tools, which agents kept as data name.
        deps: Builds the app's dependencies for a turn's tools (`ToolContext.deps`) from
            its scope, wherever the turn is driven; never stored.
        tool_access: The caller's effective tool access; an agent's tools are narrowed to
            it when a message is submitted.
        models: Served models by name: a model string names one of these before litellm
            resolves it, so an agent or a message override (`model="fast"`) reaches its
            endpoint (`ModelEndpoint(model=..., api_base=..., api_key_env=...)`), client
            or family.
        skills: Your skill catalogue: a list of `Skill`s, or a function of the principal
            returning the skills that caller may see. Merged with the builtin skills; a
            message starting with `/slug` picks one.
        plugins: Plugins for every agent's turns (run after each agent's own): `Plugin`
            objects, or names of installed plugins (the `turnkit.plugins` entry-point
            group), loaded only when named.
        config: Runtime settings; store, replay, clock: the parts to use (defaults:
            from `config`).
    """

    def __init__(
        self,
        agent: Agent | None = None,
        *,
        agents: AgentCatalog | Sequence[Agent] = (),
        tools: Sequence[Tool] = (),
        deps: DepsFactory | None = None,
        tool_access: ToolAccess | None = None,
        models: Mapping[str, str | ModelClient | ModelEndpoint] | None = None,
        skills: SkillSource | None = None,
        plugins: Sequence[Plugin | str] = (),
        config: RuntimeConfig | None = None,
        store: Store | None = None,
        replay: ReplayBuffer | None = None,
        clock: Clock | None = None,
        tenancy: Tenancy | Sequence[Organisation] | None = None,
        admission: Sequence[AdmissionCheck] = (),
        documents: DocumentResolver | None = None,
    ) -> None:
        if isinstance(agents, AgentCatalog) and tools:
            raise ConfigurationError("give the host's `tools` to the AgentCatalog, not both")
        if not isinstance(agents, AgentCatalog):
            agents = AgentCatalog(agents, tools=tools)
        self.agents = agents
        """The agents this runtime hosts, by name."""
        default = agent or next(iter(self.agents.hosted()), None)
        if default is None:
            raise ConfigurationError("a runtime needs an `agent` (or `agents=[...]`)")
        self._agent = default
        self.agents.add(default)
        self.deps = deps
        self.tool_access = tool_access
        self.models: dict[str, str | ModelClient | ModelEndpoint] = dict(models or {})
        """Served models by name."""
        self._families = ModelFamilies(lambda: self.models)  # each resolved once
        self.plugins = validate_plugins(
            [p for p in plugins if not isinstance(p, str)]
            + list(discover_plugins([p for p in plugins if isinstance(p, str)]))
        )
        """Plugins run in every turn, after the agent's own."""
        self.skill_source = skills
        """The app's skill catalogue (the builtin skills are always there too)."""
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self._store = store
        self._owns_store = store is None
        self.replay: ReplayBuffer = replay or InMemoryReplayBuffer()
        """Where detached and worker-driven turns publish for live readers."""
        self._graph: TurnGraph | None = None
        self._held = HeldTranscripts()  # sessions' transcripts, kept across their turns
        self._aftermath = Aftermath()  # work turns left running after their ending
        self._opening: asyncio.Event | None = None
        self._close_checkpointer: Callable[[], Awaitable[None]] | None = None
        self._recovery: tuple[asyncio.Event, asyncio.Task[None], Worker] | None = None
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-12:]}"
        """This runtime's lease owner name."""
        self.host = TurnHost(
            owner=self.owner,
            store=lambda: self.store,
            replay=self.replay,
            config=self.config,
            clock=self.clock,
            runner=self.runner,
            reader=self.reader,
        )
        """Claims and drives turns in this process."""
        for hosted in self.agents.hosted():
            self._families(hosted.model)  # an unresolvable model string fails here, not mid-turn
        self.tenancy = tenancy if isinstance(tenancy, Tenancy) else Tenancy(tenancy or ())
        """The organisations served, their departments and default-agent switches."""
        self.admission = Admission(
            tenancy=self.tenancy,
            agents=self.agents,
            lookup=self._message_agent,
            served=lambda: {*self.config.allowed_models, *self.models},
            family=self._families,
            store=lambda: self.store,
            config=self.config,
            documents=documents,
            checks=tuple(admission),
        )
        """The checks every message passes before anything is saved (see `submit`)."""

    @property
    def agent(self) -> Agent:
        """The default agent (a message that names none gets it)."""
        return self._agent

    @agent.setter
    def agent(self, agent: Agent) -> None:
        self.agents.add(agent)  # hosted from now on; turns pinned to the old one still find it
        self._agent = agent

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the Store and checkpointer and compile the graph (idempotent)."""
        while self._opening is not None:  # another caller is opening it: wait for that
            await self._opening.wait()
        if self._graph is not None:
            return
        self._opening = asyncio.Event()
        try:
            await self._open_parts()
        finally:
            opening, self._opening = self._opening, None
            opening.set()  # waiters find it open, or (it failed) try themselves
        if self.config.recover_in_process:
            self._start_recovery()

    async def _open_parts(self) -> None:
        if self._store is None:
            self._store = await open_store(self.config, self.clock)
        saver, self._close_checkpointer = await open_checkpointer(
            self.config.database_url, schema=self.config.database_schema
        )
        self._graph = compile_turn_graph(saver)
        try:
            await self.replay.ping()
        except Exception as exc:  # noqa: BLE001 - the buffer is a fast path, never required
            log.warning(
                "the replay buffer cannot be reached (%s): turns still run and readers "
                "follow the Store until it answers",
                exc,
            )

    def _start_recovery(self) -> None:
        """Run a worker loop beside the app: turns whose driver died are taken over."""
        from turnkit.runtime.worker import Worker

        stop = asyncio.Event()
        worker = Worker(
            self, concurrency=self.config.recovery_concurrency, owner=f"{self.owner}/recovery"
        )
        task = asyncio.create_task(worker.run(stop), name="turnkit-recovery")
        self._recovery = (stop, task, worker)

    async def wait_background(self) -> None:
        """Wait for the work turns left running after their ending.

        A session's opening turn settles before the agent's utility model names the
        session; this returns once every such call has finished (each is bounded by
        `idle_window_s`). Useful in scripts and tests; `close` cancels what is left.
        """
        await self._aftermath.wait()

    async def close(self) -> None:
        """Close what the runtime opened.

        Detached turns still running are abandoned, not cancelled: their leases expire and
        a worker resumes them (or a reader records them timed out). A naming call still
        running after its turn is cancelled (the session keeps its first name).
        """
        if self._recovery is not None:
            stop, task, _ = self._recovery
            self._recovery = None
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
        await self.host.close()
        await self._aftermath.close()
        if self._close_checkpointer is not None:
            await self._close_checkpointer()
            self._close_checkpointer = None
        if self._owns_store and self._store is not None:
            await self._store.close()
            self._store = None
        self._graph = None

    async def submit(
        self,
        session_id: str,
        content: MessageContent,
        *,
        agent: str | Agent | None = None,
        model: str | None = None,
        settings: ModelSettings | None = None,
        request_id: str | None = None,
        delivery: Delivery = "queue",
        effort: Effort | None = None,
        principal: Principal | str | None = None,
        documents: Sequence[str] = (),
        claim: bool = False,
    ) -> Submission:
        """Commit a user message and queue its turn (one transaction), without running it.

        The turn is pinned to its agent (by name and version), the message's overrides
        (`model`, `settings`, `effort`), the caller's tools and the `principal`: every
        driver rebuilds exactly that. An `Agent` object that is not hosted yet is hosted
        from now on (in this process); name one with `agents=` to drive it elsewhere.

        With `claim=True` the new turn is also claimed for this runtime in the same
        transaction (when its session lets it run now): `Submission.lease` is then set.

        A worker (or `execute_message`) runs the turn. A `request_id` already used in the
        session returns the first submission and writes nothing.

        Before anything is written the message passes the admission chain (department,
        agent visibility, model, budget policy, attached `documents`, and the app's own
        checks); the first that fails raises and nothing is saved. `principal` is a
        `Principal` (organisation, department, roles) or a bare id.

        Raises:
            InvalidInputError: bad session id, empty or oversized content, bad delivery.
            AgentNotFoundError: no hosted agent has that name, or the caller may not see it.
            UnknownModelError: the agent's (or the override's) model does not resolve.
            AdmissionRefusedError: a check refused the message (a subclass names which).
        """
        request = validate_request(self.config, session_id, content, request_id, effort)
        if delivery not in ("queue", "guide"):
            raise InvalidInputError(
                f"delivery {delivery!r} is not 'queue' or 'guide'", delivery=delivery
            )
        if delivery == "guide" and request.attachments:
            raise InvalidInputError(
                "pictures cannot join a running turn: send them with delivery='queue'",
                delivery=delivery,
            )
        caller = Principal.of(principal)
        await self.open()
        admitted = await self.admission.admit(
            session_id=request.session_id,
            content=request.content,
            principal=caller,
            agent=agent,
            model=model,
            documents=documents,
        )
        turn_agent = admitted.agent.with_overrides(model=admitted.model, settings=settings)
        family = self._families(turn_agent.model)
        if turn_agent.utility_model is not None:
            self._families(turn_agent.utility_model)
        tools = await allowed_tools(
            self.tool_access,
            turn_agent,
            principal=caller.id if caller else None,
            session_id=request.session_id,
        )
        return await self.store.submit(
            new_input(
                request,
                admitted,
                turn_agent=turn_agent,
                family=family,
                settings=settings,
                tools=tools,
                delivery=delivery,
                config=self.config,
                claim_for=self.owner if claim else None,
            )
        )

    async def _message_agent(self, agent: str | Agent | None) -> Agent:
        """The agent a message names: hosted by name, or an object (hosted from now on)."""
        if agent is None:
            return self.agent
        if isinstance(agent, str):
            return await self.agents.get(agent)
        if not isinstance(agent, Agent):
            raise InvalidInputError(
                f"agent must be a name or a turnkit.Agent, not {type(agent).__name__}"
            )
        self.agents.add(agent)
        self._families(agent.model)
        return agent

    async def set_budget_limit(self, limit: BudgetLimit) -> list[str]:
        """Create or replace a budget limit (from any process: limits live in the Store).

        Turns paused `awaiting_budget` that the new limit leaves room for resume; returns
        their ids.
        """
        await self.open()
        await self.store.set_budget_limit(limit)
        return await self.resume_budget_pauses(limit.organisation)

    async def delete_budget_limit(
        self,
        scope: BudgetScope,
        *,
        organisation: str = DEFAULT_ORGANISATION,
        key: str = "",
        period: BudgetPeriod = "month",
    ) -> bool:
        """Remove a budget limit; whether there was one."""
        await self.open()
        return await self.store.delete_budget_limit(scope, organisation, key, period)

    def callback_token(self, turn_id: str) -> str:
        """The token work in another process reports back to `turn_id` with.

        Tools get it as `ToolContext.callback_token`; any process with the same
        `RuntimeConfig.callback_secret` accepts it.
        """
        if self.config.callback_secret is None:
            raise ConfigurationError("callback tokens need RuntimeConfig(callback_secret=...)")
        return callback_token(self.config.callback_secret, turn_id)

    async def verify_callback(self, turn_id: str, token: str) -> CallbackScope:
        """Check a callback's token and that its turn is running; who it acts for.

        Raises:
            CallbackTokenError: not this turn's token (or no `callback_secret` here).
            TurnNotFoundError: no such turn.
            TurnNotRunningError: the turn finished, failed, was cancelled or is paused.
        """
        return await callback_scope(self.turn, self.config.callback_secret, turn_id, token)

    async def report_job_progress(
        self,
        turn_id: str,
        token: str,
        *,
        job_id: str,
        tool_call_id: str,
        progress: float | None = None,
        message: str | None = None,
    ) -> CallbackScope:
        """A callback: publish a `job.progress` event to the turn's live readers.

        The event is ephemeral (the turn's driver alone writes its durable log). The report
        restarts the turn's idle window, wherever its driver runs. Raises as
        `verify_callback` does, and `InvalidInputError` for a progress outside 0–1.
        """
        scope = await self.verify_callback(turn_id, token)
        await publish_job_progress(
            self.store,
            self.replay,
            scope,
            ts=self.clock.now(),
            job_id=job_id,
            tool_call_id=tool_call_id,
            progress=progress,
            message=message,
        )
        return scope

    async def resume_budget_pauses(self, organisation: str | None = None) -> list[str]:
        """Resume the turns paused `awaiting_budget` whose next call now fits; their ids.

        `set_budget_limit` calls it, and workers (and in-process recovery) call it on
        their sweep, so a turn also resumes when its budget period rolls over. Each turn
        checks its budget again before the call: one still short pauses again.
        """
        await self.open()
        resumed = await resume_budget_pauses(self.store, organisation)
        if self.config.run_in_process:
            for turn_id in resumed:
                self.host.detach(TurnId(turn_id))
        return resumed

    async def budget_limits(self, organisation: str | None = None) -> list[BudgetLimit]:
        """Every budget limit (of one organisation when given)."""
        await self.open()
        return await self.store.budget_limits(organisation)

    async def budget_uses(
        self, principal: Principal | str | None, session_id: str
    ) -> list[BudgetUse]:
        """Each limit a message of `principal` in `session_id` would spend against, as used."""
        await self.open()
        caller = Principal.of(principal)
        return await self.admission.budget_uses(caller, check_session_id(session_id))

    async def skills(self, principal: str | None = None) -> tuple[Skill, ...]:
        """The skills `principal` may pick with `/slug`: yours they may see, then builtin."""
        return await skills_for(self.skill_source, principal)

    async def create_session(
        self, session_id: str, *, principal: str | None = None, title: str | None = None
    ) -> SessionRecord:
        """Create a session (a no-op if it exists); returns it."""
        sid = check_session_id(session_id)
        if title is not None:
            check_text(title, "the title")
        await self.open()
        return await self.store.create_session(sid, principal=principal, title=title)

    async def execute_message(
        self,
        session_id: str,
        content: MessageContent,
        *,
        agent: str | Agent | None = None,
        model: str | None = None,
        settings: ModelSettings | None = None,
        request_id: str | None = None,
        delivery: Delivery = "queue",
        effort: Effort | None = None,
        principal: Principal | str | None = None,
        documents: Sequence[str] = (),
        deps: Any = NO_DEPS,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[DurableEvent | EphemeralEvent]:
        """Run one turn in this process and stream its events.

        `content` is text, or parts: `TextPart`s and `ImagePart`s (pictures by URL or
        bytes with a media type, at most 20), sent to the model in its multimodal form.
        Every durable event is committed to the Store before it is yielded. Closing the
        generator (or `cancel.cancel()`) aborts the turn: the model call is cancelled, the
        abort is audited as `user-aborted`, and the turn ends `cancelled`. A `request_id`
        already used in the session replays that turn's committed events instead of
        running it again. A turn waits for the session's earlier turns to finish.

        `agent` names a hosted agent (or is one), `model`, `settings` and `effort`
        override the agent's for this message; `principal` is who sends it and `deps` the
        app's dependencies its tools see (`ToolContext`). The turn is pinned to all of
        it, so a resume, a worker or crash recovery runs the same agent (rebuilding `deps`
        with the runtime's factory).

        Raises:
            InvalidInputError: bad session id, empty or oversized content (nothing written).
            UnknownModelError: the agent's model string does not resolve.
            AdmissionRefusedError: a turn-start check refused it (nothing written).
        """
        submission, slot = await self._submit_claiming(
            True,
            session_id,
            content,
            agent=agent,
            model=model,
            settings=settings,
            request_id=request_id,
            delivery=delivery,
            effort=effort,
            principal=principal,
            documents=documents,
        )
        follow = follow_submission(
            submission,
            host=self.host,
            store=self.store,
            turn=self.turn,
            reader=self.reader,
            cancel=cancel,
            slot=slot,
            agent=agent if isinstance(agent, Agent) else None,
            deps=deps,
        )
        try:
            async with contextlib.aclosing(follow):  # closing this stream must reach the driver
                async for event in follow:
                    yield event
        finally:  # the stream releases it too; this covers a caller gone before it began
            if slot is not None:
                slot.release()

    async def _submit_claiming(
        self, claim: bool, session_id: str, content: MessageContent, **options: Any
    ) -> tuple[Submission, Slot | None]:
        """`submit`, claiming the turn in the same transaction if `claim` and a slot is free.

        The slot comes back with the claimed turn; None: the turn waits queued.
        """
        slot = self.host.slots.try_take() if claim else None
        try:
            submission = await self.submit(session_id, content, claim=slot is not None, **options)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if submission.lease is None and slot is not None:
            slot.release()  # not claimed (a guide, a replay, an earlier turn unfinished)
            slot = None
        return submission, slot

    async def start(
        self,
        session_id: str,
        content: MessageContent,
        *,
        agent: str | Agent | None = None,
        model: str | None = None,
        settings: ModelSettings | None = None,
        request_id: str | None = None,
        delivery: Delivery = "queue",
        effort: Effort | None = None,
        principal: Principal | str | None = None,
        documents: Sequence[str] = (),
        deps: Any = NO_DEPS,
        hold_until: asyncio.Event | None = None,
    ) -> Submission:
        """Commit a message and run its turn detached from the caller.

        The turn runs in a task of this runtime (when `RuntimeConfig.run_in_process`, which
        also claims it in the message's transaction: `Submission.lease`) or in a
        `turnkit worker`, and publishes to `self.replay`; read it with `reader()`.
        Closing a reader does not stop it; `cancel(turn_id)` does. The arguments are
        those of `execute_message`, and `hold_until`: a turn driven here takes its first
        step once this event is set (or a second has passed). A caller that streams the
        turn sets it once `turn.started` is written, so that event goes out before the
        turn's first steps take the event loop (the execute route does).
        """
        submission, slot = await self._submit_claiming(
            self.config.run_in_process,
            session_id,
            content,
            agent=agent,
            model=model,
            settings=settings,
            request_id=request_id,
            delivery=delivery,
            effort=effort,
            principal=principal,
            documents=documents,
        )
        if submission.is_new and not submission.guided and self.config.run_in_process:
            self.host.detach(
                submission.turn_id,
                lease=submission.lease,  # None: it waits for a slot, or earlier turns
                slot=slot,
                agent=agent if isinstance(agent, Agent) else None,
                deps=deps,
                hold_until=hold_until,
            )
        return submission

    async def retry(self, turn_id: str, *, request_id: str | None = None) -> Submission:
        """Send a failed (or timed-out, or cancelled) turn's message again, as a new turn.

        It goes through the same commit path as any new message (`start`), so the new
        turn is queued, claimed and streamed like one; the failed turn stays as it was.
        A `request_id` makes the retry itself idempotent.

        Raises:
            TurnNotFoundError: no such turn.
            InvalidInputError: the turn has not ended, or it succeeded.
        """
        record = await self.turn(turn_id)
        if record.status not in ("failed", "timed_out", "cancelled"):
            raise InvalidInputError(
                f"turn {turn_id!r} is {record.status}: only a failed, timed-out or cancelled "
                "turn can be retried",
                status=record.status,
            )
        content: MessageContent = record.content
        if record.attachments:
            content = [TextPart(text=record.content), *record.attachments]
        pinned = Pinned.of(record)
        return await self.start(
            record.session_id,
            content,
            agent=pinned.agent,
            model=pinned.model,
            settings=pinned.settings,
            effort=pinned.effort,
            request_id=request_id,
            principal=pinned.caller,
            documents=pinned.documents,
        )

    async def cancel(self, turn_id: str) -> TurnStatus:
        """Press Stop: end the turn `cancelled` from wherever it is driven.

        A turn driven in this process is cancelled at once (its model call aborted,
        `user-aborted` audited); a paused or queued turn is ended in the Store; a turn
        driven by another process is flagged and stops at that driver's next renewal.
        Returns the turn's status after the call.
        """
        if self._recovery is not None:  # a turn this process took over: stop it at once
            await self._recovery[2].stop(TurnId(turn_id))
        return await self.host.cancel(TurnId(turn_id))

    async def resume(
        self, turn_id: str, request_id: str, resolution: Resolution, *, deps: Any = NO_DEPS
    ) -> Submission:
        """Answer a paused turn's request and continue the *same* turn.

        `Approve()` lets the tool call run; `Deny(note=...)` turns it into a failed result
        the model reads; `Answer(text=...)` answers an `ask_user` question. The turn goes
        on from its checkpoint (nothing before the pause runs or is billed again), in this
        process when `RuntimeConfig.run_in_process`, else in a worker. Follow it with
        `reader().follow(turn_id, after_seq=...)` or the HTTP resume stream. The turn runs
        with the agent it was pinned to; `deps` (else the runtime's factory) are its tools'
        dependencies.

        Raises:
            PauseNotFoundError: the turn has no such request.
            PauseAnsweredError: the request was answered (or the turn ended) already.
            InvalidInputError: an approval answered with text, or a question with a decision.
        """
        record = await self.turn(turn_id)
        if record.status == "awaiting_budget":
            raise InvalidInputError(
                f"turn {turn_id!r} waits on a budget: it resumes by itself once a limit is "
                "raised (set_budget_limit) or its period rolls over; cancel() ends it",
                turn_id=turn_id,
            )
        expected = {"awaiting_approval": ("approve", "deny"), "awaiting_input": ("answer",)}
        allowed = expected.get(record.status)
        if allowed is not None and resolution.kind not in allowed:
            raise InvalidInputError(
                f"turn {turn_id!r} is {record.status}: answer it with {' or '.join(allowed)}, "
                f"not {resolution.kind}",
                kind=resolution.kind,
            )
        await self.store.answer_pause(record.turn_id, request_id, resolution.model_dump())
        if self.config.run_in_process:
            self.host.detach(record.turn_id, deps=deps)
        return Submission(
            session_id=record.session_id,
            turn_id=record.turn_id,
            input_seq=record.input_seq,
            delivery="queue",
            requested_delivery="queue",
            is_new=False,
        )

    def reader(self, *, keepalive_s: float = 10.0) -> TurnReader:
        """A reader for one connection: replay from a cursor, then follow live."""
        return TurnReader(
            store=self.store,
            buffer=self.replay,
            clock=self.clock,
            idle_window_s=self.config.idle_window_s,
            keepalive_s=keepalive_s,
        )

    def runner(self) -> TurnRunner:
        """What turns a claimed lease into a driver (used by `Worker`)."""
        if self._graph is None:
            raise ConfigurationError(
                "the runtime is not open: use `async with SessionRuntime(...)`"
            )
        return TurnRunner(
            agents=self.agents,
            store=self.store,
            graph=self._graph,
            config=self.config,
            clock=self.clock,
            family=self._families,
            deps=self.deps,
            skills=self.skill_source,
            plugins=self.plugins,
            held=self._held,
            aftermath=self._aftermath,
        )
