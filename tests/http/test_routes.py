"""The HTTP routes in-process: problem bodies, visibility, sessions, audit, OpenAPI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header
from httpx_sse import aconnect_sse

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.http import TURN_ID_HEADER, create_turnkit_router, install_problem_handlers
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"


async def _principal(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    model = ScriptedModel([ModelStep.text_reply("Hello from the route.")], repeat_last=True)
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'http.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=_principal))
    install_problem_handlers(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http
    await runtime.close()


def _sse(text: str) -> list[dict[str, str]]:
    frames = []
    for block in text.strip().split("\r\n\r\n" if "\r\n" in text else "\n\n"):
        frame: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            key, _, value = line.partition(": ")
            frame[key] = value
        if frame:
            frames.append(frame)
    return frames


async def _execute(http: httpx.AsyncClient, session: str, user: str = "alice") -> httpx.Response:
    return await http.post(
        f"{API}/sessions/{session}/execute",
        json={"content": "hi", "requestId": None},
        headers={"x-user": user},
    )


async def test_execute_streams_the_turn_with_ids_only_on_durable_events(
    client: httpx.AsyncClient,
) -> None:
    response = await _execute(client, "s1")
    assert response.status_code == 200
    turn_id = response.headers[TURN_ID_HEADER]
    assert turn_id.startswith("turn_")
    frames = _sse(response.text)
    events = [json.loads(f["data"]) for f in frames]
    assert events[0]["type"] == "turn.started"
    assert events[-1]["type"] == "done"
    for frame, event in zip(frames, events, strict=True):
        if "seq" in event:
            assert frame["id"] == str(event["seq"])
        else:
            assert "id" not in frame  # ephemeral: no id, never replayed
    assert any(e["type"] == "message.delta" for e in events)


async def test_resume_after_a_cursor_returns_only_the_rest(client: httpx.AsyncClient) -> None:
    response = await _execute(client, "s1")
    turn_id = response.headers[TURN_ID_HEADER]
    all_durable = [json.loads(f["data"]) for f in _sse(response.text) if "id" in f]
    resumed = await client.get(
        f"{API}/turns/{turn_id}/stream", headers={"Last-Event-ID": "3", "x-user": "alice"}
    )
    assert [json.loads(f["data"])["seq"] for f in _sse(resumed.text)] == [
        e["seq"] for e in all_durable[3:]
    ]
    by_query = await client.get(
        f"{API}/turns/{turn_id}/stream", params={"after": "3"}, headers={"x-user": "alice"}
    )
    assert _sse(by_query.text) == _sse(resumed.text)


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("post", "/sessions/s1/execute", {"content": b"{not json"}, 422, "invalid-input"),
        ("post", "/sessions/s1/execute", {"json": {}}, 422, "invalid-input"),
        ("post", "/sessions/s1/execute", {"json": {"content": ""}}, 422, "empty-content"),
        ("post", "/sessions/s1/execute", {"json": {"content": []}}, 422, "empty-content"),
        ("post", "/sessions/s1/execute",
         {"json": {"content": [{"kind": "image", "url": "javascript:alert(1)"}]}}, 422,
         "invalid-input"),
        ("post", "/sessions/s1/execute", {"json": {"content": "x", "delivery": "loud"}}, 422,
         "invalid-input"),
        ("post", "/sessions/bad%20id/execute", {"json": {"content": "x"}}, 422,
         "invalid-session-id"),
        ("post", "/sessions/s1/execute", {"json": {"content": "x", "model": "gpt-x"}}, 403,
         "model-not-allowed"),
        ("get", "/sessions/nope/history", {}, 404, "session-not-found"),
        ("get", "/turns/turn_nope/stream", {}, 404, "turn-not-found"),
        ("post", "/turns/turn_nope/cancel", {}, 404, "turn-not-found"),
        ("get", "/turns/turn_nope/audit", {}, 404, "turn-not-found"),
    ],
)  # fmt: skip
async def test_bad_requests_answer_problem_bodies(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    kwargs: dict[str, object],
    status: int,
    code: str,
) -> None:
    headers = {"x-user": "alice", "content-type": "application/json"}
    response = await client.request(method.upper(), API + path, headers=headers, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith(f"#{code}")
    assert body["detail"]


async def test_a_session_can_be_created_without_a_body(client: httpx.AsyncClient) -> None:
    response = await client.post(API + "/sessions", headers={"x-user": "alice"})
    assert response.status_code == 201, response.text
    assert response.json()["sessionId"].startswith("s_")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ('{"content": 42}', "body.content: Input should be a valid string, or Input should be a "
         "valid list"),
        ("not json", "the body is not JSON: Expecting value"),
        ('{"content": "hi", "extra": 1}', "body.extra: Extra inputs are not permitted"),
    ],
)  # fmt: skip
async def test_a_bad_body_is_described_in_the_fields_a_client_wrote(
    client: httpx.AsyncClient, body: str, detail: str
) -> None:
    """Not pydantic's internals (`list[tagged-union[...]]`, `body.0: JSON decode error`)."""
    headers = {"x-user": "alice", "content-type": "application/json"}
    response = await client.post(API + "/sessions/s1/execute", content=body, headers=headers)
    assert response.status_code == 422
    problem = response.json()
    assert (problem["code"], problem["detail"]) == ("invalid-input", detail)
    for error in problem.get("errors", []):
        assert not any("[" in str(part) or part == "str" for part in error["loc"]), error


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/sessions/s1/execute", "application/x-www-form-urlencoded"),  # curl -d without -H
        ("/sessions", "text/plain"),
    ],
)
async def test_a_json_body_sent_as_another_content_type_says_to_send_json(
    client: httpx.AsyncClient, path: str, content_type: str
) -> None:
    """Not "body: Input should be a valid dictionary": the fix is the header."""
    headers = {"x-user": "alice", "content-type": content_type}
    response = await client.post(API + path, content=b'{"content": "hi"}', headers=headers)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "invalid-input"
    assert problem["detail"] == (
        f"the body is not JSON: it came as {content_type!r}; "
        "send it with the header content-type: application/json"
    )


