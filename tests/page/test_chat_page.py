"""The chat page in a real Chromium against the quickstart app, driven by scripted models."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from tests.helpers import WrappedModel
from tests.page.conftest import WAIT_MS
from tests.page.harness import PacedModel, serve_page
from turnkit import Agent, BudgetLimit, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.models import ModelChunk, ModelRequest, Usage
from turnkit.plugins.citations import Citations
from turnkit.stages._naming import NAMING_PROMPT
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
ANSWER = "The total is 42, which is six times seven, as the calculator said."


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def priced(step: ModelStep, cost: float) -> ModelStep:
    return replace(step, usage=Usage(input_tokens=120, output_tokens=30, cost_usd=cost))


@tool
async def calculator(expression: str, ctx: ToolContext) -> str:
    """Evaluate an arithmetic expression."""
    import asyncio

    await ctx.report_progress(0.5, "half way")
    await asyncio.sleep(1.0)  # long enough to see the row running
    return "42"


# ── sending a message: narration, a tool row with its status and duration, the answer ──


def test_a_message_shows_the_tool_row_and_the_answer(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([
        priced(ModelStep.tool_call_reply(call("calculator", expression="6*7"),
                                         text="Let me work that out."), 0.0012),
        priced(ModelStep.text_reply(ANSWER), 0.0009),
        ModelStep.text_reply("56."),
    ])  # fmt: skip
    with serve_page(tmp_path, Agent(model=model, tools=[calculator])) as app:
        page.goto(app.url)
        expect(page.locator("#empty")).to_be_visible()
        send(page, "What is 6 times 7?")

        turn = page.locator("article.turn")
        expect(turn.locator(".block.user .text")).to_have_text("What is 6 times 7?")
        row = turn.locator(".block.tool")
        expect(row).to_have_attribute("data-status", "running")  # live, while the tool runs
        expect(row.locator(".name")).to_have_text("calculator")
        expect(row.locator(".args")).to_have_text('expression="6*7"')
        expect(row.locator(".job-message")).to_have_text("half way")
        expect(row).to_have_attribute("data-status", "succeeded")
        expect(row.locator(".duration")).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s)$"))

        answer = turn.locator(".block.text.answer .text")
        expect(answer).to_have_text(ANSWER)
        narration = turn.locator(".block.text.narration")
        expect(narration.locator(".text")).to_have_text("Let me work that out.")
        expect(narration).to_have_class(re.compile(r"\bfaded\b"))  # the answer exists
        expect(turn).to_have_attribute("data-status", "succeeded")
        expect(turn.locator(".meta")).to_contain_text("$0.0021")

        kinds = turn.locator(".blocks > .block").evaluate_all(
            "nodes => nodes.map(n => n.dataset.kind)"
        )
        assert kinds == ["user", "text", "tool", "text"]  # blocks in log order
        expect(page.locator("#sessions button")).to_have_text(["What is 6 times 7?"])
        expect(page.locator("#stop")).to_be_hidden()

        shot = tmp_path / "page.png"
        page.screenshot(path=str(shot))
        assert shot.read_bytes().startswith(b"\x89PNG")
        if os.environ.get("TURNKIT_WRITE_PAGE_SCREENSHOT") == "1":  # refresh docs/images
            page.set_viewport_size({"width": 1000, "height": 420})
            page.screenshot(path=str(ROOT / "docs" / "images" / "page.png"))
            page.set_viewport_size({"width": 1100, "height": 760})

        page.reload()  # a finished turn replays the same way
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "succeeded")

        send(page, "And 7 times 8?")  # the next turn goes below, in the same session
        expect(page.locator(".block.text.answer .text")).to_have_text([ANSWER, "56."])
        expect(page.locator(".block.user .text")).to_have_text(
            ["What is 6 times 7?", "And 7 times 8?"]
        )
        expect(page.locator("#sessions button")).to_have_count(1)
    model.assert_complete()


# ── the session's better name, which arrives after its opening turn ──────────────────


class _HeldNamer(WrappedModel):
    """A utility model that plans at once and names the session once `gate` is set."""

    def __init__(self, title: str) -> None:
        self.gate = threading.Event()

        def answer(request: ModelRequest) -> ModelStep:
            return ModelStep.text_reply(title if _names(request) else "{}")

        self.inner = ScriptedModel([ModelStep.respond(answer)], repeat_last=True)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if _names(request):
            for _ in range(1500):  # the gate is a thread's: poll it, 30 s at most
                if self.gate.is_set():
                    break
                await asyncio.sleep(0.02)
        async for chunk in self.inner.stream(request):
            yield chunk


def _names(request: ModelRequest) -> bool:
    return request.messages[0].content == NAMING_PROMPT


def test_the_list_shows_the_better_name_after_the_turn(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Fifty-six.")])
    namer = _HeldNamer("Multiplication facts")
    agent = Agent(model=model, utility_model=namer)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "What is 7 times 8?")
        expect(page.locator(".block.text.answer .text")).to_have_text("Fifty-six.")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        # The turn ended before the name came: the list shows the first one meanwhile.
        expect(page.locator("#sessions button")).to_have_text(["What is 7 times 8?"])
        namer.gate.set()
        expect(page.locator("#sessions button")).to_have_text(["Multiplication facts"])
        expect(page.locator("#session-title")).to_have_text("Multiplication facts")


# ── tasks, job progress, a question with choices, citations ──────────────────────────────


def test_tasks_a_question_with_choices_and_citations(page: Page, tmp_path: Path) -> None:
    tasks = [
        {"id": "t1", "title": "Work out the product", "status": "done"},
        {"id": "t2", "title": "Ask for the unit", "status": "in_progress"},
    ]
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("update_tasks", tasks=tasks),
                                  call("calculator", expression="6*7")),
        ModelStep.tool_call_reply(call("ask_user", question="Which unit?",
                                       choices=["EUR", "USD"])),
        ModelStep.text_reply("The result is 42 EUR."),
    ])  # fmt: skip
    agent = Agent(
        model=model,
        tools=[calculator],
        planning=True,
        clarifications=True,
        plugins=[Citations()],
    )
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Multiply 6 by 7")
        items = page.locator(".block.tasks li")
        expect(items).to_have_text(["Work out the product", "Ask for the unit"])
        expect(items.nth(0)).to_have_attribute("data-status", "done")
        expect(items.nth(1)).to_have_attribute("data-status", "in_progress")
        job = page.locator(".block.tool", has_text="calculator").locator(".job")
        expect(job.locator(".job-message")).to_have_text("half way · job done")
        expect(job.locator("progress")).to_have_attribute("value", "1")

        card = page.locator(".card.clarification")
        expect(card.locator(".card-title")).to_have_text("Which unit?")
        expect(card.locator("[data-choice]")).to_have_text(["EUR", "USD"])
        expect(page.locator("article.turn")).to_have_attribute("data-status", "awaiting_input")
        card.locator("[data-choice='EUR']").click()

        expect(page.locator(".card")).to_have_count(0)
        expect(page.locator(".block.text.answer .text")).to_have_text("The result is 42 EUR.")
        citation = page.locator(".block.text.answer .citations li")
        expect(citation).to_have_text(re.compile(r"^calculator"))
        expect(citation.locator("q")).to_have_text("The result is 42 EUR.")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
    model.assert_complete()


# ── reload and reconnect mid-answer: the whole text, exactly once ──────────────────────


def _held_answer(tmp_path: Path) -> tuple[PacedModel, Agent]:
    model = PacedModel(
        ScriptedModel([ModelStep.text_reply(ANSWER, chunk_size=6)]), delay_s=0.03, hold_after=3
    )
    return model, Agent(model=model)


def test_reload_mid_answer_shows_the_whole_answer_once(page: Page, tmp_path: Path) -> None:
    model, agent = _held_answer(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Explain 42")
        text = page.locator(".block.text .text")
        expect(text).to_have_text(ANSWER[:18])  # three pieces, then the model holds
        page.reload()
        expect(text).to_have_text(ANSWER[:18])  # replayed from the turn's start, once
        model.release()
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        assert page.inner_text("#turns").count(ANSWER) == 1
        expect(page.locator(".block.text")).to_have_count(1)


def test_a_dropped_stream_resumes_with_last_event_id(page: Page, tmp_path: Path) -> None:
    model, agent = _held_answer(tmp_path)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "Explain 42")
        text = page.locator(".block.text .text")
        expect(text).to_have_text(ANSWER[:18])
        app.switch.drop()  # the connection drops while the answer is half written
        wait_until(lambda: app.switch.resumed_with_cursor(), "the browser to reconnect")
        model.release()
        expect(page.locator(".block.text.answer .text")).to_have_text(ANSWER)
        assert page.inner_text("#turns").count(ANSWER) == 1
        expect(page.locator(".block.text")).to_have_count(1)
        [cursor, *_] = app.switch.resumed_with_cursor()
        assert int(cursor) > 1  # the browser's EventSource sent the last durable seq


# ── approvals: the card comes from the pending route, and the same turn finishes ────────


@tool(approval="always")
async def wire(amount: int, to: str) -> str:
    """Send money."""
    return f"sent {amount} EUR to {to}"


PAY_BOB = (
    ModelStep.tool_call_reply(call("wire", amount=5, to="Bob")),
    ModelStep.text_reply("Sent 5 EUR to Bob."),
)
"""A turn that asks to approve a `wire`, then answers."""


def pay_bob(page: Page) -> Locator:
    """Send the message `PAY_BOB` answers; its approval card, once it shows."""
    send(page, "Pay Bob 5 EUR")
    card = page.locator(".card.approval")
    expect(card.locator(".card-title")).to_have_text("Approve wire?")
    return card


def test_an_approval_card_survives_a_reload_and_finishes_the_turn(
    page: Page, tmp_path: Path
) -> None:
    model = ScriptedModel(PAY_BOB)
    with serve_page(tmp_path, Agent(model=model, tools=[wire])) as app:
        page.goto(app.url)
        card = pay_bob(page)
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "awaiting_approval")
        # A paused turn takes no message in: one sent now queues after it, as the box says.
        placeholder = "Queue a message for after this turn…"
        expect(page.locator("#message")).to_have_attribute("placeholder", placeholder)

        page.route("**/stream**", lambda route: route.abort())  # no stream at all
        page.reload()
        expect(card.locator(".card-title")).to_have_text("Approve wire?")  # from GET …/pending
        expect(card.locator(".arguments")).to_contain_text('"to": "Bob"')
        page.unroute("**/stream**")

        expect(card).to_have_attribute("aria-label", "Approval needed")
        expect(page.locator("#announce")).to_have_text(  # said, not per token
            re.compile(r"^Approval needed: Approve wire\?")
        )
        card.locator("[data-decision='approve']").click()
        expect(page.locator(".card")).to_have_count(0)
        expect(page.locator("#message")).to_be_focused()  # not lost with the clicked button
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "succeeded")
        expect(page.locator(".block.tool .status")).to_have_text("succeeded:")  # not just ✓
        expect(page.locator(".block.tool .detail")).to_have_text("approved")
        expect(page.locator(".block.text.answer .text")).to_have_text("Sent 5 EUR to Bob.")
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        expect(page.locator("#announce")).to_have_text("The answer is complete.")
        page.reload()  # the same from the turn's log
        expect(page.locator(".block.tool .detail")).to_have_text("approved")
    model.assert_complete()


@tool
async def balance(account: str) -> str:
    """Look an account's balance up."""
    return f"{account}: 120 EUR"


