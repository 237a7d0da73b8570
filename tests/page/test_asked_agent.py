"""An agent asked as a tool: its tool row leads to the session it answered in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import serve_page
from turnkit import Agent, tool
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = pytest.mark.slow


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


def test_the_tool_row_of_an_asked_agent_links_to_its_session(page: Page, tmp_path: Path) -> None:
    shipping = Agent(
        name="shipping",
        model=ScriptedModel([ModelStep.text_reply("A7 arrives today.")]),
    )
    desk = Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("shipping", message="Where is order A7?")),
                ModelStep.text_reply("Your parcel arrives today."),
            ]
        ),  # fmt: skip
        tools=[shipping.as_tool()],
    )
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Where is A7?")
        expect(page.locator(".block.text.answer .text")).to_have_text("Your parcel arrives today.")
        link = page.locator(".block.tool a.asked")
        expect(link).to_be_visible()
        expect(link).to_have_attribute("href", re.compile(r"^#session=tk-sub\.[0-9a-f]{32}$"))
        asking = page.url

        page.reload()  # the link comes back from the turn's log, not from memory
        expect(link).to_have_attribute("href", re.compile(r"^#session=tk-sub\.[0-9a-f]{32}$"))

        link.click()  # the asked agent's own conversation, in the page
        expect(page.locator("article.turn .block.user .text")).to_have_text("Where is order A7?")
        expect(page.locator(".block.text.answer .text")).to_have_text("A7 arrives today.")
        page.go_back()
        assert page.url == asking
        expect(page.locator(".block.text.answer .text")).to_have_text("Your parcel arrives today.")


REFUNDED: list[str] = []


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order."""
    REFUNDED.append(order_id)
    return f"refunded {order_id}"


def _refund_desk(specialist_says: str, desk_says: str) -> Agent:
    """A front desk that asks a refunds agent, whose refund needs a person's approval."""
    REFUNDED.clear()
    refunds = Agent(
        name="refunds",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refund", order_id="A7")),
                ModelStep.text_reply(specialist_says),
            ]
        ),  # fmt: skip
        tools=[refund],
    )
    return Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refunds", message="Refund order A7.")),
                ModelStep.text_reply(desk_says),
            ]
        ),  # fmt: skip
        tools=[refunds.as_tool()],
    )


def test_a_specialists_approval_is_answered_in_the_asking_chat_only(
    page: Page, tmp_path: Path
) -> None:
    desk = _refund_desk("Refunded A7.", "Your refund is on its way.")
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund A7, please")
        card = page.locator(".card.approval")
        expect(card.locator(".summary")).to_have_text('refunds: Run refund with order_id="A7"')

        page.locator(".block.tool a.asked").click()  # the specialist's own conversation
        expect(page.locator(".asked-wait")).to_contain_text("answered in the conversation")
        expect(page.locator(".card.approval")).to_have_count(0)  # no second card to answer
        expect(page.locator("#composer")).to_be_hidden()
        expect(page.locator("#asked-note")).to_be_visible()

        page.go_back()
        expect(page.locator("#composer")).to_be_visible()
        card.locator("button[data-decision=approve]").click()
        expect(page.locator(".block.text.answer .text")).to_have_text("Your refund is on its way.")
        expect(page.locator(".block.tool .detail")).to_have_text("approved")
    assert REFUNDED == ["A7"]


def test_a_specialists_denied_request_shows_on_its_call(page: Page, tmp_path: Path) -> None:
    desk = _refund_desk("Not refunded: a person said no.", "No refund, then.")
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund A7, please")
        page.locator(".card.approval button[data-decision=deny]").click()
        expect(page.locator(".block.text.answer .text")).to_have_text("No refund, then.")
        expect(page.locator(".block.tool .detail")).to_have_text("its request denied")
    assert REFUNDED == []
