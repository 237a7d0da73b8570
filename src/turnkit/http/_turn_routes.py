"""The routes of a turn: send a message and stream it (SSE), resume, retry, stop, settle a pause."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Header, Query, Response

from turnkit.errors import missing_extra

try:
    from sse_starlette import EventSourceResponse
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The HTTP routes", "fastapi", exc) from exc

from turnkit._sse_response import SseResponse
from turnkit.http._access import (
    Principal,
    SessionPath,
    answerable_pauses,
    answerable_turn,
    owned,
    visible_turn,
)
from turnkit.http.models import (
    AnswerBody,
    ApprovalBody,
    AuditOut,
    CancelOut,
    ExecuteBody,
    PendingListOut,
    PendingOut,
    ResumeOut,
    TurnStatusOut,
)
from turnkit.http.sse import frames_to_sse, shutdown_farewell
from turnkit.ids import SessionId, TurnId
from turnkit.pauses import Answer, Approve, Deny, Resolution
from turnkit.runtime import SessionRuntime
from turnkit.runtime.answerers import answer_deps
from turnkit.runtime.reader import check_cursor, parse_cursor, set_once_sent
from turnkit.store import Submission

__all__ = ("TURN_ID_HEADER", "add_turn_routes")

TURN_ID_HEADER = "X-Turn-Id"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Streams:
    """A turn's events after a cursor, as an SSE response."""

    runtime: SessionRuntime
    keepalive_s: float
    max_frame_bytes: int

    def __call__(
        self,
        turn_id: TurnId,
        after: int,
        *,
        submission: Submission | None = None,
        sent: asyncio.Event | None = None,
    ) -> SseResponse:
        frames = self.runtime.reader(keepalive_s=self.keepalive_s).follow_batches(
            turn_id, after_seq=after, submission=submission
        )
        body = frames_to_sse(frames, max_frame_bytes=self.max_frame_bytes, turn_id=turn_id)
        # The reader sends its own keep-alives, as single comment lines (no ping here).
        return SseResponse(
            body if sent is None else set_once_sent(body, sent),
            headers={TURN_ID_HEADER: turn_id},
            farewell=shutdown_farewell,
        )


def add_turn_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
    deps: Callable[..., Any],
    keepalive_s: float,
    max_frame_bytes: int,
) -> None:
    """`POST /sessions/{session_id}/execute` and the `/turns/{turn_id}` routes.

    Streams (SSE): execute, `GET …/stream` (resume after a cursor), `POST …/retry`. Then the
    turn's state, `cancel`, `approvals/{request_id}`, `clarifications/{request_id}`, its audit
    rows and the approval or question it waits for.
    """
    stream = _Streams(runtime=runtime, keepalive_s=keepalive_s, max_frame_bytes=max_frame_bytes)
    _add_execute_route(router, runtime, stream, who=who, deps=deps)
    _add_resume_routes(router, runtime, stream, who=who)
    _add_control_routes(router, runtime, who=who, deps=deps)
    _add_record_routes(router, runtime, who=who)


def _add_execute_route(
    router: APIRouter,
    runtime: SessionRuntime,
    stream: _Streams,
    *,
    who: Callable[..., Awaitable[Principal]],
    deps: Callable[..., Any],
) -> None:
    Caller = Annotated[Principal, Depends(who)]
    RequestDeps = Annotated[Any, Depends(deps)]

    @router.post(
        "/sessions/{session_id}/execute",
        response_class=EventSourceResponse,
        summary="Send a message and stream its turn (SSE)",
    )
    async def execute(
        session_id: SessionPath,
        body: ExecuteBody,
        caller: Caller,
        request_deps: RequestDeps,
    ) -> Response:
        existing = await runtime.store.get_session(SessionId(session_id))
        if existing is not None:
            owned(existing, session_id, caller)
        # The admission chain (inside `start`) settles the agent, the model and the budget.
        # The turn's first step waits until its `turn.started` is written (`hold_until`).
        sent = asyncio.Event()
        submission = await runtime.start(
            session_id,
            body.content,
            agent=body.agent,
            model=body.model,
            settings=body.settings,
            request_id=body.request_id,
            delivery=cast(Any, body.delivery),
            effort=body.effort,
            principal=caller,
            documents=body.documents,
            deps=request_deps,
            hold_until=sent,
            anonymous=caller is None,  # not into a session someone signs in to own meanwhile
        )
        if submission.guided:  # joined a running turn: stream it from here on
            live = await runtime.turn(submission.turn_id)
            return stream(live.turn_id, live.last_seq)
        return stream(submission.turn_id, 0, submission=submission, sent=sent)


