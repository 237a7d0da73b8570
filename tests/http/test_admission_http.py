"""Turn start over HTTP: an `auth` returning a Principal, the admission chain's refusals as
403 problems with nothing written, the budget routes (admins), and turn-token callbacks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import Agent, Department, Organisation, Principal, RuntimeConfig, SessionRuntime
from turnkit.errors import CallbackTokenError
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.http._admin import CALLBACK_TOKEN_HEADER
from turnkit.testing import ModelStep, ScriptedModel, call
from turnkit.tools import ToolContext, tool

API = "/api/harness"
ACME = Organisation(
    name="acme",
    departments=(Department(name="sales", blocked_models=frozenset({"big"})),),
    default_agent="helper",
)


async def _caller(
    x_user: str | None = Header(default=None),
    x_dept: str | None = Header(default=None),
    x_role: str | None = Header(default=None),
) -> Principal | None:
    if x_user is None:
        return None
    roles = frozenset({x_role}) if x_role else frozenset()
    return Principal(id=x_user, organisation="acme", department=x_dept, roles=roles)


TOKENS: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
RELEASE = asyncio.Event()


@tool
async def long_job(ctx: ToolContext) -> str:
    """Start a job elsewhere and wait for it."""
    assert ctx.callback_token is not None
    TOKENS.put_nowait((ctx.turn_id, ctx.tool_call_id, ctx.callback_token))
    await asyncio.wait_for(RELEASE.wait(), timeout=20)
    return "job done"


def _models() -> dict[str, ScriptedModel]:
    def answers(name: str) -> ScriptedModel:
        return ScriptedModel([ModelStep.text_reply("ok.")], name=name, repeat_last=True)

    return {"small": answers("small"), "big": answers("big")}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, SessionRuntime]]:
    runtime = SessionRuntime(
        agents=[
            Agent(name="helper", model="small", skip_stages=frozenset({"anchor-plan"})),
            Agent(name="deep", model="big", skip_stages=frozenset({"anchor-plan"})),
        ],
        models=_models(),
        tenancy=[ACME],
        config=RuntimeConfig(
            database_url=f"sqlite:///{tmp_path / 'admission.db'}", budgets="enforce"
        ),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_caller))
    install_problem_handlers(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        yield http, runtime
    await runtime.close()


def _who(user: str, dept: str | None = None, role: str | None = None) -> dict[str, str]:
    headers = {"x-user": user}
    if dept:
        headers["x-dept"] = dept
    if role:
        headers["x-role"] = role
    return headers


ADMIN = _who("root", role="admin")


async def test_each_refusal_is_a_403_problem_and_writes_nothing(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    refusals = [
        (_who("eve", dept="legal"), {}, "department-unknown"),
        (_who("ann", dept="sales"), {"agent": "deep"}, "agent-not-allowed"),  # not admin
        (_who("ann", dept="sales"), {"model": "big"}, "model-not-allowed"),
        (_who("ann", dept="sales"), {}, "budget-policy-missing"),  # no limit yet
    ]
    for headers, extra, code in refusals:
        response = await http.post(
            f"{API}/sessions/s1/execute", json={"content": "hi", **extra}, headers=headers
        )
        assert response.status_code == 403, (code, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == code
    assert await runtime.store.list_sessions(limit=10) == []

    # An admin sets a limit for sales: ann's message goes through.
    put = await http.put(
        f"{API}/budgets",
        json={"scope": "department", "key": "sales", "tokens": 1_000_000},
        headers=ADMIN,
    )
    assert put.status_code == 200, put.text
    ok = await http.post(
        f"{API}/sessions/s1/execute", json={"content": "hi"}, headers=_who("ann", dept="sales")
    )
    assert ok.status_code == 200
    [record] = await runtime.store.list_turns("s1")  # type: ignore[arg-type]
    assert (record.agent, record.pinned["department"]) == ("helper", "sales")


async def test_budget_routes_are_for_admins_and_show_what_was_spent(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, _ = served
    assert (await http.get(f"{API}/budgets", headers=_who("ann"))).status_code == 403
    bad = await http.put(f"{API}/budgets", json={"scope": "principal"}, headers=ADMIN)
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid-input")  # no amount
    said = "a bad budget limit: a budget limit needs `usd`, `tokens` or both"
    assert bad.json()["detail"] == said  # without pydantic's links
    for amount in (b'"usd": 1e999', b'"tokens": 100000000000000000000000000'):  # inf; too big
        huge = await http.put(
            f"{API}/budgets", content=b'{"scope": "principal", "key": "ann", ' + amount + b"}",
            headers={**ADMIN, "content-type": "application/json"},
        )  # fmt: skip
        assert (huge.status_code, huge.json()["code"]) == (422, "invalid-input"), huge.text
    await http.put(
        f"{API}/budgets", json={"scope": "principal", "key": "ann", "usd": 5}, headers=ADMIN
    )
    await http.post(f"{API}/sessions/s1/execute", json={"content": "hi"}, headers=_who("ann"))
    [budget] = (await http.get(f"{API}/budgets", headers=ADMIN)).json()["budgets"]
    assert (budget["scope"], budget["key"], budget["usd"]) == ("principal", "ann", 5.0)
    assert budget["spentTokens"] > 0
    assert budget["reservedTokens"] == 0  # the turn ended: nothing held
    gone = await http.delete(f"{API}/budgets/principal/month?key=ann", headers=ADMIN)
    assert gone.status_code == 204
    assert (await http.get(f"{API}/budgets", headers=ADMIN)).json()["budgets"] == []
    # With no limit left, budgets fail closed again.
    refused = await http.post(
        f"{API}/sessions/s2/execute", json={"content": "hi"}, headers=_who("ann")
    )
    assert refused.json()["code"] == "budget-policy-missing"


async def test_a_callback_reaches_only_its_running_turn(tmp_path: Path) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("long_job")), ModelStep.text_reply("Finished.")]
    )
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[long_job], skip_stages=frozenset({"anchor-plan"})),
        tenancy=[Organisation(name="acme", departments=(Department(name="sales"),))],
        config=RuntimeConfig(
            database_url=f"sqlite:///{tmp_path / 'callbacks.db'}",
            callback_secret="s3cret-shared-by-every-process",
        ),
    )
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_caller))
    install_problem_handlers(app)
    RELEASE.clear()
    async with (
        runtime,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http,
    ):
        streaming = asyncio.create_task(
            http.post(
                f"{API}/sessions/s1/execute",
                json={"content": "run the job"},
                headers=_who("ann", dept="sales"),
            )
        )
        turn_id, call_id, token = await asyncio.wait_for(TOKENS.get(), timeout=10)
        assert token == runtime.callback_token(turn_id)
        url = f"{API}/turns/{turn_id}/callback"
        body = {"jobId": "j1", "toolCallId": call_id, "progress": 0.5, "message": "halfway"}

        forged = token[:-1] + ("1" if token.endswith("0") else "0")  # one character off
        wrong = await http.post(url, json=body, headers={CALLBACK_TOKEN_HEADER: forged})
        assert (wrong.status_code, wrong.json()["code"]) == (401, "callback-token-invalid")
        missing = await http.post(url, json=body)  # no token header at all
        assert (missing.status_code, missing.json()["code"]) == (401, "callback-token-invalid")
        other = await http.post(
            f"{API}/turns/turn_other/callback",
            json=body,
            headers={CALLBACK_TOKEN_HEADER: token},  # this turn's token names only this turn
        )
        assert other.json()["code"] == "callback-token-invalid"

        # A call the turn never made is refused, and nothing reaches its stream.
        stranger = {**body, "toolCallId": "call_never_made"}
        refused = await http.post(url, json=stranger, headers={CALLBACK_TOKEN_HEADER: token})
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid-input")
        assert "is not one of its tool calls" in refused.json()["detail"]

        # No user auth at all: the token names the turn, and who it acts for comes from it.
        reached = await http.post(url, json=body, headers={CALLBACK_TOKEN_HEADER: token})
        assert reached.status_code == 202, reached.text
        assert reached.json() == {
            "turnId": turn_id,
            "sessionId": "s1",
            "principal": "ann",
            "organisation": "acme",
            "department": "sales",
        }
        RELEASE.set()
        response = await asyncio.wait_for(streaming, timeout=20)
        events = [
            json.loads(line[len("data:") :])
            for line in response.text.splitlines()
            if line.startswith("data:")
        ]
        progress = [e for e in events if e["type"] == "job.progress"]
        assert [(p["progress"], p["message"]) for p in progress] == [(0.5, "halfway")]
        assert events[-1]["type"] == "done"

        finished = await http.post(url, json=body, headers={CALLBACK_TOKEN_HEADER: token})
        assert (finished.status_code, finished.json()["code"]) == (409, "turn-not-running")


async def test_a_forged_callback_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(
            database_url=f"sqlite:///{tmp_path / 'closed.db'}",
            callback_secret="s3cret-shared-by-every-process",
        ),
    )  # never opened: a token check must not need the database
    with pytest.raises(CallbackTokenError):
        await runtime.verify_callback("turn_1", "tkcb_forged")


async def _sessions_with_auth(tmp_path: Path, auth: Callable[..., Any]) -> httpx.Response:
    """`GET /sessions` of an app whose `auth` dependency is `auth` (an exception it raises
    is answered, as a server answers it, not raised into the test)."""
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'auth.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=auth))
    install_problem_handlers(app)
    try:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.get("/api/harness/sessions")
    finally:
        await runtime.close()


async def test_an_auth_that_returns_nonsense_is_the_apps_500_and_leaks_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def leaky_auth() -> object:
        return {"id": "alice", "api_token": "tok_LIVE_abcdef"}  # the app's own mistake

    answer = await _sessions_with_auth(tmp_path, leaky_auth)
    assert answer.status_code == 500  # the app's mistake, not the caller's (it said 400)
    assert answer.json()["code"] == "internal-error"
    assert "tok_LIVE" not in answer.text
    assert "returned a dict" in answer.json()["detail"]
    assert any("tok_LIVE_abcdef" in r.getMessage() for r in caplog.records)  # for the app


async def test_an_unexpected_exception_answers_a_problem_body_that_names_only_its_type(
    tmp_path: Path,
) -> None:
    """A bug in the app's own dependency (or a database error turnkit does not know) is a
    500 problem body like every other error, and its message stays in the server's log."""

    async def broken_auth() -> object:
        raise RuntimeError("connection to ldap://admin:hunter2@10.0.0.5 failed")

    answer = await _sessions_with_auth(tmp_path, broken_auth)
    assert answer.status_code == 500
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == "internal-error"
    assert "RuntimeError" in answer.json()["detail"]
    assert "hunter2" not in answer.text
