"""The Vercel AI SDK UI message stream (v1) over turnkit turns.

```python
app = FastAPI()
app.include_router(create_ai_sdk_router(runtime))  # POST /api/chat, GET /api/chat/{id}/stream
install_problem_handlers(app)
```

A chat (`id`) is a turnkit session and each assistant message is one turn: its id is the
turn id. `UIMessageStreamTranslator` turns a turn's events into the SDK's chunks; the
routes feed it from `SessionRuntime.reader()`, answer tool approvals through the SDK's own
approval parts, and rebuild a running turn's message for `resumeStream`.

The request models live in `_ai_sdk_wire`, the event mapping in `_ai_sdk_translate` and the
response's body (reading, lines, size bound) in `_ai_sdk_stream`.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

from pydantic import ValidationError

from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    PauseAnsweredError,
    SessionNotFoundError,
    missing_extra,
)

try:
    from fastapi import APIRouter, Depends, Path, Response
    from sse_starlette import EventSourceResponse  # the routes' documented response class
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The AI SDK route", "fastapi", exc) from exc

from turnkit._problems import ProblemRoute, opened
from turnkit._sse_response import SseResponse
from turnkit.ids import SESSION_ID_PATTERN, SessionId, TurnId
from turnkit.protocols._ai_sdk_stream import DONE_LINE, PAUSED, Replies, line
from turnkit.protocols._ai_sdk_translate import UIMessageStreamTranslator
from turnkit.protocols._ai_sdk_wire import ChatRequest, UIMessage, pending_answer, user_content
from turnkit.protocols._caller import Caller, caller_of, sees
from turnkit.runtime import SessionRuntime
from turnkit.runtime.answerers import answer_deps, check_answerer
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.reader import set_once_sent
from turnkit.states import TERMINAL_STATES
from turnkit.store import TurnRecord
from turnkit.tenancy import AuthDependency, anonymous

__all__ = (
    "STREAM_HEADERS",
    "ChatRequest",
    "UIMessage",
    "UIMessageStreamTranslator",
    "create_ai_sdk_router",
)


STREAM_HEADERS: Final[Mapping[str, str]] = {
    "x-vercel-ai-ui-message-stream": "v1",
    "Cache-Control": "no-store",
    "x-accel-buffering": "no",  # nginx: pass chunks on as they come
}
TURN_ID_HEADER: Final = "X-Turn-Id"
_FAREWELL: Final = (
    line(
        {
            "type": "error",
            "errorText": "the server is shutting down; the turn goes on: resume the stream "
            "(resumeStream) to read the rest (server-shutting-down)",
        }
    )
    + DONE_LINE,
)
"""A stream's last write when its server shuts down mid-turn."""


def _farewell(last: bytes | None) -> tuple[bytes, ...]:
    """What a stream sends when its server shuts down, after `last` went out.

    Nothing once its `[DONE]` went out, only that once its `finish` did; else the error
    that tells the client to resume.
    """
    if last is not None and last.endswith(DONE_LINE):
        return ()
    if last is not None and b'"type":"finish"' in last:
        return (DONE_LINE,)
    return _FAREWELL


# ── the routes ─────────────────────────────────────────────────────────────────────────


async def _no_deps() -> Any:
    return NO_DEPS


