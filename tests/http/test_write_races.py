"""Identical write requests sent at once: each answers as if it had come alone, on both stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.ids import SessionId
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"
AT_ONCE = 8
"""Requests sent together for one id."""


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


@tool(approval="always")
async def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


@pytest.fixture
async def http(db: tuple[str, str | None]) -> AsyncIterator[httpx.AsyncClient]:
    url, schema = db
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("pay", to="Ada")), ModelStep.text_reply("Paid.")],
        repeat_last=True,
    )
    config = RuntimeConfig(database_url=url, database_schema=schema)
    async with SessionRuntime(agent=Agent(model=model, tools=[pay]), config=config) as runtime:
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_racing_creates_of_one_session_answer_201_once(http: httpx.AsyncClient) -> None:
    """Of creates racing for one id, one answers 201; the others 200 with the same session.

    All of them answered 201, so two tabs (or a request retried while the first was still
    on its way) each believed it had made the session, with its own title.
    """
    headers = {"x-user": "alice"}
    for n in range(5):
        sent = [
            http.post(
                f"{API}/sessions", json={"sessionId": f"s{n}", "title": f"T{i}"}, headers=headers
            )
            for i in range(AT_ONCE)
        ]
        answers = await asyncio.gather(*sent)
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * (AT_ONCE - 1) + [201], [a.text for a in answers]
        bodies = [a.json() for a in answers]
        assert all(b == bodies[0] for b in bodies)  # the stored session, title included
        stored = await http.get(f"{API}/sessions/s{n}", headers=headers)
        assert stored.json() == bodies[0]


async def test_racing_deletes_of_one_session_answer_204_once(http: httpx.AsyncClient) -> None:
    """Of deletes racing for one session, one answers 204; the others 404, as they would
    one after another (all answered 204)."""
    headers = {"x-user": "alice"}
    for n in range(5):
        made = await http.post(f"{API}/sessions", json={"sessionId": f"d{n}"}, headers=headers)
        assert made.status_code == 201
        gone = [http.delete(f"{API}/sessions/d{n}", headers=headers) for _ in range(AT_ONCE)]
        answers = await asyncio.gather(*gone)
        assert sorted(a.status_code for a in answers) == [204] + [404] * (AT_ONCE - 1)
        assert {a.json()["code"] for a in answers if a.status_code == 404} == {"session-not-found"}


async def test_racing_answers_to_one_approval_settle_it_once(http: httpx.AsyncClient) -> None:
    """Two people answer one card at once (approve and deny): one 202, the other 409."""
    headers = {"x-user": "alice"}
    posting = asyncio.create_task(
        http.post(f"{API}/sessions/p1/execute", json={"content": "pay Ada"}, headers=headers)
    )
    async with asyncio.timeout(10):
        while True:  # until the turn waits for someone
            found = await http.get(f"{API}/sessions/p1/pending", headers=headers)
            if found.status_code == 200 and (pending := found.json()["pending"]):
                break
            await asyncio.sleep(0.02)
    [card] = pending
    url = f"{API}/turns/{card['turnId']}/approvals/{card['requestId']}"
    answers = await asyncio.gather(
        *(http.post(url, json={"decision": d}, headers=headers) for d in ("approve", "deny"))
    )
    assert sorted(a.status_code for a in answers) == [202, 409]
    [refused] = [a for a in answers if a.status_code == 409]
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "pause-already-answered"
    async with asyncio.timeout(10):
        stream = await posting
    assert stream.text.count('"type":"done"') == 1


async def test_a_stop_that_cuts_the_answers_commit_short_ends_the_log_cancelled(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop lands while the turn commits its success: status and `done` agree.

    The success's events stayed staged when the commit was cut off, and the Stop's own
    `run.finished` and `done` were taken for them: the turn was stored `cancelled` (Stop
    answered `cancelled`) while its log ended in `done` `succeeded`, so the stream showed a
    finished answer and the history a stopped turn. Seen on PostgreSQL about once in 400
    Stops pressed as a turn ended; here the commit waits, so the Stop always lands in it.
    """
    url, schema = db
    model = ScriptedModel([ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=url, database_schema=schema)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        committing = asyncio.Event()
        commit = runtime.store.commit

        async def held(*args: object, **kwargs: object) -> object:
            if kwargs.get("status") == "succeeded":
                committing.set()
                await asyncio.Event().wait()  # on its way when Stop cancels it: never lands
            return await commit(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(runtime.store, "commit", held)
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            submission = await runtime.start("s1", "hi", principal="alice")
            async with asyncio.timeout(10):
                await committing.wait()
            turn = f"{API}/turns/{submission.turn_id}"
            headers = {"x-user": "alice"}
            stopped = await http.post(f"{turn}/cancel", headers=headers)
            stored = await http.get(turn, headers=headers)
            stream = await http.get(f"{turn}/stream", headers=headers)
    assert stopped.json()["status"] == "cancelled"
    assert stored.json()["status"] == "cancelled"
    ends = [line for line in stream.text.splitlines() if '"type":"done"' in line]
    assert len(ends) == 1
    assert '"status":"cancelled"' in ends[0], ends
    finished = [line for line in stream.text.splitlines() if '"type":"run.finished"' in line]
    assert len(finished) == 1
    assert '"status":"cancelled"' in finished[0], finished


@pytest.fixture
async def recreated(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose every rename or delete first finds its session deleted and made anew
    by bob: what another request does between a route's ownership check and its write."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    agent = Agent(model=ScriptedModel([]))
    async with SessionRuntime(agent=agent, config=config) as runtime:
        store = runtime.store
        delete, rename = store.delete_session, store.rename_session

        async def bobs(session_id: SessionId) -> None:
            assert await delete(session_id)
            assert (await runtime.create_session(session_id, principal="bob")).is_new

        async def delete_after(session_id: SessionId, **kwargs: Any) -> bool:
            await bobs(session_id)
            return await delete(session_id, **kwargs)

        async def rename_after(session_id: SessionId, title: str, **kwargs: Any) -> Any:
            await bobs(session_id)
            return await rename(session_id, title, **kwargs)

        monkeypatch.setattr(store, "delete_session", delete_after)
        monkeypatch.setattr(store, "rename_session", rename_after)
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.parametrize("verb", ["PATCH", "DELETE"])
async def test_a_session_made_anew_by_another_is_neither_renamed_nor_deleted(
    recreated: httpx.AsyncClient, verb: str
) -> None:
    """Alice's rename or delete whose session another principal made anew after the route
    checked it answers 404 and leaves bob's session as it is.

    The route checked the owner, then wrote in a second statement, so the write landed on
    bob's session (renamed it, or deleted it with everything in it).
    """
    alice, bob = {"x-user": "alice"}, {"x-user": "bob"}
    made = await recreated.post(f"{API}/sessions", json={"sessionId": "s1"}, headers=alice)
    assert made.status_code == 201
    body = {"title": "Alice's"} if verb == "PATCH" else None
    answer = await recreated.request(verb, f"{API}/sessions/s1", json=body, headers=alice)
    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "session-not-found"
    kept = await recreated.get(f"{API}/sessions/s1", headers=bob)
    assert kept.status_code == 200
    assert kept.json()["title"] is None
