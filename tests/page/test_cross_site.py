"""A page on another site makes Chromium POST to the quickstart app: nothing is created.

The app is served on 127.0.0.1 and the other site's page on `localhost` (another site to
the browser); the browser, not the test, writes `Origin` and `Sec-Fetch-Site`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.support.server import serve
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.quickstart import create_app
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

ATTACK = """async (target) => {
  // What a page elsewhere can send without a CORS preflight, with the visitor's cookies.
  const sent = [];
  for (const path of ["/api/harness/sessions", "/api/harness/turns/t_1/cancel"]) {
    try {
      await fetch(target + path, {method: "POST", mode: "no-cors", credentials: "include"});
      sent.push(path);
    } catch (error) {
      sent.push(String(error));
    }
  }
  return sent;
}"""


class Seen:
    """ASGI middleware recording each POST's path and the headers the browser set."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.posts: list[tuple[str, str | None, str | None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            self.posts.append((scope["path"], headers.get("origin"), headers.get("sec-fetch-site")))
        await self.app(scope, receive, send)


async def _elsewhere(_: object) -> HTMLResponse:
    return HTMLResponse("<!doctype html><title>another site</title><p>Win a prize!</p>")


def test_another_sites_page_creates_nothing_and_the_chat_page_still_works(
    page: Page, tmp_path: Path
) -> None:
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'page.db'}"),
    )
    seen = Seen(create_app(runtime))
    other = Starlette(routes=[Route("/", _elsewhere)])
    with serve(seen) as url, serve(other) as other_url:
        page.goto(other_url.replace("127.0.0.1", "localhost"))
        expect(page).to_have_title("another site")
        sent = page.evaluate(ATTACK, url)
        assert sent == ["/api/harness/sessions", "/api/harness/turns/t_1/cancel"]
        origin = other_url.replace("127.0.0.1", "localhost")
        assert seen.posts == [
            ("/api/harness/sessions", origin, "cross-site"),
            ("/api/harness/turns/t_1/cancel", origin, "cross-site"),
        ]
        assert httpx.get(f"{url}/api/harness/sessions", timeout=30).json() == []

        page.goto(url)  # the app's own page: its requests are same-origin
        page.fill("#message", "Hi")
        page.press("#message", "Enter")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hello.")
        expect(page.locator("#sessions button")).to_have_count(1)
        assert [path for path, _, site in seen.posts[2:] if site != "same-origin"] == []