def test_a_call_waiting_on_its_batchs_approval_is_shown_waiting_not_running(
    page: Page, tmp_path: Path
) -> None:
    """Nothing of a batch runs until its approval is answered: the other call does not
    tick as if it ran, before or after a reload, and runs once the answer is in."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("wire", amount=5, to="Bob"), call("balance", account="A")
            ),
            ModelStep.text_reply("Sent, and A has 120 EUR."),
        ]
    )
    with serve_page(tmp_path, Agent(model=model, tools=[wire, balance])) as app:
        page.goto(app.url)
        send(page, "Pay Bob and check A")
        card = page.locator(".card.approval")
        expect(card.locator(".card-title")).to_have_text("Approve wire?")
        waiting = page.locator(".block.tool").nth(1)
        for _ in range(2):  # live, then from the turn's log
            expect(waiting).to_have_attribute("data-status", "queued")
            expect(waiting.locator(".status")).to_have_text("waiting for its batch's approval:")
            expect(waiting.locator(".duration")).to_have_text("")
            page.reload()
            expect(card.locator(".card-title")).to_have_text("Approve wire?")
        card.locator("[data-decision='approve']").click()
        expect(waiting).to_have_attribute("data-status", "succeeded")
        expect(page.locator(".block.tool").nth(0)).to_have_attribute("data-status", "succeeded")
    model.assert_complete()


@tool(approval="always", approver_role="supervisor")
async def wire_big(amount: int, to: str) -> str:
    """Send a lot of money (a supervisor approves)."""
    return f"sent {amount} EUR to {to}"


def test_a_card_a_role_answers_says_so_and_the_owners_answer_is_refused(
    page: Page, tmp_path: Path
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("wire_big", amount=500, to="Bob"))])
    with serve_page(tmp_path, Agent(model=model, tools=[wire_big])) as app:
        page.goto(app.url)
        send(page, "Pay Bob 500 EUR")
        card = page.locator(".card.approval")
        said = "Answered by a person with the supervisor role."
        expect(card.locator(".approver")).to_have_text(said)
        page.reload()  # from GET …/pending as well
        expect(card.locator(".approver")).to_have_text(said)
        card.locator("[data-decision='approve']").click()
        expect(page.locator("#notice")).to_contain_text("'supervisor'")
        expect(card).to_have_count(1)  # still waiting: the answer was not taken
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "awaiting_approval")


def test_a_denied_call_reads_denied_without_the_words_meant_for_the_model(
    page: Page, tmp_path: Path
) -> None:
    model = ScriptedModel([PAY_BOB[0], ModelStep.text_reply("I did not send it.")])
    with serve_page(tmp_path, Agent(model=model, tools=[wire])) as app:
        page.goto(app.url)
        pay_bob(page).locator("[data-decision='deny']").click()
        tool_row = page.locator(".block.tool")
        expect(tool_row).to_have_attribute("data-status", "denied")
        expect(tool_row.locator(".status")).to_have_text("denied:")
        expect(tool_row.locator(".icon")).to_have_text("⊘")
        expect(tool_row.locator(".detail")).to_have_text("the person denied this call")
        expect(page.locator(".block.text.answer .text")).to_have_text("I did not send it.")
        page.reload()  # the same from history
        expect(page.locator(".block.tool .detail")).to_have_text("the person denied this call")
    model.assert_complete()


def test_a_call_left_waiting_by_stop_is_no_longer_shown_waiting(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("wire", amount=5, to="Bob"))])
    with serve_page(tmp_path, Agent(model=model, tools=[wire])) as app:
        page.goto(app.url)
        send(page, "Pay Bob 5 EUR")
        tool_row = page.locator(".block.tool")
        expect(tool_row).to_have_attribute("data-status", "awaiting_approval")
        page.locator("#stop").click()
        expect(page.locator("article.turn")).to_have_attribute("data-status", "cancelled")
        expect(page.locator(".card")).to_have_count(0)
        expect(tool_row).to_have_attribute("data-status", "not_finished")
        expect(tool_row.locator(".icon")).to_have_text("–")
        page.reload()
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "not_finished")


def test_a_message_written_while_the_last_is_on_its_way_follows_it(
    page: Page, tmp_path: Path
) -> None:
    """Enter while the page still reads back the turn it just started: not dropped."""
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "Hello")
        expect(page.locator(".block.text.answer .text")).to_have_text("Noted.")

        def slow_history(route: Any) -> None:
            time.sleep(1.5)  # the read-back that follows a send, slowed down
            route.continue_()

        page.route("**/history", slow_history)
        send(page, "First")
        send(page, "Second")  # the first is still on its way
        expect(page.locator("#message")).to_have_value("")
        users = page.locator("article.turn .block.user .text")
        expect(users).to_have_text(["Hello", "First", "Second"], timeout=WAIT_MS * 2)
    assert any("Second" in str(m.content) for c in model.calls for m in c.messages)


# ── the queue: guide messages and turns that wait, drained only when a turn ends ───────


def test_messages_wait_in_the_queue_until_a_turn_ends(page: Page, tmp_path: Path) -> None:
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
        ModelStep.tool_call_reply(call("lookup", topic="A")),
        ModelStep.text_reply("A and B are fine."),
        ModelStep.tool_call_reply(call("wire", amount=5, to="Bob")),
        ModelStep.text_reply("Sent 5 EUR to Bob."),
        ModelStep.text_reply("You are welcome."),
    ])  # fmt: skip
    with serve_page(tmp_path, Agent(model=model, tools=[lookup, wire])) as app:
        page.goto(app.url)
        queue = page.locator("#queue li")
        send(page, "Check A")
        expect(page.locator(".block.tool")).to_have_attribute("data-status", "running")
        send(page, "Also check B")  # joins the running turn: queued on it until it is taken
        expect(queue).to_have_count(1)
        expect(queue).to_have_attribute("data-delivery", "guide")
        expect(queue.locator(".text")).to_have_text("Also check B")
        hold.set()
        expect(page.locator(".block.text.answer .text")).to_have_text("A and B are fine.")
        expect(queue).to_have_count(0)
        expect(page.locator("article.turn .block.user .text")).to_have_text(
            ["Check A", "Also check B"]  # taken by the same turn, as its second segment
        )

        send(page, "Pay Bob 5 EUR")
        card = page.locator(".card.approval")
        expect(card.locator(".card-title")).to_have_text("Approve wire?")
        send(page, "Thanks")  # the turn is paused: this one waits behind it
        expect(queue).to_have_count(1)
        expect(queue).to_have_attribute("data-delivery", "queue")
        expect(queue.locator(".text")).to_have_text("Thanks")
        expect(page.locator("article.turn")).to_have_count(2)
        page.reload()  # the queue comes back from the turns' own logs
        expect(queue.locator(".text")).to_have_text("Thanks")
        expect(page.locator("article.turn")).to_have_count(2)

        card.locator("[data-decision='approve']").click()
        answers = page.locator(".block.text.answer .text")
        expect(answers).to_have_text(
            ["A and B are fine.", "Sent 5 EUR to Bob.", "You are welcome."]
        )
        expect(queue).to_have_count(0)
        expect(page.locator("article.turn")).to_have_count(3)
    model.assert_complete()


def test_many_messages_behind_a_paused_turn_leave_the_page_free_to_approve(
    page: Page, tmp_path: Path
) -> None:
    """A stream per waiting turn would take all six of a browser's connections."""
    waiting = [f"And then {n}" for n in range(7)]
    model = ScriptedModel([*PAY_BOB, *(ModelStep.text_reply(f"Noted {n}.") for n in range(7))])
    with serve_page(tmp_path, Agent(model=model, tools=[wire])) as app:
        page.goto(app.url)
        card = pay_bob(page)
        for text in waiting:
            send(page, text)
            expect(page.locator("#queue li .text").last).to_have_text(text)
        page.reload()  # every waiting turn comes back from history, none is followed
        expect(page.locator("#queue li .text")).to_have_text(waiting)
        card.locator("[data-decision='approve']").click()
        answers = page.locator(".block.text.answer .text")
        expect(answers).to_have_text(["Sent 5 EUR to Bob.", *(f"Noted {n}." for n in range(7))])
        expect(page.locator("#queue li")).to_have_count(0)
    model.assert_complete()


