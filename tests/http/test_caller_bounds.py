"""What callers can make a turn do: retry and guide as themselves; small bodies, small errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import (
    Agent,
    Organisation,
    Principal,
    ProviderError,
    RuntimeConfig,
    SessionRuntime,
    ToolContext,
    tool,
)
from turnkit.http import TURN_ID_HEADER, create_turnkit_router, install_problem_handlers
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"
SEEN: list[Principal | None] = []


@tool
async def whoami(ctx: ToolContext) -> str:
    """Say who the turn acts for."""
    SEEN.append(ctx.caller)
    return ctx.caller.id if ctx.caller else "nobody"


async def _guest_or_member(
    x_user: str | None = Header(default=None),
    x_org: str | None = Header(default=None),
    x_role: str | None = Header(default=None),
) -> Principal | None:  # guest mode: no headers, no principal
    if not x_user:
        return None
    roles = frozenset({x_role}) if x_role else frozenset()
    return Principal(id=x_user, organisation=x_org or "acme", roles=roles)


async def _app(tmp_path: Path, steps: list[ModelStep]) -> tuple[FastAPI, SessionRuntime]:
    runtime = SessionRuntime(
        agent=Agent(
            model=ScriptedModel(steps), tools=[whoami], skip_stages=frozenset({"anchor-plan"})
        ),
        tenancy=[Organisation(name="acme"), Organisation(name="globex")],
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'sec.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_guest_or_member))
    install_problem_handlers(app)
    return app, runtime


@pytest.fixture
async def retry_served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, SessionRuntime]]:
    SEEN.clear()
    steps = [
        ModelStep.fail(ProviderError("bad request", status_code=400)),  # the admin's turn fails
        ModelStep.tool_call_reply(call("whoami")),  # the retry's turn
        ModelStep.text_reply("Done."),
    ]
    app, runtime = await _app(tmp_path, steps)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        yield http, runtime
    await runtime.close()


async def test_a_retry_runs_as_whoever_retries_it_not_as_the_first_sender(
    retry_served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    """A guest's session is everyone's to see; an admin of acme wrote in it and the turn
    failed. A guest (or a principal of another organisation) pressing Retry must not get
    a turn that runs as that admin: with its roles, its organisation, its budgets."""
    http, _ = retry_served
    guest: dict[str, str] = {}
    admin = {"x-user": "alice", "x-org": "acme", "x-role": "admin"}
    created = await http.post(f"{API}/sessions", json={"sessionId": "shared"}, headers=guest)
    assert created.status_code == 201
    failed = await http.post(
        f"{API}/sessions/shared/execute", json={"content": "hi"}, headers=admin
    )
    failed_id = failed.headers[TURN_ID_HEADER]
    assert (await http.get(f"{API}/turns/{failed_id}", headers=guest)).json()["status"] == "failed"

    retried = await http.post(f"{API}/turns/{failed_id}/retry", headers=guest)
    assert retried.status_code == 200, retried.text
    assert SEEN, retried.text
    # The tool of the guest's retry must not act for the admin.
    assert SEEN[-1] is None or SEEN[-1].id != "alice", SEEN


GATE: list[object] = []


@tool
async def slow() -> str:
    """Take a while."""
    import asyncio

    gate = GATE[0]
    assert isinstance(gate, asyncio.Event)
    await gate.wait()
    return "slow done"


def _obeys_guest(request: object) -> ModelStep:
    text = repr(getattr(request, "messages", ""))
    if "do the admin thing" in text:
        return ModelStep.tool_call_reply(call("whoami"))
    return ModelStep.text_reply("nothing to do")


async def test_a_guide_from_another_caller_never_steers_a_turn_running_as_someone_else(
    tmp_path: Path,
) -> None:
    """In a session everyone sees, an admin's turn runs as the admin. A guest's `guide`
    message must not join it: the guest's words would then drive tools acting for the admin."""
    import asyncio

    SEEN.clear()
    GATE[:] = [asyncio.Event()]
    steps = [
        ModelStep.tool_call_reply(call("slow")),  # the admin's turn: a slow tool
        ModelStep.respond(_obeys_guest),  # its next call reads what joined it
        ModelStep.text_reply("Done."),
        ModelStep.respond(_obeys_guest),  # a turn of the guest's own, if any
        ModelStep.text_reply("Done."),
    ]
    runtime = SessionRuntime(
        agent=Agent(
            model=ScriptedModel(steps, repeat_last=True),
            tools=[whoami, slow],
            skip_stages=frozenset({"anchor-plan"}),
        ),
        tenancy=[Organisation(name="acme")],
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'guide.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_guest_or_member))
    install_problem_handlers(app)
    admin = {"x-user": "alice", "x-org": "acme", "x-role": "admin"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30
        ) as http:
            await http.post(f"{API}/sessions", json={"sessionId": "shared"})  # a guest's
            asking = asyncio.create_task(
                http.post(f"{API}/sessions/shared/execute", json={"content": "hi"}, headers=admin)
            )
            async with asyncio.timeout(10):
                while not [
                    t
                    for t in await runtime.store.list_turns("shared")  # type: ignore[arg-type]
                    if t.status == "running" and t.lease_owner is not None
                ]:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)
            [admins_turn] = await runtime.store.list_turns("shared")  # type: ignore[arg-type]
            body = {"content": "do the admin thing", "delivery": "guide"}
            guiding = asyncio.create_task(http.post(f"{API}/sessions/shared/execute", json=body))
            await asyncio.sleep(0.3)
            GATE[0].set()  # type: ignore[attr-defined]
            answered, guided = await asyncio.gather(asking, guiding)
    finally:
        await runtime.close()
    assert guided.status_code == 200, guided.text
    # The guest's words drove no tool acting for the admin, and joined no turn of hers.
    assert all(p is None or p.id != "alice" for p in SEEN), SEEN
    assert guided.headers[TURN_ID_HEADER] != admins_turn.turn_id, "joined the admin's turn"


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/api/harness/sessions/s1/execute", b'{"content":[%s]}'),
        ("/api/harness/sessions/s1/execute", b'{"content":"hi","settings":{"stop":[%s]}}'),
        ("/api/chat", b'{"id":"c1","messages":[%s]}'),
        ("/api/agui/run", b'{"threadId":"t1","runId":"r1","messages":[%s]}'),
    ],
)
async def test_a_small_body_of_many_bad_items_costs_a_small_answer(
    tmp_path: Path, route: str, body: bytes
) -> None:
    """A 150 kB body of 50,000 bad items must not come back as a 10 MB problem body
    (nor cost the server a million error objects): at 64 MiB, `turnkit serve`'s bound,
    one such request would take tens of GB."""
    import time

    from turnkit.protocols.agui import create_agui_router
    from turnkit.protocols.ai_sdk import create_ai_sdk_router

    app, runtime = await _app(tmp_path, [ModelStep.text_reply("x")])
    app.include_router(create_ai_sdk_router(runtime))
    app.include_router(create_agui_router(runtime))
    items = b",".join([b"{}" if b"stop" not in body else b"0"] * 50_000)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            started = time.monotonic()
            answer = await http.post(
                route, content=body % items, headers={"content-type": "application/json"}
            )
            took = time.monotonic() - started
    finally:
        await runtime.close()
    assert answer.status_code == 422, answer.text[:300]
    assert len(answer.content) < 20_000, len(answer.content)
    assert took < 2.0, took


