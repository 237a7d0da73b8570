"""What a model, a tool or another person writes is drawn as text, wherever the page draws it.

An attacker who controls the model's output (a prompt injected through a tool result, say),
a tool's arguments, result or error, a citation's URL, or a message in a shared chat, gets
no markup, script or live link onto the page, and cannot make the approval card show
something else than what Approve sends.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import serve_page
from tests.page.test_chat_page import send
from turnkit import Agent, tool
from turnkit.plugins.citations import Citations
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = pytest.mark.slow


def payload(n: int) -> str:
    """Markup that, parsed as HTML anywhere on the page, sets `window.pwned` to `n`."""
    return f'<img src=x onerror="window.pwned={n};alert({n})">'


_WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""
"""Run before the page's own script: records what its Content-Security-Policy refused."""


@tool
async def lookup(query: str) -> dict[str, Any]:
    """Look something up."""
    return {
        "url": "javascript:window.pwned=40;alert(40)",
        "text": f"Zanzibar quokka colonies {payload(41)}",
    }


@tool
async def broken(query: str) -> str:
    """A tool whose error message a caller controls."""
    raise ValueError(f"no such page {payload(50)}")


@tool(approval="always")
async def wire(amount: int, to: str) -> str:
    """Send money."""
    return f"sent {amount} EUR to {to}"


def test_hostile_text_is_drawn_as_text_everywhere(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(
            call("lookup", query=f"<script>window.pwned=20</script>{payload(21)}"),
            call("broken", query=payload(22)),
            text=f"Narration {payload(30)} [click](javascript:window.pwned=31)",
        ),
        ModelStep.tool_call_reply(call("wire", amount=5, to=payload(60))),
        ModelStep.text_reply(
            f"Zanzibar quokka colonies thrive. {payload(70)} <svg onload=window.pwned=71>"
            " [x](javascript:window.pwned=72) [y](data:text/html,<script>alert(73)</script>)"
        ),
    ])  # fmt: skip
    agent = Agent(model=model, tools=[lookup, broken, wire], plugins=[Citations()])
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.add_init_script(_WATCH)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        message = f"Look it up {payload(10)}"  # a person's message: the chat is named after it
        send(page, message)

        card = page.locator(".card.approval")
        expect(card.locator(".arguments")).to_contain_text(payload(60).replace('"', '\\"'))
        expect(card.locator(".summary")).to_contain_text(payload(60).replace('"', '\\"'))
        card.locator("[data-decision='approve']").click()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")

        expect(page.locator(".block.user .text")).to_have_text(message)
        expect(page.locator("#sessions button")).to_have_text([message])
        expect(page.locator("#session-title")).to_have_text(message)
        narration = page.locator(".block.text.narration .text")
        expect(narration).to_have_text(
            f"Narration {payload(30)} [click](javascript:window.pwned=31)"
        )
        rows = page.locator(".block.tool")
        expect(rows.filter(has_text="lookup").locator(".args")).to_contain_text("<script>")
        expect(rows.filter(has_text="broken").locator(".detail")).to_contain_text(payload(50))
        answer = page.locator(".block.text.answer")
        expect(answer.locator(".text")).to_contain_text(f"{payload(70)} <svg onload=")
        expect(answer.locator(".text")).to_contain_text("[x](javascript:window.pwned=72)")
        expect(answer.locator(".text")).to_contain_text("[y](data:text/html,")
        citation = answer.locator(".citations li").first
        expect(citation).to_have_text(re.compile(r"^lookup"))
        expect(citation.locator("a")).to_have_count(0)  # its javascript: URL is no link
        # Nothing the attacker wrote became an element, a link, a script or a dialog.
        assert page.locator("a[href]").count() == 0
        assert page.locator("img, script:not([src]), svg, iframe, object, embed").count() == 0
        assert page.evaluate("window.pwned") is None
        assert dialogs == []
        assert page.evaluate("window.cspViolations") == []  # the page keeps its own policy
    model.assert_complete()


@tool(approval="always")
async def rename(path: str, to: str) -> str:
    """Rename a file."""
    return f"renamed {path} to {to}"


RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows it is shown reversed


def test_an_approval_card_shows_invisible_and_direction_characters(
    page: Page, tmp_path: Path
) -> None:
    """`report.txt` spelled with an override reads `report.exe` backwards: shown as is, the
    card would ask to approve a name other than the one Approve sends."""
    spoofed = f"report{RLO}txt.exe"  # drawn raw, it reads "reportexe.txt"
    hidden = "keep\u200bme\U000e0041"  # a zero-width space and an invisible tag letter
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("rename", path=spoofed, to=hidden)),
        ModelStep.text_reply("Renamed."),
    ])  # fmt: skip
    with serve_page(tmp_path, Agent(model=model, tools=[rename])) as app:
        page.goto(app.url)
        send(page, "Rename the report")
        card = page.locator(".card.approval")
        arguments = card.locator(".arguments")
        expect(arguments).to_contain_text('"path": "report\\u202etxt.exe"')
        expect(arguments).to_contain_text('"to": "keep\\u200bme\\udb40\\udc41"')
        expect(card.locator(".summary")).to_contain_text('path="report\\u202etxt.exe"')
        args = page.locator(".block.tool .args")
        expect(args).to_contain_text('path="report\\u202etxt.exe"')
        for where in (arguments, card.locator(".summary"), args):
            shown = where.text_content() or ""
            for invisible in (RLO, "\u200b", "\U000e0041"):
                assert invisible not in shown
        # As drawn, "txt" is still left of "exe": the name reads as the call has it.
        assert arguments.evaluate(_LEFT_OF, ["txt", ".exe"])
        card.locator("[data-decision='approve']").click()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
    model.assert_complete()


_LEFT_OF = """(node, [first, second]) => {
  // Whether `first` is drawn left of `second` (both in the node's one text node).
  const text = node.firstChild;
  const x = (word) => {
    const at = text.data.indexOf(word);
    const range = document.createRange();
    range.setStart(text, at);
    range.setEnd(text, at + word.length);
    return range.getBoundingClientRect().left;
  };
  return x(first) < x(second);
}"""
