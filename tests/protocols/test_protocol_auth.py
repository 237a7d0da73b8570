"""The AI SDK and AG-UI routes in an app's own FastAPI app, with the app's own `auth`.

The app's `auth` returns a `turnkit.Principal`, as for `create_turnkit_router`: a chat goes
on over several messages, a reloaded page finds its running message, another caller sees
nothing, and a caller the routes cannot serve is told so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from tests.support.header_auth import header_auth
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.http import install_problem_handlers
from turnkit.protocols.agui import create_agui_router
from turnkit.protocols.ai_sdk import create_ai_sdk_router
from turnkit.testing import ModelStep, ScriptedModel


def _runtime(tmp_path: Path, *replies: str) -> SessionRuntime:
    model = ScriptedModel([ModelStep.text_reply(reply) for reply in replies])
    return SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'app.db'}"),
    )


def _app(runtime: SessionRuntime, auth: Any = header_auth) -> FastAPI:
    app = FastAPI()
    app.include_router(create_ai_sdk_router(runtime, auth=auth))
    app.include_router(create_agui_router(runtime, auth=auth))
    install_problem_handlers(app)
    return app


def _chat(chat: str, *texts: str) -> dict[str, Any]:
    messages = [
        {"id": f"u{n}", "role": "user", "parts": [{"type": "text", "text": text}]}
        for n, text in enumerate(texts)
    ]
    return {"id": chat, "messages": messages}


def _run(thread: str, run: str, text: str) -> dict[str, Any]:
    message = {"id": f"m-{run}", "role": "user", "content": text}
    return {"threadId": thread, "runId": run, "messages": [message]}


def _text(body: str) -> str:
    lines = [line[6:] for line in body.splitlines() if line.startswith("data: {")]
    chunks = [json.loads(line) for line in lines]
    return "".join(c.get("delta", "") for c in chunks if c["type"] == "text-delta")


def _agui_text(body: str) -> str:
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_a_principal_from_the_apps_auth_keeps_its_chats(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path, "One.", "Two.", "Three.", "Four.")
    ada = {"x-user": "ada"}
    async with runtime:
        transport = httpx.ASGITransport(app=_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            first = await http.post("/api/chat", json=_chat("c1", "hi"), headers=ada)
            assert _text(first.text) == "One."
            again = await http.post("/api/chat", json=_chat("c1", "hi", "more"), headers=ada)
            assert again.status_code == 200, again.text  # the chat goes on
            assert _text(again.text) == "Two."
            other = await http.post("/api/chat", json=_chat("c1", "hi"), headers={"x-user": "bo"})
            assert other.status_code == 404

            run = await http.post("/api/agui/run", json=_run("t1", "r1", "hi"), headers=ada)
            assert _agui_text(run.text) == "Three."
            run = await http.post("/api/agui/run", json=_run("t1", "r2", "more"), headers=ada)
            assert run.status_code == 200, run.text  # the thread goes on
            assert _agui_text(run.text) == "Four."
            other = await http.post(
                "/api/agui/run", json=_run("t1", "r3", "hi"), headers={"x-user": "bo"}
            )
            assert other.status_code == 404
        assert (await runtime.store.get_session("c1")).principal == "ada"  # type: ignore[arg-type,union-attr]


async def test_a_caller_the_protocol_routes_cannot_serve_is_told_so(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path, "Hello.")

    async def broken() -> object:
        return 42  # not a Principal, an id or None

    async with runtime:
        transport = httpx.ASGITransport(app=_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            for headers in (
                {"x-user": "ada", "x-dept": "sales"},
                {"x-user": "ada", "x-org": "acme"},
            ):
                refused = await http.post("/api/chat", json=_chat("c1", "hi"), headers=headers)
                assert refused.status_code == 403
                assert "use the harness routes" in refused.json()["detail"]
            named = {"x-user": "ada", "x-dept": "general"}  # the default department, by name
            served = await http.post("/api/chat", json=_chat("c2", "hi"), headers=named)
            assert served.status_code == 200, served.text
            anonymous = await http.post("/api/chat", json=_chat("c1", "hi"))
            assert anonymous.status_code == 401  # the app's own refusal
        transport = httpx.ASGITransport(app=_app(runtime, broken), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            failed = await http.post("/api/agui/run", json=_run("t1", "r1", "hi"))
            assert failed.status_code == 500
            assert "not a Principal, a principal id or None" in failed.json()["detail"]
