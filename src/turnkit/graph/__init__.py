"""The four-stage graph on LangGraph: the only package that imports langgraph.

`anchor-plan → tool-loop ⇄ synthesize → post-turn`. Each tool-loop iteration is its own
super-step, so a checkpoint lands between iterations. There is no edge back into
synthesize: it runs once per turn, by structure.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypedDict, cast

from langchain_core.runnables import Runnable
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from turnkit import otel
from turnkit.clock import SystemClock
from turnkit.context._known import digests_of
from turnkit.context.prefix import PreviousRequest, compact, expand
from turnkit.errors import StoreUnavailableError, TurnkitError
from turnkit.events import StageName, StepEndEvent, StepStartEvent
from turnkit.stages import (
    StageContext,
    StageOutcome,
    run_anchor_plan,
    run_post_turn,
    run_synthesize,
    run_tool_loop,
)
from turnkit.stages._types import PendingAnswer, Route, TranscriptMessage, shown
from turnkit.telemetry import Recorder

__all__ = (
    "TranscriptPart",
    "TurnGraph",
    "TurnState",
    "bind_resumed",
    "carry_events",
    "compile_turn_graph",
    "expect_new_thread",
    "latest_checkpoint_id",
    "has_pending_interrupt",
    "forget_threads",
    "thread_ids",
    "open_checkpointer",
    "pause_here",
    "run_turn",
    "sqlite_checkpoint_file",
    "stored_request",
    "turn_part",
)

_NO_STEP_LIMIT = 2**31 - 1
"""The graph's `recursion_limit`: in effect none (see `run_turn`)."""


class TurnState(TypedDict):
    """Graph state: plain JSON, so any checkpointer stores it without custom types.

    A checkpoint holds the turn's own messages, not the session's history before them
    (every attempt reads that from the Store as it starts), so a checkpoint's size does
    not grow with its session.
    """

    transcript: list[TranscriptMessage]
    """The model-facing transcript: the turn's own part, or the whole list (see `part`)."""
    part: TranscriptPart
    """What `transcript` holds (absent in older checkpoints: the whole list)."""
    content: str
    route: Route
    iteration: int
    previous: PreviousRequest | None
    """The session's last reasoning request (the prefix check compares with it), `compact`
    against the transcript: what it shares with it is counted, not listed."""
    answer: PendingAnswer | None
    """The tool-loop's terminal text, once a call named no tool."""


TranscriptPart = Literal["turn", "replaced"]
"""`turn`: the turn's own messages, from its opening message on (the history before them
is `Recorder.notes.history`); `replaced`: the whole list, after compaction or picture release
rewrote the history."""

TurnGraph = CompiledStateGraph[TurnState, StageContext, TurnState, TurnState]


async def _bracket(
    ctx: StageContext,
    step: StageName,
    iteration: int | None,
    body: Callable[[], Awaitable[StageOutcome]],
) -> StageOutcome:
    rec = ctx.recorder
    started = time.perf_counter()
    rec.durable(StepStartEvent, step, step=step, iteration=iteration)
    otel.stage_started(rec, step, iteration)  # also when a resumed stage commits no step.start
    outcome = await body()
    otel.stage_ended(rec, step)
    rec.durable(
        StepEndEvent,
        step,
        step=step,
        iteration=iteration,
        duration_ms=(time.perf_counter() - started) * 1000,
    )
    # The next stage's `step.start` shares this transaction: one commit less
    # per stage. The next node stages it again, and the Recorder's journal drops the copy,
    # also when a recovered attempt resumes at that node.
    following = outcome.route
    if following in ("tool-loop", "synthesize", "post-turn"):
        next_iteration = (iteration or 0) + 1 if following == "tool-loop" else None
        rec.durable(StepStartEvent, following, step=following, iteration=next_iteration)
    rec.last_stage_ended = following == "end"
    if rec.checkpoints_carry:
        return outcome  # the step's checkpoint commits them with itself
    if rec.last_stage_ended and rec.ending_commits_last_stage:
        return outcome  # the turn's ending commits them, before the step's checkpoint
    await rec.flush()  # events of a super-step are durable before its checkpoint
    return outcome


