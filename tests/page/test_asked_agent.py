"""An agent asked as a tool: its tool row leads to the session it answered in."""

from __future__ import annotations

import asyncio
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
        # Its cost line adds what the agent it asked spent: no "$0" for a model without a
        # price, but the turns and calls.
        meta = page.locator("article.turn .meta")
        expect(meta).to_have_text(re.compile(r"· \+ asked agents: 1 turn, 1 model call( ·|$)"))
        link = page.locator(".block.tool a.asked")
        expect(link).to_be_visible()
        expect(link).to_have_attribute("href", re.compile(r"^#session=tk-sub\.[0-9a-f]{32}$"))
        asking = page.url

        page.reload()  # the link comes back from the turn's log, not from memory
        expect(link).to_have_attribute("href", re.compile(r"^#session=tk-sub\.[0-9a-f]{32}$"))

        link.click()  # the asked agent's own conversation, in the page
        expect(page.locator("article.turn .block.user .text")).to_have_text("Where is order A7?")
        expect(page.locator(".block.text.answer .text")).to_have_text("A7 arrives today.")
        # Titled as it is stored, though no sessions list shows it; its note links back.
        expect(page.locator("#session-title")).to_have_text("shipping: Where is order A7?")
        expect(page).to_have_title("shipping: Where is order A7? — turnkit")
        back = page.locator("#asked-from")
        expect(back).to_have_attribute("href", "#" + asking.split("#", 1)[1])
        page.go_back()
        assert page.url == asking
        expect(page.locator(".block.text.answer .text")).to_have_text("Your parcel arrives today.")
        expect(page.locator("#session-title")).not_to_have_text(re.compile("shipping"))
        page.go_forward()
        expect(page.locator(".block.text.answer .text")).to_have_text("A7 arrives today.")
        back.click()  # the note's link leads to the conversation that asked
        expect(page.locator(".block.text.answer .text")).to_have_text("Your parcel arrives today.")
        expect(page.locator("#asked-note")).to_be_hidden()


REFUNDED: list[str] = []


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order."""
    REFUNDED.append(order_id)
    return f"refunded {order_id}"


GATE: dict[str, bool] = {}


@tool
async def lookup(order_id: str) -> str:
    """Look an order up (until the test lets it answer: at most 10 s)."""
    GATE["started"] = True
    for _ in range(200):
        if GATE.get("go"):
            break
        await asyncio.sleep(0.05)
    return f"{order_id}: shipped"


def _refund_desk(specialist: list[ModelStep] | str, desk_says: str) -> Agent:
    """A front desk that asks a refunds agent, whose refund needs a person's approval.

    `specialist`: its script, or the text it answers after asking to refund A7.
    """
    REFUNDED.clear()
    GATE.clear()
    if isinstance(specialist, str):
        specialist = [
            ModelStep.tool_call_reply(call("refund", order_id="A7")),
            ModelStep.text_reply(specialist),
        ]
    refunds = Agent(name="refunds", model=ScriptedModel(specialist), tools=[refund, lookup])
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


def test_a_denial_stays_noted_after_a_later_approval_on_the_same_call(
    page: Page, tmp_path: Path
) -> None:
    refund_a7 = ModelStep.tool_call_reply(call("refund", order_id="A7"))
    refund_b8 = ModelStep.tool_call_reply(call("refund", order_id="B8"))
    desk = _refund_desk([refund_a7, refund_b8, ModelStep.text_reply("Refunded B8 only.")], "Done.")
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund A7 and B8")
        card = page.locator(".card.approval")
        expect(card.locator(".summary")).to_contain_text("A7")
        card.locator("button[data-decision=deny]").click()
        expect(card.locator(".summary")).to_contain_text("B8")
        card.locator("button[data-decision=approve]").click()
        expect(page.locator(".block.text.answer .text")).to_have_text("Done.")
        expect(page.locator(".block.tool .detail")).to_have_text("its request denied")
    assert REFUNDED == ["B8"]


def test_the_row_is_not_denied_while_the_asked_agent_goes_on(page: Page, tmp_path: Path) -> None:
    steps = [
        ModelStep.tool_call_reply(call("refund", order_id="A7")),
        ModelStep.tool_call_reply(call("lookup", order_id="A7")),
        ModelStep.text_reply("Not refunded; it shipped."),
    ]
    desk = _refund_desk(steps, "Done.")
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund A7")
        page.locator(".card.approval button[data-decision=deny]").click()
        row = page.locator(".block.tool").first
        try:  # its lookup holds the agent's answer back until the test lets it go
            expect(row).to_have_attribute("data-status", "running")  # not "denied": it goes on
        finally:
            GATE["go"] = True
        expect(page.locator(".block.text.answer .text")).to_have_text("Done.")
        expect(row).to_have_attribute("data-status", "succeeded")


def test_a_stopped_asking_turn_leaves_no_busy_job_bar(page: Page, tmp_path: Path) -> None:
    """Stop while the specialist waits: the call ends – and its job bar stops moving."""
    desk = _refund_desk("Refunded A7.", "Your refund is on its way.")
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund A7, please")
        expect(page.locator(".card.approval")).to_be_visible()
        page.locator("#stop").click()
        expect(page.locator(".card.approval")).to_have_count(0)
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "not_finished")
        expect(page.locator(".block.tool .job progress:indeterminate")).to_have_count(0)
    assert REFUNDED == []


def test_a_specialists_question_says_which_agent_asks_it(page: Page, tmp_path: Path) -> None:
    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("ask_user", question="Which order?",
                                           choices=["C3", "D4"])),
            ModelStep.text_reply("Refunded D4."),
        ]),
        clarifications=True,
    )  # fmt: skip
    desk = Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refunds", message="Refund the last order.")),
            ModelStep.text_reply("Your refund of D4 is on its way."),
        ]),
        tools=[refunds.as_tool()],
    )  # fmt: skip
    with serve_page(tmp_path, desk) as app:
        page.goto(app.url)
        send(page, "Refund my last order")
        title = page.locator(".card.clarification .card-title")
        expect(title).to_have_text("refunds asks: Which order?")
        page.reload()  # from the pending list, not the stream
        expect(title).to_have_text("refunds asks: Which order?")
        page.locator(".card.clarification [data-choice='D4']").click()
        expect(page.locator(".block.text.answer .text")).to_have_text(
            "Your refund of D4 is on its way."
        )