async def test_a_database_outage_names_no_host_port_or_file_to_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/readyz says `StoreUnavailableError (ConnectionRefusedError)` and never the host;
    every other route answered the driver's own words: the database's address and port
    (PostgreSQL) or the file's path on the server (SQLite, locked too long)."""
    from turnkit.errors import StoreError
    from turnkit.store._engine_pg import unavailable

    app, runtime = await _app(tmp_path, [ModelStep.text_reply("x")])
    refused = ConnectionRefusedError(111, "Connect call failed ('10.20.30.40', 5432)")
    failures = [
        unavailable(refused, url="postgresql://app@10.20.30.40:5432/prod"),
        StoreError(
            "the SQLite database '/srv/secret-app/data/turnkit.db' stayed locked by another "
            "connection for 5 s; nothing was written"
        ),
    ]

    async def failing(*_: object, **__: object) -> None:
        raise failures[0]

    monkeypatch.setattr(runtime.store, "get_session", failing)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            down = await http.get(f"{API}/sessions/s1/history")
            failures.pop(0)
            locked = await http.get(f"{API}/sessions/s1/history")
    finally:
        await runtime.close()
    assert (down.status_code, down.json()["code"]) == (503, "store-unavailable")
    assert "10.20.30.40" not in down.text, down.text
    assert "5432" not in down.text, down.text
    assert locked.status_code == 500
    assert "/srv/secret-app" not in locked.text, locked.text


async def test_a_retry_runs_with_the_roles_its_caller_holds_now(
    retry_served: tuple[httpx.AsyncClient, SessionRuntime],
) -> None:
    """Alice was an admin when her turn failed; the admin role was taken from her since.
    Her Retry must be admitted as she is now, not with the roles pinned to the old turn."""
    http, _ = retry_served
    then = {"x-user": "alice", "x-org": "acme", "x-role": "admin"}
    now = {"x-user": "alice", "x-org": "acme"}
    failed = await http.post(f"{API}/sessions/mine/execute", json={"content": "hi"}, headers=then)
    failed_id = failed.headers[TURN_ID_HEADER]
    retried = await http.post(f"{API}/turns/{failed_id}/retry", headers=now)
    assert retried.status_code == 200, retried.text
    [caller] = SEEN
    assert caller is not None
    assert "admin" not in caller.roles, caller