def test_a_message_that_could_not_be_sent_stays_in_the_box(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Got it.")])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        page.context.set_offline(True)
        send(page, "Hello while offline")
        expect(page.locator("#notice")).to_have_text(
            "The server could not be reached; check your connection and send again."
        )
        expect(page.locator("#message")).to_have_value("Hello while offline")
        page.context.set_offline(False)
        page.press("#message", "Enter")
        expect(page.locator(".block.text.answer .text")).to_have_text("Got it.")
        expect(page.locator("#message")).to_have_value("")
        expect(page.locator("#notice")).to_have_text("")  # the failure's notice is gone
    model.assert_complete()


def test_a_refused_first_message_leaves_no_empty_chat(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Short.")])
    with serve_page(tmp_path, Agent(model=model), max_content_chars=20) as app:
        page.goto(app.url)
        send(page, "a message far longer than twenty characters")
        expect(page.locator("#notice")).to_contain_text("20")
        expect(page.locator("#message")).to_have_value(
            "a message far longer than twenty characters"
        )
        expect(page.locator("#sessions button")).to_have_count(0)
        assert "#session=" not in page.url
        page.fill("#message", "Hi")
        page.press("#message", "Enter")
        expect(page.locator(".block.text.answer .text")).to_have_text("Short.")
        expect(page.locator("#sessions button")).to_have_count(1)


def test_a_link_to_no_session_says_so_in_words(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    with serve_page(tmp_path, Agent(model=model, skip_stages=frozenset({"anchor-plan"}))) as app:
        for bad, shown in (("never-seen", "never-seen"), ("bad%20id%20%3Cx%3E", "bad id <x>")):
            page.goto(f"{app.url}#session={bad}")
            # (this link's answer, not the one before: the page is the same document)
            expect(page.locator("#notice")).to_contain_text(f'There is no chat "{shown}"')
            expect(page.locator("#notice")).not_to_contain_text("pattern")
        # A message after a mangled link starts a new chat, not a validator's complaint.
        send(page, "hi")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hello.")
        expect(page.locator("#notice")).to_have_text("")
        assert "bad%20id" not in page.url


def test_back_returns_to_the_session_the_person_left(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "one")
        expect(page.locator(".block.text.answer .text")).to_have_text("First.")
        first = page.evaluate("location.hash")
        page.click("#new-session")
        wait_until(lambda: page.evaluate("location.hash") != first, "the new session")
        expect(page.locator("article.turn")).to_have_count(0)
        send(page, "two")
        expect(page.locator(".block.text.answer .text")).to_have_text("Second.")
        assert page.evaluate("location.hash") != first
        page.go_back()
        expect(page.locator(".block.text.answer .text")).to_have_text("First.")
        assert page.evaluate("location.hash") == first
        page.goto(f"{app.url}#session=%E0%A4%A")  # a malformed link opens a session anyway
        expect(page.locator(".block.text.answer .text")).to_have_count(1)
    model.assert_complete()


class Held:
    """The `method` requests to `pattern` a page sends, held until `release()`."""

    def __init__(self, page: Page, pattern: str, method: str) -> None:
        self.routes: list[Any] = []
        self.holding = True
        self.method = method
        page.route(pattern, self._route)

    def _route(self, route: Any) -> None:
        if self.holding and route.request.method == self.method:
            self.routes.append(route)
        else:
            route.continue_()

    def release(self, first_only: bool = False) -> None:
        """Let the held requests go (or only the first), and the next ones too."""
        self.holding = first_only
        while self.routes:
            self.routes.pop(0).continue_()
            if first_only:
                return


def pump_until(page: Page, predicate: Callable[[], object], bound_s: float) -> bool:
    """Let the page run (its routes and events too) until `predicate`, `bound_s` at most."""
    deadline = time.monotonic() + bound_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        page.wait_for_timeout(20)
    return True


def test_a_message_sent_while_new_chat_is_made_goes_to_the_new_chat(
    page: Page, tmp_path: Path
) -> None:
    """New chat, then a message at once: the message waits for that chat, never the last one."""
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    answers = page.locator(".block.text.answer .text")
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "one")
        expect(answers).to_have_text("First.")
        first = page.evaluate("location.hash")
        created = Held(page, "**/api/harness/sessions", "POST")
        posted: list[str] = []
        page.on("request", lambda r: r.url.endswith("/execute") and posted.append(r.url))
        page.click("#new-session")
        assert pump_until(page, lambda: created.routes, WAIT_MS / 1000)
        send(page, "two")  # while New chat's session is still being made
        pump_until(page, lambda: posted, 0.5)  # the page used to post it at once
        assert first.removeprefix("#session=") not in "".join(posted)
        created.release()
        expect(page.locator(".block.user .text")).to_have_text("two")
        expect(answers).to_have_text("Second.")
        assert page.evaluate("location.hash") != first
        expect(page.locator("#sessions button")).to_have_count(2)
        page.go_back()  # the chat that was open keeps its one turn
        expect(page.locator(".block.user .text")).to_have_text("one")
        expect(answers).to_have_text("First.")
    model.assert_complete()


def test_new_chat_before_the_list_arrives_stays_as_it_is(page: Page, tmp_path: Path) -> None:
    """The session list arriving after New chat opens nothing again: no redraw, no restart."""
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    answers = page.locator(".block.text.answer .text")
    with serve_page(tmp_path, Agent(model=model)) as app:
        httpx.post(f"{app.url}/api/harness/sessions", json={}).raise_for_status()  # an older chat
        listed = Held(page, "**/api/harness/sessions?limit=100", "GET")
        page.goto(app.url)
        assert pump_until(page, lambda: listed.routes, WAIT_MS / 1000)
        page.click("#new-session")
        wait_until(lambda: page.evaluate("location.hash"), "the new chat")
        opened = page.evaluate("location.hash")
        send(page, "hi")
        expect(answers).to_have_text("Hello.")
        # Ended: the history read that follows a turn's end has gone out (before this draw).
        expect(page.locator("article.turn")).to_have_attribute("data-status", "succeeded")
        page.evaluate(
            """() => {
              window.removedTurns = 0;
              new MutationObserver((records) => {
                for (const r of records) window.removedTurns += r.removedNodes.length;
              }).observe(document.querySelector("#turns"), { childList: true });
            }"""
        )
        read = Held(page, "**/history", "GET")  # a chat opened again would show empty
        listed.release(first_only=True)  # the page's first read (the later ones: the sends')
        expect(page.locator("#sessions button")).to_have_count(2)  # the list, drawn
        assert page.evaluate("window.removedTurns") == 0  # the conversation was never reset
        assert read.routes == []
        read.release()
        listed.release()
        expect(answers).to_have_text("Hello.")
        assert page.evaluate("location.hash") == opened
    model.assert_complete()


def test_the_controls_wait_for_the_page_to_start(page: Page, tmp_path: Path) -> None:
    """Before app.js has wired the page its buttons are disabled: nothing is lost or reloaded."""
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    with serve_page(tmp_path, Agent(model=model)) as app:
        script = Held(page, "**/page/app.js", "GET")  # a slow connection: the script late
        made: list[str] = []
        page.on("request", lambda r: r.method == "POST" and made.append(r.url))
        loads: list[str] = []  # the documents the page loads
        page.on("request", lambda r: r.resource_type == "document" and loads.append(r.url))
        page.goto(app.url, wait_until="commit")
        assert pump_until(page, lambda: script.routes, WAIT_MS / 1000)
        expect(page.locator("#composer")).to_be_attached()
        for control in ("#new-session", "#send", "#menu"):
            expect(page.locator(control)).to_be_disabled()  # shown not ready (and greyed)
        page.click("#new-session", force=True)
        page.fill("#message", "hi")
        page.press("#message", "Enter")  # a textarea: a new line, never a native submit
        page.click("#send", force=True)  # a native submit would reload the page, text gone
        page.wait_for_timeout(300)
        assert made == []
        assert loads == [app.url + "/"]  # the one load: no reload, nothing in the address
        expect(page.locator("#message")).to_have_value("hi\n")  # what was written, kept
        script.release()
        for control in ("#new-session", "#send"):
            expect(page.locator(control)).to_be_enabled()
        page.click("#send")
        expect(page.locator(".block.user .text")).to_have_text("hi")
        expect(page.locator(".block.text.answer .text")).to_have_text("Hello.")
        assert loads == [app.url + "/"]
    model.assert_complete()


# ── Stop: the partial answer stays, marked interrupted ─────────────────────────────────


def test_stop_keeps_the_partial_answer_as_interrupted(page: Page, tmp_path: Path) -> None:
    partial = "Counting the stars one by one"
    model = ScriptedModel([ModelStep.hang(partial)])
    with serve_page(tmp_path, Agent(model=model)) as app:
        page.goto(app.url)
        send(page, "Count the stars")
        expect(page.locator(".block.text .text")).to_have_text(partial)
        stop = page.locator("#stop")
        expect(stop).to_be_visible()
        stop.click()
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "cancelled")
        block = page.locator(".block.text.interrupted")
        expect(block.locator(".text")).to_have_text(partial)
        expect(block.locator(".badge")).to_be_visible()
        expect(turn.locator(".meta")).to_contain_text("Stopped")
        expect(stop).to_be_hidden()
        page.reload()
        expect(page.locator(".block.text.interrupted .text")).to_have_text(partial)


def test_an_answer_call_that_named_a_tool_shows_only_the_answer(page: Page, tmp_path: Path) -> None:
    """The answer call named a tool it could not use and wrote nothing, then answered when
    asked again: the page shows no tool row for the dropped call and no empty bubble."""
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("calculator", expression="6*7")),
        ModelStep.tool_call_reply(call("calculator", expression="6*8")),
        ModelStep.text_reply(ANSWER),
    ])  # fmt: skip
    agent = Agent(model=model, tools=[calculator], max_tool_rounds=1)
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "What is 6 times 7?")
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "succeeded")
        expect(turn.locator(".block.text.answer .text")).to_have_text(ANSWER)
        kinds = "nodes => nodes.map(n => n.dataset.kind)"
        assert turn.locator(".blocks > .block").evaluate_all(kinds) == ["user", "tool", "text"]
        page.reload()
        turn = page.locator("article.turn")
        expect(turn.locator(".block.text.answer .text")).to_have_text(ANSWER)
        assert turn.locator(".blocks > .block").evaluate_all(kinds) == ["user", "tool", "text"]
    model.assert_complete()


