"""turnkit's routers answer turnkit's errors with problem bodies in an app that forgot the handlers.

`install_problem_handlers` makes every error of an app a problem body (validation and
HTTP errors too). An app that mounts a router without it still gets problem bodies for
turnkit's own errors, where a bare `500 Internal Server Error` used to come back, and a
warning naming the call it lacks; an app's own handler for them still wins.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import SessionNotFoundError
from turnkit.http import create_turnkit_router
from turnkit.protocols.agui import create_agui_router
from turnkit.protocols.ai_sdk import create_ai_sdk_router
from turnkit.testing import ScriptedModel


def _runtime(tmp_path: Path) -> SessionRuntime:
    return SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'p.db'}"),
    )


async def test_turnkit_errors_are_problem_bodies_without_the_handlers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from turnkit import _problems

    _problems._warned.clear()  # the warning comes once a process
    caplog.set_level(logging.WARNING, logger="turnkit.http")
    runtime = _runtime(tmp_path)
    app = FastAPI()  # no install_problem_handlers
    app.include_router(create_turnkit_router(runtime))
    app.include_router(create_ai_sdk_router(runtime))
    app.include_router(create_agui_router(runtime))
    async with runtime:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            history = await http.get("/api/harness/sessions/nope/history")
            assert history.status_code == 404
            assert history.headers["content-type"] == "application/problem+json"
            assert history.json()["code"] == "session-not-found"
            empty = await http.post("/api/harness/sessions/s1/execute", json={"content": " "})
            assert (empty.status_code, empty.json()["code"]) == (422, "empty-content")
            resumed = await http.get("/api/chat/nope/stream")
            assert resumed.status_code == 204  # no chat: nothing to resume
            run = {"threadId": "t1", "runId": "r1", "messages": [], "resume": [
                {"interruptId": "req_x", "status": "resolved", "payload": {"approved": True}}
            ]}  # fmt: skip
            answered = await http.post("/api/agui/run", json=run)
            assert answered.status_code == 404
            assert answered.json()["code"] == "session-not-found"
    warned = [r for r in caplog.records if "install_problem_handlers(app)" in r.getMessage()]
    assert len(warned) == 1  # once a process, not once a request


async def test_an_apps_own_handler_still_answers(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    app = FastAPI()

    @app.exception_handler(SessionNotFoundError)
    async def mine(_: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("not here", status_code=410)

    app.include_router(create_turnkit_router(runtime))
    async with runtime:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            history = await http.get("/api/harness/sessions/nope/history")
    assert (history.status_code, history.text) == (410, "not here")


async def test_a_catch_all_handler_does_not_turn_a_missing_session_into_a_500(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path)
    app = FastAPI()

    @app.exception_handler(Exception)
    async def anything(_: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("oops", status_code=500)

    app.include_router(create_turnkit_router(runtime))
    async with runtime:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            history = await http.get("/api/harness/sessions/nope/history")
    assert (history.status_code, history.json()["code"]) == (404, "session-not-found")
