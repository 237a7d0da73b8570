"""`SessionRuntime`: the facade an app holds — execute a message, read history and audit."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

from turnkit.agent import Agent, Effort
from turnkit.blocks import TextPart
from turnkit.errors import InvalidInputError
from turnkit.events import StreamEvent
from turnkit.ids import TurnId, derive_id
from turnkit.models import ModelSettings
from turnkit.runtime._budget_api import RuntimeBudgets
from turnkit.runtime._callback_reports import RuntimeCallbacks
from turnkit.runtime._cancel import CancelToken
from turnkit.runtime._control import RuntimeControl
from turnkit.runtime._delegation import ask_agent, refuse_delegated
from turnkit.runtime._follow import follow_submission
from turnkit.runtime._history import TurnHistory
from turnkit.runtime._reads import caller_scope
from turnkit.runtime._retention import RetentionReport, RuntimeRetention
from turnkit.runtime._runner import Pinned
from turnkit.runtime._submit import new_input
from turnkit.runtime._validate import (
    MessageContent,
    TurnRequest,
    check_session_id,
    check_title,
    validate_request,
)
from turnkit.runtime.agents import allowed_tools
from turnkit.runtime.deps import NO_DEPS
from turnkit.skills import Skill, skills_for
from turnkit.store import Delivery, SessionRecord, Submission
from turnkit.tenancy import Principal
from turnkit.tools import delegated_session_id
from turnkit.tools._context import AskAgent

__all__ = (
    "CancelToken",
    "MessageContent",
    "RetentionReport",
    "SessionRuntime",
    "TurnHistory",
    "TurnRequest",
    "delegated_session_id",
)


class SessionRuntime(RuntimeControl, RuntimeCallbacks, RuntimeBudgets, RuntimeRetention):
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
            (a `Principal`, or None for an anonymous caller) returning the skills that
            caller may see. Merged with the builtin skills; a
            message starting with `/slug` picks one.
        plugins: Plugins for every agent's turns (run after each agent's own): `Plugin`
            objects, or names of installed plugins (the `turnkit.plugins` entry-point
            group), loaded only when named.
        config: Runtime settings; store, replay, clock: the parts to use (defaults:
            from `config`).
        tenancy: The organisations served (their departments, default agents and
            background models).
        admission: Your own checks, run after the built-in ones on every message.
        documents: Says whether each document a message attaches (by id) is indexed, still
            being read, or missing; without it, a message cannot attach documents.

    Beside running turns (`execute_message`, `start`, `submit`, `retry`) it reads them
    back (`history`, `view`, `events`, `audit`), stops and resumes them (`cancel`,
    `resume`), keeps budget limits (`set_budget_limit`, `budget_uses`), takes
    callbacks from other processes (`report_job_progress`) and deletes sessions
    (`delete_session`, and those idle for a while: `delete_idle_sessions`).
    """

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
        anonymous: bool = False,
    ) -> Submission:
        """Commit a user message and queue its turn (one transaction), without running it.

        The turn is pinned to its agent (by name and version), the message's overrides
        (`model`, `settings`, `effort`), the caller's tools and the `principal`: every
        driver rebuilds exactly that. An `Agent` object that is not hosted yet is hosted
        from now on (in this process); name one with `agents=` to drive it elsewhere.

        With `claim=True` the new turn is also claimed for this runtime in the same
        transaction (when its session lets it run now): `Submission.lease` is then set.

        A worker, or a runtime with `recover_in_process`, runs the turn (`execute_message`
        and `start` submit and run in one call; given this turn's `request_id`, they follow
        it, and it waits for one of those). A `request_id` already used in the session
        returns the first submission and writes nothing.

        Before anything is written the message passes the admission chain (department,
        agent visibility, model, budget policy, attached `documents`, and the app's own
        checks); the first that fails raises and nothing is saved. `principal` is a
        `Principal` (organisation, department, roles) or a bare id. With no principal the
        message may go into any session (it is the app's own), unless `anonymous`: then it
        comes from a caller nobody signed in (the HTTP routes set it when `auth` names
        nobody) and goes only into a session nobody owns, checked where it is written.

        Raises:
            InvalidInputError: bad session id, empty or oversized content, bad delivery.
            AgentNotFoundError: no hosted agent has that name, or the caller may not see it.
            UnknownModelError: the agent's (or the override's) model does not resolve.
            AdmissionRefusedError: a check refused the message (a subclass names which).
        """
        return await self._submit(
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
            claim=claim,
            anonymous=anonymous,
        )

    async def _submit(
        self,
        session_id: str,
        content: MessageContent,
        *,
        agent: str | Agent | None,
        model: str | None = None,
        settings: ModelSettings | None = None,
        request_id: str | None,
        delivery: Delivery = "queue",
        effort: Effort | None = None,
        principal: Principal | str | None,
        documents: Sequence[str] = (),
        claim: bool,
        anonymous: bool = False,
        asked_by: TurnId | None = None,
    ) -> Submission:
        """`submit`, also for the message an agent tool sends the agent it asks.

        That is the one message a session kept for agents asked as tools (`tk-sub.`) takes;
        `asked_by` is the turn whose agent asks, kept on the new turn (see `NewInput`).
        """
        request = validate_request(self.config, session_id, content, request_id, effort)
        if asked_by is None:
            refuse_delegated(request.session_id)
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
        await self.ensure_open()
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
        submission = await self.store.submit(
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
                anonymous=anonymous and caller is None,
                asked_by=asked_by,
            )
        )
        if submission.guided:
            self._heard_guide(submission.turn_id, submission.input_seq)
        return submission

    async def skills(self, principal: Principal | str | None = None) -> tuple[Skill, ...]:
        """The skills `principal` may pick with `/slug`: yours they may see, then builtin.

        A bare id is a principal of the default organisation.
        """
        return await skills_for(self.skill_source, Principal.of(principal))

    async def create_session(
        self,
        session_id: str,
        *,
        principal: Principal | str | None = None,
        title: str | None = None,
    ) -> SessionRecord:
        """Create a session owned by `principal` (a no-op if it exists); returns it.

        The record's `is_new` is True only when this call created it (of calls racing for
        one id, exactly one).

        A bare id is a principal of the default organisation; None: nobody owns it. Ids
        beginning `tk-sub.` are kept for agents asked as tools (`InvalidInputError`).
        A `title` is checked as a rename's is: 1-500 characters, not only white space
        (`InvalidInputError`, nothing written); a session created with one is never
        named over.
        """
        sid = check_session_id(session_id)
        refuse_delegated(sid)
        if title is not None:
            check_title(title)
        owner = Principal.of(principal)
        await self.ensure_open()
        return await self.store.create_session(
            sid,
            principal=owner.id if owner is not None else None,
            organisation=owner.organisation if owner is not None else None,
            title=title,
        )

    async def delete_session(
        self,
        session_id: str,
        *,
        principal: Principal | str | None = None,
        anonymous: bool = False,
    ) -> bool:
        """Delete a session: its inputs, turns, events, files and its turns' checkpoints.

        The sessions agents asked as tools answered in for it go with it, the same way.

        Audit and usage rows stay (its spend still counts against budgets). Returns False
        if there was no such session. A running turn is not stopped first: see
        `Store.delete_session`.

        `principal` deletes only a session it may see (`anonymous=True`: a caller nobody
        signed in, only one nobody owns), checked in the transaction that deletes it;
        another's answers False, as a missing one does, and nothing is deleted. With
        neither, any session (the app's own delete). The HTTP route passes its caller.

        Raises:
            InvalidInputError: a session an agent asked as a tool answered in, while the
                session that asked it is there: it goes with that one (whose `session`
                budget counts what it spent).
        """
        sid = check_session_id(session_id)
        caller = caller_scope(principal, anonymous)
        await self.ensure_open()
        turns = await self.store.list_turns(sid)
        for asked in await self.store.delegated_sessions(sid):  # deleted with it
            turns += await self.store.list_turns(asked)
        # Read after its turns: a session another caller made anew under this id before
        # this read is refused here, so its turns' checkpoints are not forgotten.
        record = await self.store.get_session(sid)
        if caller is not None and (record is None or not record.visible_to(*caller)):
            return False
        parent = record.parent_session if record is not None else None
        if parent is not None and await self.store.get_session(parent) is not None:
            raise InvalidInputError(
                f"session {session_id!r} is where an agent asked as a tool answered: it is "
                f"deleted with the session that asked it ({parent!r})",
                session_id=session_id,
            )
        # The checkpoints first: if deleting them fails, the session is still there, and
        # deleting it again finishes the job (its rows gone, nothing would name them).
        await self.forget_checkpoints([t.turn_id for t in turns])
        if caller is None:  # the app's own call: a Store written before `visible_to` works
            return await self.store.delete_session(sid)
        return await self.store.delete_session(sid, visible_to=caller)

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
    ) -> AsyncGenerator[StreamEvent, None]:
        """Run one turn in this process and stream its events.

        `content` is text, or parts: `TextPart`s and `ImagePart`s (pictures by URL or
        bytes with a media type, at most 20), sent to the model in its multimodal form.
        Every durable event is committed to the Store before it is yielded. Closing the
        generator (or `cancel.cancel()`) aborts the turn: the model call is cancelled, the
        abort is audited as `user-aborted`, and the turn ends `cancelled`. A `request_id`
        already used in the session replays that turn's committed events instead of
        running it again, and follows it to its end (or pause) while it still runs. A turn
        waits for the session's earlier turns to finish.

        `agent` names a hosted agent (or is one), `model`, `settings` and `effort`
        override the agent's for this message; `principal` is who sends it and `deps` the
        app's dependencies its tools see (`ToolContext`). The turn is pinned to all of
        it, so a resume, a worker or crash recovery runs the same agent (rebuilding `deps`
        with the runtime's factory).

        Raises:
            InvalidInputError: bad session id, empty or oversized content (nothing written).
            UnknownModelError: the agent's model string does not resolve.
            AdmissionRefusedError: a turn-start check refused it (nothing written).
            RuntimeClosedError: the runtime was closed while the turn ran; the turn was
                handed over, not stopped (its `turn_id` and the `last_seq` yielded).
        """
        submission, slot = await self.host.slots.submit_claiming(
            functools.partial(
                self.submit,
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
        )
        if submission.is_new and deps is not NO_DEPS:  # whoever here drives it uses them
            self.host.keep_deps(submission.turn_id, deps)
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
                    yield cast("StreamEvent", event)  # each is one of the union's events
        finally:  # the stream releases it too; this covers a caller gone before it began
            if slot is not None:
                slot.release()

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
        anonymous: bool = False,
    ) -> Submission:
        """Commit a message and run its turn detached from the caller.

        The turn runs in a task of this runtime (when `RuntimeConfig.run_in_process`, which
        also claims it in the message's transaction: `Submission.lease`) or in a
        `turnkit worker`, and publishes to `self.replay`; read it with `reader()`.
        Closing a reader does not stop it; `cancel(turn_id)` does. The arguments are
        those of `execute_message`, and `hold_until`: a turn driven here takes its first
        step once this event is set (or a second has passed). A caller that streams the
        turn sets it once `turn.started` is written, so that event goes out before the
        turn's first steps take the event loop (the execute route does). `anonymous`: see
        `submit`.
        """
        submission, slot = await self.host.slots.submit_claiming(
            functools.partial(
                self.submit,
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
                anonymous=anonymous,
            ),
            claim=self.config.run_in_process,
        )
        if submission.is_new and deps is not NO_DEPS:  # whoever here drives it uses them
            self.host.keep_deps(submission.turn_id, deps)
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

    def _ask_agent(self) -> AskAgent:
        return functools.partial(ask_agent, self)

    async def retry(
        self,
        turn_id: str,
        *,
        request_id: str | None = None,
        principal: Principal | str | None = None,
        anonymous: bool = False,
    ) -> Submission:
        """Send a failed (or timed-out, or cancelled) turn's message again, as a new turn.

        It goes through the same commit path as any new message (`start`), so the new
        turn is queued, claimed and streamed like one; the failed turn stays as it was.
        A `request_id` makes the retry itself idempotent (it names this retry of this
        turn: the original message's own `request_id` is a new key here, not a replay).
        `principal` is who retries, admitted as they are now, as for a new message
        (`anonymous=True`: a caller nobody signed in); the HTTP route passes its caller.
        With neither, the new turn is sent as the first one was (the app's own retry).

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
            request_id=derive_id("retry", turn_id, request_id) if request_id else None,
            principal=principal if principal is not None or anonymous else pinned.caller,
            documents=pinned.documents,
            anonymous=anonymous and principal is None,
        )
