"""Problem bodies (RFC 9457) for turnkit's errors, and routes that answer with them.

Shared by the harness routes (`turnkit.http`) and the protocol routes
(`turnkit.protocols`); `turnkit.http.install_problem_handlers` answers the rest of an app's
errors (validation, HTTP) the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict

from turnkit.errors import (
    DOCS_URL,
    AdmissionRefusedError,
    ApproverRequiredError,
    AttachmentNotIndexedError,
    CallbackTokenError,
    ConfigurationError,
    InvalidInputError,
    NotFoundError,
    PauseAnsweredError,
    ReplayCursorError,
    RequestConflictError,
    RuntimeClosedError,
    StaleEpochError,
    StoreError,
    StoreUnavailableError,
    TurnkitError,
    TurnNotRunningError,
)

if TYPE_CHECKING:
    from turnkit.runtime import SessionRuntime

__all__ = (
    "MEDIA_TYPE",
    "RETRY_AFTER_S",
    "Problem",
    "ProblemRoute",
    "opened",
    "problem_response",
    "status_for",
    "turnkit_problem",
)

log = logging.getLogger("turnkit.http")

MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_S = 2
"""What a 503 asks the client to wait before retrying (`Retry-After`)."""


class Problem(BaseModel):
    """An RFC 9457 problem body: `type` links the error code's documentation."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    code: str


def status_for(exc: TurnkitError) -> int:
    """The HTTP status of an error."""
    match exc:
        case NotFoundError():
            return 404
        case ReplayCursorError():
            return 416 if "last_seq" in exc.details else 400  # set for a cursor ahead
        case InvalidInputError() | AttachmentNotIndexedError():
            return 422
        case AdmissionRefusedError() | ApproverRequiredError():
            return 403
        case CallbackTokenError():
            return 401
        case TurnNotRunningError():
            return 409
        case StaleEpochError() | PauseAnsweredError() | RequestConflictError():
            return 409
        case StoreUnavailableError() | RuntimeClosedError():
            return 503
        case ConfigurationError():
            return 400
        case _:
            return 500


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A problem+json response."""
    body = Problem(
        type=f"{DOCS_URL}#{code}",
        title=code.replace("-", " ").replace("_", " "),
        status=status,
        detail=detail,
        code=code,
        **extra,
    )
    return JSONResponse(
        body.model_dump(), status_code=status, media_type=MEDIA_TYPE, headers=headers
    )


_STORE_FAILED: dict[int, str] = {
    503: "the database is out of reach for now; nothing was written, retry shortly",
    500: "the database failed this request (the server's log says why)",
}
"""What a client reads of a Store failure: its own words name hosts, ports and file paths."""


def turnkit_problem(exc: TurnkitError) -> JSONResponse:
    """The problem response for a turnkit error (a 503 asks the client to retry)."""
    status = status_for(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    detail = exc.message
    if isinstance(exc, StoreError) and status >= 500:  # the log keeps the words
        log.warning("answered %s %s: %s", status, exc.code, exc.message)
        detail = _STORE_FAILED.get(status, _STORE_FAILED[500])
    return problem_response(status, exc.code, detail, headers=headers)


def opened(runtime: SessionRuntime) -> Callable[[], Awaitable[None]]:
    """The routes' dependency that opens `runtime` at their first request (once).

    As its methods do at their first message: a runtime nobody opened (a mounted app's
    lifespan does not run) opens here; a closed one raises `RuntimeClosedError` (503).
    A configuration the opening refuses (a schema to upgrade, say) is the server's
    mistake, not the request's: 500 `internal-error`, its words in the server's log only.
    """

    async def open_runtime() -> None:
        try:
            await runtime.ensure_open()
        except ConfigurationError as exc:
            log.error("the runtime cannot open: %s", exc.message)
            raise TurnkitError("the runtime cannot open (the server's log says why)") from exc

    return open_runtime


class ProblemRoute(APIRoute):
    """A route that answers turnkit's errors with problem bodies in any app.

    An app with `install_problem_handlers` (or its own handler for the error) answers
    them itself; in one without, a turnkit error would otherwise be a bare 500. The
    first such answer logs a warning that names the missing call.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, its turnkit errors answered as problems."""
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except TurnkitError as exc:
                if _handled_by_app(request, exc):
                    raise
                _warn_once(exc)
                return turnkit_problem(exc)

        return answer


def _handled_by_app(request: Request, exc: TurnkitError) -> bool:
    """Whether the app has a handler for turnkit's errors.

    A catch-all for `Exception` answers 500 whatever the error, so it does not count.
    """
    handlers: Mapping[Any, Any] = getattr(request.app, "exception_handlers", {})
    return any(kind in handlers for kind in type(exc).__mro__ if issubclass(kind, TurnkitError))


_warned: list[bool] = []


def _warn_once(exc: TurnkitError) -> None:
    if not _warned:
        _warned.append(True)
        log.warning(
            "answered %s with a problem body, but the app has no problem handlers: call "
            "turnkit.http.install_problem_handlers(app) so that validation and HTTP errors "
            "are problem bodies too",
            exc.code,
        )