def _bind(
    runtime: Runtime[StageContext], state: TurnState
) -> tuple[StageContext, list[TranscriptMessage], PreviousRequest | None]:
    """The turn's context bound to this node, and what the node starts from.

    That is the whole transcript and the session's last request (as the prefix check
    reads it).
    """
    ctx = runtime.context
    transcript, previous = bind_state(ctx.recorder, state)
    return ctx, transcript, previous


def bind_state(
    rec: Recorder, state: TurnState
) -> tuple[list[TranscriptMessage], PreviousRequest | None]:
    """Take the turn's transcript and last request from `state` into `rec`'s notes.

    What a stage starts from, and what the turn keeps if it ends now.
    """
    rec.notes.bound = True
    part = state.get("part")
    if part == "turn":
        transcript = [*rec.notes.history, *state["transcript"]]
    else:
        transcript = state["transcript"]
        if part == "replaced":
            rec.notes.history_replaced = True  # an earlier attempt rewrote it: keep it whole
    rec.notes.transcript = transcript  # what a failure now would keep
    rec.notes.request_text = state["content"]  # as the input guardrails left it
    answer = state.get("answer")
    if answer is not None:  # the loop's answer, streamed: a Stop now keeps it as shown
        shown(rec, "tool-loop", answer)
    previous = state["previous"]
    if previous is not None:
        kept = rec.notes.stored_request
        if kept is not None and kept[0] == previous:  # this attempt stored it: as it was
            previous = kept[1]
        elif "shares" in previous:  # a checkpoint of an earlier attempt
            previous = expand(previous, digests_of(transcript, rec.notes.known), rec.notes.known)
        rec.notes.last_request = previous
    return transcript, previous


async def bind_resumed(graph: TurnGraph, thread_id: str, rec: Recorder) -> None:
    """A resumed run in which no stage ran: take its notes from the thread's state.

    The thread's last stage had finished and its writes were stored before the turn's
    ending was committed, so resuming it runs nothing. The turn's ending must still keep
    what the turn did (its calls, results and answer), as the stage would have bound it.
    """
    snapshot = await graph.aget_state(cast(Any, {"configurable": {"thread_id": thread_id}}))
    if snapshot.values:
        bind_state(rec, cast(TurnState, snapshot.values))


def stored_request(
    rec: Recorder, previous: PreviousRequest, transcript: list[TranscriptMessage]
) -> PreviousRequest:
    """`previous` as the state keeps it beside `transcript` (`compact`)."""
    kept = rec.notes.stored_request
    if kept is not None and kept[1] is previous:
        return kept[0]
    known = rec.notes.known
    out = compact(previous, digests_of(transcript, known), known)
    rec.notes.stored_request = (out, previous)
    return out


def turn_part(
    rec: Recorder, transcript: list[TranscriptMessage]
) -> tuple[list[TranscriptMessage], TranscriptPart]:
    """What the state keeps of `transcript`: the turn's part, unless history was replaced."""
    if rec.notes.history_replaced:
        return transcript, "replaced"
    return transcript[rec.notes.base_len :], "turn"


_Onward = Literal["tool-loop", "synthesize"]
"""Where anchor-plan and the tool-loop hand over: the node's `Command` says which, so no
edge function runs (LangGraph traces each such call as a run of its own)."""


def _onward(route: Route) -> _Onward:
    if route not in ("tool-loop", "synthesize"):
        raise ValueError(f"a stage before synthesize cannot hand over to {route!r}")
    return route


def _update(
    ctx: StageContext, out: StageOutcome, transcript: list[TranscriptMessage]
) -> dict[str, Any]:
    """The state's update: `transcript` is the one the node started from."""
    update: dict[str, Any] = {"route": out.route}
    if out.transcript is not None:
        update["transcript"], update["part"] = turn_part(ctx.recorder, out.transcript)
        ctx.recorder.notes.transcript = transcript = out.transcript
    if out.previous is not None:
        update["previous"] = stored_request(ctx.recorder, out.previous, transcript)
    if out.answer is not None:
        update["answer"] = out.answer
    return update


async def _anchor_plan(state: TurnState, runtime: Runtime[StageContext]) -> Command[_Onward]:
    ctx, transcript, _ = _bind(runtime, state)
    out = await _bracket(
        ctx,
        "anchor-plan",
        None,
        lambda: run_anchor_plan(ctx, state["content"], transcript),
    )
    return Command(update=_update(ctx, out, transcript), goto=_onward(out.route))


