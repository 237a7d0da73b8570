"""Cross-site request forgery: what a browser sends from another origin changes nothing.

A user signed in by cookie visits another site; its page makes her browser POST to the app
(`fetch(..., {mode: "no-cors", credentials: "include"})`, or a form). Browsers mark such
requests with `Sec-Fetch-Site` and `Origin`; non-browser clients send neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Cookie, FastAPI, HTTPException
from starlette.types import Message, Receive, Scope, Send

from turnkit import Agent, Principal, RuntimeConfig, SessionRuntime, tool
from turnkit.errors import ConfigurationError
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.http.cross_origin import CrossOriginProtection, checked_origins
from turnkit.ids import SessionId
from turnkit.quickstart import create_app
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"
ALICE = {"session": "alice"}
ATTACKER = {"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"}


async def cookie_auth(session: Annotated[str | None, Cookie()] = None) -> Principal:
    """The caller her session cookie names, as an app signing users in by cookie has it."""
    if not session:
        raise HTTPException(401, "sign in first")
    return Principal(id=session)


@tool(approval="always")
async def pay(to: str) -> str:
    """Pay someone (needs approval)."""
    return f"paid {to}"


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[SessionRuntime]:
    model = ScriptedModel([ModelStep.tool_call_reply(call("pay", to="Mallory"))], repeat_last=True)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'csrf.db'}")
    async with SessionRuntime(agent=Agent(model=model, tools=[pay]), config=config) as rt:
        yield rt


def _client(app: object, base_url: str = "http://chat.example.com") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=base_url, cookies=ALICE)


async def _session_ids(runtime: SessionRuntime) -> list[str]:
    return [s.session_id for s in await runtime.store.list_sessions(principal="alice")]


async def test_a_forged_post_from_another_site_is_refused_and_changes_nothing(
    runtime: SessionRuntime,
) -> None:
    await runtime.create_session("s1", principal="alice")
    submission = await runtime.start("s1", "pay Mallory", principal="alice")
    async with asyncio.timeout(10):
        while (await runtime.turn(submission.turn_id)).status != "awaiting_approval":
            await asyncio.sleep(0.02)
    async with _client(create_app(runtime, auth=cookie_auth)) as http:
        created = await http.post(f"{API}/sessions", headers=ATTACKER)  # no body: no preflight
        assert created.status_code == 403
        assert created.headers["content-type"] == "application/problem+json"
        problem = created.json()
        assert problem["code"] == "cross-origin-request"
        assert problem["detail"] == (
            "a browser sent this POST from 'https://attacker.example', an origin this server "
            "does not trust; list it in TURNKIT_ALLOWED_ORIGINS (CrossOriginProtection's "
            "`origins`) to allow it"
        )
        # A body with no Content-Type needs no preflight either (FastAPI < 0.132 reads JSON).
        sent = http.build_request(
            "POST", f"{API}/sessions/s1/execute", content=b'{"content": "pay Mallory"}'
        )
        sent.headers.pop("content-type", None)
        sent.headers.update(ATTACKER)
        assert (await http.send(sent)).status_code == 403
        stopped = await http.post(f"{API}/turns/{submission.turn_id}/cancel", headers=ATTACKER)
        assert stopped.status_code == 403
        deleted = await http.delete(f"{API}/sessions/s1", headers=ATTACKER)
        assert deleted.status_code == 403
        # An older browser sends no Sec-Fetch-Site: its Origin names another host.
        old = await http.post(f"{API}/sessions", headers={"Origin": "http://attacker.example"})
        assert old.status_code == 403
        sandboxed = {"Origin": "null", "Sec-Fetch-Site": "cross-site"}  # an opaque origin
        assert (await http.post(f"{API}/sessions", headers=sandboxed)).status_code == 403
        sibling = {"Origin": "https://blog.example.com", "Sec-Fetch-Site": "same-site"}
        assert (await http.post(f"{API}/sessions", headers=sibling)).status_code == 403
    assert await _session_ids(runtime) == ["s1"]
    assert (await runtime.turn(submission.turn_id)).status == "awaiting_approval"
    turns = await runtime.store.list_turns(SessionId("s1"))
    assert [t.turn_id for t in turns] == [submission.turn_id]  # no second message


async def test_the_apps_own_pages_and_other_clients_still_post(runtime: SessionRuntime) -> None:
    own = "http://chat.example.com"
    async with _client(create_app(runtime, auth=cookie_auth), own) as http:
        for headers in (
            {"Origin": own, "Sec-Fetch-Site": "same-origin"},  # a current browser
            {"Origin": own},  # an older one
            {"Sec-Fetch-Site": "none"},  # the user's own doing (the address bar)
            {},  # curl, an SDK, another server
        ):
            answer = await http.post(f"{API}/sessions", headers=headers)
            assert answer.status_code == 201, (headers, answer.text)
        # The same page's origin on another port is another origin.
        other_port = {"Origin": "http://chat.example.com:8080"}
        assert (await http.post(f"{API}/sessions", headers=other_port)).status_code == 403
    assert len(await _session_ids(runtime)) == 4


async def test_a_listed_origin_may_post(runtime: SessionRuntime) -> None:
    front = "https://app.example.com"
    app = create_app(runtime, auth=cookie_auth, allowed_origins=[front + ":443"])
    async with _client(app) as http:
        for site in ("same-site", "cross-site"):
            headers = {"Origin": front, "Sec-Fetch-Site": site}
            assert (await http.post(f"{API}/sessions", headers=headers)).status_code == 201
        assert (await http.post(f"{API}/sessions", headers={"Origin": front})).status_code == 201
        refused = await http.post(f"{API}/sessions", headers=ATTACKER)
        assert refused.status_code == 403
    async with _client(create_app(runtime, auth=cookie_auth, allowed_origins=["*"])) as http:
        assert (await http.post(f"{API}/sessions", headers=ATTACKER)).status_code == 201
    assert len(await _session_ids(runtime)) == 4


async def test_reading_and_streaming_from_another_site_is_left_to_cors(
    runtime: SessionRuntime,
) -> None:
    await runtime.create_session("s1", principal="alice")
    submission = await runtime.start("s1", "pay Mallory", principal="alice")
    async with asyncio.timeout(10):
        while (await runtime.turn(submission.turn_id)).status != "awaiting_approval":
            await asyncio.sleep(0.02)
    turn = f"{API}/turns/{submission.turn_id}"
    async with _client(create_app(runtime, auth=cookie_auth)) as http:
        assert (await http.get(f"{API}/sessions", headers=ATTACKER)).status_code == 200
        assert (await http.head("/healthz", headers=ATTACKER)).status_code == 200
        options = await http.options(f"{API}/sessions", headers=ATTACKER)
        assert options.json()["code"] == "method-not-allowed"  # no CORS here: the app's own
        assert (await http.get(turn, headers=ATTACKER)).json()["status"] == "awaiting_approval"
        assert (await http.post(f"{turn}/cancel", headers=ATTACKER)).status_code == 403
        assert (await http.post(f"{turn}/cancel")).json()["status"] == "cancelled"  # her own
        stream = await http.get(f"{turn}/stream", headers=ATTACKER)  # ended: it completes
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert '"type":"approval.requested"' in stream.text
        assert stream.text.rstrip().splitlines()[-1].startswith("data: {")
        assert '"type":"done"' in stream.text.rstrip().splitlines()[-1]


@dataclass
class Recorded:
    """An inner ASGI app that records the scopes it is given."""

    types: list[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.types.append(scope["type"])
        if scope["type"] == "lifespan":
            message: Message = await receive()
            await send({"type": "lifespan.startup.complete"})
            assert message["type"] == "lifespan.startup"


async def test_websockets_and_lifespan_pass_through() -> None:
    inner = Recorded(types=[])
    guarded = CrossOriginProtection(inner)
    hostile = [(b"origin", b"https://attacker.example"), (b"sec-fetch-site", b"cross-site")]
    sent: list[Message] = []

    async def startup() -> Message:
        return {"type": "lifespan.startup"}

    async def keep(message: Message) -> None:
        sent.append(message)

    await guarded({"type": "lifespan"}, startup, keep)
    websocket: Scope = {"type": "websocket", "path": "/ws", "headers": hostile}
    await guarded(websocket, startup, keep)
    http: Scope = {"type": "http", "method": "POST", "path": "/x", "headers": hostile}
    await guarded(http, startup, keep)
    assert inner.types == ["lifespan", "websocket"]  # the POST reached nothing
    assert sent[0] == {"type": "lifespan.startup.complete"}
    assert sent[1]["status"] == 403


async def test_your_own_app_adds_the_middleware(runtime: SessionRuntime) -> None:
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime, auth=cookie_auth))
    install_problem_handlers(app)
    app.add_middleware(CrossOriginProtection, origins=["https://app.example.com"])
    async with _client(app) as http:
        assert (await http.post(f"{API}/sessions", headers=ATTACKER)).status_code == 403
        front = {"Origin": "https://app.example.com", "Sec-Fetch-Site": "cross-site"}
        assert (await http.post(f"{API}/sessions", headers=front)).status_code == 201


def test_origins_are_written_as_browsers_send_them() -> None:
    assert checked_origins(
        [" HTTPS://App.Example.com:443 ", "http://localhost:3000", "http://[::1]:80", "", "*"]
    ) == ("https://app.example.com", "http://localhost:3000", "http://[::1]", "*")
    assert checked_origins(["https://bücher.example"]) == ("https://xn--bcher-kva.example",)
    for bad, why in (
        ("app.example.com", "no scheme"),
        ("localhost:3000", "no scheme"),
        ("https://app.example.com/", "it has a path, query or fragment"),
        ("https://app.example.com/chat", "it has a path, query or fragment"),
        ("https://app.example.com?x", "it has a path, query or fragment"),
        ("https://*.example.com", "no wildcards: list each origin"),
        ("https://user@app.example.com", "it has a user name"),
        ("https://app.example.com:99999", "Port out of range 0-65535"),
        ("https://app .example.com", "it has a space or control character"),
        ("https://", "no scheme"),
        ("https://:443", "no host"),
        ("https://app..example.com", "a host name that is not one"),
        ("http://[::1", "Invalid IPv6 URL"),
    ):
        with pytest.raises(ConfigurationError) as refused:
            checked_origins([bad])
        assert str(refused.value).startswith(
            f"origins: {bad!r} is not an origin ({why}); write scheme://host[:port], "
            "such as https://chat.example.com ["
        )
    with pytest.raises(ConfigurationError, match="a list of origins, not the string"):
        checked_origins("https://app.example.com")


def test_a_bad_origin_stops_the_app_at_construction(runtime: SessionRuntime) -> None:
    with pytest.raises(ConfigurationError, match=r"^allowed_origins: 'example\.com' is not an"):
        create_app(runtime, allowed_origins=["example.com"])
