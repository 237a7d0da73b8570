"""The chat page prints a turn's cost with the CLI's rule (`turnkit.cli._inspect.usd`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import serve_page
from tests.page.test_chat_page import priced, send
from turnkit import Agent
from turnkit.cli._inspect import asked_line, usd
from turnkit.events import AskedUsage
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

ASKED = [
    AskedUsage(turns=1, model_calls=1),  # a model without a price: no "$0"
    AskedUsage(turns=1, model_calls=0),
    AskedUsage(turns=2, model_calls=3, input_tokens=150, output_tokens=3, cost_usd=1.75),
    AskedUsage(turns=1, model_calls=1, cost_usd=0.0042),
]
COSTS = [0.0, 0.00004, 0.0000412345, 0.0021, 0.0123, 0.5, 0.9999, 1.0, 1.234, 1234.5, 1e-9]


def test_the_page_prints_costs_as_the_cli_does(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([priced(ModelStep.text_reply("Cheap."), 0.00004)])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        shown = page.evaluate(
            """async (costs) => {
                const { usd } = await import(new URL("page/app.js", document.baseURI).href);
                return costs.map(usd);
            }""",
            COSTS,
        )
        assert shown == [usd(cost) for cost in COSTS]

        send(page, "Something cheap?")  # a cheap turn shows its cost, not $0.0000
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "succeeded")
        expect(turn.locator(".meta")).to_contain_text("$0.00004 ·")
    model.assert_complete()


def test_the_page_says_what_asked_agents_spent_as_the_cli_does(page: Page, tmp_path: Path) -> None:
    with serve_page(tmp_path, Agent(model=ScriptedModel([]))) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        shown = page.evaluate(
            """async (asked) => {
                const { askedLine } = await import(new URL("page/app.js", document.baseURI).href);
                return asked.map(askedLine);
            }""",
            [asked.model_dump(mode="json") for asked in ASKED],
        )
    assert shown == [asked_line(asked) for asked in ASKED]
    assert shown[0] == "+ asked agents: 1 turn, 1 model call"
