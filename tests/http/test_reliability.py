"""HTTP edges that once broke: resuming after `done`, odd cursors, the anonymous listing,
reused request ids, auth and method errors, undecodable bodies, the session-id pattern."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header, HTTPException

from turnkit import Agent, ProviderError, RuntimeConfig, SessionRuntime
from turnkit.http import TURN_ID_HEADER, create_turnkit_router, install_problem_handlers
from turnkit.ids import SESSION_ID_PATTERN
from turnkit.testing import ModelStep, ScriptedModel

API = "/api/harness"


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    if x_user == "intruder":
        raise HTTPException(401, "sign in first", headers={"WWW-Authenticate": "Bearer"})
    return x_user


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    model = ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_principal, keepalive_s=0.05))
    install_problem_handlers(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        yield http
    await runtime.close()


async def _finished_turn(http: httpx.AsyncClient, session: str = "s1", **headers: str) -> str:
    done = await http.post(
        f"{API}/sessions/{session}/execute", json={"content": "hi"}, headers=headers
    )
    assert done.status_code == 200
    return done.headers[TURN_ID_HEADER]


async def test_resuming_a_finished_turn_at_its_last_event_ends_at_once(
    client: httpx.AsyncClient,
) -> None:
    turn_id = await _finished_turn(client)
    last = (await client.get(f"{API}/turns/{turn_id}")).json()["lastSeq"]
    url = f"{API}/turns/{turn_id}/stream"
    for request in (
        client.get(url, headers={"Last-Event-ID": str(last)}),
        client.get(url, params={"after": str(last)}),
    ):
        response = await asyncio.wait_for(request, timeout=5)  # it used to never end
        assert response.status_code == 200
        assert "data:" not in response.text  # nothing more to send, and no keep-alive loop
    one_before = await asyncio.wait_for(
        client.get(url, headers={"Last-Event-ID": str(last - 1)}), timeout=5
    )
    [frame] = [line for line in one_before.text.splitlines() if line.startswith("data:")]
    assert json.loads(frame.removeprefix("data:").strip())["type"] == "done"


@pytest.mark.parametrize("cursor", ["²", "٣", "0005", "-1", "1e3", " 3", "9" * 41])
async def test_odd_cursors_are_a_400_problem(client: httpx.AsyncClient, cursor: str) -> None:
    turn_id = await _finished_turn(client)
    url = f"{API}/turns/{turn_id}/stream"
    by_header = await client.get(url, headers={"Last-Event-ID": cursor.encode()})
    by_query = await client.get(url, params={"after": cursor})
    for response in (by_header, by_query):
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "replay-cursor-invalid"


async def test_an_anonymous_caller_lists_only_unowned_sessions(client: httpx.AsyncClient) -> None:
    await _finished_turn(client, "alices", **{"x-user": "alice"})
    await _finished_turn(client, "public")
    anonymous = (await client.get(f"{API}/sessions")).json()
    assert [s["sessionId"] for s in anonymous] == ["public"]
    alice = (await client.get(f"{API}/sessions", headers={"x-user": "alice"})).json()
    assert [s["sessionId"] for s in alice] == ["alices"]


async def test_a_reused_request_id_with_other_content_is_a_409(
    client: httpx.AsyncClient,
) -> None:
    url = f"{API}/sessions/s1/execute"
    first = await client.post(url, json={"content": "hi", "requestId": "r1"})
    again = await client.post(url, json={"content": "hi", "requestId": "r1"})
    assert first.headers[TURN_ID_HEADER] == again.headers[TURN_ID_HEADER]  # a retry
    other = await client.post(url, json={"content": "something else", "requestId": "r1"})
    assert other.status_code == 409
    assert other.json()["code"] == "request-id-reused"
    turns = (await client.get(f"{API}/sessions/s1/history")).json()
    assert len(turns) == 1  # nothing was written


async def test_auth_and_method_errors_carry_their_own_codes_and_headers(
    client: httpx.AsyncClient,
) -> None:
    denied = await client.get(f"{API}/sessions", headers={"x-user": "intruder"})
    assert denied.status_code == 401
    assert denied.json()["code"] == "unauthenticated"
    assert denied.headers["WWW-Authenticate"] == "Bearer"
    wrong = await client.put(f"{API}/sessions/s1/execute", json={"content": "hi"})
    assert wrong.status_code == 405
    assert wrong.json()["code"] == "method-not-allowed"
    assert "POST" in wrong.headers["Allow"]
    # A path several routes share: Allow names every method they take.
    for path, methods in (("/sessions", {"GET", "POST"}),
                          ("/sessions/s1", {"DELETE", "GET", "PATCH"})):  # fmt: skip
        options = await client.options(API + path, headers={"x-user": "alice"})
        assert options.status_code == 405
        assert set(options.headers["Allow"].split(", ")) == methods, path
        assert options.headers["content-type"] == "application/problem+json"


async def test_a_body_that_is_not_utf8_is_a_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        f"{API}/sessions/s1/execute",
        content=b'{"content": "\xff\xfe"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["code"] == "invalid-input"


async def test_the_session_id_pattern_is_in_openapi_and_enforced(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    params = spec["paths"][f"{API}/sessions/{{session_id}}/execute"]["post"]["parameters"]
    [session] = [p for p in params if p["name"] == "session_id"]
    assert session["schema"]["pattern"] == SESSION_ID_PATTERN.pattern
    bad = await client.post(f"{API}/sessions/-bad/execute", json={"content": "hi"})
    assert bad.status_code == 422
    assert bad.json()["code"] == "invalid-session-id"


async def test_a_failed_turn_is_retried_as_a_new_turn(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.fail(ProviderError("bad request", status_code=400)),
            ModelStep.text_reply("Second time lucky."),
        ]
    )
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'retry.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime))
    install_problem_handlers(app)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            body = {"content": "try me", "requestId": "msg-1"}
            failed = await http.post(f"{API}/sessions/s1/execute", json=body)
            failed_id = failed.headers[TURN_ID_HEADER]
            assert (await http.get(f"{API}/turns/{failed_id}")).json()["status"] == "failed"
            # A client may key its retry with the message's own id: a new key here.
            key = {"Idempotency-Key": "msg-1"}
            retried = await http.post(f"{API}/turns/{failed_id}/retry", headers=key)
            assert retried.status_code == 200
            new_id = retried.headers[TURN_ID_HEADER]
            assert new_id != failed_id
            replayed = await http.post(f"{API}/turns/{failed_id}/retry", headers=key)
            assert replayed.headers[TURN_ID_HEADER] == new_id  # the retry itself is idempotent
            assert '"status":"succeeded"' in retried.text
            history = (await http.get(f"{API}/sessions/s1/history")).json()
            assert [t["status"] for t in history] == ["failed", "succeeded"]
            assert history[1]["answer"] == "Second time lucky."
            again = await http.post(f"{API}/turns/{new_id}/retry")
            assert again.status_code == 422  # only an ended, unsuccessful turn
            assert again.json()["code"] == "invalid-input"
    finally:
        await runtime.close()


async def test_health_and_readiness(tmp_path: Path) -> None:
    from tests.support.services import free_port

    from turnkit.http import create_health_router
    from turnkit.replay.redis import RedisReplayBuffer

    dead_buffer = RedisReplayBuffer.from_url(f"redis://127.0.0.1:{free_port()}/0")
    for replay, buffer_up in ((None, True), (dead_buffer, False)):
        runtime = SessionRuntime(
            agent=Agent(model=ScriptedModel([])),
            config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'h.db'}"),
            replay=replay,
        )
        await runtime.open()
        app = FastAPI()
        app.include_router(create_health_router(runtime))
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://test"
            ) as http:
                assert (await http.get("/healthz")).json() == {"status": "ok"}
                readyz = await http.get("/readyz")
        finally:
            await runtime.close()
        # Ready either way: with the buffer down, readers follow the Store (degraded).
        assert readyz.status_code == 200
        assert readyz.json()["status"] == "ready"
        assert readyz.json()["store"] == "ok"
        if buffer_up:
            assert readyz.json()["replay"] == "ok"
        else:
            assert readyz.json()["replay"].startswith("degraded: ")
    await dead_buffer.close()


@pytest.mark.slow
async def test_an_idle_stream_never_dispatches_an_empty_event(tmp_path: Path) -> None:
    """Past sse-starlette's 15 s ping on a turn paused for approval: every event a client
    (httpx-sse) dispatches is a JSON event; keep-alives never become events."""
    from httpx_sse import aconnect_sse
    from tests.support.server import serve

    from turnkit import tool
    from turnkit.testing import call

    @tool(approval="always")
    async def wire(amount: int) -> int:
        """Move money."""
        return amount

    model = ScriptedModel([ModelStep.tool_call_reply(call("wire", amount=5))])
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[wire]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'idle.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime))
    dispatched: list[str] = []
    try:
        with serve(app) as url:
            async with httpx.AsyncClient(timeout=30) as http:

                async def listen() -> None:
                    async with aconnect_sse(
                        http, "POST", f"{url}{API}/sessions/s1/execute", json={"content": "pay"}
                    ) as source:
                        async for sse in source.aiter_sse():
                            dispatched.append(sse.data)

                with pytest.raises(TimeoutError):  # the turn waits for a person: no `done`
                    await asyncio.wait_for(listen(), timeout=16.5)  # past the 15 s ping
        types = [json.loads(data)["type"] for data in dispatched]  # empty data broke clients
        assert "approval.requested" in types
    finally:
        await runtime.close()