def test_narration_of_only_white_space_draws_no_bubble(page: Page, tmp_path: Path) -> None:
    """A model wrote only a line break beside its tool call: no blank narration bubble, while
    the turn runs (checked on every change of the page) or after a reload."""
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("calculator", expression="6*7"), text="  \n \t\n"),
        ModelStep.text_reply(ANSWER),
    ])  # fmt: skip
    agent = Agent(model=model, tools=[calculator], skip_stages=frozenset({"anchor-plan"}))
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        page.evaluate(BLANK_WATCH)
        send(page, "What is 6 times 7?")
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "succeeded")
        expect(turn.locator(".block.text.answer .text")).to_have_text(ANSWER)
        kinds = "nodes => nodes.filter(n => !n.hidden).map(n => n.dataset.kind)"
        assert turn.locator(".blocks > .block").evaluate_all(kinds) == ["user", "tool", "text"]
        assert page.evaluate("window.blankSeen") is False
        page.reload()
        turn = page.locator("article.turn")
        expect(turn.locator(".block.text.answer .text")).to_have_text(ANSWER)
        assert turn.locator(".blocks > .block").evaluate_all(kinds) == ["user", "tool", "text"]
    model.assert_complete()


BLANK_WATCH = """() => {
  window.blankSeen = false;
  const blank = () => [...document.querySelectorAll(".block.text")].some(
    (b) => b.checkVisibility() && !b.querySelector(".text").textContent.trim());
  new MutationObserver(() => { if (blank()) window.blankSeen = true; })
    .observe(document.body, { subtree: true, childList: true, characterData: true,
                              attributes: true });
}"""
"""Notes in `window.blankSeen` whether a text bubble with no visible text was ever shown."""


