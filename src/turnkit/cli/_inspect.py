"""The commands that read a database: sessions, a session's turns, stuck turns, a turn's log.

And how events print (`turnkit run` shows its turn's events the same way).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TextIO

from turnkit.errors import SessionNotFoundError, StoreError, TurnNotFoundError
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    AskedUsage,
    BudgetPausedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    ErrorEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    ProviderCascadeEvent,
    StepStartEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
    TurnStartedEvent,
    UsageEvent,
)
from turnkit.ids import SessionId, TurnId
from turnkit.store import TurnRecord, decode_events
from turnkit.store.migrate import head_revision, refuse_newer
from turnkit.store.sql import SqlStore, shown_url

__all__ = (
    "Printer",
    "asked_line",
    "call_line",
    "existing_database",
    "existing_store",
    "list_sessions",
    "session_turns",
    "show_events",
    "stuck_turns",
    "usd",
)


def call_line(tool_name: str, arguments: Mapping[str, object]) -> str:
    """A tool call as the commands print it: `delete_file(path='/tmp/x.txt')`."""
    return f"{tool_name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def asked_line(asked: AskedUsage) -> str:
    """What agents asked as tools spent, apart from the turn's own calls.

    The cost only when there is one: asked turns on models without a price add up to $0,
    which would read as free (the chat page's cost line says the same).
    """
    turns = f"{asked.turns} turn{'' if asked.turns == 1 else 's'}"
    calls = f"{asked.model_calls} model call{'' if asked.model_calls == 1 else 's'}"
    cost = f", {usd(asked.cost_usd)}" if asked.cost_usd > 0 else ""
    return f"+ asked agents: {turns}, {calls}{cost}"


class Printer:
    """Renders events readably: stages, tool rows, the streamed answer, usage."""

    def __init__(self, out: TextIO, *, from_log: bool = False) -> None:
        self.out = out
        self.from_log = from_log
        self.streaming: str | None = None

    def _line(self, text: str) -> None:
        if self.streaming is not None:
            self.out.write("\n")
            self.streaming = None
        self.out.write(text + "\n")

    def show(self, event: DurableEvent | EphemeralEvent) -> None:  # noqa: C901 - one arm per event
        match event:
            case TurnStartedEvent():
                self._line(
                    f"turn {event.turn_id} · session {event.session_id} · model {event.model}"
                )
            case StepStartEvent(step=step, iteration=iteration):
                self._line(f"▸ {step}" + (f" #{iteration}" if iteration else ""))
            case MessageDeltaEvent(stage_id=stage, text=text):
                if self.streaming != stage:
                    # Streamed as written: text that goes on to a tool call is narration,
                    # text of a call that names no tool is the answer.
                    self._line("") if self.streaming is not None else None
                    self.streaming = stage
                self.out.write(text)
            case MessageCompleteEvent(block=block):
                if self.streaming is not None:
                    self.out.write("\n")
                    self.streaming = None
                elif self.from_log:  # no deltas in a stored log: the whole text
                    self._line(block.text)
            case ToolStartedEvent(block=block):
                self._line(f"  ⚙ {call_line(block.tool_name, block.arguments)}")
            case ToolCompletedEvent(result=result, duration_ms=ms):
                self._line(f"    → {result.output!r}  ({ms:.1f} ms)")
            case ToolFailedEvent(result=result, code=code):
                self._line(f"    ✗ {code}: {result.error}")
            case ApprovalRequestedEvent(tool_name=name, arguments=arguments):
                asked = call_line(name, arguments)
                self._line(f"  ⏸ waits for approval: {asked} · request {event.request_id}")
            case ApprovalAnsweredEvent(decision=decision, note=note, arguments=changed):
                how = "approved" if decision == "approve" else "denied"
                if changed is not None:
                    how += f" as {call_line(event.tool_name, changed)}"
                self._line(f"  ↳ {how}" + (f": {note}" if note else ""))
            case ClarificationRequestedEvent(question=question, choices=choices):
                offered = f" [{' / '.join(choices)}]" if choices else ""
                self._line(f"  ? asks: {question}{offered} · request {event.request_id}")
            case BudgetPausedEvent(reason=reason):
                self._line(f"  ⏸ paused for a budget: {reason}")
            case TurnRecoveringEvent(attempt=attempt, cause=cause, resumed_from=where):
                why = _TAKEN_OVER.get(cause, cause)
                self._line(f"↻ attempt {attempt} took the turn over ({why}), from its {where}")
            case ToolInDoubtEvent(tool_name=name, resolution=resolution):
                done = {
                    "reconciled": "its reconcile hook found it done",
                    "failed": "its reconcile hook answered in a shape turnkit cannot read: "
                    "it fails, not run again",
                }.get(resolution, "it runs again with the same idempotency key")
                self._line(f"  ? {name} may have run in the attempt before: {done}")
            case ProviderCascadeEvent():
                cut = self.streaming is not None  # its text so far is not the answer
                nxt = f"trying {event.to_model}" if event.to_model else "no other model to try"
                self._line(f"  ↷ {event.from_model} failed ({event.reason}); {nxt}")
                if cut:
                    self._line("    (the text above is dropped: the next model writes it again)")
            case UsageEvent():
                self._line(
                    f"usage: {event.model_calls} model call{'' if event.model_calls == 1 else 's'}"
                    f" · {event.input_tokens} in / "
                    f"{event.output_tokens} out tokens · {usd(event.cost_usd)}"
                    + (f" · {asked_line(event.asked)}" if event.asked is not None else "")
                )
            case ErrorEvent(code=code, message=message):
                self._line(f"✗ error [{code}]: {message}")
            case DoneEvent(status=status):
                self._line(("✓ " if status == "succeeded" else "■ ") + status)
            case _:
                pass
        self.out.flush()


def usd(cost: float) -> str:
    """A cost in dollars: cents from $1 up, three significant digits below, `$0` for none."""
    if not cost > 0:
        return "$0"
    if cost >= 1:
        return f"${cost:,.2f}"
    decimals = 2 - math.floor(math.log10(cost))
    return "$" + f"{cost:.{decimals}f}".rstrip("0").rstrip(".")


async def existing_database(url: str, schema: str | None, store: SqlStore | None = None) -> None:
    """Commands that only read or tidy a database refuse one turnkit never set up.

    Opening a store creates what is missing: a mistyped SQLite path or PostgreSQL schema
    would answer from an empty new database. `store`: the one to ask (else a probe).
    """
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path and not Path(path).exists():  # noqa: ASYNC240 - one stat, before any I/O
            raise StoreError(
                f"there is no database at {path!r} (a typo? `turnkit db upgrade` creates one)",
                path=path,
            )
        return
    probe = store or SqlStore.from_url(url, schema=schema)
    try:
        revision = await probe.schema_revision()
    finally:
        if store is None:
            await probe.close()
    if revision is None:
        where = f"schema {schema!r}" if schema else "its default schema"
        raise StoreError(
            f"{shown_url(url)} has no turnkit tables in {where} (a typo? `turnkit db "
            "upgrade` creates them)",
            url=shown_url(url),
        )


@contextlib.asynccontextmanager
async def existing_store(url: str, schema: str | None) -> AsyncIterator[SqlStore]:
    """The store at `url`, opened once `existing_database` found turnkit set up there.

    Its schema is left as it is: a command that reads or tidies never migrates (the
    processes still running on an older schema would meet the new one unannounced).
    """
    store = SqlStore.from_url(url, schema=schema)
    try:
        await existing_database(url, schema, store)
        revision = await store.schema_revision()
        refuse_newer(revision)
        if revision is None:  # a SQLite file turnkit never set up
            raise StoreError(
                f"{shown_url(url)} has no turnkit tables (a typo? `turnkit db upgrade` "
                "creates them)",
                url=shown_url(url),
            )
        if revision != head_revision():
            raise StoreError(
                f"the database schema is at {revision!r}, this turnkit reads "
                f"{head_revision()!r}: run `turnkit db upgrade` (it changes the schema for "
                "every process using it), or use the turnkit that wrote it",
                revision=revision,
            )
        yield store
    finally:
        await store.close()


async def stuck_turns(store: SqlStore, out: TextIO, *, ceiling_s: float, unclaimed_s: float) -> int:
    """`turnkit turns [--stuck]`: running turns to look at; 1 when there are any."""
    stuck = await store.stuck(ceiling_s=ceiling_s, unclaimed_s=unclaimed_s)
    if not stuck:
        out.write("no stuck turns\n")
        return 0
    out.write(f"{len(stuck)} turn(s) to look at:\n")
    for record, reason in stuck:
        out.write(
            f"  {record.turn_id}  session {record.session_id}  attempt {record.attempts}  "
            f"seq {record.last_seq}  owner {record.lease_owner or '-'}  — {reason}\n"
        )
    out.write(
        "a worker (or an app with recover_in_process) takes over turns with no live driver "
        "and claims waiting ones (is one running, hosting their agent?); `turnkit sweep` "
        "ends those past the ceiling or out of attempts\n"
    )
    return 1


async def list_sessions(
    store: SqlStore,
    out: TextIO,
    *,
    principal: str | None,
    organisation: str | None,
    limit: int,
) -> int:
    """`turnkit sessions`: sessions, most recently active first."""
    found = await store.list_sessions(principal=principal, organisation=organisation, limit=limit)
    if not found:
        out.write("no sessions\n")
        return 0
    out.write(f"{len(found)} session(s), most recently active first:\n")
    for session in found:
        owner = f"owner {session.principal}" if session.principal else "anonymous"
        if session.principal and session.organisation:
            owner += f" of {session.organisation}"
        out.write(
            f"  {session.session_id}  {_quoted(session.title or '')}  {owner}  "
            f"{session.last_input_seq} message(s)  active {_when(session.updated_at)}\n"
        )
    return 0


async def session_turns(store: SqlStore, out: TextIO, session_id: SessionId) -> int:
    """`turnkit turns --session ID`: the session's turns, oldest first, with their cost."""
    session = await store.get_session(session_id)
    if session is None:
        raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
    turns = await store.list_turns(session_id)
    out.write(f"session {session_id} {_quoted(session.title or '')}: {len(turns)} turn(s)\n")
    for turn in turns:
        out.write(f"  {turn.turn_id}  {_status(turn)}  {_excerpt(turn.content)}\n")
        out.write(f"    {_account(turn)}\n")
    return 0


async def show_events(store: SqlStore, out: TextIO, turn_id: TurnId, *, as_json: bool) -> int:
    """`turnkit events TURN_ID`: the turn's committed log, readable or as JSON lines."""
    if await store.get_turn(turn_id) is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    if as_json:
        async for stored in store.read_events(turn_id):
            out.write(stored.data.decode() + "\n")
        return 0
    events, unreadable = await decode_events(store.read_events(turn_id))
    printer = Printer(out, from_log=True)
    for event in events:
        printer.show(event)
    for skipped in unreadable:
        out.write(f"(seq {skipped.seq}, {skipped.type}: unreadable, {skipped.reason})\n")
    return 0


def _status(turn: TurnRecord) -> str:
    if turn.error_code and turn.status != "cancelled":
        return f"{turn.status} ({turn.error_code})"
    return turn.status


def _excerpt(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return _quoted(line if len(line) <= width else line[: width - 1] + "…")


def _quoted(text: str) -> str:
    """Text in double quotes, as JSON writes it, any language's letters kept as they are."""
    return json.dumps(text, ensure_ascii=False)


_TAKEN_OVER = {
    "lease-expired": "its previous driver died or was cut off",
    "handed-over": "a worker that shut down handed it over",
}


def _account(turn: TurnRecord) -> str:
    """What the turn cost and when, from its summary once it settled."""
    agent = f"agent {turn.agent}"
    earlier, version = turn.pinned.get("repinned_from"), turn.pinned.get("agent_version")
    if isinstance(earlier, str) and isinstance(version, str):  # its version was gone
        agent += f" (re-pinned from version {earlier} to {version} before it started)"
    parts = [agent, f"created {_when(turn.created_at)}"]
    summary = turn.summary
    if summary is not None:
        calls = summary.model_calls
        parts += [
            f"{calls} model call{'' if calls == 1 else 's'}",
            f"{summary.input_tokens} in / {summary.output_tokens} out tokens",
            usd(summary.cost_usd),
            _duration(summary.duration_ms),
        ]
        if summary.attempt > 1:
            parts.append(f"{summary.attempt} attempts")
        if summary.asked is not None:
            parts.append(asked_line(summary.asked))
    elif turn.status == "running":
        parts.append(f"attempt {turn.attempts}, owner {turn.lease_owner or '-'}")
    return " · ".join(parts)


def _duration(ms: float) -> str:
    return f"{round(ms)} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _when(moment: object) -> str:
    return str(moment)[:19]
