"""Agents asked as tools (`Agent.as_tool`): each call is a turn in a session of its own.

The session's id is derived from the call's idempotency key, and its one message has a
fixed request id, so asking again for the same call (after a crash of the asking turn,
from its reconcile hook, or once a person answered what it waited for) joins the turn
the first ask started instead of running the agent twice. The turn runs in the asking
turn's slot: a bound on running turns never makes a parent wait for its own child. A Stop
of the asking turn stops the asked one; a shutdown leaves both to whoever recovers them.
When the asked turn waits for a person, the ask raises `AskedAgentWaits`: the asking turn
pauses with the same request, and the answer given there goes on to the asked turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final, cast

from pydantic import JsonValue

from turnkit.agent import Agent
from turnkit.audit import AskedTurnPayload, UsageDelta, asked_usage
from turnkit.clock import Clock
from turnkit.errors import AskingTurnEndedError, InvalidInputError
from turnkit.events import (
    ApprovalRequestedEvent,
    AskedUsage,
    BudgetPausedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    ErrorEvent,
    JobProgressEvent,
    MessageCompleteEvent,
    RunFinishedEvent,
    ToolStartedEvent,
)
from turnkit.ids import SessionId, TurnId
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.driver import hand_over_all
from turnkit.stages._titles import opening_title
from turnkit.states import TERMINAL_STATES, TerminalStatus
from turnkit.store import Lease, RunSummary
from turnkit.tools import (
    DELEGATED_SESSION_PREFIX,
    AgentToolError,
    AskedAgentWaits,
    ToolContext,
    delegated_session_id,
)

if TYPE_CHECKING:
    from turnkit.runtime import SessionRuntime

__all__ = ("ask_agent", "refuse_delegated")

log = logging.getLogger("turnkit.runtime")

_REQUEST_ID: Final = "delegated"
"""The request id of the one message of a delegated session: asking again joins it."""

_GIVE_UP_S: Final = 1.0
"""How long a call given up (a shutdown, a lost lease) waits for its cancelled count."""

_PULSE_S: Final = 5.0
"""How often, at most, the asking call reports that the agent still works (which keeps
the asking turn from its idle window; a third of that window when it is shorter)."""


def refuse_delegated(session_id: str) -> None:
    """Refuse a session id kept for agents asked as tools (`tk-sub.`) to anyone else.

    Such a session takes only its asking call's one message: another message (or a
    session opened first under its id) would stand in for the asked agent's answer.

    Raises:
        InvalidInputError: `session_id` begins with `tk-sub.`.
    """
    if session_id.startswith(DELEGATED_SESSION_PREFIX):
        raise InvalidInputError(
            f"session ids beginning {DELEGATED_SESSION_PREFIX!r} are kept for agents asked "
            "as tools: they take no other message (read them; send to the asking session)",
            session_id=session_id,
        )


async def ask_agent(
    runtime: SessionRuntime, agent: object, message: str, ctx: ToolContext
) -> JsonValue:
    """Run `agent` on `message` for the tool call `ctx` and return its answer.

    Raises:
        AgentToolError: the agent's turn failed, timed out, was stopped, or stopped to
            wait for a budget (that turn is then cancelled); or the asking turn ended,
            or was stopped from another process, before the agent was asked (nothing was
            submitted).
        AskedAgentWaits: the agent's turn waits for a person's approval or answer.
    """
    if not isinstance(agent, Agent):
        raise AgentToolError(f"an agent tool asks a turnkit.Agent, not {type(agent).__name__}")
    session_id = await _asked_session(runtime, agent, message, ctx)
    try:
        submission = await runtime._submit(
            session_id,
            message,
            agent=agent,
            request_id=_REQUEST_ID,
            principal=ctx.caller if ctx.caller is not None else ctx.principal,
            claim=True,
            asked_by=ctx.turn_id,  # an ending of the asking turn but its success stops it
        )
    except AskingTurnEndedError as exc:  # ended elsewhere, or a Stop this driver missed
        why = "was stopped" if exc.details.get("stop_pending") else "has ended"
        raise AgentToolError(
            f"the agent {agent.name!r} was not asked: the asking turn {ctx.turn_id} {why}"
        ) from exc
    turn_id = submission.turn_id
    taking_over: asyncio.Task[None] | None = None
    if submission.is_new:  # driven here, detached: a shutdown leaves it to recovery too
        _drive_here(runtime, turn_id, submission.lease, agent, ctx)
    else:  # asked again (the asking turn was taken over): only the turn this call began
        await _check_joined(runtime, agent, session_id, turn_id)
        # ... driven here once its driver is gone: left to a recovery loop or a worker,
        # it could wait for the very place the asking turn holds.
        taking_over = asyncio.create_task(_take_over(runtime, turn_id, agent, ctx))
    pulse_s = min(_PULSE_S, runtime.config.idle_window_s / 3)
    answer = _Answer(agent, turn_id, session_id, pulse_s, runtime.clock)
    try:  # from here on a Stop (or timeout_s) stops the asked turn too
        await ctx.report_progress(None, f"asked {agent.name} (session {session_id})")
        async for event in runtime.follow(turn_id):
            await answer.take(event, ctx)
    except asyncio.CancelledError:
        if not runtime._gave_up(ctx.turn_id):  # a Stop: the asked agent stops too
            await _through_a_stop(runtime, ctx, _stop_and_count(runtime, answer, ctx))
        raise  # a shutdown or a lost lease: whoever takes the asking turn over joins it
    finally:
        if taking_over is not None:
            taking_over.cancel()
            await asyncio.gather(taking_over, return_exceptions=True)
    if isinstance(answer.last, ApprovalRequestedEvent | ClarificationRequestedEvent):
        raise AskedAgentWaits(agent.name, answer.last)  # the asking turn waits with it
    if isinstance(answer.last, BudgetPausedEvent):
        await runtime._stop(turn_id, None)
        await _followed_to_its_end(runtime, answer, ctx)
    await _counted(runtime, answer, ctx)
    return answer.result()


async def _through_a_stop(
    runtime: SessionRuntime, ctx: ToolContext, work: Coroutine[Any, Any, None]
) -> None:
    """Run `work` to its end, though the asking call is cancelled again meanwhile.

    A Stop of the asking turn that comes while `timeout_s` stops the asked one (or the
    asking turn's deadline while a Stop does) must not cut the count short: the asking
    turn's ending would be written without it, and nothing counts it later. A shutdown
    or a lost lease does not wait: whoever takes the asking turn over joins the asked one,
    and `work` is cancelled (it would go on reading a Store that closes).
    """
    task = asyncio.ensure_future(work)
    while True:
        try:
            await asyncio.shield(task)
            return
        except asyncio.CancelledError:
            if task.done():
                raise
            if runtime._gave_up(ctx.turn_id):
                task.cancel()
                await asyncio.wait((task,), timeout=_GIVE_UP_S)
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: accounting failing as it leaves is moot
                raise


async def _stop_and_count(runtime: SessionRuntime, answer: _Answer, ctx: ToolContext) -> None:
    """Stop the asked turn (a Stop, or `timeout_s`), then count what it spent once it ended.

    A driver here ends it before `_stop` returns; a driver in another process is flagged,
    and ends it once it hears the Stop (PostgreSQL: at once) or at its next renewal:
    its ending is waited for, half a lease's ttl at most (`_followed_to_its_end`).
    """
    await runtime._stop(answer.turn_id, None)
    await _followed_to_its_end(runtime, answer, ctx)
    await _counted(runtime, answer, ctx)


async def _followed_to_its_end(runtime: SessionRuntime, answer: _Answer, ctx: ToolContext) -> None:
    """Follow the asked turn from where the call left it to its `done`: ttl/2 seconds at most.

    Its `run.finished` is then what `_count_spent` counts. A turn whose driver does not end
    it within half a lease's ttl (a process stalled, or gone: the sweep ends its turn
    later) is not waited for longer, and not counted. Half: a live driver elsewhere hears
    the Stop at its next renewal, within a third; and the asking turn's own lease must
    outlast the wait, though its keeper renews it no more once it learned of a Stop
    pressed elsewhere (renewed then, or less than a third ago, it has two thirds left at
    least): its driver, not a process that takes the turn over, writes its ending.
    """
    if answer.done is not None:
        return
    within_s = runtime.config.lease_ttl_s / 2
    try:
        async with asyncio.timeout(within_s):
            async for event in runtime.follow(answer.turn_id, after_seq=answer.seq):
                answer.keep(event)
    except TimeoutError:
        log.warning(
            "the asked turn %s did not end within %g s of its Stop: the asking turn %s does "
            "not count what it spent",
            answer.turn_id,
            within_s,
            ctx.turn_id,
        )
    except Exception as exc:  # noqa: BLE001 - accounting never fails the call (`_counted`)
        log.warning("following the asked turn %s to its end failed: %r", answer.turn_id, exc)


async def _counted(runtime: SessionRuntime, answer: _Answer, ctx: ToolContext) -> None:
    """`_count_spent`, never failing the call: its answer (or failure) stands either way.

    A database blip here must not turn an answer already paid for into a failed call the
    model would ask again.
    """
    try:
        await _count_spent(runtime, answer, ctx)
    except Exception as exc:  # noqa: BLE001 - accounting never fails the call
        log.warning("reading what the asked turn %s spent failed: %r", answer.turn_id, exc)


async def _count_spent(runtime: SessionRuntime, answer: _Answer, ctx: ToolContext) -> None:
    """Hand the asking call what the asked turn spent, once that turn has ended.

    Its account as its ending wrote it (`run.finished`: its own totals and what the agents
    it asked spent), so a call that joins it again after a crash reads the same numbers:
    as the call followed it (no read), else as its record's summary holds it; a turn
    ended with no account (timed out by the sweep) is read from its usage rollup and its
    own `askedTurn` audit rows. One still running is not counted here.
    """
    status: str
    own: UsageDelta
    nested: AskedUsage | None
    account: RunFinishedEvent | RunSummary | None = answer.finished
    if answer.done is not None and account is not None:  # followed to its end: no read
        status = answer.done.status
    else:
        record = await runtime.store.get_turn(answer.turn_id)
        if record is None or record.status not in TERMINAL_STATES:
            return
        status, account = record.status, record.summary
    if account is not None:
        own = UsageDelta(
            model_calls=account.model_calls,
            input_tokens=account.input_tokens,
            output_tokens=account.output_tokens,
            cached_tokens=account.cached_tokens,
            cost_usd=account.cost_usd,
        )
        nested = account.asked
    else:
        own = await runtime.store.read_usage(answer.turn_id)
        rows = await runtime.store.read_audit(answer.turn_id)
        nested = asked_usage(row.payloads.asked_turn for row in rows)
    ctx._asked_spent(
        AskedTurnPayload(
            tool_call_id=ctx.tool_call_id,
            agent=answer.agent.name,
            session_id=answer.session_id,
            turn_id=answer.turn_id,
            status=cast(TerminalStatus, status),  # ended: one of TERMINAL_STATES
            turns=1 + (nested.turns if nested is not None else 0),
            model_calls=own.model_calls + (nested.model_calls if nested else 0),
            input_tokens=own.input_tokens + (nested.input_tokens if nested else 0),
            output_tokens=own.output_tokens + (nested.output_tokens if nested else 0),
            cached_tokens=own.cached_tokens + (nested.cached_tokens if nested else 0),
            cost_usd=own.cost_usd + (nested.cost_usd if nested else 0.0),
        )
    )


async def _asked_session(
    runtime: SessionRuntime, agent: Agent, message: str, ctx: ToolContext
) -> SessionId:
    """The call's session, created (once) with the asking session's owner."""
    session_id = delegated_session_id(ctx.idempotency_key, agent.name)
    asking = await runtime.store.get_session(ctx.session_id)
    made = await runtime.store.create_session(
        session_id,
        principal=asking.principal if asking is not None else None,
        organisation=asking.organisation if asking is not None else None,
        title=f"{agent.name}: {opening_title(message)}",
        parent=ctx.session_id,
    )
    if made.parent_session != ctx.session_id:  # a caller opened it first (its id is public)
        raise AgentToolError(
            f"the session {session_id} the agent {agent.name!r} answers this call in was "
            "not opened by this call: it is not asked"
        )
    return session_id


async def _check_joined(
    runtime: SessionRuntime, agent: Agent, session_id: SessionId, turn_id: TurnId
) -> None:
    """The turn a repeated ask joined is the asked agent's own, its session's first."""
    record = await runtime.store.get_turn(turn_id)
    if record is None or record.agent != agent.name or record.input_seq != 1:
        raise AgentToolError(
            f"the turn {turn_id} in session {session_id} is not the one the agent "
            f"{agent.name!r} answers this call in: it is not asked"
        )


def _drive_here(
    runtime: SessionRuntime, turn_id: TurnId, lease: Lease | None, agent: Agent, ctx: ToolContext
) -> None:
    runtime.host.detach(
        turn_id,
        lease=lease,
        # Counted, never refused: the asking turn waits for this one, in its own slot.
        slot=runtime.host.slots.hold() if lease is not None else None,
        agent=agent,
        deps=NO_DEPS if ctx.deps is None else ctx.deps,
    )


async def _take_over(
    runtime: SessionRuntime, turn_id: TurnId, agent: Agent, ctx: ToolContext
) -> None:
    """Claim the asked turn as soon as no live driver holds it, and drive it here.

    A claim succeeds only on a lease handed over or lapsed, so a driver alive elsewhere
    keeps its turn; it is tried every half lease until it succeeds or the caller is done.
    """
    config = runtime.config
    while True:
        claim = asyncio.ensure_future(
            runtime.store.claim(
                runtime.host.owner,
                ttl_s=config.lease_ttl_s,
                max_attempts=config.max_attempts,
                turn_id=turn_id,
            )
        )
        try:
            lease = await asyncio.shield(claim)
        except asyncio.CancelledError:
            # The caller is done (or leaving) while a claim may have committed: a lease
            # taken and never driven would hold the turn for a whole ttl. Hand it over.
            taken = await asyncio.gather(claim, return_exceptions=True)
            if isinstance(taken[0], Lease):
                await hand_over_all(runtime.store, [taken[0]], log)
            raise
        except Exception as exc:  # noqa: BLE001 - a failed claim is tried again
            log.warning("taking over the asked turn %s failed: %r", turn_id, exc)
            lease = None
        if lease is not None:
            _drive_here(runtime, turn_id, lease, agent, ctx)
            return
        await runtime.clock.sleep(config.lease_ttl_s / 2)


class _Answer:
    """What a delegated turn's events say: its answer, its failure, or the pause it waits on."""

    def __init__(
        self, agent: Agent, turn_id: TurnId, session_id: SessionId, pulse_s: float, clock: Clock
    ) -> None:
        self.clock = clock
        """The runtime's: the asking turn's idle window is measured on it."""
        self.agent = agent
        self.turn_id = turn_id
        self.session_id = session_id
        self.pulse_s = pulse_s
        self.where = f"turn {turn_id} in session {session_id}"
        self.text: str | None = None
        self.error: ErrorEvent | None = None
        self.done: DoneEvent | None = None
        self.finished: RunFinishedEvent | None = None
        """Its account, as its ending wrote it (what `_count_spent` counts)."""
        self.seq = 0
        """The last committed event followed: following again goes on from there."""
        self.last: DurableEvent | EphemeralEvent | None = None
        """The last event followed: the pause it waits on, when it does."""
        self._pulse = self.clock.monotonic()

    def keep(self, event: DurableEvent | EphemeralEvent) -> None:
        """Keep what the answer and the count need of `event`.

        Not as `last`: a turn followed on past its budget pause, once stopped, still
        answers as that pause says.
        """
        if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
            self.text = event.block.text
        elif isinstance(event, ErrorEvent):
            self.error = event
        elif isinstance(event, RunFinishedEvent):
            self.finished = event
        elif isinstance(event, DoneEvent):
            self.done = event
        if isinstance(event, DurableEvent):
            self.seq = event.seq

    async def take(self, event: DurableEvent | EphemeralEvent, ctx: ToolContext) -> None:
        """Keep what the answer needs; tell the asking call what the agent does."""
        self.keep(event)
        self.last = event
        if isinstance(event, ToolStartedEvent):
            await self._report(ctx, f"{self.agent.name}: {event.block.tool_name}")
        elif isinstance(event, JobProgressEvent) and event.message:  # its tools', nested
            await self._report(ctx, f"{self.agent.name}: {event.message}")
        elif self.clock.monotonic() - self._pulse >= self.pulse_s:
            await self._report(ctx, f"{self.agent.name} is working")

    async def _report(self, ctx: ToolContext, message: str) -> None:
        self._pulse = self.clock.monotonic()
        await ctx.report_progress(None, message)

    def result(self) -> JsonValue:
        """The answer: text, or the `output_type`'s JSON value.

        Raises:
            AgentToolError: the turn did not complete with an answer.
        """
        name = self.agent.name
        if isinstance(self.last, BudgetPausedEvent):
            raise AgentToolError(
                f"the agent {name!r} stopped to wait for a raised budget ({self.last.reason}): "
                f"its {self.where} was cancelled"
            )
        if self.done is None:
            raise AgentToolError(f"the agent {name!r} did not finish ({self.where})")
        if self.done.status != "succeeded" or self.text is None:
            said = f": {self.error.message}" if self.error is not None else ""
            raise AgentToolError(
                f"the agent {name!r} did not answer: its {self.where} ended "
                f"{self.done.status}{said}"
            )
        if self.agent.output is None:
            return self.text
        try:
            value: JsonValue = json.loads(self.text)
        except ValueError:
            return self.text
        return value
