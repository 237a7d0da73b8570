"""Two organisations on one runtime: a principal is its id *within* its organisation.

Callers with the same id in two organisations are two callers: neither sees, lists, posts
into or streams the other's sessions; and two first messages racing for a new session id
never put one organisation's message into the other's session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import (
    Agent,
    Department,
    Organisation,
    Principal,
    RuntimeConfig,
    SessionRuntime,
    ToolContext,
    tool,
)
from turnkit.errors import SessionNotFoundError
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.runtime.deps import DepsScope
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

API = "/api/harness"


async def _caller(
    x_user: str = Header(), x_org: str = Header()
) -> Principal:  # e.g. a bearer token mapped to its user
    return Principal(id=x_user, organisation=x_org)


def _as(user: str, org: str) -> dict[str, str]:
    return {"x-user": user, "x-org": org}


@pytest.fixture
async def served(
    db: tuple[str, str | None],
) -> AsyncIterator[tuple[httpx.AsyncClient, SessionRuntime]]:
    url, schema = db
    model = ScriptedModel([ModelStep.text_reply("ok.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model, skip_stages=frozenset({"anchor-plan"})),
        tenancy=[Organisation(name="acme"), Organisation(name="globex")],
        config=RuntimeConfig(database_url=url, database_schema=schema),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_caller))
    install_problem_handlers(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, runtime
    await runtime.close()


async def _say(http: httpx.AsyncClient, sid: str, text: str, who: dict[str, str]) -> int:
    """POST a message and read its stream to the end; the response's status."""
    async with http.stream(
        "POST", f"{API}/sessions/{sid}/execute", json={"content": text}, headers=who, timeout=30
    ) as response:
        await response.aread()
        return response.status_code


