"""The agent loop on `ScriptedModel`: a transcript that only grows across turns and
processes, compaction, picture release, long results, argument repair, thinking summaries."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

import turnkit.context.prefix as prefix
from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import (
    Agent,
    ImagePart,
    InvalidInputError,
    ModelFamily,
    PrefixRewriteError,
    ProviderError,
    RuntimeConfig,
    SessionRuntime,
    TextPart,
    tool,
)
from turnkit.blocks import ThinkingSummaryBlock, UserBlock
from turnkit.context.compaction import SUMMARY_PROMPT as COMPACTION_PROMPT
from turnkit.context.prefix import RequestView, check_prefix
from turnkit.events import (
    CompactionCompletedEvent,
    CompactionStartedEvent,
    DoneEvent,
    RunFinishedEvent,
    ThinkingCompleteEvent,
    ToolCompletedEvent,
)
from turnkit.models import ModelRequest, Usage, estimate_tokens
from turnkit.plugins import ModelCallView, Note, Plugin, PluginContext
from turnkit.stages._thinking import SUMMARY_PROMPT
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events, raw_call

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24


def _starts_with(after: ModelRequest, before: ModelRequest) -> bool:
    return after.messages[: len(before.messages)] == before.messages and after.tools == before.tools


def _assert_only_appends(calls: list[ModelRequest]) -> None:
    reasoning = [c for c in calls if c.purpose in ("tool-loop", "synthesize")]
    for before, after in zip(reasoning, reasoning[1:], strict=False):
        assert _starts_with(after, before), "a request rewrote what an earlier one sent"


def _three_turn_script() -> list[ModelStep]:
    return [
        ModelStep.tool_call_reply(call("add", a=1, b=2), text="Adding."),
        ModelStep.text_reply("1 + 2 = 3."),
        ModelStep.text_reply("You are welcome."),
        ModelStep.tool_call_reply(call("add", a=3, b=4)),
        ModelStep.text_reply("3 + 4 = 7."),
    ]


async def test_three_turns_with_tools_only_append(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel(_three_turn_script())
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    for message in ("What is 1 + 2?", "Thanks!", "And 3 + 4?"):
        events = await collect_events(runtime.execute_message("s1", message))
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
    model.assert_complete()
    assert len(model.calls) == 5  # 2 + 1 + 2: no call beyond the loop's own
    _assert_only_appends(model.calls)
    # Turn 2's first request carries turn 1's tool call and result, not a rebuilt summary.
    second = model.calls[2].messages
    assert [m.role for m in second] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert [t.answer for t in await runtime.history("s1")] == [
        "1 + 2 = 3.",
        "You are welcome.",
        "3 + 4 = 7.",
    ]
    # Every request of the session's model shares the whole previous request.
    rows = [r for t in await runtime.history("s1") for r in await runtime.audit(t.turn_id)]
    breakpoints = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint]
    assert len(breakpoints) == 5
    assert breakpoints[0].prefix_messages == 0  # the session's first request
    for previous, row in zip(model.calls, breakpoints[1:], strict=False):
        assert row.prefix_messages == len(previous.messages)
        assert row.broken_region is None


async def test_the_prefix_holds_across_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    first = ScriptedModel(_three_turn_script()[:2])
    async with SessionRuntime(
        agent=Agent(model=first, tools=[add]), config=RuntimeConfig(database_url=url)
    ) as runtime:
        await collect_events(runtime.execute_message("s1", "What is 1 + 2?"))
    second = ScriptedModel([ModelStep.text_reply("You are welcome.")])
    async with SessionRuntime(
        agent=Agent(model=second, tools=[add]), config=RuntimeConfig(database_url=url)
    ) as runtime:
        await collect_events(runtime.execute_message("s1", "Thanks!"))
    assert _starts_with(second.calls[0], first.calls[-1])
    assert second.calls[0].messages[len(first.calls[-1].messages)].content == "1 + 2 = 3."


async def test_the_prefix_holds_after_a_fallback_to_the_next_rung(
    runtime_factory: RuntimeFactory,
) -> None:
    big = ScriptedModel(
        [ModelStep.text_reply("Hi."), ModelStep.fail(ProviderError("busy", status_code=429))],
        name="big",
    )
    small = ScriptedModel([ModelStep.text_reply("Still here.")], name="small")
    runtime = runtime_factory(Agent(model=ModelFamily("fam", [big, small]), tools=[add]))
    await collect_events(runtime.execute_message("s1", "Hello"))
    await collect_events(runtime.execute_message("s1", "Are you there?"))
    # Only the model differs: the rung that answered got the same bytes the first would have.
    assert big.calls[1] == small.calls[0]
    assert _starts_with(small.calls[0], big.calls[0])


def test_an_unexpected_rewrite_fails_loudly_when_strict(caplog: pytest.LogCaptureFixture) -> None:
    before = RequestView(("sys", "u1", "a1"), "tools")
    rewritten = RequestView(("sys", "u1-edited", "a1", "u2"), "tools")
    with pytest.raises(PrefixRewriteError) as raised:
        check_prefix(before, rewritten)
    assert raised.value.code == "prefix-rewritten"
    prefix.STRICT = False
    with caplog.at_level(logging.ERROR, logger="turnkit.context"):
        report = check_prefix(before, rewritten)
    assert (report.shared, report.broken, report.reason) == (1, "history", "unexpected-rewrite")
    assert "rewrote the history region" in caplog.text
    # The two deliberate rewrites are recorded, never refused.
    prefix.STRICT = True
    assert check_prefix(before, rewritten, deliberate="compaction").reason == "compaction"
    changed_tools = RequestView(("sys", "u1", "a1", "u2"), "other-tools")
    report = check_prefix(before, changed_tools, between_turns=True)
    assert (report.broken, report.reason) == ("tools", "agent-changed")


def _background(request: ModelRequest) -> ModelStep:
    """The utility model: compaction summaries and thinking summaries."""
    if "compress a conversation" in str(request.messages[0].content):
        return ModelStep.text_reply("The person asked twice about words.")
    return ModelStep.text_reply("It considered the request.")


async def test_compaction_summarizes_at_85_percent_and_the_turn_answers(
    runtime_factory: RuntimeFactory,
) -> None:
    long = "word " * 300  # ~375 tokens a message by the four-characters estimate
    model = ScriptedModel(
        [ModelStep.text_reply(long), ModelStep.text_reply("Short answer.")], context_window=900
    )
    utility = ScriptedModel([ModelStep.respond(_background)], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, utility_model=utility, tools=[add]))
    await collect_events(runtime.execute_message("s1", long))
    events = await collect_events(runtime.execute_message("s1", "Now be brief."))
    [started] = [e for e in events if isinstance(e, CompactionStartedEvent)]
    [done] = [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert events.index(started) < events.index(done)
    assert done.strategy == "summary"
    assert done.model == "scripted"
    assert done.tokens_after < done.tokens_before
    assert done.tokens_before >= 0.85 * 900
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    request = model.calls[-1]
    assert "The person asked twice about words." in str(request.messages[1].content)
    assert request.messages[-1].content == "Now be brief."
    rows = await runtime.audit(events[0].turn_id)
    [row] = [r for r in rows if r.payloads.compaction is not None]
    assert row.call is not None
    assert row.call.model == "scripted"
    assert row.payloads.compaction is not None
    assert row.payloads.compaction.context_window == 900
    [breakpoint_] = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint]
    assert breakpoint_ is not None
    assert (breakpoint_.broken_region, breakpoint_.break_reason) == ("history", "compaction")
    # After compaction the list grows by appending again, also in the next turn.
    more = ScriptedModel([ModelStep.text_reply("Ok.")], context_window=900)
    runtime2 = runtime_factory(Agent(model=more, utility_model=utility, tools=[add]))
    await collect_events(runtime2.execute_message("s1", "Thanks."))
    assert _starts_with(more.calls[0], request)


class _TokenPerCharacter(ScriptedModel):
    """Counts as a tokenizer counts Chinese or Japanese: about a token a character."""

    def count_tokens(self, request: ModelRequest) -> int:
        return sum(len(str(m.content)) for m in request.messages)


async def test_compaction_counts_exactly_text_of_a_token_a_character(
    runtime_factory: RuntimeFactory,
) -> None:
    """A rough four-characters-a-token look must not skip the exact count of such text."""
    long = "東京の天気は晴れです。" * 30  # 330 characters: 330 tokens, "83" by the estimate
    model = _TokenPerCharacter(
        [ModelStep.text_reply("はい。")], repeat_last=True, context_window=900
    )
    runtime = runtime_factory(Agent(model=model, skip_stages=frozenset({"anchor-plan"})))
    compacted = []
    for _ in range(3):
        events = await collect_events(runtime.execute_message("s1", long))
        compacted += [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert compacted, "the third turn's request (1,000+ tokens) had to be compacted"
    assert all(model.count_tokens(c) <= 900 for c in model.calls)


async def test_a_summary_too_long_for_the_utility_model_keeps_the_newest_turns(
    runtime_factory: RuntimeFactory,
) -> None:
    """The summary request would not fit the utility model's own window: the turn keeps
    its newest turns instead of sending it a request it must refuse."""
    long = "word " * 300
    model = ScriptedModel(
        [ModelStep.text_reply(long), ModelStep.text_reply("Short answer.")], context_window=900
    )
    small = ScriptedModel([ModelStep.respond(_background)], repeat_last=True, context_window=200)
    runtime = runtime_factory(Agent(model=model, utility_model=small, tools=[add]))
    await collect_events(runtime.execute_message("s1", long))
    events = await collect_events(runtime.execute_message("s1", "Now be brief."))
    [done] = [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert (done.strategy, done.model) == ("keep-newest", None)
    assert not [c for c in small.calls if c.messages[0].content == COMPACTION_PROMPT]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


def _summaries_fail(request: ModelRequest) -> ModelStep:
    if "compress a conversation" in str(request.messages[0].content):
        return ModelStep.fail(ProviderError("overloaded", status_code=529))
    return _background(request)


async def test_a_utility_outage_at_compaction_keeps_the_newest_turns(
    runtime_factory: RuntimeFactory,
) -> None:
    """The summary is the utility model's help: when it fails, the turn keeps its newest
    turns, as without a utility model, and the audit says why."""
    long = "word " * 300
    model = ScriptedModel(
        [ModelStep.text_reply(long), ModelStep.text_reply("Short answer.")], context_window=900
    )
    utility = ScriptedModel([ModelStep.respond(_summaries_fail)], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, utility_model=utility, tools=[add]))
    await collect_events(runtime.execute_message("s1", long))
    events = await collect_events(runtime.execute_message("s1", "Now be brief."))
    [done] = [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert (done.strategy, done.model) == ("keep-newest", None)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert model.calls[-1].messages[-1].content == "Now be brief."
    rows = await runtime.audit(events[0].turn_id)
    [row] = [r for r in rows if r.payloads.compaction is not None]
    assert row.payloads.compaction is not None
    assert row.payloads.compaction.utility_error == "family-exhausted"


async def test_compaction_without_a_utility_model_keeps_the_newest_turns(
    runtime_factory: RuntimeFactory,
) -> None:
    long = "word " * 200  # ~250 tokens: the third turn's first call crosses 85% of 900
    model = ScriptedModel(
        [ModelStep.text_reply(t) for t in ("First.", "Second.", "Third.")], context_window=900
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    await collect_events(runtime.execute_message("s1", long))
    await collect_events(runtime.execute_message("s1", long))
    events = await collect_events(runtime.execute_message("s1", f"{long} And now?"))
    [done] = [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert (done.strategy, done.model) == ("keep-newest", None)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    contents = [str(m.content) for m in model.calls[-1].messages]
    assert f"[{done.summarized_messages} earlier message(s) were left out" in contents[1]
    assert contents[-1].endswith("And now?")
    assert "First." not in contents
    rows = await runtime.audit(events[0].turn_id)
    [row] = [r for r in rows if r.payloads.compaction is not None]
    assert row.call is None  # no model wrote it
    assert row.payloads.compaction is not None
    assert row.payloads.compaction.strategy == "keep-newest"


@tool
async def fetch_page(n: int) -> str:
    """A long page of a document."""
    return f"page {n}: " + "text " * 60


@pytest.mark.parametrize("with_utility", [False, True])
async def test_a_long_turn_that_is_not_the_first_compacts_its_own_rounds(
    runtime_factory: RuntimeFactory, with_utility: bool
) -> None:
    """Twelve tool rounds in a session's second turn: the earlier turn is no bulk worth
    cutting, so the turn's own work goes, and every request stays inside the window."""
    rounds = [ModelStep.tool_call_reply(call("fetch_page", n=n)) for n in range(12)]
    model = ScriptedModel(
        [ModelStep.text_reply("Hello."), *rounds, ModelStep.text_reply("Read them all.")],
        context_window=900,
    )
    utility = (
        ScriptedModel([ModelStep.text_reply("Pages were read.")], repeat_last=True)
        if with_utility
        else None
    )
    agent = Agent(
        model=model,
        utility_model=utility,
        tools=[fetch_page],
        skip_stages=frozenset({"anchor-plan"}),
    )
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "hi"))
    events = await collect_events(runtime.execute_message("s1", "read the twelve pages"))
    compactions = [e for e in events if isinstance(e, CompactionCompletedEvent)]
    assert compactions
    assert all(c.tokens_after < 0.85 * 900 < c.tokens_before for c in compactions)
    assert all(estimate_tokens(c) <= 900 for c in model.calls)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    last = [str(m.content) for m in model.calls[-1].messages]
    assert "read the twelve pages" in last  # the turn's opening message stays
    # Each call reads the result of the round before it, whatever was compacted: the
    # newest round stays whole, and the earlier turn goes before it does.
    second_turn = model.calls[1:]
    for n, request in enumerate(second_turn[1:]):
        assert f"page {n}: text" in str(request.messages[-1].content), n
        assert request.messages[-2].tool_calls, n  # with the call it answers
    assert "Hello." not in last
    if utility is not None:
        asked = [
            str(c.messages[-1].content)
            for c in utility.calls
            if c.messages[0].content == COMPACTION_PROMPT
        ]
        assert asked
        assert all("current request, kept as it is: read the twelve pages" in a for a in asked)