NUL_REQUESTS = [
    ("POST", "/sessions/n1/execute", {"content": "hi\u0000there"}),
    ("POST", "/sessions/n1/execute", {"content": [{"kind": "text", "text": "a\u0000"}]}),
    ("POST", "/sessions/n1/execute", {"content": "hi", "requestId": "a\u0000b"}),
    ("POST", "/sessions", {"sessionId": "n1", "title": "x\u0000y"}),
]


async def test_text_with_a_nul_character_is_refused_on_both_stores(
    db: tuple[str, str | None],
) -> None:
    """PostgreSQL cannot store U+0000: a clear 422 on either store, never a 500."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    model = ScriptedModel([ModelStep.text_reply("never")])
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            headers = {"x-user": "alice"}
            for method, path, body in NUL_REQUESTS:
                response = await http.request(method, API + path, json=body, headers=headers)
                assert response.status_code == 422, (path, body, response.text)
                assert response.json()["code"] == "invalid-input"
                assert "U+0000" in response.json()["detail"]
                assert "Value error" not in response.text  # our words, not pydantic's frame
            for raw in (
                rb'{"content": "hi \ud800"}',  # a lone surrogate, JSON-escaped
                rb'{"content": [{"kind": "image", "url": "https://x.org/\udcff"}]}',
            ):
                response = await http.post(
                    f"{API}/sessions/n1/execute", content=raw,
                    headers={**headers, "content-type": "application/json"},
                )  # fmt: skip
                assert response.status_code == 422, (raw, response.text)
                assert "lone surrogate" in response.json()["detail"]
            listed = await http.get(f"{API}/sessions", headers=headers)
            assert listed.json() == []
            await http.post(f"{API}/sessions", json={"sessionId": "n2"}, headers=headers)
            renamed = await http.patch(
                f"{API}/sessions/n2", json={"title": "a\u0000"}, headers=headers
            )
            assert renamed.status_code == 422, renamed.text
    assert model.calls == []


async def test_creating_a_session_again_answers_200_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    headers = {"x-user": "alice"}
    body = {"sessionId": "n1", "title": "Plans"}
    created = await client.post(f"{API}/sessions", json=body, headers=headers)
    again = await client.post(f"{API}/sessions", json={**body, "title": "Other"}, headers=headers)
    assert (created.status_code, again.status_code) == (201, 200)
    assert again.json()["title"] == "Plans"
    assert again.json()["createdAt"] == created.json()["createdAt"]
    bob = await client.post(f"{API}/sessions", json=body, headers={"x-user": "bob"})
    assert bob.status_code == 404
    for blank in ("", "   "):  # a title PATCH would refuse: refused here too
        refused = await client.post(f"{API}/sessions", json={"title": blank}, headers=headers)
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid-input")


async def test_a_session_another_principal_created_meanwhile_stays_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'race.db'}"),
    )
    async with runtime:
        await runtime.create_session("n1", principal="bob", title="Bob's plans")

        async def not_yet(session_id: str) -> None:  # as if bob's write came just after
            return None

        monkeypatch.setattr(runtime.store, "get_session", not_yet)
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            alice = await http.post(
                f"{API}/sessions", json={"sessionId": "n1"}, headers={"x-user": "alice"}
            )
    assert alice.status_code == 404, alice.text
    assert "Bob" not in alice.text


async def test_bad_requests_write_nothing(client: httpx.AsyncClient) -> None:
    await client.post(f"{API}/sessions/s9/execute", json={"content": ""}, headers={"x-user": "a"})
    listed = await client.get(f"{API}/sessions", headers={"x-user": "a"})
    assert listed.json() == []


async def test_cursors_that_are_garbage_or_ahead_are_4xx(client: httpx.AsyncClient) -> None:
    turn_id = (await _execute(client, "s1")).headers[TURN_ID_HEADER]
    url = f"{API}/turns/{turn_id}/stream"
    garbage = await client.get(url, headers={"Last-Event-ID": "abc", "x-user": "alice"})
    assert garbage.status_code == 400
    assert garbage.json()["code"] == "replay-cursor-invalid"
    for cursor in ("9999", "9" * 20, "9" * 40):  # a long number is ahead all the same
        ahead = await client.get(url, headers={"Last-Event-ID": cursor, "x-user": "alice"})
        assert ahead.status_code == 416, cursor
        assert ahead.json()["code"] == "replay-cursor-invalid"
    too_long = await client.get(url, headers={"Last-Event-ID": "9" * 41, "x-user": "alice"})
    assert too_long.status_code == 400


async def test_another_principals_session_is_not_found(client: httpx.AsyncClient) -> None:
    turn_id = (await _execute(client, "private", user="alice")).headers[TURN_ID_HEADER]
    bob = {"x-user": "bob"}
    for method, path in [
        ("GET", "/sessions/private/history"),
        ("GET", f"/turns/{turn_id}/stream"),
        ("GET", f"/turns/{turn_id}/audit"),
        ("POST", f"/turns/{turn_id}/cancel"),
        ("DELETE", "/sessions/private"),
    ]:
        response = await client.request(method, API + path, headers=bob)
        assert response.status_code == 404, (method, path)
    hijack = await client.post(
        f"{API}/sessions/private/execute", json={"content": "x"}, headers=bob
    )
    assert hijack.status_code == 404
    assert (await client.get(f"{API}/sessions", headers=bob)).json() == []


async def test_sessions_history_rename_delete_and_audit(client: httpx.AsyncClient) -> None:
    alice = {"x-user": "alice"}
    turn_id = (await _execute(client, "s1")).headers[TURN_ID_HEADER]
    history = (await client.get(f"{API}/sessions/s1/history", headers=alice)).json()
    assert [t["answer"] for t in history] == ["Hello from the route."]
    assert history[0]["status"] == "succeeded"
    assert [b["kind"] for b in history[0]["blocks"]] == ["user", "text"]
    renamed = await client.patch(f"{API}/sessions/s1", json={"title": "Greetings"}, headers=alice)
    assert renamed.json()["title"] == "Greetings"
    untitled = await client.patch(f"{API}/sessions/s1", json={}, headers=alice)
    assert (untitled.status_code, untitled.json()["detail"]) == (422, "body.title: Field required")
    for blank, says in (("", "at least 1 character"), ("   ", "not only white space")):
        cleared = await client.patch(f"{API}/sessions/s1", json={"title": blank}, headers=alice)
        assert cleared.status_code == 422, blank
        assert says in cleared.json()["detail"], cleared.json()
    # The constraints the routes check are in the OpenAPI document, where clients read them.
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    assert schemas["RenameBody"]["required"] == ["title"]
    assert schemas["SessionBody"]["properties"]["sessionId"]["anyOf"][0]["pattern"]
    bad_id = await client.post(f"{API}/sessions", json={"sessionId": "a b"}, headers=alice)
    assert bad_id.status_code == 422, bad_id.text
    audit = (await client.get(f"{API}/turns/{turn_id}/audit", headers=alice)).json()
    assert [r["payloads"] for r in audit["rows"]][-1]["synthesisQuality"]["answer_chars"] == 21
    turn = (await client.get(f"{API}/turns/{turn_id}", headers=alice)).json()
    assert turn["status"] == "succeeded"
    assert (await client.delete(f"{API}/sessions/s1", headers=alice)).status_code == 204
    gone = await client.get(f"{API}/sessions/s1/history", headers=alice)
    assert gone.status_code == 404


async def test_a_session_without_a_message_has_an_empty_history(
    client: httpx.AsyncClient,
) -> None:
    alice = {"x-user": "alice"}
    created = await client.post(f"{API}/sessions", json={"sessionId": "fresh"}, headers=alice)
    assert created.status_code == 201
    history = await client.get(f"{API}/sessions/fresh/history", headers=alice)
    assert (history.status_code, history.json()) == (200, [])


async def test_the_openapi_document_validates(client: httpx.AsyncClient) -> None:
    from openapi_spec_validator import validate

    spec = (await client.get("/openapi.json")).json()
    validate(spec)
    paths = spec["paths"]
    assert f"{API}/sessions/{{session_id}}/execute" in paths
    assert f"{API}/turns/{{turn_id}}/stream" in paths
    execute = paths[f"{API}/sessions/{{session_id}}/execute"]["post"]["responses"]
    assert {"401", "403", "422"} <= set(execute)  # auth and admission refuse with these


async def test_an_oversized_frame_is_dropped_and_the_stream_carries_on(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("x" * 3000, chunk_size=3000)])
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'big.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, max_frame_bytes=2000))
    install_problem_handlers(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        response = await http.post(f"{API}/sessions/big/execute", json={"content": "long"})
    await runtime.close()
    assert "dropped oversized frame" in response.text
    types = [json.loads(f["data"])["type"] for f in _sse(response.text)]
    assert "message.delta" not in types  # the 3,000-character delta was dropped
    assert types[-1] == "done"  # ... and the stream went on to the end


async def test_keep_alives_never_reach_a_client_as_empty_events(tmp_path: Path) -> None:
    """httpx-sse dispatches an empty event for a comment followed by a blank line."""

    @tool
    async def slow(x: int) -> int:
        """Take a while: sixteen keep-alive periods, so a loaded machine still sends three."""
        await asyncio.sleep(0.8)
        return x

    turn = [
        ModelStep.tool_call_reply(call("slow", x=1)),
        ModelStep.text_reply("1"),
    ]
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel(turn * 2), tools=[slow]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'ka.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, keepalive_s=0.05))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        raw = await http.post(f"{API}/sessions/ka/execute", json={"content": "go"})
        async with aconnect_sse(
            http, "POST", f"{API}/sessions/ka2/execute", json={"content": "go"}
        ) as source:
            parsed = [sse.data async for sse in source.aiter_sse()]
    await runtime.close()
    assert raw.text.count(": keep-alive") >= 3  # the slow tool left room for several
    seen = []
    for block in raw.text.replace("\r\n", "\n").split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if block.strip() and not data:
            assert all(line.startswith(":") for line in block.splitlines())
        seen += data
    assert all(seen)
    assert json.loads(seen[-1])["type"] == "done"
    assert all(parsed)  # httpx-sse saw no empty event
    assert json.loads(parsed[-1])["type"] == "done"
