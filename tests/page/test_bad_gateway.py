"""The chat page behind a proxy that answers 502: plain words, and never a turn run twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import serve_page
from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

BAD_GATEWAY = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


class LostAnswers:
    """Routes the execute POST: while `on`, the request reaches the server but its answer is
    lost, replaced by a proxy's HTML 502 page (the proxy gave up waiting, say)."""

    def __init__(self, page: Page) -> None:
        self.on = True
        self.request_ids: list[str] = []
        page.route("**/execute", self._route)

    def _route(self, route: Any) -> None:
        self.request_ids.append(json.loads(route.request.post_data)["requestId"])
        if not self.on:
            route.continue_()
            return
        route.fetch()  # the server takes the message (and starts its turn)
        route.fulfill(status=502, content_type="text/html", body=BAD_GATEWAY)


def test_a_message_sent_again_after_a_502_runs_once(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Got it."), ModelStep.text_reply("Again.")])
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan"}))
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        lost = LostAnswers(page)
        send(page, "Book the table for two")
        notice = page.locator("#notice")
        expect(notice).to_have_text("The server did not answer (HTTP 502); try again in a moment.")
        expect(notice).not_to_contain_text("<")
        expect(page.locator("#message")).to_have_value("Book the table for two")
        lost.on = False
        page.press("#message", "Enter")  # the same message again
        expect(page.locator(".block.text.answer .text")).to_have_text("Got it.")
        expect(page.locator("article.turn")).to_have_count(1)
        expect(page.locator(".block.user .text")).to_have_text(["Book the table for two"])
        expect(notice).to_have_text("")
        assert len(set(lost.request_ids)) == 1, lost.request_ids  # one id, sent again
        with httpx.Client(base_url=app.url, timeout=10) as http:
            [session] = http.get("/api/harness/sessions").json()
            history = http.get(f"/api/harness/sessions/{session['sessionId']}/history").json()
        assert [turn["status"] for turn in history] == ["succeeded"]
        send(page, "Book the table for two")  # sent once more on purpose: a new message
        expect(page.locator("article.turn")).to_have_count(2)
        assert len(set(lost.request_ids)) == 2
        expect(page.locator(".block.text.answer .text")).to_have_text(["Got it.", "Again."])
    model.assert_complete()


def test_a_problem_body_keeps_its_words(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Got it.")])
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan"}))
    problem = {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "The store is not reachable right now.",
        "code": "store-unavailable",
    }
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        page.route(
            "**/execute",
            lambda route: route.fulfill(
                status=503, content_type="application/problem+json", body=json.dumps(problem)
            ),
        )
        send(page, "Hello")
        expect(page.locator("#notice")).to_have_text("The store is not reachable right now.")
        page.unroute("**/execute")
        page.route(
            "**/history",
            lambda route: route.fulfill(status=504, content_type="text/html", body="<h1>504</h1>"),
        )
        page.reload()
        expect(page.locator("#notice")).to_have_text(
            "The server did not answer (HTTP 504); try again in a moment."
        )


def test_a_chat_list_that_did_not_load_keeps_saying_so_until_it_does(
    page: Page, tmp_path: Path
) -> None:
    """The list's failure stays on the page while a chat opens; opening one reads it again.

    Opening a chat cleared the notice, though the list was still empty: nothing said it
    had not loaded, and (in a chat with no finished turn to replay) nothing read it again.
    """
    agent = Agent(model=ScriptedModel([]), skip_stages=frozenset({"anchor-plan"}))
    with serve_page(tmp_path, agent) as app:
        with httpx.Client(base_url=app.url, timeout=10) as http:
            for session in ("s1", "s2"):  # chats with no turn: nothing replays, nothing ends
                made = http.post("/api/harness/sessions", json={"sessionId": session})
                assert made.status_code == 201
        lists: list[str] = []

        def down(route: Any) -> None:
            lists.append(route.request.url)
            route.fulfill(status=502, content_type="text/html", body=BAD_GATEWAY)

        page.route("**/api/harness/sessions?limit=*", down)
        with page.expect_response("**/sessions/s1/history"):  # s1 opened after the list failed
            page.goto(f"{app.url}/#session=s1")
        notice = page.locator("#notice")
        expect(notice).to_have_text("The server did not answer (HTTP 502); try again in a moment.")
        expect(page.locator("#sessions li")).to_have_count(0)
        assert lists
        page.unroute("**/api/harness/sessions?limit=*")
        page.evaluate("location.hash = '#session=s2'")  # another chat opens: the list is read
        expect(page.locator("#sessions li")).to_have_count(2)
        expect(notice).to_have_text("")