async def test_a_long_turn_keeps_its_plan_note_through_compaction(
    runtime_factory: RuntimeFactory,
) -> None:
    """The note the turn works by (here: keep a task list) is not folded into a summary."""
    rounds = [ModelStep.tool_call_reply(call("fetch_page", n=n)) for n in range(12)]
    model = ScriptedModel([*rounds, ModelStep.text_reply("Read them all.")], context_window=900)
    utility = ScriptedModel([ModelStep.text_reply("Pages were read.")], repeat_last=True)
    agent = Agent(model=model, utility_model=utility, tools=[fetch_page], planning=True)
    runtime = runtime_factory(agent)
    long_ask = "please read the twelve pages " + "and then tell me what they say " * 12
    events = await collect_events(runtime.execute_message("s1", long_ask))
    assert [e for e in events if isinstance(e, CompactionCompletedEvent)]
    notes = [str(m.content) for m in model.calls[-1].messages[1:] if m.role == "system"]
    assert any("update_tasks" in note for note in notes), notes


@tool
async def screenshot(page: int) -> ImagePart:
    """A picture of one page."""
    return ImagePart(data=PNG + bytes([page]), media_type="image/png")


async def test_pictures_past_twenty_are_released_but_never_the_users(
    runtime_factory: RuntimeFactory,
) -> None:
    steps = [ModelStep.tool_call_reply(call("screenshot", page=i)) for i in range(1, 21)]
    model = ScriptedModel([*steps, ModelStep.text_reply("Reviewed 20 pages.")])
    runtime = runtime_factory(Agent(model=model, tools=[screenshot]))
    attached = ImagePart(url="https://example.com/scan.png", media_type="image/png")
    events = await collect_events(
        runtime.execute_message("s1", [TextPart(text="Review every page."), attached])
    )
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"

    def pictures(request: ModelRequest) -> list[ImagePart]:
        return [
            p
            for m in request.messages
            if not isinstance(m.content, str)
            for p in m.content
            if isinstance(p, ImagePart)
        ]

    # Call 20 carries the user's picture and 19 tool pictures: 20, no release yet.
    assert len(pictures(model.calls[19])) == 20
    last = model.calls[20]  # would carry 21: every tool picture but the newest is released
    assert [p.url for p in pictures(last)] == ["https://example.com/scan.png", None]
    assert pictures(last)[1].data == PNG + bytes([20])
    notes = [
        p.text
        for m in last.messages
        if m.role == "tool" and not isinstance(m.content, str)
        for p in m.content
        if isinstance(p, TextPart) and "released" in p.text
    ]
    assert len(notes) == 19
    rows = await runtime.audit(events[0].turn_id)
    final = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint][-1]
    assert final is not None
    assert (final.broken_region, final.break_reason) == ("pictures", "picture-release")
    [turn] = await runtime.history("s1")
    assert isinstance(turn.blocks[0], UserBlock)
    assert turn.blocks[0].attachments == (attached,)


