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
