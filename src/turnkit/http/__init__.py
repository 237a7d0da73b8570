"""FastAPI routes for turnkit: execute with resumable SSE, resume, cancel, sessions, files, audit.

```python
app = FastAPI()
app.include_router(create_turnkit_router(runtime, auth=current_user))
install_problem_handlers(app)
```
"""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from sse_starlette import EventSourceResponse

from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    NotFoundError,
    SessionNotFoundError,
    TurnNotFoundError,
)
from turnkit.http._admin import add_budget_routes, add_callback_routes, require_admin
from turnkit.http.models import (
    AnswerBody,
    ApprovalBody,
    AuditOut,
    CancelOut,
    ExecuteBody,
    PendingListOut,
    PendingOut,
    QueuedInputOut,
    QueueOut,
    ResumeOut,
    SessionBody,
    SessionOut,
    SkillOut,
    TurnOut,
    TurnStatusOut,
    UsageGroup,
    UsageLineOut,
    UsageOut,
    WorkspaceFileOut,
    WorkspaceFilesOut,
)
from turnkit.http.problems import (
    MEDIA_TYPE,
    Problem,
    install_problem_handlers,
    problem_response,
)
from turnkit.http.sse import frames_to_sse
from turnkit.ids import SESSION_ID_PATTERN, SessionId, TurnId, uuid7
from turnkit.pauses import Answer, Approve, Deny, Resolution
from turnkit.runtime import SessionRuntime
from turnkit.runtime._history import turn_history
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.reader import check_cursor, parse_cursor, set_once_sent
from turnkit.store import SessionRecord, Submission, TurnRecord
from turnkit.tenancy import Principal as TenantPrincipal

__all__ = (
    "TURN_ID_HEADER",
    "create_health_router",
    "create_turnkit_router",
    "install_problem_handlers",
)

TURN_ID_HEADER = "X-Turn-Id"
_NO_PING_S = 10**9
Principal = str | None
"""A caller's id as the routes compare it (None: anonymous)."""
AuthResult = TenantPrincipal | str | None
AuthDependency = Callable[..., AuthResult | Awaitable[AuthResult]]

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {MEDIA_TYPE: {}}}
    for status in (400, 404, 409, 416, 422, 503)
}
SessionPath = Annotated[
    str,
    Path(
        pattern=SESSION_ID_PATTERN.pattern,
        max_length=128,
        description="1-128 letters, digits or `_ . : -`, starting with a letter or digit.",
    ),
]


async def _anonymous() -> AuthResult:
    return None


def _caller_dependencies(
    auth: AuthDependency,
) -> tuple[Callable[..., Awaitable[TenantPrincipal | None]], Callable[..., Awaitable[Principal]]]:
    """Dependencies for the whole principal and for its id, over one call of `auth`."""

    async def who(found: Annotated[Any, Depends(auth)]) -> TenantPrincipal | None:
        try:
            return TenantPrincipal.of(found)
        except TypeError as exc:
            raise ConfigurationError(f"`auth` returned {found!r}: {exc}") from exc

    async def principal_id(caller: Annotated[TenantPrincipal | None, Depends(who)]) -> Principal:
        return caller.id if caller is not None else None

    return who, principal_id


async def _no_deps() -> Any:
    return NO_DEPS