@tool
async def scan_batch(batch: int) -> list[ImagePart]:
    """Eight pictures of one batch."""
    return [ImagePart(data=PNG + bytes([batch, i]), media_type="image/png") for i in range(8)]


def _pictures_in(request: ModelRequest) -> int:
    return sum(
        isinstance(p, ImagePart)
        for m in request.messages
        if not isinstance(m.content, str)
        for p in m.content
    )


async def test_only_pictures_the_model_has_seen_are_released(
    runtime_factory: RuntimeFactory,
) -> None:
    """A round of three calls returns 24 pictures at once: none is released unseen (the
    model would be told to look again at what it never saw). An earlier turn's attached
    pictures are seen ones, and go before the new message's own."""
    batch = ModelStep.tool_call_reply(
        call("scan_batch", batch=1), call("scan_batch", batch=2), call("scan_batch", batch=3)
    )
    model = ScriptedModel(
        [ModelStep.text_reply("Noted."), batch, ModelStep.text_reply("Read all 24.")]
    )
    runtime = runtime_factory(
        Agent(model=model, tools=[scan_batch], skip_stages=frozenset({"anchor-plan"}))
    )
    earlier = [ImagePart(url=f"https://example.com/old-{i}.png") for i in range(6)]
    await collect_events(runtime.execute_message("s1", [TextPart(text="Old scans."), *earlier]))
    now = [ImagePart(url=f"https://example.com/new-{i}.png") for i in range(2)]
    events = await collect_events(runtime.execute_message("s1", [TextPart(text="Scan."), *now]))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    after_batch = model.calls[-1]  # 6 old + 2 new + 24 unread: the 6 old ones go
    assert _pictures_in(after_batch) == 2 + 24
    texts = [str(m.content) for m in after_batch.messages]
    assert any("6 picture(s) the person attached earlier were released" in t for t in texts)
    assert not any("reviewed earlier were released" in t for t in texts)