# ── a budget pause: the page says so, and goes on when the limit is raised ──────────────


@tool
async def quote(symbol: str) -> str:
    """A stock quote."""
    return f"{symbol} 12.50"


def test_a_budget_pause_shows_and_the_turn_goes_on_when_raised(page: Page, tmp_path: Path) -> None:
    costly = replace(
        ModelStep.tool_call_reply(call("quote", symbol="ACME")),
        usage=Usage(input_tokens=900, output_tokens=100),
    )
    model = ScriptedModel([costly, ModelStep.text_reply("ACME trades at 12.50.")])
    url = f"sqlite:///{tmp_path / 'page.db'}"
    with serve_page(
        tmp_path,
        Agent(model=model, tools=[quote]),
        budgets="enforce",
        budget_reserve_tokens=100,
        recover_in_process=True,
    ) as app:
        limit = BudgetLimit(scope="organisation", tokens=1_100)
        _in_thread(_set_limit(url, limit))
        page.goto(app.url)
        send(page, "Quote ACME")
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-status", "awaiting_budget")
        expect(turn.locator(".meta")).to_contain_text("Paused: out of budget")
        expect(page.locator(".block.notice")).to_contain_text("1000 of 1100 tokens")
        resumed = _in_thread(_set_limit(url, limit.model_copy(update={"tokens": 50_000})))
        assert len(resumed) == 1
        expect(page.locator(".block.text .text").last).to_have_text("ACME trades at 12.50.")
        expect(turn).to_have_attribute("data-status", "succeeded")


