"""The routes of a caller's sessions: list, create, read, rename, delete; skills and usage."""

import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BeforeValidator

from turnkit.errors import NotFoundError, SessionNotFoundError
from turnkit.http._access import Principal, SessionPath, owned, visible_session
from turnkit.http._admin import require_admin
from turnkit.http.models import (
    PendingListOut,
    PendingOut,
    QueuedInputOut,
    QueueOut,
    RenameBody,
    SessionBody,
    SessionOut,
    SkillOut,
    TurnOut,
    UsageGroup,
    UsageLineOut,
    UsageOut,
    WorkspaceFileOut,
    WorkspaceFilesOut,
)
from turnkit.ids import SessionId, uuid7
from turnkit.runtime import SessionRuntime
from turnkit.store import WorkspaceFile

__all__ = ("add_session_routes",)


_NUMBER: Final = re.compile(r"[-+]?\d+(\.\d*)?")


def _not_a_number(value: object) -> object:
    """Refuse a bare number, which pydantic would read as seconds since 1970."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        raise ValueError(
            f"{value!r} is a number, not a date: give one in ISO 8601, such as 2026-12-01 "
            "or 2026-12-01T09:00:00Z"
        )
    return value


When = Annotated[datetime | None, BeforeValidator(_not_a_number)]
"""A `since`/`until` bound: an ISO 8601 date or date-time."""

FilePath = Annotated[
    str,
    Path(
        description=(
            "Relative, 1-200 characters: segments of ASCII letters, digits, `.`, `_` and `-` "
            "joined by `/`; no segment empty, `.` or `..`."
        ),
        # Documented, not enforced here: the store's check says what is wrong with a path.
        json_schema_extra={"pattern": r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", "maxLength": 200},
    ),
]


def add_session_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    """`GET`/`POST /sessions`, `/skills`, `/usage` and the `/sessions/{session_id}` routes.

    Per session: the approvals and questions it waits for, its queue, its history, its
    workspace files, `PATCH` (rename) and `DELETE`.
    """
    _add_listing_routes(router, runtime, who=who)
    _add_account_routes(router, runtime, who=who)
    _add_read_routes(router, runtime, who=who)
    _add_file_routes(router, runtime, who=who)
    _add_edit_routes(router, runtime, who=who)


def _add_listing_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.get("/sessions", response_model=list[SessionOut], summary="Your sessions")
    async def list_sessions(
        principal: Caller, limit: Annotated[int, Query(ge=1, le=500)] = 100
    ) -> list[SessionOut]:
        # An anonymous caller sees only sessions nobody owns, never another principal's.
        records = await runtime.store.list_sessions(
            principal=principal.id if principal else None,
            organisation=principal.organisation if principal else None,
            anonymous=principal is None,
            limit=limit,
        )
        return [SessionOut.model_validate(r) for r in records]

    @router.get("/sessions/{session_id}", response_model=SessionOut, summary="One session")
    async def get_session(session_id: SessionPath, principal: Caller) -> SessionOut:
        # Also a session an agent asked as a tool answered in, which no list shows.
        return SessionOut.model_validate(await visible_session(runtime, session_id, principal))

    @router.post(
        "/sessions",
        response_model=SessionOut,
        status_code=201,
        summary="New session",
        responses={200: {"model": SessionOut, "description": "It existed: left as it was"}},
    )
    async def create_session(
        principal: Caller, response: Response, body: SessionBody | None = None
    ) -> SessionOut:
        body = body or SessionBody()  # both fields are optional: so is the body
        session_id = body.session_id or f"s_{uuid7()}"
        record = await runtime.create_session(session_id, principal=principal, title=body.title)
        # It may have been there already (or created by a request racing this one): the
        # session must be the caller's, and only the request that created it answers 201.
        owned(record, session_id, principal)
        if not record.is_new:
            response.status_code = 200  # creating it again changes nothing
        return SessionOut.model_validate(record)


def _add_account_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

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
        caller: Caller,
        by: Annotated[UsageGroup, Query(description="Group by.")] = "day",
        scope: Annotated[
            Literal["self", "organisation"],
            Query(description="Your own usage, or (admins) your organisation's."),
        ] = "self",
        since: Annotated[When, Query(description="From (inclusive), ISO 8601.")] = None,
        until: Annotated[When, Query(description="To (exclusive), ISO 8601.")] = None,
    ) -> UsageOut:
        if scope == "organisation":  # everyone's in the admin's organisation
            organisation, pid = require_admin(caller).organisation, None
        elif caller is not None:  # the caller's own: its id within its organisation
            organisation, pid = caller.organisation, caller.id
        else:
            organisation, pid = None, None
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


def _add_read_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.get(
        "/sessions/{session_id}/pending",
        response_model=PendingListOut,
        summary="The approvals and questions the session's paused turns wait for",
    )
    async def session_pending(session_id: SessionPath, principal: Caller) -> PendingListOut:
        await visible_session(runtime, session_id, principal)
        found = await runtime.pending(session_id)
        return PendingListOut(pending=[PendingOut.of(p, session_id) for p in found])

    @router.get(
        "/sessions/{session_id}/queue",
        response_model=QueueOut,
        summary="Messages the session holds that no turn has answered yet",
    )
    async def session_queue(session_id: SessionPath, principal: Caller) -> QueueOut:
        await visible_session(runtime, session_id, principal)
        found = await runtime.queue(session_id)
        return QueueOut(queue=[QueuedInputOut.model_validate(q) for q in found])

    @router.get(
        "/sessions/{session_id}/history",
        response_model=list[TurnOut],
        summary="Committed blocks per turn",
    )
    async def history(session_id: SessionPath, principal: Caller) -> list[TurnOut]:
        await visible_session(runtime, session_id, principal)
        try:
            turns = await runtime.history(session_id)
        except SessionNotFoundError:  # created, no message yet
            return []
        return [TurnOut.model_validate(turn) for turn in turns]


def _file_response(found: WorkspaceFile) -> Response:
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


def _add_file_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.get(
        "/sessions/{session_id}/files",
        response_model=WorkspaceFilesOut,
        summary="The session's workspace files (without content)",
    )
    async def list_files(session_id: SessionPath, principal: Caller) -> WorkspaceFilesOut:
        await visible_session(runtime, session_id, principal)
        found = await runtime.store.list_files(SessionId(session_id))
        return WorkspaceFilesOut(files=[WorkspaceFileOut.model_validate(f) for f in found])

    @router.get(
        "/sessions/{session_id}/files/{path:path}",
        response_class=Response,
        summary="One workspace file's content",
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def read_file(session_id: SessionPath, path: FilePath, principal: Caller) -> Response:
        await visible_session(runtime, session_id, principal)
        found = await runtime.store.read_file(SessionId(session_id), path)
        if found is None:
            raise NotFoundError(f"session {session_id!r} has no file {path!r}", path=path)
        return _file_response(found)


def _add_edit_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    *,
    who: Callable[..., Awaitable[Principal]],
) -> None:
    Caller = Annotated[Principal, Depends(who)]

    @router.patch("/sessions/{session_id}", response_model=SessionOut, summary="Rename")
    async def rename(session_id: SessionPath, body: RenameBody, principal: Caller) -> SessionOut:
        # Who may rename is checked in the statement that writes (not read first, then
        # written): a session deleted and made anew by another meanwhile is not theirs.
        renamed = await runtime.rename_session(
            session_id, body.title, principal=principal, anonymous=principal is None
        )
        return SessionOut.model_validate(renamed)

    @router.delete("/sessions/{session_id}", status_code=204, summary="Delete a session")
    async def delete(session_id: SessionPath, principal: Caller) -> Response:
        # Not there, another's, or a request racing this one deleted it first: all 404.
        if not await runtime.delete_session(
            session_id, principal=principal, anonymous=principal is None
        ):
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return Response(status_code=204)
