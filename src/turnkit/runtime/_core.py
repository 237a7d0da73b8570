"""What a `SessionRuntime` holds and how it opens and closes: its agents, Store, graph, host."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Self, cast

from turnkit.agent import Agent
from turnkit.clock import Clock, SystemClock
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    AgentNotFoundError,
    ConfigurationError,
    InvalidInputError,
    RuntimeClosedError,
    StoreUnavailableError,
)
from turnkit.graph import (
    TurnGraph,
    compile_turn_graph,
    forget_threads,
    open_checkpointer,
    thread_ids,
)
from turnkit.ids import TURN_ID_PREFIX, TurnId, uuid7
from turnkit.models import ModelClient
from turnkit.models.litellm import ModelEndpoint
from turnkit.plugins import Plugin, PluginValidationError, discover_plugins, validate_plugins
from turnkit.replay import ReplayBuffer
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime._aftermath import Aftermath
from turnkit.runtime._families import ModelFamilies
from turnkit.runtime._held import HeldTranscripts
from turnkit.runtime._host import TurnHost
from turnkit.runtime._opening import open_store
from turnkit.runtime._runner import Driving, TurnRunner
from turnkit.runtime.admission import Admission, AdmissionCheck, DocumentResolver
from turnkit.runtime.agents import AgentCatalog, ToolAccess
from turnkit.runtime.deps import DepsFactory
from turnkit.runtime.driver import StopAsked
from turnkit.runtime.reader import TurnReader
from turnkit.skills import SkillSource
from turnkit.store import Store
from turnkit.store._engine import closing_within, normalize_url
from turnkit.tenancy import Organisation, Tenancy
from turnkit.tools import Tool
from turnkit.tools._context import AskAgent

if TYPE_CHECKING:
    from turnkit.runtime import SessionRuntime
    from turnkit.runtime.worker import Worker

__all__ = ("RuntimeCore",)

log = logging.getLogger("turnkit.runtime")


class RuntimeCore:
    """The parts of a `SessionRuntime` and their lifecycle: opening and closing them.

    Its arguments are documented on `SessionRuntime`.
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
        if agent is not None and not isinstance(agent, Agent):
            raise ConfigurationError(f"`agent` is a turnkit.Agent, not {type(agent).__name__}")
        if config is not None and not isinstance(config, RuntimeConfig):
            raise ConfigurationError(
                f"`config` is a turnkit.RuntimeConfig, not {type(config).__name__}"
            )
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
        if isinstance(plugins, str | Plugin):  # one plugin, or one name: not a list
            raise PluginValidationError(f"`plugins` is a list, such as [{plugins!r}]")
        self.plugins = validate_plugins(
            [p for p in plugins if not isinstance(p, str)]
            + list(discover_plugins([p for p in plugins if isinstance(p, str)]))
        )
        """Plugins run in every turn, after the agent's own."""
        for hosted in self.agents.hosted():
            self._check_plugins(hosted)
        self.skill_source = skills
        """The app's skill catalogue (the builtin skills are always there too)."""
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self._store = store
        self._owns_store = store is None
        self.replay: ReplayBuffer = replay or InMemoryReplayBuffer()
        """Where detached and worker-driven turns publish for live readers."""
        self._graph: TurnGraph | None = None
        self._driving: Driving = weakref.WeakValueDictionary()
        """This process's turn drivers by turn, for the runners to share."""
        # sessions' transcripts, kept across their turns
        self._held = HeldTranscripts(max_bytes=self.config.held_transcript_bytes)
        self._aftermath = Aftermath()  # work turns left running after their ending
        self._opening: asyncio.Event | None = None
        self._closed = False
        """Closed by `close` (and not opened again): its methods refuse to open it."""
        self._close_checkpointer: Callable[[], Awaitable[None]] | None = None
        self._recovery: tuple[asyncio.Event, asyncio.Task[None], Worker] | None = None
        self._stopping: dict[TurnId, int] = {}
        """Turns a Stop here is ending (by how many Stops at once)."""
        self._told_here: set[TurnId] = set()
        """Turns of `_stopping` whose driver here wrote the ending and stopped what it
        asked: the Stop leaves that to it."""
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
        for served in self.tenancy.organisations:
            if served.background_model is not None:  # unresolvable: fails here, not after a turn
                self._families(served.background_model)
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
        self._check_plugins(agent)
        self.agents.add(agent)  # hosted from now on; turns pinned to the old one still find it
        self._agent = agent

    def _check_plugins(self, agent: Agent) -> None:
        """Refuse, as it is hosted, an agent that has a plugin the runtime has too.

        Raises:
            PluginValidationError: a plugin of the agent has the name of a runtime's plugin
                (its turns would fail: each plugin runs once, by its unique name).
        """
        mine = {type(p).name for p in agent.plugins}
        both = sorted(mine & {type(p).name for p in self.plugins})
        if both:
            raise PluginValidationError(
                f"the plugin {both[0]!r} is registered on the agent {agent.name!r} and on the "
                "runtime: register it once (on the agent for its turns, on the runtime for all)"
            )

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the Store and checkpointer and compile the graph (idempotent).

        A runtime never opened opens on first use; one closed opens again only here (or
        with `async with`): its other methods then raise `RuntimeClosedError`.
        """
        self._closed = False
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
        try:  # first: a buffer that refuses its setup stops the opening before anything opens
            await self.replay.ping()
        except ConfigurationError:  # it answered, and would refuse every turn alike
            raise
        except Exception as exc:  # noqa: BLE001 - the buffer is a fast path, never required
            logging.getLogger("turnkit.replay").warning(  # beside the buffer's other lines
                "the replay buffer cannot be reached (%s): turns still run and readers "
                "follow the Store until it answers",
                exc,
            )
        if self._store is None:
            self._store = await open_store(self.config, self.clock)
        saver, self._close_checkpointer = await open_checkpointer(
            self.config.database_url, schema=self.config.database_schema
        )
        self._graph = compile_turn_graph(saver)
        keep = self.config.keep_ended_checkpoints
        self._aftermath.prune_with(None if keep else self.forget_checkpoints)

    async def ensure_open(self) -> None:
        """Open the runtime on first use (once, however many callers ask at a time).

        What its own methods do before they work, and turnkit's routes before they answer:
        a runtime nobody opened opens here; one already open returns at once.

        Raises:
            RuntimeClosedError: it was closed (it opens again only with `open()`).
        """
        if self._closed:
            raise _closed()
        await self.open()

    def _start_recovery(self) -> None:
        """Run a worker loop beside the app: turns whose driver died are taken over."""
        from turnkit.runtime.worker import Worker

        stop = asyncio.Event()
        worker = Worker(
            cast("SessionRuntime", self),  # the only runtime built on this core
            concurrency=self.config.recovery_concurrency,
            owner=f"{self.owner}/recovery",
            drain_timeout_s=0.0,  # closing hands its turns over, as the app's own turns are
        )
        # In a context of its own: opened by a request's first use, the loop would otherwise
        # carry that request's context (its trace span, as every recovered turn's cause).
        task = asyncio.create_task(
            worker.run(stop), name="turnkit-recovery", context=contextvars.Context()
        )
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

        Turns still running here are abandoned, not cancelled, detached ones and those
        streamed to a caller alike: each commits what it had staged, their leases are
        handed over, and a worker (or a runtime recovering turns) takes them over at once;
        when the database cannot be told within 2 s (`HAND_OVER_WITHIN_S`, logged), once
        their leases lapse. On SQLite, reads and writes still waiting for a lock another
        process holds then get 2 s more (`CLOSE_LOCK_WAIT_S`), the checkpoints' and the
        Store's together. A caller's
        `execute_message` stream of such a turn raises `RuntimeClosedError` (with the
        turn's `turn_id` and the `last_seq` it yielded). A naming call still
        running after its turn is cancelled (the session keeps its first name). Its
        methods then raise `RuntimeClosedError` until it is opened again.

        Close it (in the app's lifespan) even when it opened on first use. A runtime never
        closed goes down with its process: when the event loop cancels the tasks of the
        turns it drives (`asyncio.run` returning or interrupted), each is handed over as
        here, not cancelled; when the process dies first, their leases lapse.
        """
        if self._recovery is not None:
            stop, task, _ = self._recovery
            self._recovery = None
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
        # Closed for good only if it was open (after its own recovery loop, which may still
        # be sweeping): a runtime never opened, or closed twice, stays as it was.
        self._closed = self._closed or self._graph is not None
        await self.host.close()
        await self._aftermath.close()
        with closing_within():  # one wait for SQLite's lock, for both closes
            if self._close_checkpointer is not None:
                close_checkpointer, self._close_checkpointer = self._close_checkpointer, None
                try:
                    await close_checkpointer()
                except StoreUnavailableError as exc:
                    # A full disk, a read-only server: the checkpoints it held are not
                    # stored; turns still running resume from their earlier ones.
                    log.warning("closing: held checkpoints not stored: %s", exc.message)
            if self._owns_store and self._store is not None:
                await self._store.close()
                self._store = None
        self._graph = None

    @property
    def store_beside_checkpoints(self) -> bool:
        """Whether the Store is in the database its checkpoints are in (`database_url`).

        So when the runtime opened it; a Store the app gave (`SessionRuntime(store=...)`)
        only when it names the same database and schema.
        """
        if self._owns_store:
            return True
        url, schema = getattr(self._store, "url", None), getattr(self._store, "schema", None)
        config = self.config
        return url == normalize_url(config.database_url) and schema == config.database_schema

    @property
    def closed(self) -> bool:
        """Whether it was closed and not opened again (its methods raise `RuntimeClosedError`)."""
        return self._closed

    @property
    def store(self) -> Store:
        """The Store turns are written to."""
        if self._store is None:
            raise _closed() if self._closed else _not_open()
        return self._store

    async def _message_agent(self, agent: str | Agent | None) -> Agent:
        """The agent a message names: hosted by name, or an object (hosted from now on)."""
        if agent is None:
            return self.agent
        if isinstance(agent, str):
            if self.agents.asked_only(agent):  # run only by the tool that asks it
                raise AgentNotFoundError(f"no agent named {agent!r} on this host", agent=agent)
            found = await self.agents.get(agent)
            self._check_plugins(found)  # added with `agents.add`, or by the loader, since
            return found
        if not isinstance(agent, Agent):
            raise InvalidInputError(
                f"agent must be a name or a turnkit.Agent, not {type(agent).__name__}"
            )
        self._check_plugins(agent)
        self.agents.add(agent, asked=self.agents.asked_only(agent.name))
        self._families(agent.model)
        return agent

    def reader(self, *, keepalive_s: float = 10.0) -> TurnReader:
        """A reader for one connection: replay from a cursor, then follow live."""
        return TurnReader(
            store=self.store,
            buffer=self.replay,
            clock=self.clock,
            idle_window_s=self.config.idle_window_s,
            keepalive_s=keepalive_s,
            on_timed_out=self.forget_ended,
        )

    def _heard_guide(self, turn_id: TurnId, input_seq: int) -> None:
        """A guide message joined `turn_id`: tell its driver, if it runs in this process.

        Its next model request presents it without waiting for a commit to report it (a
        commit that travels beside the model call, as with `async` checkpoints on
        PostgreSQL, reports it only after the request was built).
        """
        driver = self._driving.get(turn_id)
        if driver is not None:
            driver.heard_guide(input_seq)

    def _gave_up(self, turn_id: str) -> bool:
        """Whether this process's driver of `turn_id` gave it up (a shutdown, a lost lease).

        A turn cancelled then is not stopped: another process takes it over.
        """
        driver = self._driving.get(TurnId(turn_id))
        return driver is not None and (driver.lease_lost or driver.leaving)

    def forget_ended(self, turn_id: str) -> None:
        """Delete the checkpoints of a turn ended without its driver, with the next batch.

        A Stop, the sweep or a reader's timeout ended it; unless ended turns' checkpoints
        are kept, they go as a driver's do.
        """
        self._aftermath.ended(turn_id)

    async def forget_checkpoints(self, turn_ids: Sequence[str]) -> None:
        """Delete these turns' graph checkpoints (each turn is one checkpoint thread)."""
        if self._graph is None:
            raise _not_open()
        await forget_threads(self._graph, turn_ids)

    async def turn_threads(self, *, after: str, limit: int) -> list[str] | None:
        """Up to `limit` checkpoint threads named as turns, past `after`, in order.

        Their turns may be gone (see `forget_orphaned_checkpoints`); None when the
        checkpointer cannot list its threads (an app's own).
        """
        if self._graph is None:
            raise _not_open()
        return await thread_ids(self._graph, prefix=TURN_ID_PREFIX, after=after, limit=limit)

    def runner(self) -> TurnRunner:
        """What turns a claimed lease into a driver (used by `Worker`)."""
        if self._graph is None:
            raise _not_open()
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
            driving=self._driving,
            ask_agent=self._ask_agent(),
            stop_asked=self._stop_asked(),
            admission=self.admission,
            tool_access=self.tool_access,
        )

    def _ask_agent(self) -> AskAgent | None:
        """What runs an agent a tool call asks (`Agent.as_tool`): the runtime's own."""
        return None

    def _stop_asked(self) -> StopAsked | None:
        """What stops the asked agents' turns a turn that ended waited on: the runtime's."""
        return None


def _closed() -> RuntimeClosedError:
    return RuntimeClosedError(
        "the runtime is closed: open it again (`async with runtime:` or `await runtime.open()`)"
    )


def _not_open() -> ConfigurationError:
    return ConfigurationError("the runtime is not open: use `async with SessionRuntime(...)`")