def _in_thread(work: Coroutine[Any, Any, list[str]]) -> list[str]:
    """Run `work` on its own loop (Playwright's sync API holds this thread's)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result(timeout=60)


async def _set_limit(url: str, limit: BudgetLimit) -> list[str]:
    """An administrator in another runtime (driving nothing) sets a limit."""
    admin = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=url, budgets="enforce", run_in_process=False),
    )
    async with admin:
        return await admin.set_budget_limit(limit)


# ── an idle stream: keep-alives only, never an event or an error ───────────────────────

_LISTEN = """(url) => {
  window.idle = { messages: 0, errors: 0 };
  window.idleSource = new EventSource(url);
  window.idleSource.onmessage = () => { window.idle.messages += 1; };
  window.idleSource.onerror = () => { window.idle.errors += 1; };
}"""


def test_an_idle_event_source_gets_no_events_and_no_errors(page: Page, tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("wire", amount=5, to="Bob"))])
    with serve_page(tmp_path, Agent(model=model, tools=[wire]), keepalive_s=1.0) as app:
        page.goto(app.url)
        send(page, "Pay Bob 5 EUR")
        expect(page.locator(".card.approval")).to_be_visible()  # the turn waits for a person
        turn_id = page.locator("article.turn").get_attribute("data-turn-id")
        stream = f"/api/harness/turns/{turn_id}/stream"
        page.evaluate(_LISTEN, f"{stream}?after=0")
        opened = "window.idle.messages > 0 && window.idleSource.readyState === 1"
        wait_until(lambda: page.evaluate(opened), "the replay")  # no wait_for_function: CSP
        page.wait_for_timeout(500)  # the replay up to `approval.requested` is in
        replayed = page.evaluate("window.idle.messages")

        raw = ""
        with (
            httpx.Client(base_url=app.url, timeout=10) as http,
            http.stream("GET", stream, headers={"Last-Event-ID": "1"}) as response,
        ):
            deadline = time.monotonic() + 3.5  # past three keep-alive intervals
            for chunk in response.iter_text():
                raw += chunk
                if time.monotonic() > deadline:
                    break
        assert raw.count(": keep-alive\n") >= 2

        idle = page.evaluate("[window.idle, window.idleSource.readyState]")
        assert idle == [{"messages": replayed, "errors": 0}, 1]
        expect(page.locator("article.turn .meta")).not_to_contain_text("reconnecting")
        page.evaluate("window.idleSource.close()")


def test_a_failed_turn_is_sent_again_with_retry(page: Page, tmp_path: Path) -> None:
    from turnkit import ProviderError

    down = ProviderError("the provider is down", status_code=503)
    model = ScriptedModel([ModelStep.fail(down), ModelStep.text_reply("Back: 42.")])
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan"}))
    with serve_page(tmp_path, agent) as app:
        page.goto(app.url)
        send(page, "What is six times seven?")
        failed = page.locator("article.turn").first
        expect(failed).to_have_attribute("data-status", "failed")
        # Said once: the error, which names the failed model, without a notice repeating it.
        expect(failed.get_by_text("the provider is down")).to_have_count(1)
        again = failed.get_by_role("button", name="Retry")
        expect(again).to_be_visible()
        again.click()
        turns = page.locator("article.turn")
        expect(turns).to_have_count(2)
        expect(turns.last.locator(".block.user .text")).to_have_text("What is six times seven?")
        expect(turns.last.locator(".block.text.answer .text")).to_have_text("Back: 42.")
        expect(turns.last).to_have_attribute("data-status", "succeeded")
        expect(turns.last.get_by_role("button", name="Retry")).to_have_count(0)
        page.reload()  # the same, drawn from history
        expect(page.locator("article.turn")).to_have_count(2)
        retry_again = page.locator("article.turn").first.get_by_role("button", name="Retry")
        expect(retry_again).to_be_visible()
        # Retry once more (or from another tab): the turn the first Retry started, not a third.
        with page.expect_response(lambda r: r.url.endswith("/retry")) as answered:
            retry_again.click()
        assert answered.value.status == 200
        with httpx.Client(base_url=app.url, timeout=10) as http:
            [session] = http.get("/api/harness/sessions").json()
            history = http.get(f"/api/harness/sessions/{session['sessionId']}/history").json()
        assert len(history) == 2
        expect(page.locator("article.turn")).to_have_count(2)
