"""The workspace routes: list a session's files, fetch one, refuse others' and bad paths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.ids import SessionId, TurnId
from turnkit.testing import ModelStep, ScriptedModel

API = "/api/harness"
ALICE = {"x-user": "alice"}
S1 = SessionId("s1")


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[SessionRuntime]:
    opened = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("unused")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'http.db'}"),
    )
    await opened.open()
    await opened.create_session(S1, principal="alice")
    yield opened
    await opened.close()


@pytest.fixture
async def client(runtime: SessionRuntime) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_principal))
    install_problem_handlers(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http


async def test_files_are_listed_without_content(
    client: httpx.AsyncClient, runtime: SessionRuntime
) -> None:
    empty = await client.get(f"{API}/sessions/s1/files", headers=ALICE)
    assert empty.json() == {"files": []}
    spec = await runtime.store.write_file(S1, "spec.md", "# Spëc\n", turn_id=TurnId("turn_1"))
    await runtime.store.write_file(S1, "data/rows.csv", "a,b\n")
    listed = await client.get(f"{API}/sessions/s1/files", headers=ALICE)
    assert listed.status_code == 200
    body = listed.json()
    assert [f["path"] for f in body["files"]] == ["data/rows.csv", "spec.md"]
    assert body["files"][1] == {
        "path": "spec.md",
        "mediaType": "text/markdown",
        "size": 8,
        "version": 1,
        "updatedAt": body["files"][1]["updatedAt"],
        "turnId": "turn_1",
    }
    assert datetime.fromisoformat(body["files"][1]["updatedAt"]) == spec.updated_at
    assert body["files"][0]["turnId"] is None


async def test_a_file_is_fetched_raw_with_its_media_type_and_version(
    client: httpx.AsyncClient, runtime: SessionRuntime
) -> None:
    await runtime.store.write_file(S1, "plans/plan.md", "1. ship ✓\n")
    await runtime.store.write_file(S1, "plans/plan.md", "1. ship ✓\n2. rest\n")
    await runtime.store.write_file(S1, "state.json", '{"ok": true}')
    response = await client.get(f"{API}/sessions/s1/files/plans/plan.md", headers=ALICE)
    assert response.status_code == 200
    assert response.content == "1. ship ✓\n2. rest\n".encode()
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert response.headers["etag"] == '"2"'
    assert response.headers["x-content-type-options"] == "nosniff"
    as_json = await client.get(f"{API}/sessions/s1/files/state.json", headers=ALICE)
    assert as_json.headers["content-type"] == "application/json; charset=utf-8"
    assert as_json.json() == {"ok": True}


async def _problem(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code


async def test_a_missing_file_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.get(f"{API}/sessions/s1/files/nope.md", headers=ALICE)
    await _problem(response, 404, "not-found")


async def test_another_principals_session_is_not_found(
    client: httpx.AsyncClient, runtime: SessionRuntime
) -> None:
    await runtime.store.write_file(S1, "spec.md", "secret")
    bob = {"x-user": "bob"}
    await _problem(await client.get(f"{API}/sessions/s1/files", headers=bob), 404,
                   "session-not-found")  # fmt: skip
    await _problem(await client.get(f"{API}/sessions/s1/files/spec.md", headers=bob), 404,
                   "session-not-found")  # fmt: skip
    await _problem(await client.get(f"{API}/sessions/s9/files", headers=ALICE), 404,
                   "session-not-found")  # fmt: skip


@pytest.mark.parametrize("path", ["%2E%2E/x", "a/%2E%2E/b", "a//b", "a%20b.md", ""])
async def test_a_bad_path_is_refused(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(f"{API}/sessions/s1/files/{path}", headers=ALICE)
    await _problem(response, 422, "invalid-input")
    assert response.json()["detail"].startswith("workspace path")
