"""The execute route picks a hosted agent, pins message settings, and hands tools deps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header
from tests.support import agents_host
from tests.support.agents_host import AppDeps, RuleModel

from turnkit import SessionRuntime
from turnkit.http import TURN_ID_HEADER, create_turnkit_router, install_problem_handlers

API = "/api/harness"


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


async def _deps(x_tenant: str | None = Header(default=None)) -> AppDeps:
    return AppDeps(tenant=x_tenant or "none", built_by_pid=0)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, SessionRuntime]]:
    runtime = agents_host.runtime(
        f"sqlite:///{tmp_path / 'http.db'}", models={"warm": RuleModel("warm-model")}
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_principal, deps=_deps))
    install_problem_handlers(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, runtime
    await runtime.close()


def _events(text: str) -> list[dict[str, object]]:
    return [
        json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")
    ]


async def test_execute_runs_the_named_agent_with_the_callers_deps(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    response = await http.post(
        f"{API}/sessions/s1/execute",
        json={"content": "who?", "agent": "special", "settings": {"temperature": 0.3, "topP": 0.5}},
        headers={"x-user": "ada", "x-tenant": "acme"},
    )
    assert response.status_code == 200
    answers = [e for e in _events(response.text) if e["type"] == "message.complete"]
    assert answers[-1]["block"]["text"] == "special-model: ada at acme"  # type: ignore[index]
    record = await runtime.turn(response.headers[TURN_ID_HEADER])
    assert record.agent == "special"
    assert record.pinned["overrides"] == {"settings": {"temperature": 0.3, "top_p": 0.5}}


async def test_a_served_model_can_be_picked_per_message(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, _ = served
    response = await http.post(
        f"{API}/sessions/s1/execute", json={"content": "hi", "model": "warm"}
    )
    answers = [e for e in _events(response.text) if e["type"] == "message.complete"]
    assert answers[-1]["block"]["text"] == "warm-model: no tools"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"content": "hi", "agent": "nobody"}, 404, "agent-not-found"),
        ({"content": "hi", "settings": {"temperature": 9}}, 422, "invalid-input"),
        ({"content": "hi", "settings": {"temprature": 0.1}}, 422, "invalid-input"),
        ({"content": "hi", "model": "not-served"}, 403, "model-not-allowed"),
    ],
)
async def test_bad_agent_or_settings_answer_a_problem_and_write_nothing(
    served: tuple[httpx.AsyncClient, SessionRuntime],
    body: dict[str, object],
    status: int,
    code: str,
) -> None:
    http, runtime = served
    response = await http.post(f"{API}/sessions/s-bad/execute", json=body)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert await runtime.store.list_turns("s-bad") == []  # type: ignore[arg-type]
