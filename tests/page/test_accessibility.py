"""The chat page for people on small screens, on keyboards and with screen readers.

Each test checks what such a person meets: a page that fits a 320-pixel-wide window, a
sessions menu, focus that stays where it was, text with enough contrast. The checks are
computed in the page (`scroll_width`, `contrast`), not taken from an audit tool.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from tests.page.harness import serve_page
from tests.page.test_chat_page import (
    ANSWER,
    PAY_BOB,
    _held_answer,
    calculator,
    send,
    wait_until,
    wire,
)
from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = pytest.mark.slow

FADED = "!document.getAnimations().length"

NARROW: ViewportSize = {"width": 320, "height": 640}
ZOOMED: ViewportSize = {"width": 640, "height": 400}  # a 1280x800 window at 200%
CODE = "```python\nnumbers = [" + ", ".join(str(n) for n in range(60)) + "]\n```"
TABLE = "| " + " | ".join(f"column {n}" for n in range(12)) + " |\n" + "|---" * 12 + "|"
WIDE_ANSWER = f"Here it is:\n\n{CODE}\n\n{TABLE}\n\nDone."


def sideways(page: Page) -> tuple[int, int]:
    """The page's scroll width and the window's width."""
    width: list[int] = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
    return width[0], width[1]


def assert_fits(page: Page, *selectors: str) -> None:
    """No sideways scroll, and each of `selectors` wholly inside the window."""
    scroll_width, window_width = sideways(page)
    assert scroll_width <= window_width, f"the page scrolls sideways ({scroll_width} px)"
    for selector in selectors:
        box = page.locator(selector).bounding_box()
        assert box is not None, f"{selector} is not shown"
        assert box["x"] >= 0, (selector, box)
        assert box["x"] + box["width"] <= window_width, (selector, box)


_CONTRAST = """([selectors, edge]) => {
  // The contrast of each selector's text (or, with `edge`, its top border against what is
  // around it), as WCAG computes it: opacity and translucent backgrounds composited.
  const parse = (css) => {
    const [r, g, b, a = 1] = css.match(/[\\d.]+/g).map(Number);
    return [r, g, b, a];
  };
  const over = (top, below) =>
    [0, 1, 2].map((i) => top[i] * top[3] + below[i] * (1 - top[3])).concat(1);
  const backdrop = (node) => {
    const layers = [];
    for (let n = node; n; n = n.parentElement) {
      layers.unshift(parse(getComputedStyle(n).backgroundColor));
    }
    return layers.reduce((below, layer) => over(layer, below), [255, 255, 255, 1]);
  };
  const opacity = (node) => {
    let o = 1;
    for (let n = node; n; n = n.parentElement) o *= Number(getComputedStyle(n).opacity);
    return o;
  };
  const luminance = (rgb) =>
    rgb.slice(0, 3).map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    }).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const ratio = (a, b) => {
    const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  return Object.fromEntries(selectors.map((selector) => {
    const node = document.querySelector(selector);
    if (!node) return [selector, null];
    const style = getComputedStyle(node);
    const back = backdrop(edge ? node.parentElement : node);
    const ink = parse(edge ? style.borderTopColor : style.color);
    ink[3] *= opacity(node);
    return [selector, Math.round(ratio(over(ink, back), back) * 100) / 100];
  }));
}"""


def contrasts(page: Page, selectors: list[str], *, edge: bool = False) -> dict[str, float]:
    """Each selector's (first match's) contrast ratio: its text, or with `edge` its border."""
    found: dict[str, float] = page.evaluate(_CONTRAST, [selectors, edge])
    return found


def test_the_page_fits_a_narrow_window(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply(WIDE_ANSWER), ModelStep.hang(CODE)])
    with serve_page(tmp_path, Agent(model=model)) as app:
        for size in (NARROW, ZOOMED):
            page.set_viewport_size(size)
            page.goto(app.url)
            expect(page.locator("#empty")).to_be_visible()
            assert_fits(page, "#send", "#message")
        send(page, "Show me wide things")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        code = page.locator(".block.text.answer pre")
        for size in (NARROW, ZOOMED):
            page.set_viewport_size(size)
            assert_fits(page, "#send", "#message")
            assert code.evaluate("n => n.scrollWidth > n.clientWidth")  # it scrolls itself
        # A keyboard scrolls it too: Tab reaches it, an arrow key moves it.
        expect(page.get_by_role("region", name="Code")).to_have_count(1)
        expect(page.get_by_role("region", name="Table")).to_have_attribute("tabindex", "0")
        code.focus()
        page.keyboard.press("ArrowRight")
        expect(code).to_be_focused()
        # Polled with `evaluate`: `wait_for_function` evals its text, which the page's
        # Content-Security-Policy refuses (no `unsafe-eval`).
        wait_until(lambda: page.evaluate("document.activeElement.scrollLeft > 0"), "a scroll")
        expect(page.get_by_role("region", name="Conversation")).to_have_attribute("tabindex", "0")
        send(page, "Show me more")  # Stop shows beside Send while the turn runs
        expect(page.locator("#stop")).to_be_visible()
        for size in (NARROW, ZOOMED):
            page.set_viewport_size(size)
            assert_fits(page, "#send", "#stop", "#message")
        page.locator("#stop").click()
        expect(page.locator("article.turn").last).to_have_attribute("data-status", "cancelled")


def test_a_menu_opens_the_sessions_on_a_narrow_window(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.set_viewport_size(NARROW)
        page.goto(app.url)
        send(page, "one")
        expect(page.locator(".block.text.answer .text")).to_have_text("First.")
        menu = page.locator("#menu")
        expect(page.locator("#new-session")).to_be_hidden()
        expect(menu).to_be_visible()
        expect(menu).to_have_attribute("aria-expanded", "false")
        expect(menu).to_have_attribute("aria-controls", "sidebar")

        menu.click()
        expect(menu).to_have_attribute("aria-expanded", "true")
        expect(page.locator("#new-session")).to_be_visible()
        current = page.locator("#sessions button[aria-current='true']")
        expect(current).to_be_focused()  # focus goes into the menu, on the open chat
        assert_fits(page, "#new-session")
        page.keyboard.press("Escape")
        expect(page.locator("#new-session")).to_be_hidden()
        expect(menu).to_have_attribute("aria-expanded", "false")
        expect(menu).to_be_focused()  # back where the person opened it

        page.keyboard.press("Enter")  # the menu button again, from the keyboard
        expect(current).to_be_focused()
        page.keyboard.press("Shift+Tab")
        expect(page.locator("#new-session")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("article.turn")).to_have_count(0)  # a new chat
        expect(page.locator("#new-session")).to_be_hidden()  # the menu closed
        expect(page.locator("#message")).to_be_focused()
        send(page, "two")
        expect(page.locator(".block.text.answer .text")).to_have_text("Second.")

        menu.click()
        page.locator("#sessions button", has_text="one").click()
        expect(page.locator(".block.text.answer .text")).to_have_text("First.")
        expect(page.locator("#new-session")).to_be_hidden()
        expect(page.locator("#message")).to_be_focused()
    model.assert_complete()


def test_a_focused_session_keeps_focus_while_a_turn_streams(page: Page, tmp_path: Path) -> None:
    model, agent = _held_answer(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Explain 42")
        expect(page.locator(".block.text .text")).to_have_text(ANSWER[:18])
        page.locator("#sessions button").focus()
        page.evaluate("window.focused = document.activeElement")
        model.release()  # the rest streams in: a redraw per piece, then the list's refresh
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        expect(page.locator("#sessions button")).to_have_text("Explain 42")
        assert page.evaluate("window.focused.isConnected")  # the same button, still there
        assert page.evaluate("document.activeElement === window.focused")

        page.click("#new-session")
        expect(page.locator("#sessions button")).to_have_count(2)
        page.locator("#sessions button", has_text="Explain 42").press("Enter")  # picked
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        expect(page.locator("#message")).to_be_focused()  # ready to write in that chat


def test_a_card_takes_focus_from_the_message_box_and_says_what_it_needs(
    page: Page, tmp_path: Path
) -> None:
    model = ScriptedModel([
        *PAY_BOB,
        ModelStep.tool_call_reply(call("ask_user", question="Which unit?",
                                       choices=["EUR", "USD"])),
        ModelStep.text_reply("42 EUR."),
    ])  # fmt: skip
    agent = Agent(model=model, tools=[wire], clarifications=True)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Pay Bob 5 EUR")  # focus is in the message box
        card = page.locator(".card.approval")
        expect(card).to_be_focused()  # the card itself: a stray key decides nothing
        expect(card.get_by_role("region", name="Arguments")).to_have_attribute("tabindex", "0")
        said = re.compile(r"^Approval needed: Approve wire\?")
        expect(page.locator("#announce")).to_have_text(said)
        page.keyboard.press("Tab")  # the arguments, which may scroll
        page.keyboard.press("Tab")
        expect(card.locator("[data-decision='approve']")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator(".block.text.answer .text")).to_have_text("Sent 5 EUR to Bob.")
        expect(page.locator("#message")).to_be_focused()

        send(page, "Multiply 6 by 7")
        question = page.locator(".card.clarification")
        expect(question).to_be_focused()
        expect(page.locator("#announce")).to_have_text("Question: Which unit?")
        # The ask_user row waits for the person: no spinner, no "running", no clock.
        row = page.locator("article.turn").last.locator(".block.tool")
        expect(row).to_have_attribute("data-status", "awaiting_input")
        expect(row.locator(".status")).to_have_text("waiting for your answer:")
        expect(row.locator(".icon")).to_have_text("?")
        expect(row.locator(".duration")).to_have_text("")
        question.locator("[data-choice='EUR']").click()
        expect(page.locator(".block.text.answer .text").last).to_have_text("42 EUR.")
        expect(row).to_have_attribute("data-status", "succeeded")
    model.assert_complete()


def test_a_card_drawn_with_its_turn_takes_focus(page: Page, tmp_path: Path) -> None:
    # A turn first drawn already waiting (the page opened on it, or its events came in
    # before the page drew it) has its card focused too, not only one that arrives later.
    model = ScriptedModel([*PAY_BOB])
    # A busy machine: frames come late, so a turn's events arrive before it is first drawn.
    page.add_init_script("""{
      const draw = window.requestAnimationFrame.bind(window);
      window.requestAnimationFrame = (callback) => setTimeout(() => draw(callback), 400);
    }""")
    with serve_page(tmp_path, Agent(model=model, tools=[wire])) as app:
        page.goto(app.url)
        send(page, "Pay Bob 5 EUR")
        expect(page.locator(".card.approval")).to_be_focused()
        page.reload()
        expect(page.locator(".card.approval")).to_be_focused()
        page.locator(".card.approval [data-decision='approve']").click()
        expect(page.locator(".block.text.answer .text")).to_have_text("Sent 5 EUR to Bob.")
    model.assert_complete()


def test_focus_on_stop_goes_to_the_message_box_when_the_turn_ends(
    page: Page, tmp_path: Path
) -> None:
    model, agent = _held_answer(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Explain 42")
        expect(page.locator(".block.text .text")).to_have_text(ANSWER[:18])
        page.locator("#stop").focus()
        model.release()  # the turn ends by itself and Stop goes away
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        expect(page.locator("#stop")).to_be_hidden()
        expect(page.locator("#message")).to_be_focused()


_COMPOSE = """(keyCode) => {
  const box = document.querySelector("#message");
  let submitted = 0;
  const count = (event) => {
    submitted += 1;
    event.preventDefault();
    event.stopImmediatePropagation(); // counted, never sent
  };
  window.addEventListener("submit", count, true);
  box.focus();
  box.value = "日本語";
  box.dispatchEvent(new CompositionEvent("compositionstart", { data: "" }));
  box.dispatchEvent(new CompositionEvent("compositionend", { data: "日本語" }));
  const enter = { key: "Enter", code: "Enter", keyCode, bubbles: true, cancelable: true };
  box.dispatchEvent(new KeyboardEvent("keydown", enter)); // Safari: isComposing is false
  return new Promise((resolve) =>
    setTimeout(() => {
      const before = submitted;
      box.dispatchEvent(new KeyboardEvent("keydown", { ...enter, keyCode: 13 }));
      window.removeEventListener("submit", count, true);
      resolve([before, submitted]);
    }),
  );
}"""


def test_enter_that_ends_an_input_method_composition_sends_nothing(
    page: Page, tmp_path: Path
) -> None:
    with serve_page(tmp_path, Agent(model=ScriptedModel([]))) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        for key_code in (229, 13):  # Safari's order: compositionend, then keydown Enter
            # The Enter that confirms the text sends nothing; a later Enter sends.
            assert page.evaluate(_COMPOSE, key_code) == [0, 1]
        expect(page.locator("#message")).to_have_value("日本語")


TEXT = [
    ".chat-title",
    "#sessions button",
    "#send",
    ".block.user .text",
    ".block.narration.faded .text > p",
    ".block.text.answer .text > p",
    ".block.tool .name",
    ".block.tool .args",
    ".block.tool .duration",
    ".meta",
    ".card-title",
]
EDGES = ["#message", ".card .answer input"]


def test_text_and_input_edges_keep_their_contrast_light_and_dark(
    page: Page, tmp_path: Path
) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("calculator", expression="6*7"),
                                  text="Let me work that out."),
        ModelStep.text_reply(ANSWER),
        ModelStep.tool_call_reply(call("ask_user", question="Which unit?")),
        ModelStep.text_reply("42 EUR."),
    ])  # fmt: skip
    agent = Agent(model=model, tools=[calculator], clarifications=True)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "What is 6 times 7?")
        expect(page.locator(".block.narration.faded")).to_have_count(1)
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        send(page, "In which unit?")
        expect(page.locator(".card .answer input")).to_be_visible()
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            # Faded to the end, polled with `evaluate` (see above).
            wait_until(lambda: page.evaluate(FADED), "the fade to end")
            text = contrasts(page, TEXT)
            assert {s: r for s, r in text.items() if r is None or r < 4.5} == {}, scheme
            edges = contrasts(page, EDGES, edge=True)
            assert {s: r for s, r in edges.items() if r is None or r < 3} == {}, scheme
        dark = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        assert dark != "rgb(247, 247, 245)"  # the dark scheme is dark, not the light one
        assert page.evaluate("getComputedStyle(document.documentElement).colorScheme") == (
            "light dark"
        )
        page.fill(".card .answer input", "EUR")
        page.press(".card .answer input", "Enter")
        expect(page.locator(".block.text.answer .text").last).to_have_text("42 EUR.")
    model.assert_complete()


def test_streaming_text_respects_reduced_motion_and_its_cursor_is_not_read(
    page: Page, tmp_path: Path
) -> None:
    model, agent = _held_answer(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.emulate_media(reduced_motion="reduce")
        page.goto(app.url)
        send(page, "Explain 42")
        text = page.locator(".block.text.streaming .text > p")
        expect(text).to_have_text(ANSWER[:18])
        assert text.evaluate("n => getComputedStyle(n, '::after').content").startswith('"▍"')
        assert text.evaluate("n => getComputedStyle(n, '::after').animationName") == "none"
        cdp = page.context.new_cdp_session(page)
        tree = cdp.send("Accessibility.getFullAXTree")
        said = [str(node.get("name", {}).get("value", "")) for node in tree["nodes"]]
        assert any(ANSWER[:18] in name for name in said)  # the text is read ...
        assert not [name for name in said if "▍" in name]  # ... and the cursor is not
        model.release()
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)


ARABIC = "مرحبا بالعالم!"


def test_a_screen_reader_can_tell_turns_speakers_and_directions(page: Page, tmp_path: Path) -> None:
    answer = f"# عنوان\n\n{ARABIC}\n\nSee [the docs](https://example.com/docs)."
    model = ScriptedModel([ModelStep.text_reply(answer), ModelStep.text_reply("Done.")])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        expect(page.locator("#message")).to_have_attribute("dir", "auto")
        send(page, ARABIC)
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "succeeded")
        # Arabic reads right to left: the message, each block of the answer, the title.
        rtl = "n => getComputedStyle(n).direction"
        assert page.locator(".block.user .text").evaluate(rtl) == "rtl"
        text = page.locator(".block.text.answer .text")
        assert text.locator("p").first.evaluate(rtl) == "rtl"
        assert text.locator("p").last.evaluate(rtl) == "ltr"  # the English one stays
        assert page.locator("#sessions button").evaluate(rtl) == "rtl"
        assert page.locator("#session-title").evaluate(rtl) == "rtl"
        expect(page).to_have_title(f"{ARABIC} — turnkit")

        # One h1 (the chat's title), an h2 per turn, the model's `#` one level below.
        expect(page.locator("h1")).to_have_count(1)
        expect(page.locator("h1")).to_have_text(ARABIC)
        expect(text.locator("h3")).to_have_text("عنوان")
        send(page, "Thanks")
        expect(page.get_by_role("article", name="Turn 2")).to_contain_text("Done.")
        first = page.get_by_role("article", name="Turn 1")
        expect(first.get_by_role("heading", level=2)).to_have_text("Turn 1")
        expect(first.locator(".block.user")).to_have_text(f"You:{ARABIC}")
        expect(first.locator(".block.text.answer")).to_contain_text("Answer:")
        link = first.get_by_role("link", name="the docs (opens in a new tab)")
        expect(link).to_have_attribute("target", "_blank")

        page.emulate_media(forced_colors="active")  # the bubble keeps an edge there
        bubble = page.locator(".block.user").first
        expect(bubble).to_have_css("border-top-style", "solid")
        expect(bubble).to_have_css("border-top-width", "1px")
    model.assert_complete()


_REORDER = """async () => {
  const { placeAfter } = await import(new URL("page/turn_view.js", document.baseURI).href);
  const list = document.createElement("ul");
  const items = ["older", "newer"].map((name) => {
    const item = document.createElement("li");
    item.append(Object.assign(document.createElement("button"), { textContent: name }));
    list.append(item);
    return item;
  });
  document.body.append(list);
  const button = items[1].firstChild;
  button.focus();
  placeAfter(list, items[1], null);  // the list's refresh moves "newer" to the top
  const kept = document.activeElement === button && list.firstChild === items[1];
  list.remove();
  return kept;
}"""


def test_a_list_that_reorders_keeps_the_focus_of_what_it_moves(page: Page, tmp_path: Path) -> None:
    # The sessions list reorders when a chat gets a name or a message; a session button that
    # moved lost focus, and the Enter pressed on it next went nowhere.
    with serve_page(tmp_path, Agent(model=ScriptedModel([]))) as app:
        page.goto(app.url)
        assert page.evaluate(_REORDER)