async def test_too_many_attached_pictures_are_refused(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([])
    runtime = runtime_factory(Agent(model=model))
    parts = [ImagePart(url=f"https://example.com/{i}.png") for i in range(21)]
    with pytest.raises(InvalidInputError, match="at most 20"):
        await collect_events(runtime.execute_message("s1", parts))
    assert model.calls == []


@tool
async def report() -> str:
    """A long report."""
    return "".join(f"line {i:04d}\n" for i in range(2000))


async def test_a_long_result_is_a_preview_the_model_can_read_on(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("report", tool_call_id="call_r")),
            ModelStep.tool_call_reply(
                raw_call(
                    "read_tool_result", '{"tool_call_id": "call_r", "offset": 1000, "limit": 22}'
                )
            ),
            ModelStep.text_reply("Done reading."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[report], tool_result_preview_chars=1000))
    events = await collect_events(runtime.execute_message("s1", "Read the report"))
    shown = model.calls[1].messages[-1]
    assert shown.role == "tool"
    assert isinstance(shown.content, str)
    assert len(shown.content) < 1300
    assert "call `read_tool_result` with tool_call_id='call_r' and offset=1000" in shown.content
    completed = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert len(completed[0].result.output) == 20000  # type: ignore[arg-type]  # kept whole
    window = json.loads(str(model.calls[2].messages[-1].content))
    assert window["offset"] == 1000
    assert window["remaining_chars"] > 0
    assert len(window["text"]) == 22


