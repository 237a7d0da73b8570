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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal, assert_never, cast

from fastapi import APIRouter, Depends, Header, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic.alias_generators import to_camel
from sse_starlette import EventSourceResponse, ServerSentEvent

from turnkit.blocks import ImagePart, TextPart
from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    PauseAnsweredError,
    PauseNotFoundError,
    SessionNotFoundError,
    TurnNotFoundError,
)
from turnkit.events import (
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    CheckpointCreatedEvent,
    ClarificationRequestedEvent,
    CompactionCompletedEvent,
    CompactionStartedEvent,
    DoneEvent,
    DurableEvent,
    ErrorEvent,
    GuardrailEvent,
    HeartbeatEvent,
    InputGuidedEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    MessageCitationsEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageEntitiesEvent,
    MessageSnapshotEvent,
    PluginEmittedEvent,
    PluginSignalEvent,
    ProviderCascadeEvent,
    RunFinishedEvent,
    SessionRenamedEvent,
    StepEndEvent,
    StepStartEvent,
    StreamEvent,
    TasksUpdatedEvent,
    ThinkingCompleteEvent,
    ThinkingDeltaEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
    TurnStartedEvent,
    UsageEvent,
    decode_event,
)
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import CLARIFY_TOOL, Answer, Approve, Deny, Resolution
from turnkit.projection import PendingDecision, decision_of, project
from turnkit.replay import BufferEntry, ReplayBuffer
from turnkit.runtime import SessionRuntime
from turnkit.runtime.reader import (
    KEEPALIVE,
    Frame,
    TurnReader,
    check_cursor,
    parse_cursor,
    set_once_sent,
)
from turnkit.states import TurnStatus
from turnkit.store import Store, TurnRecord

__all__ = (
    "ForwardedProps",
    "InputMessage",
    "InputToolCall",
    "ResumeEntry",
    "RunAgentInput",
    "create_agui_router",
)

log = logging.getLogger("turnkit.protocols")

_NO_PING_S: Final = 10**9
_AWAITING: Final[frozenset[TurnStatus]] = frozenset({"awaiting_approval", "awaiting_input"})
_DISMISSED: Final = "(The person dismissed the question without answering.)"
_PROBLEMS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"content": {"application/problem+json": {}}} for status in (400, 404, 409, 416, 422)
}
Principal = str | None
AuthDependency = Callable[..., Principal | Awaitable[Principal]]

# ── RunAgentInput: camelCase on the wire; unknown fields are accepted, as AG-UI allows ──

_WIRE = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)


class _Function(BaseModel):
    model_config = _WIRE
    name: str
    arguments: str = ""


class InputToolCall(BaseModel):
    """A tool call inside an assistant message the client holds."""

    model_config = _WIRE
    tool_call_id: str = Field(alias="id")
    function: _Function


class InputMessage(BaseModel):
    """One message of the client's conversation; only what the adapter reads is checked."""

    model_config = _WIRE
    message_id: str = Field(default="", alias="id")
    role: str
    content: JsonValue = None
    tool_calls: tuple[InputToolCall, ...] = ()
    tool_call_id: str | None = None


class ResumeEntry(BaseModel):
    """The answer to one interrupt: `payload` is `{"approved": bool}` or `{"answer": str}`."""

    model_config = _WIRE
    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: JsonValue = None


class ForwardedProps(BaseModel):
    """What the adapter reads of `forwardedProps`: a hosted agent's name and the effort."""

    model_config = _WIRE
    agent: str | None = None
    effort: Literal["off", "low", "medium", "high"] | None = None


class RunAgentInput(BaseModel):
    """AG-UI's run request. `tools`, `context` and `state` are accepted and not used."""

    model_config = _WIRE
    thread_id: str = Field(min_length=1, max_length=128)
    run_id: str = Field(min_length=1, max_length=128)
    parent_run_id: str | None = None
    state: JsonValue = None
    messages: tuple[InputMessage, ...] = ()
    tools: tuple[JsonValue, ...] = ()
    context: tuple[JsonValue, ...] = ()
    forwarded_props: ForwardedProps = Field(default_factory=ForwardedProps)
    resume: tuple[ResumeEntry, ...] | None = None


# ── the route ─────────────────────────────────────────────────────────────────────────


async def _anonymous() -> Principal:
    return None


async def _no_deps() -> None:
    return None