def _add_resume_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    stream: _Streams,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.get(
        "/turns/{turn_id}/stream",
        response_class=EventSourceResponse,
        summary="Resume a turn's stream after a cursor (SSE)",
    )
    async def resume(
        turn_id: str,
        principal: Caller,
        after: Annotated[str | None, Query(description="Resume after this event id.")] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        record = await visible_turn(runtime, turn_id, principal)
        cursor = parse_cursor(last_event_id if last_event_id is not None else after)
        check_cursor(record, cursor)
        return stream(record.turn_id, cursor)

    @router.post(
        "/turns/{turn_id}/retry",
        response_class=EventSourceResponse,
        summary="Send a failed turn's message again, as a new turn (SSE)",
    )
    async def retry(
        turn_id: str,
        principal: Caller,
        request_id: Annotated[
            str | None, Header(alias="Idempotency-Key", min_length=1, max_length=128)
        ] = None,
    ) -> Response:
        record = await visible_turn(runtime, turn_id, principal)
        # The new turn is the caller's, admitted as they are now: never the first sender's
        # (another caller's, in a session nobody owns; or roles since taken away).
        submission = await runtime.retry(
            record.turn_id,
            request_id=request_id,
            principal=principal,
            anonymous=principal is None,
        )
        return stream(submission.turn_id, 0, submission=submission)


async def _settle_pause(
    runtime: SessionRuntime,
    turn_id: str,
    request_id: str,
    resolution: Resolution,
    principal: Principal,
    request_deps: Any,
) -> ResumeOut:
    record = await answerable_turn(runtime, turn_id, request_id, principal)
    deps = answer_deps(record, principal, request_deps)
    await runtime.resume(record.turn_id, request_id, resolution, deps=deps, principal=principal)
    status = (await runtime.turn(record.turn_id)).status
    return ResumeOut(turn_id=record.turn_id, request_id=request_id, status=status)


def _add_control_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
    deps: Callable[..., Any],
) -> None:
    Caller = Annotated[Principal, Depends(who)]
    RequestDeps = Annotated[Any, Depends(deps)]

    @router.get("/turns/{turn_id}", response_model=TurnStatusOut, summary="A turn's state")
    async def get_turn(turn_id: str, principal: Caller) -> TurnStatusOut:
        return TurnStatusOut.model_validate(await visible_turn(runtime, turn_id, principal))

    @router.post("/turns/{turn_id}/cancel", response_model=CancelOut, summary="Stop a turn")
    async def cancel(turn_id: str, principal: Caller) -> CancelOut:
        record = await visible_turn(runtime, turn_id, principal)
        status = await runtime.cancel(record.turn_id, principal=principal)
        return CancelOut(turn_id=record.turn_id, status=status)

    @router.post(
        "/turns/{turn_id}/approvals/{request_id}",
        response_model=ResumeOut,
        status_code=202,
        summary="Approve or deny a paused tool call",
    )
    async def approve(
        turn_id: str,
        request_id: str,
        body: ApprovalBody,
        principal: Caller,
        request_deps: RequestDeps,
    ) -> ResumeOut:
        resolution: Resolution = (
            Approve(note=body.note, arguments=body.arguments)
            if body.decision == "approve"
            else Deny(note=body.note)
        )
        return await _settle_pause(
            runtime, turn_id, request_id, resolution, principal, request_deps
        )

    @router.post(
        "/turns/{turn_id}/clarifications/{request_id}",
        response_model=ResumeOut,
        status_code=202,
        summary="Answer the model's question",
    )
    async def answer(
        turn_id: str,
        request_id: str,
        body: AnswerBody,
        principal: Caller,
        request_deps: RequestDeps,
    ) -> ResumeOut:
        return await _settle_pause(
            runtime, turn_id, request_id, Answer(text=body.answer), principal, request_deps
        )


def _add_record_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.get("/turns/{turn_id}/audit", response_model=AuditOut, summary="A turn's audit rows")
    async def audit(turn_id: str, principal: Caller) -> AuditOut:
        record = await visible_turn(runtime, turn_id, principal)
        return AuditOut(turn_id=record.turn_id, rows=await runtime.store.read_audit(record.turn_id))

    @router.get(
        "/turns/{turn_id}/pending",
        response_model=PendingListOut,
        summary="The approval or question a paused turn waits for",
    )
    async def turn_pending(turn_id: str, principal: Caller) -> PendingListOut:
        record = await visible_turn(runtime, turn_id, principal)
        found = (await runtime.turn_view(record)).pending
        return PendingListOut(pending=[PendingOut.of(found, record.session_id)] if found else [])

    @router.get(
        "/pauses",
        response_model=PendingListOut,
        summary="The approvals and questions the caller may answer, in every session",
    )
    async def inbox(
        principal: Caller,
        limit: Annotated[int, Query(ge=1, le=500, description="At most this many.")] = 100,
    ) -> PendingListOut:
        return PendingListOut(pending=await answerable_pauses(runtime, principal, limit))