@tool
def forecast(city: str) -> str:
    """The weather in a city."""
    return f'{city}: "sunny", 21°C\nwind light'


@tool
def forecast_data(city: str) -> dict[str, object]:
    """The weather in a city, as data."""
    return {"city": city, "sky": "sunny"}


async def test_a_string_result_reaches_the_model_as_written_and_data_as_json(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("forecast", city="Oslo"), call("forecast_data", city="Oslo")
            ),
            ModelStep.text_reply("Sunny."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[forecast, forecast_data]))
    await collect_events(runtime.execute_message("s1", "Weather?"))
    text_result, data_result = model.calls[1].messages[-2:]
    assert text_result.content == 'Oslo: "sunny", 21°C\nwind light'
    assert json.loads(str(data_result.content)) == {"city": "Oslo", "sky": "sunny"}


async def test_a_small_window_gets_a_preview_that_fits_it_and_says_how_to_read_on(
    runtime_factory: RuntimeFactory,
) -> None:
    """The default 16,000-character preview would fill a 4,000-token window: the model gets
    a quarter of the window, with the note, and reads on."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("report", tool_call_id="call_r")),
            ModelStep.tool_call_reply(
                raw_call("read_tool_result", '{"tool_call_id": "call_r", "offset": 4000}')
            ),
            ModelStep.text_reply("Done reading."),
        ],
        context_window=4000,
    )
    runtime = runtime_factory(Agent(model=model, tools=[report]))
    events = await collect_events(runtime.execute_message("s1", "Read the report"))
    assert not [e for e in events if isinstance(e, CompactionCompletedEvent)]
    shown = model.calls[1].messages[-1]
    assert shown.role == "tool"
    assert "call `read_tool_result` with tool_call_id='call_r' and offset=4000" in str(
        shown.content
    )
    sent = str(model.calls[2].messages[-1].content)
    assert len(sent) <= 4000  # the window as the model reads it (JSON) is no preview longer
    window = json.loads(sent)
    full = "".join(f"line {i:04d}\n" for i in range(2000))
    assert window["offset"] == 4000
    assert 3000 < len(window["text"]) < 4000  # its newlines are two characters in JSON
    assert window["text"] == full[4000 : 4000 + len(window["text"])]


async def test_almost_json_arguments_are_repaired(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(raw_call("add", '```json\n{"a": 1, "b": 2,}\n```')),
            ModelStep.text_reply("3."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "1+2"))
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == 3
    sent = model.calls[1].messages[-2].tool_calls[0].arguments
    assert json.loads(sent) == {"a": 1, "b": 2}


async def test_a_thinking_summary_with_a_utility_model_and_none_without(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    secret = "SECRET-CHAIN-OF-THOUGHT"
    model = ScriptedModel(
        [
            ModelStep(text="", thinking=f"{secret} maybe add", tool_calls=(call("add", a=2, b=2),)),
            ModelStep.text_reply("2 + 2 = 4. " * 20, thinking=f"{secret} done"),
        ]
    )
    utility = ScriptedModel(
        [
            ModelStep.text_reply('{"intent": "math", "depth": "none"}'),
            ModelStep(  # reported without usage, as a hand-written client might
                text="The assistant chose to add the numbers with the tool.", usage=Usage()
            ),
        ],
        name="background",
    )
    runtime = runtime_factory(Agent(model=model, utility_model=utility, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "2+2?"))
    utility.assert_complete()
    [thinking] = [e for e in events if isinstance(e, ThinkingCompleteEvent)]
    assert thinking.block.summary == "The assistant chose to add the numbers with the tool."
    answer_at = next(i for i, e in enumerate(events) if getattr(e, "type", "") == "message.complete"
                     and e.block.is_answer)  # type: ignore[attr-defined]  # fmt: skip
    assert events.index(thinking) < answer_at
    summary_request = utility.calls[1]
    assert secret in str(summary_request.messages[-1].content)  # read inside the runtime only
    rows = await runtime.audit(events[0].turn_id)
    [row] = [r for r in rows if r.payloads.thinking_summary is not None]
    assert row.call is not None
    assert row.call.model == "background"  # priced as its own work, naming its model
    assert row.call.output_tokens > 0  # counted, though its client reported nothing
    [turn] = await runtime.history("s1")
    assert any(isinstance(b, ThinkingSummaryBlock) for b in turn.blocks)
    # Raw reasoning is in no event, audit row or table.
    dumped = json.dumps([e.model_dump(mode="json") for e in events])
    dumped += json.dumps([r.model_dump(mode="json") for r in rows])
    assert secret not in dumped
    await runtime.close()
    for path in Path(database_url.split("///", 1)[1]).parent.glob("*.db*"):
        assert secret.encode() not in path.read_bytes()

    plain = ScriptedModel([ModelStep.text_reply("4.", thinking=secret)])
    runtime = runtime_factory(Agent(model=plain, tools=[add]))
    events = await collect_events(runtime.execute_message("s2", "2+2?"))
    assert not [e for e in events if isinstance(e, ThinkingCompleteEvent)]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


async def test_the_summary_reads_the_answering_calls_reasoning_and_none_is_invented(
    runtime_factory: RuntimeFactory,
) -> None:
    """The answering call's own reasoning reaches the summary (it starts mid-answer); a
    turn whose model shared no reasoning gets no summary and pays no utility call."""
    model = ScriptedModel(
        [
            ModelStep.text_reply("Four. " * 40, thinking="two and two make four"),
            ModelStep.text_reply("Five. " * 40),
        ]
    )
    utility = ScriptedModel(
        [ModelStep.text_reply("It added the numbers.")], name="background", repeat_last=True
    )
    agent = Agent(model=model, utility_model=utility, skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)

    def summaries() -> list[str]:
        return [
            str(c.messages[-1].content)
            for c in utility.calls
            if c.messages[0].content == SUMMARY_PROMPT
        ]

    first = await collect_events(runtime.execute_message("s1", "2+2?"))
    [summary_request] = summaries()
    assert "two and two make four" in summary_request
    assert [e for e in first if isinstance(e, ThinkingCompleteEvent)]

    second = await collect_events(runtime.execute_message("s1", "2+3?"))
    assert len(summaries()) == 1, "no reasoning: no summary call"
    assert not [e for e in second if isinstance(e, ThinkingCompleteEvent)]
    assert isinstance(second[-1], DoneEvent)
    assert second[-1].status == "succeeded"


async def test_a_summary_finished_before_its_call_turned_to_a_tool_is_still_audited(
    runtime_factory: RuntimeFactory,
) -> None:
    """The summary is dropped (its call used a tool), but it was made and paid for: its
    row is there, `cancelled`, and its cost is in the turn's rollup."""
    long = "Let me add these numbers for you carefully. " * 6 + "\n\n"
    model = ScriptedModel(
        [
            ModelStep(
                text=long + "Calling the tool now. " * 20,
                thinking="thinking about adding",
                tool_calls=(call("add", a=1, b=2),),
                stop_reason="tool_use",
                chunk_size=4,
            ),
            ModelStep.text_reply("3 is the answer. " * 12),
        ]
    )
    paid = Usage(input_tokens=100, output_tokens=10, cost_usd=0.01)
    utility = ScriptedModel(
        [dataclasses.replace(ModelStep.text_reply("It added."), usage=paid)],
        name="background",
        repeat_last=True,
    )
    agent = Agent(
        model=model, utility_model=utility, tools=[add], skip_stages=frozenset({"anchor-plan"})
    )
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "add 1 and 2"))
    await runtime.wait_background()
    turn_id = events[0].turn_id
    summaries = [c for c in utility.calls if c.messages[0].content == SUMMARY_PROMPT]
    assert summaries, "the scenario needs a summary started while the call streamed"
    rows = [r for r in await runtime.audit(turn_id) if r.call and r.call.model == "background"]
    assert len(rows) == len(utility.calls)
    dropped = [r for r in rows if r.call is not None and r.call.outcome == "cancelled"]
    assert dropped
    usage = await runtime.store.read_usage(turn_id)
    assert usage is not None
    assert usage.cost_usd == pytest.approx(0.01 * len(utility.calls))


