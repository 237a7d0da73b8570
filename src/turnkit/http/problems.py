"""RFC 9457 problem bodies built from `TurnkitError`s and request validation errors."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnkit.errors import (
    DOCS_URL,
    ConfigurationError,
    InvalidInputError,
    NotFoundError,
    PauseAnsweredError,
    ReplayCursorError,
    StaleEpochError,
    TurnkitError,
)

__all__ = ("Problem", "install_problem_handlers", "problem_response", "status_for")

MEDIA_TYPE = "application/problem+json"


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
            return 416 if "last_seq" in exc.details else 400  # only `check_cursor` sets it
        case InvalidInputError():
            return 422
        case StaleEpochError() | PauseAnsweredError():
            return 409
        case ConfigurationError():
            return 400
        case _:
            return 500


def problem_response(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    """A problem+json response."""
    body = Problem(
        type=f"{DOCS_URL}#{code}",
        title=code.replace("-", " ").replace("_", " "),
        status=status,
        detail=detail,
        code=code,
        **extra,
    )
    return JSONResponse(body.model_dump(), status_code=status, media_type=MEDIA_TYPE)


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every turnkit error, validation error and HTTP error with a problem body."""

    async def turnkit_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TurnkitError)
        return problem_response(status_for(exc), exc.code, exc.message)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(422, "invalid-input", detail or "invalid request", errors=errors)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = "not-found" if exc.status_code == 404 else "invalid-input"
        return problem_response(exc.status_code, code, str(exc.detail))

    app.add_exception_handler(TurnkitError, turnkit_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