def create_ai_sdk_router(
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = anonymous,
    prefix: str = "/api/chat",
    keepalive_s: float = 10.0,
    deps: Callable[..., Any] | None = None,
    max_frame_bytes: int = 1_000_000,
) -> APIRouter:
    """The AI SDK chat routes for `runtime`: `POST {prefix}`, `GET {prefix}/{chat_id}/stream`.

    `auth` is a FastAPI dependency returning the caller's principal (or None); a chat of
    another principal answers like one that does not exist. `deps` builds the app's
    dependencies for the turns a request starts or resumes (`ToolContext.deps`).
    Install `turnkit.http.install_problem_handlers` on the app for problem bodies. A chunk
    whose line would pass `max_frame_bytes` is sent as a transient
    `data-turnkit-frame-dropped` part instead (its `type` and size); a tool's output as a
    `tool-output-error` saying so; chunks that open or close a message, step, text or tool
    input go out whatever their size. The stream carries on.
    """
    if max_frame_bytes < 1:
        raise ConfigurationError("max_frame_bytes must be at least 1")
    router = APIRouter(
        prefix=prefix,
        tags=["ai-sdk"],
        route_class=ProblemRoute,
        dependencies=[Depends(opened(runtime))],  # a runtime nobody opened opens here
    )
    Who = Annotated[Caller, Depends(caller_of(auth))]
    RequestDeps = Annotated[Any, Depends(deps or _no_deps)]
    replies = Replies(runtime, keepalive_s=keepalive_s, max_frame_bytes=max_frame_bytes)

    @router.post(
        "",
        response_class=EventSourceResponse,
        summary="Send a chat message (or answer a pause) and stream the reply (AI SDK)",
    )
    async def chat(body: ChatRequest, principal: Who, request_deps: RequestDeps) -> Response:
        return await _chat(replies, body, principal, request_deps)

    @router.get(
        "/{session_id}/stream",  # the chat's id: a session id (the same checks, problems)
        response_class=EventSourceResponse,
        summary="Resume the chat's running reply: the message so far, then live (AI SDK)",
        responses={204: {"description": "No reply is being written."}},
    )
    async def resume(
        session_id: Annotated[str, Path(max_length=128, pattern=SESSION_ID_PATTERN.pattern)],
        principal: Who,
    ) -> Response:
        return await _resume_reply(replies, session_id, principal)

    return router


async def _chat(
    replies: Replies, body: ChatRequest, principal: Caller, request_deps: Any
) -> Response:
    """`POST {prefix}`: start a turn for the user's message, or resume the paused one."""
    runtime = replies.runtime
    turns = await _visible(runtime, body.id, principal)
    if turns is None and await runtime.store.get_session(SessionId(body.id)) is not None:
        raise SessionNotFoundError(f"no session {body.id!r}", session_id=body.id)
    turns = turns or []
    last = body.messages[-1]
    if last.role == "assistant":
        turn_id, after, asked = await _answer(
            runtime, turns, last, body.message_id, request_deps, principal
        )
        reply = replies.render(await runtime.turn(turn_id), after, asked=asked)
        return _respond(reply, turn_id)
    if last.role != "user":
        raise InvalidInputError("the last message must be the user's (or answer a pause)")
    if turns and turns[-1].status in PAUSED:
        raise InvalidInputError(
            f"turn {turns[-1].turn_id!r} is {turns[-1].status}: answer it first "
            "(addToolApprovalResponse, or addToolOutput for a question)",
            turn_id=turns[-1].turn_id,
        )
    try:
        content = user_content(last)
    except ValidationError as exc:
        raise InvalidInputError(f"a picture does not fit: {exc.errors()[0]['msg']}") from exc
    fresh = body.trigger == "submit-message" and body.message_id is None
    sent = asyncio.Event()  # the turn's first step waits for the stream's opening
    submission = await runtime.start(
        body.id,
        content,
        request_id=last.id if fresh and 0 < len(last.id) <= 128 else None,
        principal=principal,
        deps=request_deps,
        hold_until=sent,
        anonymous=principal is None,
    )
    reply = replies.render(await runtime.turn(submission.turn_id), 0)
    return _respond(set_once_sent(reply, sent), submission.turn_id)