async def test_the_context_size_is_the_latest_own_model_call(
    runtime_factory: RuntimeFactory,
) -> None:
    """`run.finished` reports the context's size in tokens: the input plus output of the
    turn's latest call on its own model; the utility model's calls (plan, thinking summary,
    naming) carry none."""
    model = ScriptedModel(
        [
            dataclasses.replace(
                ModelStep.tool_call_reply(call("add", a=2, b=3)),
                usage=Usage(input_tokens=100, output_tokens=20),
            ),
            dataclasses.replace(
                ModelStep.text_reply("It is 5.", thinking="two and three make five"),
                usage=Usage(input_tokens=300, output_tokens=40),
            ),
        ]
    )
    background = dataclasses.replace(
        ModelStep.text_reply("It considered the request."),
        usage=Usage(input_tokens=5_000, output_tokens=900),
    )
    utility = ScriptedModel([background], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, utility_model=utility, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert len(utility.calls) >= 2  # it planned and summarized the thinking, at least
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    assert finished.status == "succeeded"
    assert finished.context_tokens == 340
    record = await runtime.turn(events[0].turn_id)
    assert record.summary is not None
    assert record.summary.context_tokens == 340


class _HouseStyle(Plugin):
    """A note the whole session works by, added once (standing) or left to its round."""

    name: ClassVar[str] = "house-style"
    standing: ClassVar[bool] = True

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str | Note] | None:
        if any(text == HOUSE_STYLE for _, text in call.messages):
            return None
        return [Note(HOUSE_STYLE, standing=True) if self.standing else HOUSE_STYLE]


