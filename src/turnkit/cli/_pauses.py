"""`turnkit pauses` and `turnkit answer`: what paused turns wait for, and answering one.

`answer` drives the turn on in this process and prints it as `turnkit run` does, so a turn
`turnkit run` left waiting can be finished from the same terminal; `--queue` only records
the answer and leaves the turn to a worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from datetime import UTC, datetime, timedelta
from typing import TextIO

from pydantic import JsonValue

from turnkit.agent import load_agent
from turnkit.cli._inspect import Printer, call_line, existing_store
from turnkit.config import RuntimeConfig, env_plugins
from turnkit.demo import demo_agent
from turnkit.errors import (
    AgentNotFoundError,
    InvalidInputError,
    PauseAnsweredError,
    TurnNotFoundError,
)
from turnkit.events import (
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
)
from turnkit.ids import SessionId, TurnId
from turnkit.models import ModelClient
from turnkit.models.litellm import ModelEndpoint
from turnkit.pauses import ANSWERS, Answer, Approve, Deny, PauseRequest, Resolution
from turnkit.runtime import SessionRuntime
from turnkit.store import TurnRecord
from turnkit.store.sql import SqlStore

__all__ = ("PAUSES", "Pause", "answer_turn", "list_pauses", "misused_answer_flag", "waiting")

Pause = ApprovalRequestedEvent | ClarificationRequestedEvent | BudgetPausedEvent
"""An event a turn stops at until someone (or a budget) answers."""

PAUSES = (ApprovalRequestedEvent, ClarificationRequestedEvent, BudgetPausedEvent)


def waiting(event: Pause) -> str:
    """What a turn left paused waits for, and how to answer it (the command's last line)."""
    turn = event.turn_id
    if isinstance(event, BudgetPausedEvent):
        return (
            f"⏸ turn {turn} waits for a budget: it resumes by itself once the limit has room "
            "(`turnkit budgets`); `turnkit pauses` lists it\n"
        )
    if isinstance(event, ApprovalRequestedEvent):
        how, kind = "--approve (or --deny)", "approvals"
    else:
        how, kind = "--reply TEXT", "clarifications"
    return (
        f"⏸ turn {turn} waits for an answer: `turnkit answer {turn} {how}` with the same "
        "--agent and database, the chat page of `turnkit serve`, or POST "
        f"/api/harness/turns/{turn}/{kind}/{event.request_id}\n"
    )


async def list_pauses(
    store: SqlStore, out: TextIO, *, session_id: SessionId | None, limit: int
) -> int:
    """`turnkit pauses`: the paused turns, oldest first, each with what it waits for."""
    # One more than the limit: is there more? An agent asked as a tool waits in its asking
    # turn too, whose request is the one answered: left out.
    found = await store.open_pauses(session_id, limit=limit + 1, asked=False)
    more = len(found) > limit
    found = found[:limit]
    if not found:
        where = f" in session {session_id}" if session_id is not None else ""
        out.write(f"no paused turns{where}\n")
        return 0
    now = datetime.now(UTC)
    for record, request in found:
        since = _ago(now - record.updated_at)
        out.write(
            f"{record.turn_id}  {record.status}  session {record.session_id}  "
            f"agent {record.agent}  since {since}\n"
        )
        out.write(f"  {_describe(request)}\n")
    if more:
        out.write(f"(the first {limit}; --limit shows more)\n")
    return 0


def _describe(request: PauseRequest) -> str:
    payload = request.payload
    asked = payload.get("asked")
    who = f"the {asked.get('agent')} agent asks: " if isinstance(asked, dict) else ""
    if request.kind == "approval":
        raw = payload.get("arguments")
        call = call_line(str(payload.get("tool_name")), raw if isinstance(raw, dict) else {})
        role = payload.get("approver_role")
        by = f" (the {role} role answers over HTTP)" if role else ""
        return f"approve or deny{by}: {who}{call} · request {request.request_id}"
    if request.kind == "clarification":
        raw = payload.get("choices")
        choices = [str(c) for c in raw] if isinstance(raw, list) else []
        offered = f" [{' / '.join(choices)}]" if choices else ""
        question = payload.get("question")
        return f"answer: {who}{question}{offered} · request {request.request_id}"
    reason = payload.get("reason") or "a budget limit"
    return f"a budget: {reason} (it resumes by itself once the limit has room)"


def _ago(elapsed: timedelta) -> str:
    seconds = int(elapsed.total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172_800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86_400} d"


def misused_answer_flag(args: argparse.Namespace) -> str | None:
    """What is wrong with `turnkit answer`'s flags together, or None."""
    if args.arguments is not None and not args.approve:
        return "--arguments goes with --approve (the arguments the call runs with)"
    if args.note is not None and args.reply is not None:
        return "--note goes with --approve or --deny; --reply is the whole answer"
    return None


def resolution_of(args: argparse.Namespace) -> Resolution:
    """The answer the flags give (argparse has made sure exactly one kind is chosen)."""
    if args.reply is not None:
        return Answer(text=args.reply)
    if args.deny:
        return Deny(note=args.note)
    arguments: dict[str, JsonValue] | None = args.arguments
    return Approve(note=args.note, arguments=arguments)


async def answer_turn(args: argparse.Namespace, out: TextIO, config: RuntimeConfig) -> int:
    """`turnkit answer TURN_ID`: answer its open request, then drive it on here.

    The turn and its request are read before anything is opened for writing: a mistyped
    id or database is one line, and the turn is left as it was.
    """
    resolution = resolution_of(args)
    async with existing_store(config.database_url, config.database_schema) as store:
        record = await store.get_turn(TurnId(args.turn_id))
        if record is None:
            raise TurnNotFoundError(f"no turn {args.turn_id!r}", turn_id=args.turn_id)
        request_id = args.request or await _open_request(store, record, resolution)
    served: dict[str, str | ModelClient | ModelEndpoint] = {}
    if args.api_base or args.api_key_env:  # where the turn's own model is served
        served[record.model] = ModelEndpoint(
            model=record.model, api_base=args.api_base, api_key_env=args.api_key_env
        )
    agent = load_agent(args.agent) if args.agent else demo_agent()
    plugins = env_plugins(os.environ)
    async with SessionRuntime(agent=agent, models=served, config=config, plugins=plugins) as rt:
        if config.run_in_process:  # driven here: another agent would end it agent-not-found
            try:
                await rt.runner().pinned_agent(record)
            except AgentNotFoundError as exc:
                raise AgentNotFoundError(
                    f"{exc.message}: give --agent pkg.mod:name, the agent (or a function "
                    "making it) the turn started with, or --queue to leave the turn to a "
                    "worker or to the app that serves it",
                    **exc.details,
                ) from exc
        await rt.resume(record.turn_id, request_id, resolution, principal=args.by)
        out.write(f"answered {request_id}: {resolution.kind}\n")
        if not config.run_in_process:
            out.write(f"turn {record.turn_id} is queued: a worker drives it on\n")
            return 0
        status = await _follow(rt, record, out)
        await rt.wait_background()
    return 0 if status == "succeeded" else 1


async def _follow(runtime: SessionRuntime, record: TurnRecord, out: TextIO) -> str:
    """Print the resumed turn until it ends or pauses again; its status then."""
    printer = Printer(out)
    events = runtime.reader().events(record.turn_id, after_seq=record.last_seq)
    async with contextlib.aclosing(events):
        async for event in events:
            printer.show(event)
            if isinstance(event, DoneEvent):
                return event.status
            if isinstance(event, PAUSES):
                out.write(waiting(event))
                return "paused"
    return "failed"  # the stream ended with no ending: the runtime is closing


async def _open_request(store: SqlStore, record: TurnRecord, resolution: Resolution) -> str:
    """The request `record`'s turn waits on, when the command names none.

    Raises:
        InvalidInputError: it waits on a budget, or on another kind of answer.
        PauseAnsweredError: it waits on nothing.
    """
    if record.status == "awaiting_budget":
        raise InvalidInputError(
            f"turn {record.turn_id} waits on a budget: it resumes by itself once a limit has "
            "room (`turnkit budgets set`)",
            turn_id=record.turn_id,
        )
    for turn, request in await store.open_pauses(record.session_id):
        if turn.turn_id != record.turn_id:
            continue
        if resolution.kind not in ANSWERS[request.kind]:
            asked = request.kind == "clarification"
            what, how = ("a question", "--reply TEXT") if asked else ("an approval", "--approve")
            raise InvalidInputError(
                f"turn {record.turn_id} waits on {what}: answer it with {how}",
                turn_id=record.turn_id,
            )
        return request.request_id
    raise PauseAnsweredError(
        f"turn {record.turn_id} waits on nothing: it is {record.status}",
        turn_id=record.turn_id,
    )
