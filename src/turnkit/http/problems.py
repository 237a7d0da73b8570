"""RFC 9457 problem bodies built from `TurnkitError`s and request validation errors."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from turnkit.errors import (
    DOCS_URL,
    AdmissionRefusedError,
    AttachmentNotIndexedError,
    CallbackTokenError,
    ConfigurationError,
    InvalidInputError,
    NotFoundError,
    PauseAnsweredError,
    ReplayCursorError,
    RequestConflictError,
    StaleEpochError,
    StoreUnavailableError,
    TurnkitError,
    TurnNotRunningError,
)

__all__ = ("Problem", "install_problem_handlers", "problem_response", "status_for")

MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_S = 2
"""What a 503 asks the client to wait before retrying (`Retry-After`)."""
_HTTP_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "content-too-large",
}


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
        case AdmissionRefusedError():
            return 403
        case CallbackTokenError():
            return 401
        case TurnNotRunningError():
            return 409
        case StaleEpochError() | PauseAnsweredError() | RequestConflictError():
            return 409
        case StoreUnavailableError():
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


_UNION_BRANCH = re.compile(r"(str|int|float|bool|list|dict|none)|.*[\[(].*")
"""A `loc` segment naming which member of a union pydantic tried (`str`, `list[...]`)."""


def _where(loc: Sequence[int | str]) -> list[int | str]:
    """An error's location as a client wrote the field: without union branches."""
    return [part for part in loc if not (isinstance(part, str) and _UNION_BRANCH.fullmatch(part))]


def _detail(errors: list[dict[str, Any]]) -> str:
    """One line: each field once, with what each accepted form expected (`a, or b`)."""
    by_field: dict[str, list[str]] = {}
    for error in errors:
        said = by_field.setdefault(".".join(map(str, error["loc"])), [])
        if error["msg"] not in said:
            said.append(error["msg"])
    return "; ".join(f"{field}: {', or '.join(said)}" for field, said in by_field.items())


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every turnkit error, validation error and HTTP error with a problem body."""

    async def turnkit_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TurnkitError)
        status = status_for(exc)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
        return problem_response(status, exc.code, exc.message, headers=headers)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        found = exc.errors()
        not_json = [e for e in found if e.get("type") == "json_invalid"]
        if not_json:
            reason = (not_json[0].get("ctx") or {}).get("error") or not_json[0].get("msg")
            return problem_response(422, "invalid-input", f"the body is not JSON: {reason}")
        errors = [{"loc": _where(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in found]
        code = (
            "invalid-session-id"
            if any(e["loc"] == ["path", "session_id"] for e in errors)
            else "invalid-input"
        )
        return problem_response(422, code, _detail(errors) or "invalid request", errors=errors)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        if status == 405:  # Starlette's Allow names the first matching route's methods only
            methods = _allowed(request)
            detail = f"{request.method} is not allowed here; use {methods}"
            return problem_response(405, "method-not-allowed", detail, headers={"Allow": methods})
        code = _HTTP_CODES.get(status, "invalid-input" if status < 500 else "internal-error")
        if status == 400 and "parsing the body" in str(exc.detail):
            # A body that is not UTF-8 JSON is invalid input like any other (422).
            return problem_response(422, "invalid-input", f"the body is not JSON: {exc.detail}")
        return problem_response(status, code, str(exc.detail), headers=exc.headers)

    def _allowed(request: Request) -> str:
        """Every method some route at the request's path takes (each route is asked)."""
        routes = request.app.router.routes
        return ", ".join(
            method
            for method in _METHODS
            if any(
                route.matches({**request.scope, "method": method})[0] == Match.FULL
                for route in routes
            )
        )

    app.add_exception_handler(TurnkitError, turnkit_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
