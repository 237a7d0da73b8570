"""RFC 9457 problem bodies built from `TurnkitError`s and request validation errors."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from turnkit._problems import (
    MEDIA_TYPE,
    Problem,
    ProblemRoute,
    problem_response,
    status_for,
    turnkit_problem,
)
from turnkit.errors import TurnkitError

__all__ = (
    "MEDIA_TYPE",
    "Problem",
    "ProblemRoute",
    "install_problem_handlers",
    "problem_response",
    "status_for",
)

_HTTP_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "content-too-large",
}


_UNION_BRANCH = re.compile(r"(str|int|float|bool|list|dict|none)|.*[\[(].*")
"""A `loc` segment naming which member of a union pydantic tried (`str`, `list[...]`)."""


def _where(loc: Sequence[int | str]) -> list[int | str]:
    """An error's location as a client wrote the field: without union branches."""
    return [part for part in loc if not (isinstance(part, str) and _UNION_BRANCH.fullmatch(part))]


def _said(error: Mapping[str, Any]) -> str:
    """Pydantic's message, in words where it quotes a pattern a person cannot read."""
    pattern = (error.get("ctx") or {}).get("pattern")
    if error.get("type") == "string_pattern_mismatch" and pattern == r"\S":
        return "String should be not only white space"
    # A check of turnkit's own raised ValueError: its words, without pydantic's prefix.
    return str(error.get("msg", "")).removeprefix("Value error, ")


def _detail(errors: list[dict[str, Any]]) -> str:
    """One line: each field once, with what each accepted form expected (`a, or b`)."""
    by_field: dict[str, list[str]] = {}
    for error in errors:
        said = by_field.setdefault(".".join(map(str, error["loc"])), [])
        if error["msg"] not in said:
            said.append(error["msg"])
    return "; ".join(f"{field}: {', or '.join(said)}" for field, said in by_field.items())


MAX_ERRORS = 20
"""The most validation errors a problem body lists."""

_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _not_json_content_type(request: Request) -> str | None:
    """The request's content type when it names one that is not JSON, else None.

    FastAPI parses a body as JSON only when it has no content type or a JSON one
    (`application/json`, `application/*+json`); any other leaves it unparsed.
    """
    sent = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not sent:
        return None
    kind, _, subtype = sent.partition("/")
    if kind == "application" and (subtype == "json" or subtype.endswith("+json")):
        return None
    return sent


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error with a problem body.

    Turnkit's errors, validation and HTTP errors each as documented; any other exception
    as 500 `internal-error`, naming only its type (the server logs it whole).
    """

    async def turnkit_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TurnkitError)
        return turnkit_problem(exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        found = exc.errors()
        not_json = [e for e in found if e.get("type") == "json_invalid"]
        if not_json:
            reason = (not_json[0].get("ctx") or {}).get("error") or not_json[0].get("msg")
            return problem_response(422, "invalid-input", f"the body is not JSON: {reason}")
        sent_as = _not_json_content_type(request)
        if sent_as is not None and any(tuple(e.get("loc", ())) == ("body",) for e in found):
            # FastAPI reads a body as JSON only under a JSON content type (curl's `-d`
            # without `-H` sends a form): the fix is the header, not the body.
            detail = (
                f"the body is not JSON: it came as {sent_as!r}; "
                "send it with the header content-type: application/json"
            )
            return problem_response(422, "invalid-input", detail)
        # A body of a million bad items is a million errors: answer the first few (a
        # problem body as large as the body it refuses would be a memory and CPU lever).
        errors = [{"loc": _where(e.get("loc", ())), "msg": _said(e)} for e in found[:MAX_ERRORS]]
        code = (
            "invalid-session-id"
            if any(e["loc"] == ["path", "session_id"] for e in errors)
            else "invalid-input"
        )
        detail = _detail(errors) or "invalid request"
        if len(found) > MAX_ERRORS:
            detail += f"; and {len(found) - MAX_ERRORS} more errors"
        return problem_response(422, code, detail, errors=errors)

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

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette raises the exception on after this answer: the server logs it whole.
        detail = f"an unexpected {type(exc).__name__} on the server (its log has the details)"
        return problem_response(500, "internal-error", detail)

    app.add_exception_handler(TurnkitError, turnkit_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
