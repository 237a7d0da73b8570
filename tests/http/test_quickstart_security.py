"""The quickstart app with your auth (`TURNKIT_AUTH`), for the host names it serves
(`TURNKIT_ALLOWED_HOSTS`), trusting the origins it is told to (`TURNKIT_ALLOWED_ORIGINS`),
and a page no other site may frame."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import turnkit.quickstart
from turnkit import Agent, Organisation, RuntimeConfig, SessionRuntime
from turnkit.errors import ConfigurationError
from turnkit.quickstart import (
    allowed_hosts_from_env,
    allowed_origins_from_env,
    auth_from_env,
    create_app,
)
from turnkit.testing import ModelStep, ScriptedModel


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[SessionRuntime]:
    model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'quick.db'}")
    tenancy = [Organisation(name="default"), Organisation(name="acme")]
    async with SessionRuntime(agent=Agent(model=model), config=config, tenancy=tenancy) as rt:
        yield rt


def _client(app: object, host: str = "test") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


async def test_your_auth_decides_who_calls(runtime: SessionRuntime) -> None:
    auth = auth_from_env({"TURNKIT_AUTH": "tests.support.header_auth:header_auth"})
    app = create_app(runtime, auth=auth)
    async with _client(app) as http:
        assert (await http.get("/api/harness/sessions")).status_code == 401  # no one signed in
        alice = {"x-user": "alice"}
        sent = await http.post(
            "/api/harness/sessions/a1/execute", json={"content": "my PIN is 4921"}, headers=alice
        )
        assert sent.status_code == 200
        assert [
            s["sessionId"] for s in (await http.get("/api/harness/sessions", headers=alice)).json()
        ] == ["a1"]
        bob = {"x-user": "bob"}
        assert (await http.get("/api/harness/sessions", headers=bob)).json() == []
        history = await http.get("/api/harness/sessions/a1/history", headers=bob)
        assert history.status_code == 404
        # The protocol routes take the same callers, and admit them as the harness does.
        chat = {
            "id": "c1",
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
        assert (await http.post("/api/chat", json=chat)).status_code == 401
        carol_of_acme = {"x-user": "carol", "x-org": "acme"}  # an organisation served here
        started = await http.post("/api/chat", json=chat, headers=carol_of_acme)
        assert started.status_code == 200, started.text
        carol = {"x-user": "carol"}  # the same id in the default organisation: someone else
        assert (await http.post("/api/chat", json=chat, headers=carol)).status_code == 404
        dave = {"x-user": "dave", "x-dept": "sales"}  # a department not served here
        refused = await http.post("/api/chat", json={**chat, "id": "c2"}, headers=dave)
        assert refused.status_code == 403
        assert refused.json()["code"] == "department-unknown"


def test_a_bad_auth_setting_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match="must look like `package.module:name`"):
        auth_from_env({"TURNKIT_AUTH": "header_auth"})
    with pytest.raises(ConfigurationError, match="cannot load TURNKIT_AUTH"):
        auth_from_env({"TURNKIT_AUTH": "tests.support.header_auth:nope"})
    assert auth_from_env({"TURNKIT_AUTH": ""}) is None
    assert allowed_hosts_from_env({"TURNKIT_ALLOWED_HOSTS": " chat.example.com, localhost "}) == [
        "chat.example.com",
        "localhost",
    ]


async def test_only_the_allowed_host_names_are_answered(runtime: SessionRuntime) -> None:
    app = create_app(runtime, allowed_hosts=["chat.example.com", "*.internal.example"])
    async with _client(app, "chat.example.com") as http:
        assert (await http.get("/api/harness/sessions")).status_code == 200
    async with _client(app, "api.internal.example:8443") as http:
        assert (await http.get("/api/harness/sessions")).status_code == 200
    async with _client(app, "attacker.example") as http:
        refused = await http.get("/api/harness/sessions")
    assert refused.status_code == 400
    assert refused.json()["code"] == "host-not-allowed"
    # What to do, as the cross-origin refusal says it: where to list the name.
    assert refused.json()["detail"] == (
        "this server does not answer to the host 'attacker.example'; list it in "
        "TURNKIT_ALLOWED_HOSTS (TrustedHosts' `hosts`) to allow it"
    )


async def test_health_probes_are_answered_whatever_the_host(runtime: SessionRuntime) -> None:
    """A probe by address (compose's health check, a kubelet, a load balancer) names no host."""
    from fastapi import FastAPI

    app = create_app(runtime, allowed_hosts=["chat.example.com"])
    outer = FastAPI()
    outer.mount("/chat", create_app(runtime, allowed_hosts=["chat.example.com"]))
    for served, prefix in ((app, ""), (outer, "/chat")):
        async with _client(served, "10.0.0.7:8000") as http:
            for path in ("/healthz", "/readyz"):
                assert (await http.get(prefix + path)).status_code == 200, prefix + path
                assert (await http.head(prefix + path)).status_code == 200, prefix + path
            for path in ("/", "/api/harness/sessions", "/healthz/x", "/readyzz"):
                refused = await http.get(prefix + path)
                assert refused.status_code == 400, prefix + path
                assert refused.json()["code"] == "host-not-allowed"


def test_the_trusted_origins_come_from_the_environment() -> None:
    assert allowed_origins_from_env({}) == []
    assert allowed_origins_from_env({"TURNKIT_ALLOWED_ORIGINS": " , "}) == []
    given = {"TURNKIT_ALLOWED_ORIGINS": " https://App.example.com:443, http://localhost:5173 "}
    assert allowed_origins_from_env(given) == ["https://app.example.com", "http://localhost:5173"]
    assert allowed_origins_from_env({"TURNKIT_ALLOWED_ORIGINS": "*"}) == ["*"]
    for bad in ("app.example.com", "https://app.example.com/", "https://*.example.com"):
        with pytest.raises(ConfigurationError) as refused:
            allowed_origins_from_env({"TURNKIT_ALLOWED_ORIGINS": f"http://localhost:5173,{bad}"})
        said = str(refused.value)
        assert said.startswith(f"TURNKIT_ALLOWED_ORIGINS: {bad!r} is not an origin ("), said
        assert "\n" not in said


def _directives(policy: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for directive in policy.split(";"):
        name, *values = directive.split()
        found[name.lower()] = values
    return found


async def test_no_other_site_may_frame_the_page(runtime: SessionRuntime) -> None:
    async with _client(create_app(runtime)) as http:
        for path in ("/", "/page/app.js"):
            page = await http.get(path)
            assert page.headers["x-frame-options"] == "DENY", path
            csp = _directives(page.headers["content-security-policy"])
            assert csp["frame-ancestors"] == ["'none'"], path


async def test_the_page_runs_only_its_own_script(runtime: SessionRuntime) -> None:
    """A strict policy on every file of the page: should anything ever draw the model's
    text as HTML, no inline script, `eval`, other site's script or request runs."""
    from fastapi import FastAPI

    app = create_app(runtime)
    outer = FastAPI()
    outer.mount("/chat", create_app(runtime))
    for served, prefix in ((app, ""), (outer, "/chat")):
        async with _client(served) as http:
            for path in ("/", "/page/app.js", "/page/style.css", "/page/markdown.js"):
                page = await http.get(prefix + path)
                assert page.status_code == 200, path
                csp = _directives(page.headers["content-security-policy"])
                assert csp["default-src"] == ["'none'"], path
                assert csp["script-src"] == ["'self'"], path  # no 'unsafe-inline', no eval
                assert csp["style-src"] == ["'self'"], path
                assert csp["connect-src"] == ["'self'"], path
                assert csp["img-src"] == ["'self'", "data:"], path
                assert csp["base-uri"] == ["'none'"], path
                assert csp["form-action"] == ["'none'"], path
                assert page.headers["x-content-type-options"] == "nosniff", path
                assert page.headers["referrer-policy"] == "same-origin", path
    index = (Path(turnkit.quickstart.__file__).parent / "http" / "page" / "index.html").read_text()
    assert "<script>" not in index  # nothing inline to allow
    assert " style=" not in index


async def test_the_chat_page_answers_head_as_get(runtime: SessionRuntime) -> None:
    """Uptime checks and link previews ask with HEAD: the page is there, not 405."""
    async with _client(create_app(runtime)) as http:
        got, head = await http.get("/"), await http.head("/")
    assert (got.status_code, head.status_code) == (200, 200)
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.content == b""