async def _resume_reply(replies: Replies, chat_id: str, principal: Caller) -> Response:
    """`GET {prefix}/{chat_id}/stream`: the live turn's message so far, then live.

    A paused turn's message comes whole, up to its pause: a reloaded page gets its
    approval request back. A turn that ended moments ago comes whole too: a client that
    asks just after it ended (having answered its approval elsewhere) still gets its end.
    """
    turns = await _visible(replies.runtime, chat_id, principal)
    record = _resumable(turns or [], replies.runtime.clock.now())
    if record is None:
        return Response(status_code=204)
    return _respond(replies.render(record, 0, rebuild=True), record.turn_id)


ENDED_REPLAY_S: Final = 30.0
"""How long after its turn ended a reply is still sent whole to a client that resumes."""


def _resumable(turns: list[TurnRecord], now: datetime) -> TurnRecord | None:
    """The turn whose message a resuming client gets, if any.

    The first turn not yet ended is the one being written (those after it wait their
    turn); with none, the latest, if it ended within `ENDED_REPLAY_S`.
    """
    unfinished = [t for t in turns if t.status not in TERMINAL_STATES]
    if unfinished:
        live = min(unfinished, key=lambda t: t.input_seq)  # the order turns are claimed in
        return live if live.status == "running" or live.status in PAUSED else None
    if turns and now - turns[-1].updated_at <= timedelta(seconds=ENDED_REPLAY_S):
        return turns[-1]
    return None


def _respond(body: AsyncIterator[bytes], turn_id: str) -> SseResponse:
    # Keep-alives are our own comment lines (see turnkit.http): no ping.
    return SseResponse(
        body, headers={**STREAM_HEADERS, TURN_ID_HEADER: turn_id}, farewell=_farewell
    )


# ── the chat's turns ──────────────────────────────────────────────────────────────────


async def _visible(
    runtime: SessionRuntime, session_id: str, principal: Caller
) -> list[TurnRecord] | None:
    """The chat's turns, oldest first; None when it is not the caller's (or absent)."""
    record = await runtime.store.get_session(SessionId(session_id))
    if record is None or not sees(principal, record):
        return None
    return await runtime.store.list_turns(SessionId(session_id))


async def _answer(
    runtime: SessionRuntime,
    turns: list[TurnRecord],
    message: UIMessage,
    message_id: str | None,
    request_deps: Any,
    principal: Caller,
) -> tuple[TurnId, int, tuple[str, ...]]:
    """Resume the paused turn the assistant message stands for.

    Returns the turn, the cursor to stream from, and the tool calls whose approval was asked
    and not granted.
    """
    ids = {message.id, message_id}
    record = next((t for t in reversed(turns) if t.turn_id in ids), None)
    if record is None and turns:
        record = turns[-1]
    if record is None:
        raise InvalidInputError("the chat has no turn for this assistant message")
    if record.status not in PAUSED:
        raise PauseAnsweredError(
            f"turn {record.turn_id!r} is not waiting for an answer (status: {record.status})",
            turn_id=record.turn_id,
        )
    pause = (await runtime.turn_view(record)).pending
    if pause is None:
        raise PauseAnsweredError(f"turn {record.turn_id!r} is not waiting for an answer")
    session = await runtime.store.get_session(record.session_id)
    check_answerer(pause, record, session, principal)
    try:
        request_id, resolution = pending_answer(record, pause, message)
    except ValidationError as exc:  # an empty answer, a reason past 4,000 characters
        raise InvalidInputError(f"the answer does not fit: {exc.errors()[0]['msg']}") from exc
    deps = answer_deps(record, principal, request_deps)
    await runtime.resume(record.turn_id, request_id, resolution, deps=deps, principal=principal)
    # Calls whose approval was asked in this or an earlier stream and not granted: their
    # parts carry it. A granted call a plugin then denies is an error part (the SDK's
    # denied part needs a denied approval).
    asked = tuple(
        str(part["toolCallId"])
        for part in message.parts
        if isinstance(approval := part.get("approval"), dict)
        and approval.get("approved") is not True
        and isinstance(part.get("toolCallId"), str)
    )
    return record.turn_id, record.last_seq, asked