async def _tool_loop(state: TurnState, runtime: Runtime[StageContext]) -> Command[_Onward]:
    ctx, transcript, previous = _bind(runtime, state)
    iteration = state["iteration"] + 1
    out = await _bracket(
        ctx,
        "tool-loop",
        iteration,
        lambda: run_tool_loop(ctx, transcript, iteration, previous),
    )
    update = {**_update(ctx, out, transcript), "iteration": iteration}
    return Command(update=update, goto=_onward(out.route))


async def _synthesize(state: TurnState, runtime: Runtime[StageContext]) -> dict[str, Any]:
    ctx, transcript, previous = _bind(runtime, state)
    out = await _bracket(
        ctx,
        "synthesize",
        None,
        lambda: run_synthesize(ctx, transcript, previous, state["answer"]),
    )
    return _update(ctx, out, transcript)


async def _post_turn(state: TurnState, runtime: Runtime[StageContext]) -> dict[str, Any]:
    ctx, transcript, _ = _bind(runtime, state)
    out = await _bracket(ctx, "post-turn", None, lambda: run_post_turn(ctx, transcript))
    return {"route": out.route}


class _Entry(Runnable[TurnState, Route]):
    """START's edge: the stage the driver put in the state (`route`).

    A runnable of its own, not a function: LangGraph traces an edge function as a run of
    its own (a callback manager and two tasks per turn), which this skips.
    """

    name = "entry"

    def invoke(self, input: TurnState, config: Any = None, **kwargs: Any) -> Route:
        return input["route"]

    async def ainvoke(self, input: TurnState, config: Any = None, **kwargs: Any) -> Route:
        return input["route"]


def compile_turn_graph(checkpointer: BaseCheckpointSaver[Any] | None) -> TurnGraph:
    """Build and compile the graph once; per-turn dependencies arrive as LangGraph context."""
    builder = StateGraph(TurnState, context_schema=StageContext)
    builder.add_node("anchor-plan", _anchor_plan)
    builder.add_node("tool-loop", _tool_loop)
    builder.add_node("synthesize", _synthesize)
    builder.add_node("post-turn", _post_turn)
    builder.add_conditional_edges(START, _Entry(), ["anchor-plan", "tool-loop", "synthesize"])
    builder.add_edge("synthesize", "post-turn")
    builder.add_edge("post-turn", END)
    return builder.compile(checkpointer=checkpointer, name="turnkit-turn")


def pause_here(value: Any) -> Any:
    """Pause the running node (LangGraph `interrupt`); returns the resume value on resume."""
    return interrupt(value)


async def has_pending_interrupt(graph: TurnGraph, thread_id: str) -> bool:
    """Whether the thread stopped at an `interrupt` that has not been resumed."""
    snapshot = await graph.aget_state(cast(Any, {"configurable": {"thread_id": thread_id}}))
    return bool(snapshot.interrupts)


async def run_turn(
    graph: TurnGraph,
    state: TurnState | None,
    ctx: StageContext,
    *,
    thread_id: str,
    durability: Literal["sync", "async", "exit"],
    resume: Any = None,
) -> None:
    """Run (state given) or resume (None: from the last checkpoint) one turn's graph.

    The stages' Recorder sends the turn's events itself; what a tool writes to
    LangGraph's stream writer is dropped.
    """
    # Each tool round is a super-step: LangGraph's own step limit (25 in some releases,
    # or what LANGGRAPH_DEFAULT_RECURSION_LIMIT says) must not end a long loop. The turn's
    # ceiling, its budgets, a Stop and `Agent.max_tool_rounds` bound it instead.
    config: Any = {"configurable": {"thread_id": thread_id}, "recursion_limit": _NO_STEP_LIMIT}
    graph_input: Any = Command(resume=resume) if resume is not None else state
    async for _ in graph.astream(
        graph_input, config, context=ctx, stream_mode="custom", durability=durability
    ):
        pass


