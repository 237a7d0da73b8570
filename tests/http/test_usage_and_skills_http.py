"""Usage grouped by session and day, from the rollup the audit transaction writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.testing import ModelStep, ScriptedModel

API = "/api/harness"


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, SessionRuntime]]:
    model = ScriptedModel([ModelStep.text_reply("Hello from the route.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model, skip_stages=frozenset({"anchor-plan"})),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'usage.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_principal))
    install_problem_handlers(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        yield http, runtime
    await runtime.close()


async def _turn(http: httpx.AsyncClient, session: str, user: str) -> None:
    response = await http.post(
        f"{API}/sessions/{session}/execute", json={"content": "hi"}, headers={"x-user": user}
    )
    assert response.status_code == 200


async def test_usage_is_grouped_and_only_the_callers(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    await _turn(http, "a1", "alice")
    await _turn(http, "a1", "alice")
    await _turn(http, "a2", "alice")
    await _turn(http, "b1", "bob")
    by_session = (await http.get(f"{API}/usage?by=session", headers={"x-user": "alice"})).json()
    by_day = (await http.get(f"{API}/usage", headers={"x-user": "alice"})).json()
    rollups = [
        await runtime.store.read_usage(t.turn_id) for t in await runtime.store.list_turns("a1")
    ]  # type: ignore[arg-type]

    assert [(line["key"], line["turns"]) for line in by_session["lines"]] == [("a1", 2), ("a2", 1)]
    a1 = by_session["lines"][0]
    assert a1["modelCalls"] == sum(r.model_calls for r in rollups) == 2
    assert a1["inputTokens"] == sum(r.input_tokens for r in rollups) > 0
    assert by_day["by"] == "day"
    [today] = by_day["lines"]
    assert today["turns"] == 3  # bob's turn is not alice's
    assert len(today["key"]) == 10  # YYYY-MM-DD
    # Per-turn totals in history, from the same rollup.
    history = (await http.get(f"{API}/sessions/a1/history", headers={"x-user": "alice"})).json()
    assert [(t["inputTokens"], t["outputTokens"]) for t in history] == [
        (r.input_tokens, r.output_tokens) for r in rollups
    ]
    future = await http.get(
        f"{API}/usage", params={"since": "2999-01-01T00:00:00Z"}, headers={"x-user": "alice"}
    )
    assert future.json()["lines"] == []
    bad = await http.get(f"{API}/usage?by=team", headers={"x-user": "alice"})
    assert bad.status_code == 422
    # A bare number is not read as seconds since 1970 (`since=2026` was 00:33:46 that day).
    year = await http.get(f"{API}/usage?since=2026", headers={"x-user": "alice"})
    assert year.status_code == 422
    assert "'2026' is a number, not a date" in year.json()["detail"]
    day = await http.get(f"{API}/usage?until=2999-01-01", headers={"x-user": "alice"})
    assert [line["turns"] for line in day.json()["lines"]] == [3]
    # Her own usage by department: one line, the default department's.
    mine = (await http.get(f"{API}/usage?by=department", headers={"x-user": "alice"})).json()
    assert [(line["key"], line["turns"]) for line in mine["lines"]] == [("general", 3)]
    # The organisation's usage is for admins only.
    refused = await http.get(f"{API}/usage?scope=organisation", headers={"x-user": "alice"})
    assert (refused.status_code, refused.json()["code"]) == (403, "admission-refused")


async def test_skills_route_lists_what_a_slash_menu_offers(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, _ = served
    skills = (await http.get(f"{API}/skills", headers={"x-user": "alice"})).json()
    assert [s["ref"] for s in skills] == ["builtin:brainstorming", "builtin:writing-plans"]
    assert all(s["description"] and s["builtin"] for s in skills)
