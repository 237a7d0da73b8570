"""The AI SDK and AG-UI routes in an app's own FastAPI app, with the app's own `auth`.

The app's `auth` returns a `turnkit.Principal`, as for `create_turnkit_router`: a chat goes
on over several messages, a reloaded page finds its running message, another caller (of
this organisation or of another) sees nothing, and a tenant not served is told so.
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


async def test_callers_of_other_organisations_keep_their_own_chats(tmp_path: Path) -> None:
    """Tenants use these routes as they use the harness's: a chat is its principal's within
    their organisation, and an organisation or department not served is refused (403)."""
    from turnkit import Department, Organisation

    model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'app.db'}"),
        tenancy=[
            Organisation(name="acme", departments=(Department(name="sales"),)),
            Organisation(name="globex"),
        ],
    )

    async def broken() -> object:
        return 42  # not a Principal, an id or None

    acme = {"x-user": "ada", "x-org": "acme", "x-dept": "sales"}
    globex = {"x-user": "ada", "x-org": "globex"}  # the same id, another tenant
    async with runtime:
        transport = httpx.ASGITransport(app=_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            served = await http.post("/api/chat", json=_chat("c1", "hi"), headers=acme)
            assert served.status_code == 200, served.text
            assert _text(served.text) == "Hello."
            other = await http.post("/api/chat", json=_chat("c1", "hi"), headers=globex)
            assert other.status_code == 404  # acme's ada's chat, not globex's ada's
            resumed = await http.get("/api/chat/c1/stream", headers=globex)
            assert resumed.status_code == 204  # nothing of hers to resume
            run = await http.post("/api/agui/run", json=_run("t1", "r1", "hi"), headers=globex)
            assert _agui_text(run.text) == "Hello."
            other = await http.post("/api/agui/run", json=_run("t1", "r2", "hi"), headers=acme)
            assert other.status_code == 404
            unknown = {"x-user": "ada", "x-org": "initech"}
            refused = await http.post("/api/chat", json=_chat("c2", "hi"), headers=unknown)
            assert refused.status_code == 403  # as the harness routes refuse it
            assert refused.json()["code"] == "department-unknown"
            anonymous = await http.post("/api/chat", json=_chat("c1", "hi"))
            assert anonymous.status_code == 401  # the app's own refusal
        session = await runtime.store.get_session("c1")  # type: ignore[arg-type]
        assert session is not None
        assert (session.principal, session.organisation) == ("ada", "acme")
        transport = httpx.ASGITransport(app=_app(runtime, broken), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            failed = await http.post("/api/agui/run", json=_run("t1", "r1", "hi"))
            assert failed.status_code == 500
            assert "not a Principal, a principal id or None" in failed.json()["detail"]