def carry_events(
    graph: TurnGraph, thread_id: str, rec: Recorder, *, keep_ended: bool = True
) -> Callable[[bool], Awaitable[None]] | None:
    """Have the thread's checkpoints commit `rec`'s staged events with them.

    If the checkpointer can (PostgreSQL), returns what ends it (after the turn's ending:
    `keep` stores what no commit carried, else it is dropped), and each stage ends
    without a commit of its own (`rec.checkpoints_carry`): its events are stored in its
    checkpoint's statement; a checkpoint that found nothing staged, and the last one,
    ride on the turn's next commit (the last on its ending). Only for checkpoints after
    every super-step (not `exit`).

    A checkpointer that can only hold a thread's checkpoint back (SQLite, whose
    checkpoints live in a file of their own) holds the last stage's: that stage's events
    commit with the turn's ending, and the checkpoint is stored after it (`keep`), unless
    the ending is committed and the turn's checkpoints are not kept once it has ended
    (`keep_ended`).
    """
    saver = graph.checkpointer
    carry: Callable[..., Callable[[bool], Awaitable[None]]] | None = getattr(saver, "carry", None)
    if carry is None:
        return _hold_last(saver, thread_id, rec, keep_ended=keep_ended)
    stop_carrying = carry(thread_id, rec.commit_carrying)
    rec.held_checkpoints = functools.partial(saver.held_rider, thread_id)  # type: ignore[union-attr]

    async def stop(keep: bool) -> None:
        rec.held_checkpoints = None
        await stop_carrying(keep)

    return stop


def _hold_last(
    saver: object, thread_id: str, rec: Recorder, *, keep_ended: bool
) -> Callable[[bool], Awaitable[None]] | None:
    hold: Callable[..., Callable[[bool], Awaitable[None]]] | None = getattr(
        saver, "hold_last", None
    )
    if hold is None:
        return None
    release = hold(thread_id, lambda: rec.last_stage_ended)
    rec.ending_commits_last_stage = True

    async def stop(keep: bool) -> None:
        rec.ending_commits_last_stage = False
        await release(keep and (keep_ended or not rec.log_closed))

    return stop


async def forget_threads(graph: TurnGraph, thread_ids: Sequence[str]) -> None:
    """Delete the threads' checkpoints (they hold the turns' messages) from the checkpointer."""
    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver) or not thread_ids:
        return
    many: Callable[[Sequence[str]], Awaitable[None]] | None = getattr(
        saver, "adelete_threads", None
    )
    if many is not None:
        await many(thread_ids)
        return
    for thread_id in thread_ids:  # a checkpointer of the app's own
        await saver.adelete_thread(thread_id)


async def thread_ids(graph: TurnGraph, *, prefix: str, after: str, limit: int) -> list[str] | None:
    """Up to `limit` checkpoint threads whose ids start with `prefix`, past `after`, in order.

    None when the checkpointer cannot list its threads (an app's own).
    """
    lister: Callable[..., Awaitable[list[str]]] | None = getattr(
        graph.checkpointer, "athread_ids", None
    )
    if lister is None:
        return None
    return await lister(prefix=prefix, after=after, limit=limit)


def expect_new_thread(graph: TurnGraph, thread_id: str) -> None:
    """Tell the checkpointer `thread_id` has no checkpoint yet (a turn's first attempt).

    The run's opening read of the thread's newest checkpoint then asks no database.
    """
    expect: Callable[[str], None] | None = getattr(graph.checkpointer, "expect_new", None)
    if expect is not None:
        expect(thread_id)


async def latest_checkpoint_id(
    graph: TurnGraph, thread_id: str, *, just_ran: bool = False
) -> str | None:
    """Id of the newest checkpoint of a thread, if the graph has a checkpointer.

    `just_ran`: this process just ran the thread, so the id it wrote is the newest.
    """
    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        return None
    if just_ran:
        take_written: Callable[[str], str | None] | None = getattr(saver, "take_written", None)
        if take_written is not None and (written := take_written(thread_id)) is not None:
            return written
    found = await saver.aget_tuple(cast(Any, {"configurable": {"thread_id": thread_id}}))
    return None if found is None else str(found.checkpoint["id"])


async def open_checkpointer(
    database_url: str, *, schema: str | None = None
) -> tuple[BaseCheckpointSaver[Any], Callable[[], Awaitable[None]]]:
    """LangGraph's own checkpointer for the database: SQLite or PostgreSQL.

    Returns the saver and an async `close` for what it opened.
    """
    if database_url.startswith("sqlite"):
        from turnkit.graph._sqlite_saver import ThreadedSqliteSaver

        saver = ThreadedSqliteSaver(sqlite_checkpoint_file(database_url) or ":memory:")
        await saver.asetup()
        return saver, saver.aclose
    if database_url.startswith(("postgresql", "postgres")):
        return await _open_postgres_checkpointer(database_url, schema)
    raise ValueError(f"no checkpointer for database url {database_url!r}")