async def test_one_id_in_two_organisations_is_two_callers(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    acme, globex = _as("alice", "acme"), _as("alice", "globex")
    assert await _say(http, "acme-plan", "our secret plan", acme) == 200
    [turn] = (await http.get(f"{API}/sessions/acme-plan/history", headers=acme)).json()

    assert (await http.get(f"{API}/sessions", headers=globex)).json() == []
    for path in (
        "/sessions/acme-plan/history",
        "/sessions/acme-plan/pending",
        "/sessions/acme-plan/files",
        f"/turns/{turn['turnId']}",
        f"/turns/{turn['turnId']}/audit",
    ):
        answer = await http.get(f"{API}{path}", headers=globex)
        assert answer.status_code == 404, (path, answer.text)
        assert "secret" not in answer.text
    assert await _say(http, "acme-plan", "let me in", globex) == 404
    renamed = await http.patch(f"{API}/sessions/acme-plan", json={"title": "mine"}, headers=globex)
    assert renamed.status_code == 404
    assert (await http.delete(f"{API}/sessions/acme-plan", headers=globex)).status_code == 404

    # The owner still has exactly what was hers.
    turns = await runtime.store.list_turns("acme-plan")  # type: ignore[arg-type]
    assert [t.content for t in turns] == ["our secret plan"]
    [mine] = (await http.get(f"{API}/sessions", headers=acme)).json()
    assert mine["sessionId"] == "acme-plan"


async def test_first_messages_racing_for_a_new_session_never_share_it(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    acme, globex = _as("alice", "acme"), _as("gina", "globex")
    for round_ in range(8):
        sid = f"race-{round_}"
        statuses = await asyncio.gather(
            _say(http, sid, "acme's words", acme), _say(http, sid, "globex's words", globex)
        )
        assert sorted(statuses) == [200, 404], statuses
        winner = acme if statuses[0] == 200 else globex
        turns = await runtime.store.list_turns(sid)  # type: ignore[arg-type]
        assert [t.content for t in turns] == [
            "acme's words" if winner is acme else "globex's words"
        ]
        listed = (await http.get(f"{API}/sessions", headers=winner)).json()
        assert sid in [s["sessionId"] for s in listed]


async def test_the_sdk_refuses_a_principal_another_principals_session(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    _, runtime = served
    await runtime.create_session("s1", principal=Principal(id="alice", organisation="acme"))
    intruder = Principal(id="alice", organisation="globex")
    with pytest.raises(SessionNotFoundError):
        await runtime.start("s1", "hi", principal=intruder)
    assert await runtime.store.list_turns("s1") == []  # type: ignore[arg-type]
    # The app's own code (no principal) may still post into any session.
    submission = await runtime.start("s1", "from the app", request_id="r1")
    assert submission.is_new
    # Another principal retrying that request id learns nothing: not even the turn's id.
    with pytest.raises(SessionNotFoundError):
        await runtime.start("s1", "from the app", request_id="r1", principal=intruder)


async def test_each_callers_usage_is_its_own(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, _ = served
    acme, globex = _as("alice", "acme"), _as("alice", "globex")
    for n in range(3):
        assert await _say(http, f"a{n}", "hi", acme) == 200
    assert await _say(http, "g0", "hi", globex) == 200

    def turns(report: httpx.Response) -> int:
        return sum(line["turns"] for line in report.json()["lines"])

    assert turns(await http.get(f"{API}/usage?by=principal", headers=acme)) == 3
    assert turns(await http.get(f"{API}/usage?by=principal", headers=globex)) == 1


async def test_ids_and_keys_with_a_nul_character_are_refused_not_a_server_error(
    served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    http, runtime = served
    alice = _as("alice", "acme")
    assert await _say(http, "s-nul", "hi", alice) == 200
    [turn] = await runtime.store.list_turns("s-nul")  # type: ignore[arg-type]
    for method, path in (
        ("GET", "/turns/turn_x%00"),
        ("GET", "/turns/turn_x%00/audit"),
        ("POST", "/turns/turn_x%00/cancel"),
        ("POST", f"/turns/{turn.turn_id}/approvals/req%00x"),
        ("POST", f"/turns/{turn.turn_id}/clarifications/req%00x"),
    ):
        body = {"decision": "approve", "answer": "x"}
        answer = await http.request(method, f"{API}{path}", headers=alice, json=body)
        assert answer.status_code in (404, 422), (path, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")


SEEN: list[tuple[object, ...]] = []


@tool
async def whoami(ctx: ToolContext) -> str:
    """Say who is asking."""
    caller = ctx.caller
    assert caller is not None
    SEEN.append((ctx.principal, caller.id, caller.organisation, caller.department))
    return caller.organisation


async def test_tools_and_deps_see_the_whole_caller(db: tuple[str, str | None]) -> None:
    """Ids are unique only within an organisation: a tool (and the deps factory) must be
    able to tell which tenant it acts for."""
    SEEN.clear()
    scopes: list[DepsScope] = []

    def deps(scope: DepsScope) -> str:
        scopes.append(scope)
        return "deps"

    url, schema = db
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("whoami")), ModelStep.text_reply("Done.")]
    )
    async with SessionRuntime(
        agent=Agent(model=model, tools=[whoami], skip_stages=frozenset({"anchor-plan"})),
        tenancy=[Organisation(name="globex", departments=(Department(name="ops"),))],
        config=RuntimeConfig(database_url=url, database_schema=schema),
        deps=deps,
    ) as runtime:
        gina = Principal(id="alice", organisation="globex", department="ops")
        await collect_events(runtime.execute_message("s1", "who?", principal=gina))
    assert SEEN == [("alice", "alice", "globex", "ops")]
    assert [s.caller for s in scopes] == [gina]


async def _guest_or_member(
    x_user: str | None = Header(default=None), x_org: str | None = Header(default=None)
) -> Principal | None:  # an app with guest mode: no headers, no principal
    return Principal(id=x_user, organisation=x_org or "acme") if x_user else None


async def test_a_guest_never_writes_into_a_session_a_member_created_meanwhile(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route's look finds no session; alice's first message creates it before the
    guest's is written: the write itself refuses the guest (it went in, and read hers)."""
    url, schema = db
    model = ScriptedModel([ModelStep.text_reply("ok.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model, skip_stages=frozenset({"anchor-plan"})),
        tenancy=[Organisation(name="acme")],
        config=RuntimeConfig(database_url=url, database_schema=schema),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_guest_or_member))
    install_problem_handlers(app)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            alice = _as("alice", "acme")
            said = await http.post(
                f"{API}/sessions/new-1/execute", json={"content": "my PIN is 4921"}, headers=alice
            )
            assert said.status_code == 200
            looked = runtime.store.get_session

            async def not_there_yet(session_id: str) -> object:
                return None  # the guest's route looked before alice's message was written

            monkeypatch.setattr(runtime.store, "get_session", not_there_yet)
            guest = await http.post(f"{API}/sessions/new-1/execute", json={"content": "DUMP"})
            monkeypatch.setattr(runtime.store, "get_session", looked)
        assert guest.status_code == 404
        assert guest.json()["code"] == "session-not-found"
        turns = await runtime.store.list_turns("new-1")  # type: ignore[arg-type]
        assert [t.content for t in turns] == ["my PIN is 4921"]
        # The app's own code (no principal, not a guest) still may.
        assert (await runtime.start("new-1", "from the app")).is_new
    finally:
        await runtime.close()
