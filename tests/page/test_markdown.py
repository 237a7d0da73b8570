"""The page draws the model's Markdown as structure, and never as markup of the model's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import PacedModel, serve_page
from tests.page.test_chat_page import send
from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

ANSWER = """## Plan

Use **bold**, *emphasis*, `code` and ~~old~~ words.
A second line of the same paragraph.

1. first step
2. second step
   - a nested point
   - another

- [docs](https://example.com/docs "Docs")
- [bad](javascript:alert(1))

> quoted *advice*

```python
def add(a, b):
    return a + b  # **not bold**
```

| name | count |
|:-----|------:|
| apples | 3 |
| pears \\| plums | 12 |

<img src=x onerror="window.pwned = 1"><script>window.pwned = 2</script>

---
Done."""


def test_an_answer_in_markdown_is_drawn_as_structure(page: Page, tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply(ANSWER, chunk_size=7)]))
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Make a plan")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        answer = page.locator(".block.text.answer .text")
        expect(answer.locator("h4")).to_have_text("Plan")  # `##`, under the turn's h2
        first = answer.locator(":scope > p").first
        expect(first.locator("strong")).to_have_text("bold")
        expect(first.locator("em")).to_have_text("emphasis")
        expect(first.locator("code")).to_have_text("code")
        expect(first.locator("del")).to_have_text("old")
        assert "\n" in (first.text_content() or "")  # the paragraph keeps its line break
        expect(answer.locator(":scope > ol > li")).to_have_count(2)
        expect(answer.locator(":scope > ol > li").nth(1).locator("ul > li")).to_have_text(
            ["a nested point", "another"]
        )
        link = answer.locator("a")
        expect(link).to_have_count(1)  # the javascript: link stays text
        expect(link).to_have_text("docs (opens in a new tab)")  # the end is not shown
        expect(link).to_have_attribute("href", "https://example.com/docs")
        expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
        expect(answer.locator("ul > li").last).to_have_text("[bad](javascript:alert(1))")
        expect(answer.locator("blockquote em")).to_have_text("advice")
        code = answer.locator("pre > code.language-python")
        expect(code).to_have_text("def add(a, b):\n    return a + b  # **not bold**")
        expect(answer.locator("table th")).to_have_text(["name", "count"])
        expect(answer.locator("table tbody tr")).to_have_count(2)
        expect(answer.locator("table tbody td").nth(2)).to_have_text("pears | plums")
        expect(answer.locator("table tbody td").nth(1)).to_have_css("text-align", "right")
        expect(answer.locator("hr")).to_have_count(1)
        # The model's HTML is text on the page: no element made, no script run.
        expect(answer.locator("img, script")).to_have_count(0)
        expect(answer).to_contain_text('<img src=x onerror="window.pwned = 1">')
        assert page.evaluate("window.pwned") is None


def test_text_still_streaming_is_drawn_as_it_stands(page: Page, tmp_path: Path) -> None:
    text = "Here is the code:\n\n```js\nconst a = 1;\nconst b = 2;\n```\n\nThat is **all**."
    model = PacedModel(
        ScriptedModel([ModelStep.text_reply(text, chunk_size=8)]), delay_s=0.02, hold_after=5
    )
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "Show me")
        block = page.locator(".block.text")
        # Five pieces (40 characters) in, the fence is open: a code block to the end.
        expect(block.locator("pre > code.language-js")).to_have_text("const a = 1;\nco")
        expect(block).to_have_class(re.compile(r"\bstreaming\b"))
        model.release()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        answer = page.locator(".block.text.answer .text")
        expect(answer.locator("pre > code")).to_have_text("const a = 1;\nconst b = 2;")
        expect(answer.locator("p strong")).to_have_text("all")
        assert page.inner_text("#turns").count("const a = 1;") == 1


HOSTILE = "\n\n".join(
    [
        "# a" + " " * 4000 + "b",  # a heading pattern that backtracks would take seconds
        ">" * 5000 + " deep quote",  # recursion past the stack
        "\n".join("  " * depth + "- level" for depth in range(300)),  # nesting past any use
        "[" * 30000,  # link openers with no end
        "| a |" + " " * 20000 + "\n|---|",  # a divider row to scan
        "**" * 5000 + "tail",  # emphasis openers with no end
    ]
)


def test_hostile_markdown_neither_freezes_nor_breaks_the_page(page: Page, tmp_path: Path) -> None:
    """A model's text (or a prompt injected into it) is drawn at once, whatever it holds."""
    model = ScriptedModel(
        [ModelStep.text_reply(HOSTILE, chunk_size=4000), ModelStep.text_reply("Still here.")]
    )
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "Break the page")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        answer = page.locator(".block.text.answer .text")
        expect(answer.locator("h3")).to_have_text("a" + " " * 4000 + "b", use_inner_text=False)
        assert "deep quote" in (answer.text_content() or "")
        assert (answer.text_content() or "").count("level") == 300
        send(page, "Still there?")  # the page keeps drawing
        expect(page.locator(".block.text.answer .text").last).to_have_text("Still here.")
