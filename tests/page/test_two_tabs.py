"""Two tabs on one session: a message sent from a tab that has not seen the other's turn."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.page.conftest import WAIT_MS
from tests.page.harness import serve_page
from turnkit import Agent, tool
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = pytest.mark.slow


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


@pytest.fixture
def other_tab(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], f"the page raised: {errors}"


def test_a_message_from_a_second_tab_waits_behind_the_turn_the_first_started(
    page: Page, other_tab: Page, tmp_path: Path
) -> None:
    hold = threading.Event()

    @tool
    async def lookup(topic: str) -> str:
        """Look a topic up."""
        for _ in range(1500):  # until the test lets it finish (30 s at most)
            if hold.is_set():
                break
            await asyncio.sleep(0.02)
        return f"{topic}: fine"

    model = ScriptedModel([
        ModelStep.text_reply("Hello."),
        ModelStep.tool_call_reply(call("lookup", topic="A")),
        ModelStep.text_reply("A is fine."),
        ModelStep.text_reply("B noted."),
    ])  # fmt: skip
    with serve_page(tmp_path, Agent(model=model, tools=[lookup])) as app:
        page.goto(app.url)
        send(page, "Hi")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hello.")
        other_tab.goto(page.url)  # the same session, open while it is idle
        expect(other_tab.locator(".block.text.answer .text")).to_have_text("Hello.")

        send(page, "Check A")  # the first tab starts a turn the second has not seen
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "running")
        send(other_tab, "And B")  # waits behind it on the server

        queue = other_tab.locator("#queue li")
        expect(queue).to_have_count(1)
        expect(queue).to_have_attribute("data-delivery", "queue")
        expect(queue.locator(".text")).to_have_text("And B")
        expect(other_tab.locator("article.turn .block.user .text")).to_have_text(["Hi", "Check A"])
        expect(other_tab.locator(".block.tool")).to_have_attribute("data-status", "running")

        hold.set()
        expect(other_tab.locator(".block.text.answer .text")).to_have_text(
            ["Hello.", "A is fine.", "B noted."]
        )
        expect(queue).to_have_count(0)
    model.assert_complete()


def test_an_idle_tab_of_the_same_browser_shows_the_turn_another_tab_started(
    page: Page, tmp_path: Path
) -> None:
    errors: list[str] = []
    sibling = page.context.new_page()  # the same browser: tabs that hear each other
    sibling.on("pageerror", lambda error: errors.append(str(error)))
    model = ScriptedModel([
        ModelStep.text_reply("Hello."),
        ModelStep.text_reply("A is fine."),
        ModelStep.text_reply("Hi again."),
    ])  # fmt: skip
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "Hi")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hello.")
        sibling.goto(page.url)  # the same chat, open and idle
        expect(sibling.locator(".block.text.answer .text")).to_have_text("Hello.")

        send(page, "Check A")  # the idle tab is told, and follows the new turn
        expect(sibling.locator("article.turn .block.user .text")).to_have_text(["Hi", "Check A"])
        expect(sibling.locator(".block.text.answer .text")).to_have_text(["Hello.", "A is fine."])

        page.locator("#new-session").click()  # a new chat shows in the other tab's list
        expect(sibling.locator("#sessions li")).to_have_count(2)
        send(page, "Hello?")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hi again.")
        expect(sibling.locator("#sessions li").first).to_have_text("Hello?")
        # The idle tab stays on its chat: news of another chat changes only its list.
        expect(sibling.locator(".block.text.answer .text")).to_have_text(["Hello.", "A is fine."])
    sibling.close()
    assert errors == [], f"the page raised: {errors}"
