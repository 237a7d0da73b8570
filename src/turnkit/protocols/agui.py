"""AG-UI over SSE: `create_agui_router(runtime)` answers AG-UI's `RunAgentInput` with events.

```python
app = FastAPI()
app.include_router(create_agui_router(runtime))  # POST /api/agui/run
install_problem_handlers(app)
```

A run is a turnkit turn: `threadId` names the session, `runId` is the turn's request id (so
posting the same run twice never starts a second turn) and the last user message is the
turn's content. A pause ends the run with an interrupt outcome; the thread's next run,
carrying `resume`, continues the same turn. The last frame of each durable turnkit event
carries `id: <seq>`: re-post the same input with `Last-Event-ID` to pick up exactly there.
The mapping is documented in docs/protocols/agui.md.

The request models live in `_agui_wire`, the event mapping in `_agui_translate` and the
response's body (framing, size bound, buffer view) in `_agui_stream`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any, Final, cast

from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    PauseAnsweredError,
    PauseNotFoundError,
    SessionNotFoundError,
    TurnNotFoundError,
    missing_extra,
)

try:
    from fastapi import APIRouter, Depends, Header, Response
    from sse_starlette import EventSourceResponse  # the routes' documented response class
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The AG-UI route", "fastapi", exc) from exc

from turnkit._problems import ProblemRoute, opened
from turnkit._sse_response import SseResponse
from turnkit.events import StreamEvent
from turnkit.ids import SessionId, TurnId
from turnkit.projection import PendingDecision, project
from turnkit.protocols._agui_stream import Bound, BufferView, stream_run
from turnkit.protocols._agui_translate import SHUTDOWN, AgUi, Translator, client_view
from turnkit.protocols._agui_wire import (
    ForwardedProps,
    InputMessage,
    InputToolCall,
    ResumeEntry,
    RunAgentInput,
    resolution_of,
    user_content,
)
from turnkit.protocols._caller import Caller, caller_of, sees
from turnkit.runtime import SessionRuntime
from turnkit.runtime.answerers import answer_deps, check_answerer
from turnkit.runtime.reader import TurnReader, check_cursor, parse_cursor, set_once_sent
from turnkit.states import TurnStatus
from turnkit.store import SessionRecord, TurnRecord
from turnkit.tenancy import AuthDependency, anonymous

_SHUTTING_DOWN: Final = "the server is shutting down; the run goes on: reconnect with Last-Event-ID"

__all__ = (
    "ForwardedProps",
    "InputMessage",
    "InputToolCall",
    "ResumeEntry",
    "RunAgentInput",
    "create_agui_router",
)

log = logging.getLogger("turnkit.protocols")

_AWAITING: Final[frozenset[TurnStatus]] = frozenset({"awaiting_approval", "awaiting_input"})
_PROBLEMS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"content": {"application/problem+json": {}}} for status in (400, 404, 409, 416, 422)
}


# ── the route ─────────────────────────────────────────────────────────────────────────


async def _no_deps() -> None:
    return None


def create_agui_router(
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = anonymous,
    prefix: str = "/api/agui",
    keepalive_s: float = 10.0,
    deps: Callable[..., Any] | None = None,
    max_frame_bytes: int = 1_000_000,
) -> APIRouter:
    """`POST {prefix}/run`: an AG-UI agent endpoint for `runtime`.

    `auth` is a FastAPI dependency returning the caller's principal (or None); a thread
    owned by another principal answers 404. `deps` builds the app's dependencies for the
    turn a request starts or resumes (`ToolContext.deps`). Idle streams get a `: keep-alive`
    comment line every `keepalive_s`. An event whose frame would pass `max_frame_bytes` is
    sent as a `CUSTOM` event `turnkit.frame_dropped` instead (its `type`, size and, with
    the frame's id, the turnkit event's `seq`); a tool result keeps its event with a
    placeholder for its content; events that open or close a run, step, message or tool
    call go out whatever their size. The run carries on.
    """
    if max_frame_bytes < 1:
        raise ConfigurationError("max_frame_bytes must be at least 1")
    router = APIRouter(
        prefix=prefix,
        tags=["ag-ui"],
        responses=_PROBLEMS,
        route_class=ProblemRoute,
        dependencies=[Depends(opened(runtime))],  # a runtime nobody opened opens here
    )
    # Plain defaults, not `Annotated` aliases: the annotations are strings (postponed), and
    # FastAPI resolves them in this module's globals, where the closure's names are not.
    caller, request_deps_of = Depends(caller_of(auth)), Depends(deps or _no_deps)

    @router.post(
        "/run",
        response_class=EventSourceResponse,
        summary="Run the agent: AG-UI RunAgentInput in, AG-UI events out (SSE)",
    )
    async def run(
        body: RunAgentInput,
        last_event_id: Annotated[str | None, Header()] = None,
        principal: Caller = caller,
        request_deps: Any = request_deps_of,
    ) -> Response:
        cursor = None if last_event_id is None else parse_cursor(last_event_id)
        sent = asyncio.Event()
        extra: dict[str, Any] = {} if deps is None else {"deps": request_deps}
        record, after = await _turn_of(runtime, body, cursor, principal, extra, sent)
        check_cursor(record, after)
        return await _respond(
            runtime, body, record, after, sent, keepalive_s=keepalive_s, max_bytes=max_frame_bytes
        )

    return router


async def _turn_of(
    runtime: SessionRuntime,
    body: RunAgentInput,
    cursor: int | None,
    principal: Caller,
    extra: dict[str, Any],
    sent: asyncio.Event,
) -> tuple[TurnRecord, int]:
    """The run's turn and the cursor to stream after; starts or resumes it if asked.

    A turn it starts takes its first step once `sent` is set (the stream's opening
    written). `extra` carries the request's `deps`, when the app gives them.
    """
    known = await runtime.store.get_session(SessionId(body.thread_id))
    if known is not None and not sees(principal, known):
        raise SessionNotFoundError(f"no thread {body.thread_id!r}", session_id=body.thread_id)
    if body.resume is not None:
        if known is None:
            raise SessionNotFoundError(f"no thread {body.thread_id!r}", session_id=body.thread_id)
        return await _resume(runtime, body, cursor, known, {**extra, "principal": principal})
    if cursor is not None:  # a reconnect: its turn exists already, nothing is written
        return await _turn_of_run(runtime, body.thread_id, body.run_id), cursor
    content = user_content(body.messages)
    await _refuse_when_paused(runtime, body.thread_id, body.run_id)
    submission = await runtime.start(
        body.thread_id,
        content,
        agent=body.forwarded_props.agent,
        effort=body.forwarded_props.effort,
        request_id=body.run_id,
        principal=principal,
        hold_until=sent,
        anonymous=principal is None,
        **extra,
    )
    return await runtime.turn(submission.turn_id), 0


async def _respond(
    runtime: SessionRuntime,
    body: RunAgentInput,
    record: TurnRecord,
    after: int,
    sent: asyncio.Event,
    *,
    keepalive_s: float,
    max_bytes: int,
) -> SseResponse:
    """The run's SSE response: its opening, then the turn's events after `after`."""
    translator = Translator(
        thread_id=body.thread_id,
        run_id=body.run_id,
        turn_id=record.turn_id,
        client=client_view(body.messages),
        now=runtime.clock.now,
    )
    opening = await _opening(runtime, translator, record.turn_id, after, body.resume is None)
    view = BufferView(runtime.replay, runtime.store)
    reader = TurnReader(
        store=runtime.store,
        buffer=view,
        clock=runtime.clock,
        idle_window_s=runtime.config.idle_window_s,
        keepalive_s=keepalive_s,
    )
    batches = cast(
        AsyncGenerator[object, None],
        reader.follow_batches(record.turn_id, after_seq=after),
    )
    bound = Bound(max_bytes, record.turn_id)

    def farewell(_: bytes | None) -> list[bytes]:  # nothing once the run ended
        return [bound.frame(out, None) for out in translator.abandon(_SHUTTING_DOWN, SHUTDOWN)]

    stream = stream_run(translator, opening, batches, view, bound)
    # Keep-alives are single comment lines from the reader: no ping.
    return SseResponse(
        set_once_sent(stream, sent),
        headers={"X-Turn-Id": record.turn_id, "Cache-Control": "no-store"},
        farewell=farewell,
    )


async def _resume(
    runtime: SessionRuntime,
    body: RunAgentInput,
    cursor: int | None,
    thread: SessionRecord,
    extra: dict[str, Any],
) -> tuple[TurnRecord, int]:
    """Answer the interrupt `resume` names; the stream starts after it (or at the cursor)."""
    entries = body.resume or ()
    if len(entries) != 1:
        raise InvalidInputError(
            f"a turnkit run raises one interrupt at a time: send exactly one `resume` entry, "
            f"not {len(entries)}"
        )
    record, request = await _find_request(runtime, body.thread_id, entries[0].interrupt_id)
    check_answerer(request, record, thread, extra["principal"])  # an approval a role answers
    resolution = resolution_of(request, entries[0])
    after = request.seq if cursor is None else cursor
    check_cursor(record, after)
    try:
        if "deps" in extra:
            extra = {**extra, "deps": answer_deps(record, extra["principal"], extra["deps"])}
        await runtime.resume(record.turn_id, request.request_id, resolution, **extra)
    except PauseAnsweredError:
        # A reconnect finds it answered already. So does a client dismissing an interrupt
        # whose turn a Stop ended meanwhile: its run ends `cancelled` again, which clears
        # the client's pending interrupt. Anything else is a 409.
        if cursor is None and not await _stopped(runtime, record, entries[0]):
            raise
    return record, after


async def _stopped(runtime: SessionRuntime, record: TurnRecord, entry: ResumeEntry) -> bool:
    """Whether `entry` dismisses an interrupt of a turn that a Stop ended."""
    if entry.status != "cancelled":
        return False
    return (await runtime.turn(record.turn_id)).status == "cancelled"


async def _opening(
    runtime: SessionRuntime, translator: Translator, turn_id: TurnId, after: int, restate: bool
) -> list[AgUi]:
    """RUN_STARTED and the state the log holds up to the cursor (open steps, a pause)."""
    past: list[StreamEvent] = []
    if after > 0:
        async for stored in runtime.store.read_events(turn_id, after_seq=0):
            if stored.seq > after:
                continue  # read to the end: the reader sends these
            try:
                past.append(stored.decode())
            except ValueError:
                log.warning("skipped unreadable event %s of turn %s", stored.seq, turn_id)
    translator.restore(past)
    record = await runtime.turn(turn_id)
    pending = project(turn_id, past).pending  # what the client's view of the log waits for
    paused = restate and record.status in _AWAITING and record.last_seq == after
    return translator.opening(
        last=past[-1] if past else None, waits_for=pending if paused else None
    )


# ── the run's turn ────────────────────────────────────────────────────────────────────


async def _turn_of_run(runtime: SessionRuntime, thread_id: str, run_id: str) -> TurnRecord:
    for record in await runtime.store.list_turns(SessionId(thread_id)):
        if record.request_id == run_id:
            return record
    raise TurnNotFoundError(f"thread {thread_id!r} has no run {run_id!r} to reconnect to")


async def _refuse_when_paused(runtime: SessionRuntime, thread_id: str, run_id: str) -> None:
    """AG-UI: a thread with an open interrupt takes only a run that resumes it."""
    for record in await runtime.store.list_turns(SessionId(thread_id)):
        if record.status in _AWAITING and record.request_id != run_id:
            raise InvalidInputError(
                f"thread {thread_id!r} has a run paused on an interrupt (turn {record.turn_id}): "
                "send `resume` with its interrupt id",
                turn_id=record.turn_id,
            )


async def _find_request(
    runtime: SessionRuntime, thread_id: str, request_id: str
) -> tuple[TurnRecord, PendingDecision]:
    """The turn of the thread that asked `request_id` (answered or not), newest first.

    Turns that have not ended are read first: a resume almost always names one of them.
    """
    for ended in (False, True):
        view = await runtime.view(thread_id, ended=ended)
        for turn in reversed(view.turns):
            for decision in turn.decisions:
                if decision.request_id == request_id:
                    return await runtime.turn(turn.turn_id), decision
    raise PauseNotFoundError(
        f"thread {thread_id!r} has no interrupt {request_id!r}", request_id=request_id
    )
