"""The routes open a runtime nobody opened, as its Python methods do; a closed one is a 503.

`create_app` opens its runtime in its lifespan, which Starlette does not run for a mounted
sub-app (nor does `httpx.ASGITransport` for any app): the routes must not depend on it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from turnkit import Agent, RuntimeClosedError, RuntimeConfig, SessionRuntime
from turnkit.quickstart import create_app
from turnkit.runtime import worker as worker_module
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel

CHAT = {
    "id": "c1",
    "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
}
RUN = {"threadId": "t1", "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "hi"}]}


def _runtime(db: tuple[str, str | None], replies: int = 3) -> SessionRuntime:
    url, schema = db
    model = ScriptedModel([ModelStep.text_reply("Hello!") for _ in range(replies)])
    return SessionRuntime(
        agent=Agent(model=model), config=RuntimeConfig(database_url=url, database_schema=schema)
    )


def _mounted(runtime: SessionRuntime) -> httpx.AsyncClient:
    """A client of an app of one's own with the quickstart app mounted (no lifespan runs)."""
    app = FastAPI()
    app.mount("/chat", create_app(runtime))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
async def closing() -> AsyncIterator[list[SessionRuntime]]:
    runtimes: list[SessionRuntime] = []
    yield runtimes
    for runtime in runtimes:
        await runtime.close()


async def test_a_mounted_app_opens_its_runtime_at_the_first_request(
    db: tuple[str, str | None], closing: list[SessionRuntime]
) -> None:
    runtime = _runtime(db)
    closing.append(runtime)
    async with _mounted(runtime) as http:
        listed = await http.get("/chat/api/harness/sessions")
        assert (listed.status_code, listed.json()) == (200, [])
        sent = await http.post("/chat/api/harness/sessions/s1/execute", json={"content": "hi"})
        assert sent.status_code == 200
        assert '"type":"done"' in sent.text.rstrip().splitlines()[-1]
        chat = await http.post("/chat/api/chat", json=CHAT)  # the AI SDK's route
        assert chat.status_code == 200, chat.text
        assert '"type":"finish"' in chat.text
        run = await http.post("/chat/api/agui/run", json=RUN)  # AG-UI's
        assert run.status_code == 200, run.text
        assert "RUN_FINISHED" in run.text
        ready = await http.get("/chat/readyz")
        assert (ready.status_code, ready.json()["store"]) == (200, "ok")


async def test_readyz_opens_a_runtime_nobody_opened(
    tmp_path: Path, closing: list[SessionRuntime]
) -> None:
    """Else a load balancer would wait for readiness that only its traffic could bring."""
    runtime = _runtime((f"sqlite:///{tmp_path / 'r.db'}", None))
    closing.append(runtime)
    async with _mounted(runtime) as http:
        ready = await http.get("/chat/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")


async def test_concurrent_first_requests_open_the_runtime_once(
    tmp_path: Path, closing: list[SessionRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime((f"sqlite:///{tmp_path / 'c.db'}", None))
    closing.append(runtime)
    opened = runtime._open_parts
    openings: list[int] = []

    async def slow_open() -> None:
        openings.append(1)
        await asyncio.sleep(0.05)  # the other requests arrive while it opens
        await opened()

    monkeypatch.setattr(runtime, "_open_parts", slow_open)
    async with _mounted(runtime) as http:
        answers = await asyncio.gather(
            *(http.get("/chat/api/harness/sessions") for _ in range(8)),
            http.get("/chat/readyz"),
            http.post("/chat/api/harness/sessions/s1/execute", json={"content": "hi"}),
        )
    assert [a.status_code for a in answers] == [200] * 10
    assert len(openings) == 1


async def test_a_closed_runtime_answers_503_runtime_closed(
    db: tuple[str, str | None],
) -> None:
    runtime = _runtime(db)
    await runtime.open()
    await runtime.close()
    async with _mounted(runtime) as http:
        answers = {
            "sessions": await http.get("/chat/api/harness/sessions"),
            "execute": await http.post(
                "/chat/api/harness/sessions/s1/execute", json={"content": "hi"}
            ),
            "ai-sdk": await http.post("/chat/api/chat", json=CHAT),
            "ag-ui": await http.post("/chat/api/agui/run", json=RUN),
        }
        ready = await http.get("/chat/readyz")
    for route, answer in answers.items():
        assert answer.status_code == 503, (route, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json"), route
        assert answer.headers["Retry-After"] == "2", route
        assert answer.json()["code"] == "runtime-closed", route
    assert ready.status_code == 503
    assert "RuntimeClosedError" in ready.json()["detail"]
    with pytest.raises(RuntimeClosedError):  # nothing opened it again
        runtime.store  # noqa: B018


async def test_an_opening_the_configuration_refuses_is_the_servers_500_not_a_400(
    db: tuple[str, str | None],
    closing: list[SessionRuntime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, schema = db
    runtime = SessionRuntime(  # a fresh database it may not migrate: the opening refuses it
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=url, database_schema=schema, auto_migrate=False),
    )
    closing.append(runtime)
    async with _mounted(runtime) as http:
        answers = [
            await http.get("/chat/api/harness/sessions"),
            await http.post("/chat/api/chat", json=CHAT),
            await http.post("/chat/api/agui/run", json=RUN),
        ]
        ready = await http.get("/chat/readyz")
    for answer in answers:
        assert answer.status_code == 500, answer.text
        assert answer.json()["code"] == "internal-error"
        assert "upgrade" not in answer.text  # the server's words stay in its log
    assert "turnkit db upgrade" in caplog.text
    assert ready.status_code == 503


async def test_readyz_is_not_ready_once_a_runtime_with_the_apps_store_closed(
    tmp_path: Path,
) -> None:
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'own.db'}")
    await store.setup()
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        store=store,
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'own.db'}"),
    )
    try:
        async with _mounted(runtime) as http:
            assert (await http.get("/chat/readyz")).status_code == 200  # not opened: the Store
            await runtime.open()
            await runtime.close()  # the app's own Store stays open
            ready = await http.get("/chat/readyz")
            listed = await http.get("/chat/api/harness/sessions")
    finally:
        await store.close()
    assert ready.status_code == 503
    assert "RuntimeClosedError" in ready.json()["detail"]
    assert (listed.status_code, listed.json()["code"]) == (503, "runtime-closed")


async def test_the_recovery_loop_does_not_carry_the_opening_requests_context(
    tmp_path: Path, closing: list[SessionRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened by a request, the loop must not run in its context (its trace span, say)."""
    request_scoped: contextvars.ContextVar[str] = contextvars.ContextVar("request_scoped")
    seen: list[str] = []

    async def run(self: Any, stop: asyncio.Event) -> None:
        seen.append(request_scoped.get("none"))
        await stop.wait()

    monkeypatch.setattr(worker_module.Worker, "run", run)
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(
            database_url=f"sqlite:///{tmp_path / 'x.db'}", recover_in_process=True
        ),
    )
    closing.append(runtime)
    request_scoped.set("the first request")
    await runtime.ensure_open()
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == ["none"]