def create_agui_router(
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = _anonymous,
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
    router = APIRouter(prefix=prefix, tags=["ag-ui"], responses=_PROBLEMS)
    # Plain defaults, not `Annotated` aliases: the annotations are strings (postponed), and
    # FastAPI resolves them in this module's globals, where the closure's names are not.
    caller, request_deps_of = Depends(auth), Depends(deps or _no_deps)

    async def turn_of(
        body: RunAgentInput,
        cursor: int | None,
        principal: Principal,
        request_deps: Any,
        sent: asyncio.Event,
    ) -> tuple[TurnRecord, int]:
        """The run's turn and the cursor to stream after; starts or resumes it if asked.

        A turn it starts takes its first step once `sent` is set (the stream's opening
        written).
        """
        extra: dict[str, Any] = {} if deps is None else {"deps": request_deps}
        known = await runtime.store.get_session(SessionId(body.thread_id))
        if known is not None and known.principal not in (None, principal):
            raise SessionNotFoundError(f"no thread {body.thread_id!r}", session_id=body.thread_id)
        if body.resume is not None:
            if known is None:
                raise SessionNotFoundError(
                    f"no thread {body.thread_id!r}", session_id=body.thread_id
                )
            return await _resume(runtime, body, cursor, extra)
        if cursor is not None:  # a reconnect: its turn exists already, nothing is written
            return await _turn_of_run(runtime, body.thread_id, body.run_id), cursor
        content = _user_content(body.messages)
        await _refuse_when_paused(runtime, body.thread_id, body.run_id)
        submission = await runtime.start(
            body.thread_id,
            content,
            agent=body.forwarded_props.agent,
            effort=body.forwarded_props.effort,
            request_id=body.run_id,
            principal=principal,
            hold_until=sent,
            **extra,
        )
        return await runtime.turn(submission.turn_id), 0

    @router.post(
        "/run",
        response_class=EventSourceResponse,
        summary="Run the agent: AG-UI RunAgentInput in, AG-UI events out (SSE)",
    )
    async def run(
        body: RunAgentInput,
        last_event_id: Annotated[str | None, Header()] = None,
        principal: Principal = caller,
        request_deps: Any = request_deps_of,
    ) -> Response:
        cursor = None if last_event_id is None else parse_cursor(last_event_id)
        sent = asyncio.Event()
        record, after = await turn_of(body, cursor, principal, request_deps, sent)
        check_cursor(record, after)
        translator = _Translator(
            thread_id=body.thread_id,
            run_id=body.run_id,
            turn_id=record.turn_id,
            client=_client_view(body.messages),
            now=runtime.clock.now,
        )
        opening = await _opening(runtime, translator, record.turn_id, after, body.resume is None)
        view = _View(runtime.replay, runtime.store)
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
        bound = _Bound(max_frame_bytes, record.turn_id)
        return EventSourceResponse(
            set_once_sent(_stream(translator, opening, batches, view, bound), sent),
            headers={"X-Turn-Id": record.turn_id, "Cache-Control": "no-store"},
            # Keep-alives are single comment lines from the reader; sse-starlette's ping
            # (`None` means its 15 s default) ends with a blank line: never let it fire.
            ping=_NO_PING_S,
            sep="\n",  # @ag-ui/client splits frames on "\n\n" only (see `_frame`)
        )

    return router


async def _resume(
    runtime: SessionRuntime, body: RunAgentInput, cursor: int | None, extra: dict[str, Any]
) -> tuple[TurnRecord, int]:
    """Answer the interrupt `resume` names; the stream starts after it (or at the cursor)."""
    entries = body.resume or ()
    if len(entries) != 1:
        raise InvalidInputError(
            f"a turnkit run raises one interrupt at a time: send exactly one `resume` entry, "
            f"not {len(entries)}"
        )
    record, request = await _find_request(runtime, body.thread_id, entries[0].interrupt_id)
    resolution = _resolution(request, entries[0])
    after = request.seq if cursor is None else cursor
    check_cursor(record, after)
    try:
        await runtime.resume(record.turn_id, request.request_id, resolution, **extra)
    except PauseAnsweredError:
        if cursor is None:  # a reconnect finds it answered already; anything else is a 409
            raise
    return record, after


async def _opening(
    runtime: SessionRuntime, translator: _Translator, turn_id: TurnId, after: int, restate: bool
) -> list[_AgUi]:
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


async def _stream(
    translator: _Translator,
    opening: list[_AgUi],
    batches: AsyncGenerator[object, None],
    view: _View,
    bound: _Bound,
) -> AsyncIterator[ServerSentEvent | bytes]:
    async with contextlib.aclosing(batches):  # closing the reader leaves the turn running
        for out in opening:
            yield bound.frame(out, None)
        while not translator.finished:  # a pause ends the run (the reader would wait)
            item = await anext(batches, None)
            if item is None:
                break
            if item is KEEPALIVE:
                yield b": keep-alive\n"  # a comment line: no client dispatches an event
                continue
            assert isinstance(item, list)
            if written := _translated(translator, item, view, bound):
                yield written  # the frames ready together, in one write
        for out in translator.abandon():
            yield bound.frame(out, None)


def _translated(translator: _Translator, frames: list[Frame], view: _View, bound: _Bound) -> bytes:
    """The AG-UI frames of a batch of turnkit frames (up to the end of the run)."""
    written: list[bytes] = []
    for item in frames:
        translator.notice(view.views, view.seq)
        outs = translator.feed(item.data)
        for index, out in enumerate(outs):
            written.append(bound.frame(out, item.seq if index == len(outs) - 1 else None).encode())
        if translator.finished:
            break
    return b"".join(written)


def _frame(event: _AgUi, seq: int | None) -> ServerSentEvent:
    """One AG-UI event; the last frame of a durable turnkit event carries its seq as id."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    # Lines end with "\n": the response's `sep` reaches only the frames it builds itself.
    return ServerSentEvent(data=data, id=None if seq is None else str(seq), sep="\n")


_STRUCTURAL: Final = frozenset(
    {
        "RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "STEP_STARTED", "STEP_FINISHED",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_END", "TOOL_CALL_START", "TOOL_CALL_END",
    }
)  # fmt: skip
"""Events a client's state machine needs: sent whatever their size."""


@dataclass(frozen=True, slots=True)
class _Bound:
    """How far one frame may grow; a larger one goes out as `turnkit.frame_dropped`."""

    max_bytes: int
    turn_id: str

    def frame(self, event: _AgUi, seq: int | None) -> ServerSentEvent:
        sent = _frame(event, seq)
        size = len(str(sent.data).encode())
        kind = event.get("type")
        if size <= self.max_bytes or kind in _STRUCTURAL:
            return sent
        # Losing one frame costs less than losing a turn that has run for minutes; the
        # stand-in keeps the frame's id, so a resume goes on after it.
        log.warning(
            "dropped an oversized AG-UI frame of turn %s (%s, %d bytes > %d)",
            self.turn_id, kind, size, self.max_bytes,
        )  # fmt: skip
        if kind == "TOOL_CALL_RESULT":  # the call keeps its result message, not the content
            too_large = f"[a result of {size} bytes, too large to stream]"
            metadata: _AgUi = {"turnkit": {"droppedBytes": size}}
            return _frame({**event, "content": too_large, "metadata": metadata}, seq)
        dropped: _AgUi = {"type": kind, "bytes": size}
        if seq is not None:
            dropped["seq"] = seq  # the turnkit event it stood for
        stand_in: _AgUi = {
            "type": "CUSTOM",
            "timestamp": event.get("timestamp"),
            "name": "turnkit.frame_dropped",
            "value": dropped,
        }
        return _frame(stand_in, seq)


class _View:
    """The runtime's `ReplayBuffer` as one reader uses it, counting the views it takes.

    The reader takes the buffer's tail before it reads the Store; what was written before
    reaches it as `message.snapshot`. A later tail (after a buffer outage) comes without
    snapshots: deltas before it were lost. `seq` is the turn's last event right after that
    later tail; a block whose first delta comes after a newer durable event is whole here.
    """

    def __init__(self, inner: ReplayBuffer, store: Store) -> None:
        self.inner, self.store = inner, store
        self.views = 0
        self.seq = sys.maxsize

    async def tail(self, turn_id: TurnId) -> str:
        self.views += 1
        self.seq = sys.maxsize  # trust no delta until the seq is known
        position = await self.inner.tail(turn_id)
        if self.views > 1 and (record := await self.store.get_turn(turn_id)) is not None:
            self.seq = record.last_seq
        return position

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        return await self.inner.read(turn_id, after=after, wait_s=wait_s, limit=limit)

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        await self.inner.publish(turn_id, entries)

    async def release(self, turn_id: TurnId) -> None:
        await self.inner.release(turn_id)

    async def ping(self) -> None:
        await self.inner.ping()

    async def drop(self, turn_id: TurnId) -> None:
        await self.inner.drop(turn_id)

    async def close(self) -> None:
        pass  # the runtime owns the buffer


# ── input ─────────────────────────────────────────────────────────────────────────────


def _user_content(messages: Sequence[InputMessage]) -> str | list[TextPart | ImagePart]:
    """The last user message's content: text, or text and image parts."""
    for message in reversed(messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        if isinstance(message.content, list):
            return [_part(part) for part in message.content]
        raise InvalidInputError("a user message's content is text or a list of parts")
    raise InvalidInputError("the input has no user message: its last one is the turn's content")


def _part(part: JsonValue) -> TextPart | ImagePart:
    """An AG-UI content part as a turnkit one (text, or an image by URL or inline data)."""
    fields = part if isinstance(part, dict) else {}
    source = fields.get("source")
    try:
        if fields.get("type") == "text" and isinstance(text := fields.get("text"), str):
            return TextPart(text=text)
        if fields.get("type") == "image" and isinstance(source, dict):
            where = {"url": "url", "data": "data"}.get(str(source.get("type")))
            if where is not None:
                return ImagePart.model_validate(
                    {where: source.get("value"), "media_type": source.get("mimeType", "image/png")}
                )
    except ValidationError as exc:
        raise InvalidInputError(f"an image part does not fit: {exc.errors()[0]['msg']}") from exc
    raise InvalidInputError(
        f"content parts of type {fields.get('type')!r} are not supported (text and image are)"
    )


def _resolution(request: PendingDecision, entry: ResumeEntry) -> Resolution:
    """The turnkit answer a resume entry gives."""
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    try:
        if request.kind == "approval":
            if entry.status == "cancelled":
                return Deny(note="The person cancelled instead of approving.")
            approved, note = payload.get("approved"), payload.get("note")
            if isinstance(approved, bool) and "editedArgs" not in payload:
                text = note if isinstance(note, str) else None
                return Approve(note=text) if approved else Deny(note=text)
            raise InvalidInputError(
                'answer an approval with the payload {"approved": true | false, "note"?: "…"} '
                "(edited arguments are not supported)"
            )
        if entry.status == "cancelled":
            return Answer(text=_DISMISSED)
        answer = entry.payload if isinstance(entry.payload, str) else payload.get("answer")
        if isinstance(answer, str):
            return Answer(text=answer)
        raise InvalidInputError('answer a question with the payload {"answer": "…"}')
    except ValidationError as exc:
        raise InvalidInputError(
            f"the resume payload does not fit: {exc.errors()[0]['msg']}"
        ) from exc


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


# ── turnkit events → AG-UI events ─────────────────────────────────────────────────────

_AgUi = dict[str, JsonValue]
_APPROVAL_SCHEMA: Final[_AgUi] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["approved"],
}


def _ms(ts: datetime) -> int:
    """Integer milliseconds since the epoch (AG-UI timestamps)."""
    return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@dataclass(slots=True, kw_only=True)
class _ClientView:
    """What the client says it holds already (its `messages`): only the rest is sent."""

    texts: dict[str, str]
    arguments: dict[str, str]
    results: set[str]


def _client_view(messages: Sequence[InputMessage]) -> _ClientView:
    view = _ClientView(texts={}, arguments={}, results=set())
    for message in messages:
        if message.role == "assistant":
            if isinstance(message.content, str) and message.message_id:
                view.texts[message.message_id] = message.content
            for call in message.tool_calls:
                view.arguments[call.tool_call_id] = call.function.arguments
        elif message.role == "tool" and message.tool_call_id:
            view.results.add(message.tool_call_id)
    return view


@dataclass(slots=True)
class _Block:
    """A text block of this stream: the text the client holds, whether START was sent."""

    sent: str = ""
    opened: bool = False
    held: bool = False
    """Its deltas are not forwarded: the rest goes out with its `message.complete`."""


class _Translator:
    """Turns one turn's events into the AG-UI events of one run (one HTTP response)."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        turn_id: TurnId,
        client: _ClientView,
        now: Callable[[], datetime],
    ) -> None:
        self.run: _AgUi = {"threadId": thread_id, "runId": run_id}
        self.turn_id = turn_id
        self.client = client
        self.now = now
        self.steps: list[str] = []
        self.blocks: dict[str, _Block] = {}
        self.parents: dict[str, str] = {}  # generation id → text block of the same call
        self.ask_user: str | None = None
        self.error: ErrorEvent | None = None
        self.usage: UsageEvent | None = None
        self.model: str | None = None
        self.views = 0
        self.trusted_after: int | None = None  # set: only blocks begun after it are whole
        self.finished = False

    # ── state ──

    def restore(self, past: Sequence[StreamEvent]) -> None:
        """Take the state the log holds up to the cursor (events the client has)."""
        for event in past:
            self._remember(event)
            if isinstance(event, StepStartEvent):
                self.steps.append(event.step)
            elif isinstance(event, StepEndEvent) and event.step in self.steps:
                self.steps.remove(event.step)

    def notice(self, views: int, seq: int) -> None:
        """A later view of the buffer (after an outage): deltas before it were lost."""
        if views != self.views:
            self.views = views
            if views > 1:
                self.trusted_after = seq
                for block in self.blocks.values():
                    block.held = True

    def _remember(self, event: StreamEvent) -> None:
        match event:
            case MessageCompleteEvent(generation_id=str() as generation):
                self.parents[generation] = event.block.block_id
            case ToolStartedEvent() if event.block.tool_name == CLARIFY_TOOL:
                self.ask_user = event.block.tool_call_id
            case ErrorEvent():
                self.error = event
            case UsageEvent():
                self.usage = event
            case RunFinishedEvent():
                self.model = event.model
            case _:
                pass

    # ── the run's edges ──

    def opening(
        self, *, last: StreamEvent | None, waits_for: PendingDecision | None
    ) -> list[_AgUi]:
        """RUN_STARTED, the steps still open, and the run's end (or its pause) again."""
        now = self.now()
        out = [
            self._ev(
                "RUN_STARTED", now, **self.run, metadata={"turnkit": {"turnId": self.turn_id}}
            ),
            *(self._ev("STEP_STARTED", now, stepName=step) for step in self.steps),
        ]
        if isinstance(last, DoneEvent):
            out += self._ending(last, now)
        elif waits_for is not None:
            out += self._interrupt(waits_for, now)
        return out

    def abandon(self) -> list[_AgUi]:
        """The reader stopped before the run's end (the turn was deleted): end it."""
        if self.finished:
            return []
        self.finished, now = True, self.now()
        message = "the turn's event stream ended before the turn did"
        return [
            *self._close(now),
            self._ev("RUN_ERROR", now, message=message, code="internal-error"),
        ]

    def _end_blocks(self, ts: datetime) -> list[_AgUi]:
        """End the open messages of blocks that will not complete; forget held ones."""
        out = [self._ev("TEXT_MESSAGE_END", ts, messageId=block_id)
               for block_id, block in self.blocks.items() if block.opened]  # fmt: skip
        self.blocks.clear()
        return out

    def _close(self, ts: datetime) -> list[_AgUi]:
        out = self._end_blocks(ts)
        out += [self._ev("STEP_FINISHED", ts, stepName=step) for step in reversed(self.steps)]
        self.steps.clear()
        return out

    def _ending(self, done: DoneEvent, ts: datetime) -> list[_AgUi]:
        self.finished = True
        out = self._close(ts)
        match done.status:
            case "succeeded":
                result: _AgUi = {"turnId": self.turn_id}
                extra: _AgUi = {}
                if (u := self.usage) is not None:
                    result["usage"] = {
                        "modelCalls": u.model_calls,
                        "inputTokens": u.input_tokens,
                        "outputTokens": u.output_tokens,
                        "cachedTokens": u.cached_tokens,
                        "costUsd": u.cost_usd,
                    }
                    usage: _AgUi = {
                        "inputTokens": u.input_tokens,
                        "outputTokens": u.output_tokens,
                        "totalTokens": u.input_tokens + u.output_tokens,
                        "cachedInputTokens": u.cached_tokens,
                    }
                    extra["usage"] = [usage | ({"model": self.model} if self.model else {})]
                outcome: _AgUi = {"type": "success"}
                out.append(self._ev("RUN_FINISHED", ts, **self.run, outcome=outcome,
                                    result=result, **extra))  # fmt: skip
            case "cancelled":
                out.append(self._ev("RUN_FINISHED", ts, **self.run, outcome={"type": "cancelled"}))
            case "failed" | "timed_out":
                message = self.error.message if self.error else f"the turn {done.status}"
                code = self.error.code if self.error else (done.error_code or done.status)
                out.append(self._ev("RUN_ERROR", ts, message=message, code=code))
            case _:
                assert_never(done.status)
        return out

    def _interrupt(self, request: PendingDecision, ts: datetime) -> list[_AgUi]:
        self.finished = True
        turnkit: _AgUi = {"turnId": self.turn_id}
        interrupt: _AgUi = {"id": request.request_id}
        if request.kind == "approval":
            interrupt |= {
                "reason": "tool_call",
                "message": request.summary,
                "toolCallId": request.tool_call_id,
                "responseSchema": _APPROVAL_SCHEMA,
            }
            turnkit |= {
                "kind": "approval",
                "toolCallId": request.tool_call_id,
                "toolName": request.tool_name,
                "arguments": request.arguments,
                "summary": request.summary,
            }
        else:
            answer: _AgUi = {"type": "string"}
            if request.choices:
                answer["examples"] = list(request.choices)
            schema: _AgUi = {"type": "object", "properties": {"answer": answer}}
            interrupt |= {
                "reason": "input_required",
                "message": request.question,
                "responseSchema": schema | {"required": ["answer"]},
            }
            turnkit |= {
                "kind": "clarification",
                "question": request.question,
                "choices": list(request.choices),
            }
            if self.ask_user is not None:
                interrupt["toolCallId"] = turnkit["toolCallId"] = self.ask_user
        interrupt["metadata"] = {"turnkit": turnkit}
        outcome: _AgUi = {"type": "interrupt", "interrupts": [interrupt]}
        return [*self._close(ts), self._ev("RUN_FINISHED", ts, **self.run, outcome=outcome)]

    # ── events ──

    def feed(self, data: bytes) -> list[_AgUi]:
        """The AG-UI events for one turnkit event's wire JSON (none if it is unreadable)."""
        try:
            event = decode_event(data)
        except ValueError:
            log.warning("skipped an unreadable event of turn %s", self.turn_id)
            return []
        self._remember(event)
        out = self._map(event, cast(_AgUi, json.loads(data)))
        if isinstance(event, DurableEvent) and (self.trusted_after or 0) < event.seq:
            self.trusted_after = None  # committed after the view: later blocks are whole
        return out

    def _map(self, event: StreamEvent, raw: _AgUi) -> list[_AgUi]:  # noqa: C901 - a case per kind
        match event:
            case StepStartEvent():
                self.steps.append(event.step)
                return [self._ev("STEP_STARTED", event.ts, stepName=event.step)]
            case StepEndEvent():
                if event.step not in self.steps:
                    return []
                self.steps.remove(event.step)
                return [self._ev("STEP_FINISHED", event.ts, stepName=event.step)]
            case MessageDeltaEvent() | MessageSnapshotEvent():
                return self._text(event)
            case MessageCompleteEvent():
                return self._complete(event)
            case ToolStartedEvent():
                return self._tool_call(event)
            case ToolCompletedEvent() | ToolFailedEvent():
                return self._tool_result(event)
            case ProviderCascadeEvent():  # the failed rung's block never completes: end it
                return [*self._end_blocks(event.ts), self._custom(event, raw)]
            case TurnRecoveringEvent():  # a new attempt may write the open block again
                for block in self.blocks.values():
                    block.held = True
                return [self._custom(event, raw)]
            case ApprovalRequestedEvent() | ClarificationRequestedEvent():
                return [self._custom(event, raw), *self._interrupt(decision_of(event), event.ts)]
            case DoneEvent():
                return self._ending(event, event.ts)
            case (
                TurnStartedEvent() | InputGuidedEvent() | ThinkingDeltaEvent()
                | ThinkingCompleteEvent() | ToolDeltaEvent() | JobDispatchedEvent()
                | JobProgressEvent() | JobCompletedEvent() | MessageCitationsEvent()
                | MessageEntitiesEvent() | GuardrailEvent() | CompactionStartedEvent()
                | CompactionCompletedEvent() | UsageEvent() | CheckpointCreatedEvent()
                | HeartbeatEvent() | ToolInDoubtEvent() | TasksUpdatedEvent()
                | RunFinishedEvent() | ErrorEvent() | PluginEmittedEvent() | PluginSignalEvent()
                | SessionRenamedEvent() | BudgetPausedEvent()
            ):  # fmt: skip
                # A budget pause keeps the run open: the turn goes on by itself once the
                # limit is raised (nothing for the client to answer).
                return [self._custom(event, raw)]
            case _:
                assert_never(event)

    def _text(self, event: MessageDeltaEvent | MessageSnapshotEvent) -> list[_AgUi]:
        """A delta appends; a snapshot (a reader joining mid-block) says what is there."""
        block_id = event.block_id
        block = self.blocks.get(block_id)
        if block is None:
            block = self.blocks[block_id] = _Block(sent=self.client.texts.get(block_id, ""))
            # A delta with no snapshot before it may follow deltas this stream never saw.
            unsure = block_id in self.client.texts or self.trusted_after is not None
            block.held = isinstance(event, MessageDeltaEvent) and unsure
        whole = event.text if isinstance(event, MessageSnapshotEvent) else block.sent + event.text
        if block.held or not whole.startswith(block.sent):
            block.held = True  # the rest goes out with `message.complete`
            return []
        out = []
        if not block.opened:
            block.opened = True
            out.append(
                self._ev("TEXT_MESSAGE_START", event.ts, messageId=block_id, role="assistant")
            )
        if rest := whole[len(block.sent) :]:
            out.append(self._ev("TEXT_MESSAGE_CONTENT", event.ts, messageId=block_id, delta=rest))
        block.sent = whole
        return out

    def _complete(self, event: MessageCompleteEvent) -> list[_AgUi]:
        text, block_id = event.block.text, event.block.block_id
        block = self.blocks.pop(block_id, None) or _Block(sent=self.client.texts.get(block_id, ""))
        out = []
        if not block.opened:
            out.append(
                self._ev("TEXT_MESSAGE_START", event.ts, messageId=block_id, role="assistant")
            )
        if not text.startswith(block.sent):
            log.warning("the client holds text of block %s that the block does not start with",
                        block_id)  # fmt: skip
        elif rest := text[len(block.sent) :]:
            out.append(self._ev("TEXT_MESSAGE_CONTENT", event.ts, messageId=block_id, delta=rest))
        out.append(self._ev("TEXT_MESSAGE_END", event.ts, messageId=block_id))
        return out

    def _tool_call(self, event: ToolStartedEvent) -> list[_AgUi]:
        call, ts = event.block, event.ts
        start: _AgUi = {"toolCallId": call.tool_call_id, "toolCallName": call.tool_name}
        if event.generation_id in self.parents:
            start["parentMessageId"] = self.parents[event.generation_id]
        arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
        held = self.client.arguments.get(call.tool_call_id, "")
        out = [self._ev("TOOL_CALL_START", ts, **start)]
        if arguments.startswith(held) and (rest := arguments[len(held) :]):
            out.append(self._ev("TOOL_CALL_ARGS", ts, toolCallId=call.tool_call_id, delta=rest))
        out.append(self._ev("TOOL_CALL_END", ts, toolCallId=call.tool_call_id))
        return out

    def _tool_result(self, event: ToolCompletedEvent | ToolFailedEvent) -> list[_AgUi]:
        if event.tool_call_id in self.client.results:
            return []  # the client has it already
        result = event.result
        fields: _AgUi = {
            "messageId": f"result_{event.tool_call_id}",
            "toolCallId": event.tool_call_id,
            "role": "tool",
        }
        if isinstance(event, ToolFailedEvent) or result.is_error:
            fields["content"] = result.error or "the tool failed"
            code = event.code if isinstance(event, ToolFailedEvent) else "tool-error"
            fields["metadata"] = {"turnkit": {"isError": True, "code": code}}
        elif isinstance(result.output, str):
            fields["content"] = result.output
        else:
            fields["content"] = json.dumps(result.output, ensure_ascii=False)
        return [self._ev("TOOL_CALL_RESULT", event.ts, **fields)]

    def _custom(self, event: StreamEvent, raw: _AgUi) -> _AgUi:
        return self._ev("CUSTOM", event.ts, name=f"turnkit.{event.type}", value=raw)

    @staticmethod
    def _ev(kind: str, ts: datetime, **fields: JsonValue) -> _AgUi:
        return {"type": kind, "timestamp": _ms(ts), **fields}
