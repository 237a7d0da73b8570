"""A streamed answer is drawn block by block: what has ended stays on the page as it is.

Each frame draws again only the blocks still open, so a paragraph that ended keeps its
node while the answer goes on: a selection in it, a screen reader's place and a scrolled
code block stay. What the page shows is, at every frame, what drawing the text so far
from scratch shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.page.harness import PacedModel, serve_page
from tests.page.test_chat_page import send
from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

CODE_LINE = "x = " + " + ".join(["value"] * 40)  # wider than the answer: it scrolls
FIRST = "The first paragraph, finished early and **kept** while the rest streams."
LONG_ANSWER = "\n\n".join(
    [
        FIRST,
        f"```python\n{CODE_LINE}\n```",
        *(
            f"Paragraph {n} goes on for a little while, *with* some `code` in it."
            for n in range(40)
        ),
        "- a list\n- to close\n\nDone.",
    ]
)
CHUNK = 10
HOLD = (len(FIRST) + len(CODE_LINE) + 60) // CHUNK  # pieces: the code block has ended

# Functions the page's own modules are checked with (markdown.js, turn_view.js).
IMPORTS = """
const base = document.baseURI;
const { renderMarkdown } = await import(new URL("page/markdown.js", base).href);
"""


def _fresh_equals_shown(page: Page, text: str) -> bool:
    """Whether the answer on the page equals `text` drawn from scratch."""
    return bool(
        page.evaluate(
            f"""async (text) => {{
                {IMPORTS}
                const shown = document.querySelector(".block.text.answer .text");
                const fresh = shown.cloneNode(false);
                fresh.append(renderMarkdown(text));
                return fresh.isEqualNode(shown);
            }}""",
            text,
        )
    )


def _streamed(tmp_path: Path) -> tuple[PacedModel, Agent]:
    model = PacedModel(
        ScriptedModel([ModelStep.text_reply(LONG_ANSWER, chunk_size=CHUNK)]),
        delay_s=0.01,
        hold_after=HOLD,
    )
    return model, Agent(model=model)


def test_blocks_that_ended_keep_their_nodes_while_the_answer_streams(
    page: Page, tmp_path: Path
) -> None:
    model, agent = _streamed(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Write a lot")
        answer = page.locator(".block.text .text")
        code = answer.locator("pre")
        expect(code).to_have_count(1)
        expect(answer.locator(":scope > p")).to_have_count(2)  # the first, and one more
        # Mark the first paragraph and the code block; focus the code and scroll it sideways.
        page.evaluate(
            """() => {
                const answer = document.querySelector(".block.text .text");
                answer.querySelector(":scope > p").keptMark = "first";
                answer.querySelector("pre").keptMark = "code";
            }"""
        )
        code.focus()
        scrolled = code.evaluate("n => { n.scrollLeft = 60; return n.scrollLeft; }")
        assert scrolled == 60
        model.release()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        expect(answer.locator(":scope > p")).to_have_count(42)
        kept = page.evaluate(
            """() => {
                const answer = document.querySelector(".block.text .text");
                const pre = answer.querySelector("pre");
                return {
                    first: answer.querySelector(":scope > p").keptMark ?? null,
                    code: pre.keptMark ?? null,
                    scrollLeft: pre.scrollLeft,
                    focused: document.activeElement === pre,
                };
            }"""
        )
        assert kept == {"first": "first", "code": "code", "scrollLeft": scrolled, "focused": True}
        assert _fresh_equals_shown(page, LONG_ANSWER)


def test_a_selection_in_an_earlier_paragraph_survives_the_text_after_it(
    page: Page, tmp_path: Path
) -> None:
    model, agent = _streamed(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Write a lot")
        answer = page.locator(".block.text .text")
        expect(answer.locator("pre")).to_have_count(1)
        # The person selects "first paragraph" while the answer is still being written.
        selected = page.evaluate(
            """() => {
                const text = document.querySelector(".block.text .text > p").firstChild;
                const start = text.data.indexOf("first paragraph");
                const range = document.createRange();
                range.setStart(text, start);
                range.setEnd(text, start + "first paragraph".length);
                getSelection().removeAllRanges();
                getSelection().addRange(range);
                return getSelection().toString();
            }"""
        )
        assert selected == "first paragraph"
        model.release()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        expect(answer.locator(":scope > p")).to_have_count(42)
        assert page.evaluate("getSelection().toString()") == "first paragraph"
        assert page.evaluate(
            "getSelection().anchorNode.parentNode === "
            "document.querySelector('.block.text .text > p')"
        )


# ── every frame equals a fresh drawing, on text whose later lines change earlier ones ──

INTRO = "Intro paragraph.\n\n"
TRICKY = {
    "setext-like": INTRO + "Title\n===\n\nAfter.\n\nTitle two\n---\nmore\n",
    "unclosed fence": INTRO + "Before.\n\n```py\ndef f():\n\n    return 1\n\nstill code",
    "fences": INTRO + "~~~~\n```\nnot the end\n~~~\n~~~~\nafter\n\n    ```\nindented\n    ```\n",
    "list continuation": INTRO
    + "- one\ncontinued lazily\n- two\n\n  still two\n\n- three\n1. another list\n\nafter",
    "nested lists": INTRO + "1. a\n   - b\n\n     deeper\n   - c\n2) other\n\n\tx\n- y",
    "table": INTRO + "a | b\n|---|:-:|\n| 1 | 2 \\| 3 |\nnot a row\n\nx | y\nplain\n| z |\n|--|",
    "quote": INTRO + "> q1\n> q2\nlazy\n\n> q3\n>\n> - item\n\n> ```\n> code",
    "headings and rules": INTRO + "# H #\n---\n***\ntext\n___\n## two\n- - -\n",
    "line breaks": INTRO + "Para one.\r\n\r\nPara two\r\nline\r\n\r\n- a\r- b\r\n\r\nend\r",
    "inline": INTRO + "**bold\nacross** and [a](https://x.y) `co\nde` ~~s~~\n\n_em_ *em*",
}

STREAM_CHECK = """async ({ inputs, chunkings, randomDocs }) => {
  const base = document.baseURI;
  const { renderMarkdown } = await import(new URL("page/markdown.js", base).href);
  const { drawTurn, newTurnElement } = await import(new URL("page/turn_view.js", base).href);
  const random = (seed) => () => {  // mulberry32: the same documents and pieces every run
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const LINES = ["text line", "more *text* here", "", "", "- item", "  - nested",
    "    deeper", "1. one", "2) two", "```js", "```", "~~~", "    ```", "> quoted", ">",
    "# Heading", "### h3 ##", "---", "***", "===", "| a | b |", "|---|:--:|", "a | b",
    "  continued", "\\t- tab item", "[link](https://x.y)", "**bold", "closing**", "| only"];
  const docs = Object.entries(inputs);
  for (let n = 0; n < randomDocs; n += 1) {
    const next = random(1000 + n);
    let text = "Intro paragraph.\\n\\n";
    const count = 10 + Math.floor(next() * 40);
    for (let k = 0; k < count; k += 1) {
      const cut = next();
      const end = cut < 0.85 ? "\\n" : cut < 0.95 ? "\\r\\n" : "\\r";
      text += LINES[Math.floor(next() * LINES.length)] + end;
    }
    docs.push([`random ${n}`, text]);
  }
  const problems = [];
  for (const [name, text] of docs) {
    for (const [most, seed] of chunkings) {
      const next = random(seed);
      const node = newTurnElement(`t-${seed}`);
      const turn = { turnId: "t", status: "running", blocks: [], pending: null, cost: null,
        answerKey: "text:1", done: false, settled: false, connection: "open", errorCode: null };
      const page = { busy: new Set(), announce: () => {} };
      const where = `${name} in pieces of up to ${most}`;
      let at = 0;
      let intro = null;
      while (at < text.length) {
        at = Math.min(text.length, at + 1 + Math.floor(next() * most));
        const prefix = text.slice(0, at);
        turn.blocks = [{ kind: "text", key: "text:1", text: prefix, isAnswer: true,
          interrupted: false, complete: at === text.length, citations: [] }];
        drawTurn(node, turn, page);
        const shown = node.querySelector(".block.text .text");
        const fresh = shown.cloneNode(false);
        fresh.append(renderMarkdown(prefix));
        if (!fresh.isEqualNode(shown)) {
          problems.push(`${where}: differs at ${at}: ${JSON.stringify(prefix)}`);
          break;
        }
        // The intro, a blank line and two whole lines: the intro has ended, whatever follows.
        const lines = prefix.replace(/\\r\\n?/g, "\\n").split("\\n").length;
        if (intro === null && lines > 4) intro = shown.firstChild;
      }
      const shown = node.querySelector(".block.text .text");
      if (intro !== shown.firstChild) problems.push(`${where}: the intro was drawn again`);
    }
  }
  return { problems, checked: docs.length };
}"""


def test_every_frame_equals_the_text_so_far_drawn_from_scratch(page: Page, tmp_path: Path) -> None:
    """Through the page's own drawing of a turn, in pieces of 1 to 40 characters."""
    model = ScriptedModel([])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        chunkings = [[1, 1], [4, 2], [12, 3], [40, 4]]  # [most characters per piece, seed]
        result: dict[str, Any] = page.evaluate(
            STREAM_CHECK, {"inputs": TRICKY, "chunkings": chunkings, "randomDocs": 60}
        )
        assert result["checked"] == len(TRICKY) + 60
        assert result["problems"] == []


REPLACED_CHECK = """async ({ pairs }) => {
  const base = document.baseURI;
  const { renderMarkdown } = await import(new URL("page/markdown.js", base).href);
  const { drawMarkdown } = await import(new URL("page/markdown_stream.js", base).href);
  const problems = [];
  for (const [before, after] of pairs) {
    const shown = document.createElement("div");
    drawMarkdown(shown, before);
    drawMarkdown(shown, after);  // a retry's block written again, a snapshot after a gap
    const fresh = document.createElement("div");
    fresh.append(renderMarkdown(after));
    if (!fresh.isEqualNode(shown)) problems.push(`${JSON.stringify(after)}: ${shown.innerHTML}`);
  }
  return problems;
}"""


def test_a_text_that_changes_rather_than_grows_is_drawn_as_it_now_is(
    page: Page, tmp_path: Path
) -> None:
    """A kept block looked one line past its end: a text sharing only the block's own
    lines (a recovered attempt writing the block again) must not keep it."""
    with serve_page(tmp_path, Agent(model=ScriptedModel([]))) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        pairs = [
            ["Hello\n\nWorld\nmore", "Hello\nthere"],
            ["- a\n\n- b\nc", "- a\n\n  still a"],
            ["Intro.\n\nOld answer\n\n", "Intro.\n\nNew answer"],
        ]
        assert page.evaluate(REPLACED_CHECK, {"pairs": pairs}) == []