def sqlite_checkpoint_file(database_url: str) -> str:
    """The file a SQLite database's checkpoints live in; "" for one in memory."""
    path = database_url.split("///", 1)[1] if "///" in database_url else ""
    return "" if path in ("", ":memory:") else _checkpoint_path(path)


_SETUP_LOCK = 7413620512
"""The advisory lock that serializes checkpointer setup across processes starting at once."""


async def _open_postgres_checkpointer(
    database_url: str, schema: str | None
) -> tuple[BaseCheckpointSaver[Any], Callable[[], Awaitable[None]]]:
    """LangGraph's PostgreSQL checkpoints on an asyncpg pool (see `AsyncPgSaver`).

    A pool, not one connection: a connection broken by a database restart is replaced,
    so checkpoints work again once the database is back. Setup (LangGraph's own
    migrations) runs under an advisory lock, so processes starting together on a fresh
    schema do not race on it.
    """
    import asyncpg

    from turnkit.graph._postgres_saver import AsyncPgSaver, prepare_connection
    from turnkit.store._asyncpg_pool import NO_STATEMENT_EXPIRY, close_pool, keep_session
    from turnkit.store._engine_pg import asyncpg_dsn
    from turnkit.store.sql import database_refused

    dsn, timeout = asyncpg_dsn(database_url)
    settings = {"search_path": schema} if schema else None
    unreachable = (OSError, TimeoutError, asyncpg.PostgresConnectionError,
                   asyncpg.CannotConnectNowError, asyncpg.InterfaceError)  # fmt: skip
    try:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=10,
            server_settings=settings,
            init=prepare_connection,
            reset=keep_session,
            timeout=timeout,
            **NO_STATEMENT_EXPIRY,
        )
    except unreachable as exc:
        raise StoreUnavailableError(
            f"the database for checkpoints cannot be reached ({exc}); retry shortly"
        ) from exc
    saver = AsyncPgSaver(pool)
    try:
        lock = await asyncpg.connect(dsn, server_settings=settings, timeout=timeout)
        try:
            await _take_setup_lock(lock)
            try:
                await saver.setup()
            finally:
                await lock.execute("SELECT pg_advisory_unlock($1)", _SETUP_LOCK)
        finally:
            await lock.close()
    except unreachable as exc:
        await pool.close()
        raise StoreUnavailableError(
            f"the database for checkpoints cannot be reached ({exc}); retry shortly"
        ) from exc
    except BaseException as exc:
        await pool.close()
        if isinstance(exc, Exception) and database_refused(exc):  # read-only, disk full
            why = exc.message if isinstance(exc, TurnkitError) else exc  # without its code
            raise StoreUnavailableError(
                f"the database for checkpoints takes no writes now ({type(exc).__name__}: "
                f"{why}); retry shortly"
            ) from exc
        raise

    async def close() -> None:
        try:
            await saver.aclose()
        finally:
            await close_pool(pool)

    return saver, close


async def _take_setup_lock(conn: Any) -> None:
    """Take the setup lock by polling, never by waiting inside a statement.

    LangGraph's setup creates an index `CONCURRENTLY`, which waits for every open
    transaction to end; a process blocked in `pg_advisory_lock` would be one, and the two
    would wait for each other. Each try here is a statement that returns at once.
    """
    for _ in range(_SETUP_LOCK_TRIES):
        if await conn.fetchval("SELECT pg_try_advisory_lock($1)", _SETUP_LOCK):
            return
        await SystemClock().sleep(_SETUP_LOCK_POLL_S)
    raise StoreUnavailableError(
        "another process held the checkpoint setup lock for too long; retry shortly"
    )


_SETUP_LOCK_POLL_S = 0.05
_SETUP_LOCK_TRIES = 1200  # one minute


def _checkpoint_path(store_path: str) -> str:
    """Checkpoints live beside the store (`x.db` → `x.checkpoints.db`).

    A second file, not a second connection to the same file: two connections writing one
    SQLite file serialize on its write lock and back off in milliseconds.
    """
    stem, dot, ext = store_path.rpartition(".")
    return f"{stem}.checkpoints.{ext}" if dot and "/" not in ext else f"{store_path}.checkpoints"