def create_turnkit_router(  # noqa: C901 - one closure per route keeps the routes readable
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = _anonymous,
    prefix: str = "/api/harness",
    max_frame_bytes: int = 1_000_000,
    keepalive_s: float = 10.0,
    deps: Callable[..., Any] | None = None,
) -> APIRouter:
    """Routes for `runtime` under `prefix`.

    `auth` is a FastAPI dependency returning the caller: a `turnkit.Principal`
    (organisation, department, roles), a bare principal id, or None for anonymous use.
    Sessions belong to the principal that created them; a session or turn of another
    principal answers 404, exactly like one that does not exist. Every message passes the
    runtime's admission chain (a refusal is a 403 problem naming the check); the budget
    routes need the `admin` role; callbacks authenticate with their turn's token instead.

    `deps` is a FastAPI dependency returning the app's dependencies for the turn a
    request starts or resumes (`ToolContext.deps`); where the turn is driven elsewhere
    (a worker, after a restart) the runtime's own `deps` factory builds them.
    """
    router = APIRouter(prefix=prefix, tags=["turnkit"], responses=_PROBLEMS)
    who, principal_id = _caller_dependencies(auth)
    Caller = Annotated[Principal, Depends(principal_id)]
    Who = Annotated[TenantPrincipal | None, Depends(who)]
    RequestDeps = Annotated[Any, Depends(deps or _no_deps)]

    def owned(record: SessionRecord | None, session_id: str, principal: Principal) -> SessionRecord:
        if record is None or (record.principal is not None and record.principal != principal):
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return record

    async def visible_session(session_id: str, principal: Principal) -> SessionRecord:
        return owned(await runtime.store.get_session(SessionId(session_id)), session_id, principal)

    async def visible_turn(turn_id: str, principal: Principal) -> TurnRecord:
        record = await runtime.store.get_turn(TurnId(turn_id))
        if record is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        try:
            await visible_session(record.session_id, principal)
        except SessionNotFoundError as exc:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id) from exc
        return record

    async def settle_pause(
        turn_id: str,
        request_id: str,
        resolution: Resolution,
        principal: Principal,
        request_deps: Any,
    ) -> ResumeOut:
        record = await visible_turn(turn_id, principal)
        await runtime.resume(record.turn_id, request_id, resolution, deps=request_deps)
        status = (await runtime.turn(record.turn_id)).status
        return ResumeOut(turn_id=record.turn_id, request_id=request_id, status=status)

    def stream(
        turn_id: TurnId,
        after: int,
        status_code: int = 200,
        *,
        submission: Submission | None = None,
        sent: asyncio.Event | None = None,
    ) -> EventSourceResponse:
        frames = runtime.reader(keepalive_s=keepalive_s).follow_batches(
            turn_id, after_seq=after, submission=submission
        )
        body = frames_to_sse(frames, max_frame_bytes=max_frame_bytes, turn_id=turn_id)
        return EventSourceResponse(
            body if sent is None else set_once_sent(body, sent),
            status_code=status_code,
            headers={TURN_ID_HEADER: turn_id, "Cache-Control": "no-store"},
            # The reader sends its own keep-alives as single comment lines. sse-starlette's
            # ping (`None` means its 15 s default, not off) ends with a blank line, which
            # clients dispatch as an event with empty data: keep it from ever firing.
            ping=_NO_PING_S,
            sep="\n",
        )

    @router.post(
        "/sessions/{session_id}/execute",
        response_class=EventSourceResponse,
        summary="Send a message and stream its turn (SSE)",
    )
    async def execute(
        session_id: SessionPath,
        body: ExecuteBody,
        principal: Caller,
        caller: Who,
        request_deps: RequestDeps,
    ) -> Response:
        existing = await runtime.store.get_session(SessionId(session_id))
        if existing is not None:
            owned(existing, session_id, principal)
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
        )
        if submission.guided:  # joined a running turn: stream it from here on
            live = await runtime.turn(submission.turn_id)
            return stream(live.turn_id, live.last_seq)
        return stream(submission.turn_id, 0, submission=submission, sent=sent)

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
        record = await visible_turn(turn_id, principal)
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
        record = await visible_turn(turn_id, principal)
        submission = await runtime.retry(record.turn_id, request_id=request_id)
        return stream(submission.turn_id, 0, submission=submission)

    @router.get("/turns/{turn_id}", response_model=TurnStatusOut, summary="A turn's state")
    async def get_turn(turn_id: str, principal: Caller) -> TurnStatusOut:
        return TurnStatusOut.model_validate(await visible_turn(turn_id, principal))

    @router.post("/turns/{turn_id}/cancel", response_model=CancelOut, summary="Stop a turn")
    async def cancel(turn_id: str, principal: Caller) -> CancelOut:
        record = await visible_turn(turn_id, principal)
        status = await runtime.cancel(record.turn_id)
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
            Approve(note=body.note) if body.decision == "approve" else Deny(note=body.note)
        )
        return await settle_pause(turn_id, request_id, resolution, principal, request_deps)

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
        return await settle_pause(
            turn_id, request_id, Answer(text=body.answer), principal, request_deps
        )

    @router.get("/turns/{turn_id}/audit", response_model=AuditOut, summary="A turn's audit rows")
    async def audit(turn_id: str, principal: Caller) -> AuditOut:
        record = await visible_turn(turn_id, principal)
        return AuditOut(turn_id=record.turn_id, rows=await runtime.store.read_audit(record.turn_id))

    @router.get("/sessions", response_model=list[SessionOut], summary="Your sessions")
    async def list_sessions(
        principal: Caller, limit: Annotated[int, Query(ge=1, le=500)] = 100
    ) -> list[SessionOut]:
        # An anonymous caller sees only sessions nobody owns, never another principal's.
        records = await runtime.store.list_sessions(
            principal=principal, anonymous=principal is None, limit=limit
        )
        return [SessionOut.model_validate(r) for r in records]

    @router.post(
        "/sessions",
        response_model=SessionOut,
        status_code=201,
        summary="New session",
        responses={200: {"model": SessionOut, "description": "It existed: left as it was"}},
    )
    async def create_session(
        body: SessionBody, principal: Caller, response: Response
    ) -> SessionOut:
        session_id = body.session_id or f"s_{uuid7()}"
        existing = await runtime.store.get_session(SessionId(session_id))
        if existing is not None:
            owned(existing, session_id, principal)
            response.status_code = 200  # creating it again changes nothing
        record = await runtime.create_session(session_id, principal=principal, title=body.title)
        # Someone may have created it between the read and the write: it must be ours too.
        return SessionOut.model_validate(owned(record, session_id, principal))

    @router.get("/skills", response_model=list[SkillOut], summary="Skills you may pick")
    async def skills(principal: Caller) -> list[SkillOut]:
        return [
            SkillOut(
                ref=s.ref, slug=s.slug, name=s.name, description=s.description, builtin=s.builtin
            )
            for s in await runtime.skills(principal)
        ]

    @router.get("/usage", response_model=UsageOut, summary="Usage by session, principal, …")
    async def usage_report(
        caller: Who,
        by: Annotated[UsageGroup, Query(description="Group by.")] = "day",
        scope: Annotated[
            Literal["self", "organisation"],
            Query(description="Your own usage, or (admins) your organisation's."),
        ] = "self",
        since: Annotated[datetime | None, Query(description="From (inclusive).")] = None,
        until: Annotated[datetime | None, Query(description="To (exclusive).")] = None,
    ) -> UsageOut:
        if scope == "organisation":  # everyone's in the admin's organisation
            organisation, pid = require_admin(caller).organisation, None
        else:
            organisation, pid = None, caller.id if caller is not None else None
        lines = await runtime.store.usage_report(
            by=by,
            principal=pid,
            anonymous=scope == "self" and pid is None,
            since=since,
            until=until,
            organisation=organisation,
        )
        return UsageOut(
            by=by, scope=scope, lines=[UsageLineOut.model_validate(line) for line in lines]
        )

    add_budget_routes(router, runtime, who)
    add_callback_routes(router, runtime)

    @router.get(
        "/sessions/{session_id}/pending",
        response_model=PendingListOut,
        summary="The approvals and questions the session's paused turns wait for",
    )
    async def session_pending(session_id: SessionPath, principal: Caller) -> PendingListOut:
        await visible_session(session_id, principal)
        found = await runtime.pending(session_id)
        return PendingListOut(pending=[PendingOut.model_validate(p) for p in found])

    @router.get(
        "/sessions/{session_id}/queue",
        response_model=QueueOut,
        summary="Messages the session holds that no turn has answered yet",
    )
    async def session_queue(session_id: SessionPath, principal: Caller) -> QueueOut:
        await visible_session(session_id, principal)
        found = await runtime.queue(session_id)
        return QueueOut(queue=[QueuedInputOut.model_validate(q) for q in found])

    @router.get(
        "/turns/{turn_id}/pending",
        response_model=PendingListOut,
        summary="The approval or question a paused turn waits for",
    )
    async def turn_pending(turn_id: str, principal: Caller) -> PendingListOut:
        record = await visible_turn(turn_id, principal)
        found = (await turn_history(runtime.store, record)).pending
        return PendingListOut(pending=[PendingOut.model_validate(found)] if found else [])

    @router.get(
        "/sessions/{session_id}/history",
        response_model=list[TurnOut],
        summary="Committed blocks per turn",
    )
    async def history(session_id: SessionPath, principal: Caller) -> list[TurnOut]:
        await visible_session(session_id, principal)
        turns = await runtime.store.list_turns(SessionId(session_id))
        return [TurnOut.model_validate(await turn_history(runtime.store, t)) for t in turns]

    @router.get(
        "/sessions/{session_id}/files",
        response_model=WorkspaceFilesOut,
        summary="The session's workspace files (without content)",
    )
    async def list_files(session_id: SessionPath, principal: Caller) -> WorkspaceFilesOut:
        await visible_session(session_id, principal)
        found = await runtime.store.list_files(SessionId(session_id))
        return WorkspaceFilesOut(files=[WorkspaceFileOut.model_validate(f) for f in found])

    @router.get(
        "/sessions/{session_id}/files/{path:path}",
        response_class=Response,
        summary="One workspace file's content",
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def read_file(session_id: SessionPath, path: str, principal: Caller) -> Response:
        await visible_session(session_id, principal)
        found = await runtime.store.read_file(SessionId(session_id), path)
        if found is None:
            raise NotFoundError(f"session {session_id!r} has no file {path!r}", path=path)
        return Response(
            found.content.encode(),
            media_type=f"{found.media_type}; charset=utf-8",
            headers={
                "ETag": f'"{found.version}"',
                "Cache-Control": "no-cache",
                # Model-written content: never sniffed, never run as a page of this origin.
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox; default-src 'none'",
            },
        )

    @router.patch("/sessions/{session_id}", response_model=SessionOut, summary="Rename")
    async def rename(session_id: SessionPath, body: SessionBody, principal: Caller) -> SessionOut:
        await visible_session(session_id, principal)
        if body.title is None:
            raise InvalidInputError("send a `title` to rename the session")
        return SessionOut.model_validate(
            await runtime.store.rename_session(SessionId(session_id), body.title)
        )

    @router.delete("/sessions/{session_id}", status_code=204, summary="Delete a session")
    async def delete(session_id: SessionPath, principal: Caller) -> Response:
        await visible_session(session_id, principal)
        await runtime.store.delete_session(SessionId(session_id))
        return Response(status_code=204)

    return router


def create_health_router(runtime: SessionRuntime) -> APIRouter:
    """Health routes for load balancers and orchestrators.

    `GET /healthz`: the process answers. `GET /readyz`: its Store answers too (503
    `not-ready` with `Retry-After` otherwise). The replay buffer is only a fast path:
    while it does not answer, readers follow the Store, so the process stays ready and
    says `"replay": "degraded: …"`.
    """
    router = APIRouter(tags=["health"])
    ping_timeout_s = 2.0  # a buffer that hangs (not refuses) must not hang the probe

    @router.get("/healthz", summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/readyz",
        summary="The Store answers (the replay buffer may be degraded)",
        response_model=None,
    )
    async def readyz() -> Response | dict[str, str]:
        checks: dict[str, str] = {}
        try:
            await runtime.store.list_sessions(limit=1)
            checks["store"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            checks["store"] = f"unavailable: {type(exc).__name__}"
        try:
            async with asyncio.timeout(ping_timeout_s):
                await runtime.replay.ping()
            checks["replay"] = "ok"
        except Exception as exc:  # noqa: BLE001 - readers follow the Store meanwhile
            checks["replay"] = f"degraded: {type(exc).__name__}; readers follow the Store"
        if checks["store"] == "ok":
            return {"status": "ready", **checks}
        return problem_response(
            503,
            "not-ready",
            "; ".join(f"{k}: {v}" for k, v in checks.items()),
            headers={"Retry-After": "2"},
        )

    return router