HOUSE_STYLE = "Quote every page number you read."


class _RoundNote(_HouseStyle):
    name: ClassVar[str] = "round-note"
    standing: ClassVar[bool] = False


@pytest.mark.parametrize("plugin", [_HouseStyle(), _RoundNote()], ids=["standing", "plain"])
async def test_a_standing_plugin_note_stays_through_compaction(
    runtime_factory: RuntimeFactory, plugin: Plugin
) -> None:
    """Marked standing, a plugin's note is kept as the plan's is; a plain one goes with its
    round, and the plugin adds it again on the next request (not on the compacting one)."""
    rounds = [ModelStep.tool_call_reply(call("fetch_page", n=n)) for n in range(12)]
    model = ScriptedModel([*rounds, ModelStep.text_reply("Read them all.")], context_window=900)
    utility = ScriptedModel([ModelStep.text_reply("Pages were read.")], repeat_last=True)
    agent = Agent(
        model=model,
        utility_model=utility,
        tools=[fetch_page],
        plugins=[plugin],
        skip_stages=frozenset({"anchor-plan"}),
    )
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "read the twelve pages"))
    assert [e for e in events if isinstance(e, CompactionCompletedEvent)]
    carried = [HOUSE_STYLE in [str(m.content) for m in c.messages] for c in model.calls]
    if isinstance(plugin, _RoundNote):
        assert not all(carried)  # the compacting request went without it
    else:
        assert all(carried), carried  # every request carries the session's note
        [first] = [m for m in model.calls[0].messages if str(m.content) == HOUSE_STYLE]
        assert first.role == "system"
