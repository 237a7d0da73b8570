"""Plugins: every hook fires in order, bad plugins are refused, guardrails redact and block,
failures are audited, shipped plugins cite, name entities and mask personal data."""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import JsonValue

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.errors import ConfigurationError
from turnkit.events import (
    DurableEvent,
    DurableStreamEvent,
    GuardrailEvent,
    PluginEmittedEvent,
    StreamEvent,
)
from turnkit.ids import SessionId
from turnkit.plugins import (
    Enrichment,
    ModelCallView,
    Plugin,
    PluginContext,
    PluginValidationError,
    ToolCall,
    Verdict,
    discover_plugins,
    validate_plugins,
)
from turnkit.plugins.citations import Citations
from turnkit.plugins.entities import Entities
from turnkit.plugins.pii import PiiRedaction
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def lookup(company: str) -> dict[str, object]:
    """Look a company up."""
    return {"company": company, "price": "12.50", "url": "https://example.com/acme",
            "contact": "ceo@acme.example"}  # fmt: skip


def _runtime(tmp_path: Path, agent: Agent, **kw: object) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'plugins.db'}")
    return SessionRuntime(agent=agent, config=config, **kw)  # type: ignore[arg-type]


def _model(answer: str = "ACME trades at 12.50 dollars today.") -> ScriptedModel:
    return ScriptedModel(
        [ModelStep.tool_call_reply(call("lookup", company="ACME")), ModelStep.text_reply(answer)]
    )


class Recorder(Plugin):
    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        self.calls.append("check_input")
        return None

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        self.calls.append(f"before_model_request:{call.stage_id}")
        return ["Prices are in dollars."] if len(self.calls) == 2 else None

    async def after_model_response(self, ctx: PluginContext, call: ModelCallView) -> None:
        self.calls.append(f"after_model_response:{','.join(call.tool_calls)}")

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        self.calls.append(f"before_tool_call:{call.name}")
        return None

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        self.calls.append("check_tool_result")
        return None

    async def after_tool_call(
        self, ctx: PluginContext, call: ToolCall, result: ToolResultBlock
    ) -> None:
        self.calls.append(f"after_tool_call:{result.is_error}")
        ctx.audit({"tool": call.name})
        await ctx.emit("seen", {"tool": call.name})

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        if "check_answer" not in self.calls:
            self.calls.append("check_answer")
        return None

    async def on_event(self, ctx: PluginContext, event: DurableEvent) -> None:
        if event.type == "done":
            self.calls.append("on_event:done")

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        self.calls.append(f"enrich_message:{len(sources)}")
        return None


async def test_every_hook_fires_in_order(tmp_path: Path) -> None:
    plugin, model = Recorder(), _model()
    async with _runtime(tmp_path, Agent(model=model, tools=[lookup]), plugins=[plugin]) as rt:
        events = await collect_events(rt.execute_message("s1", "price of ACME?"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert plugin.calls[:9] == [
        "check_input",
        "before_model_request:tool-loop",
        "after_model_response:lookup",
        "before_tool_call:lookup",
        "check_tool_result",
        "after_tool_call:False",
        "before_model_request:tool-loop",
        "check_answer",
        "after_model_response:",
    ]
    assert plugin.calls[-2:] == ["enrich_message:1", "on_event:done"]
    # the note was appended (not rewritten) and every later call carries it
    assert "Prices are in dollars." in str(model.calls[1].messages)
    assert [r.plugin_payloads for r in rows if r.plugin_payloads] == [
        {"recorder": {"tool": "lookup"}}
    ]
    [emitted] = [e for e in events if isinstance(e, PluginEmittedEvent)]
    assert (emitted.name, emitted.data) == ("plugin.recorder.seen", {"tool": "lookup"})


class Denier(Plugin):
    name: ClassVar[str] = "denier"

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        return "lookups are off today"


class Broken(Plugin):
    name: ClassVar[str] = "broken"

    async def after_model_response(self, ctx: PluginContext, call: ModelCallView) -> None:
        raise RuntimeError("boom")


class BrokenRequired(Broken):
    name: ClassVar[str] = "broken-required"
    required: ClassVar[bool] = True


async def test_a_denied_call_is_a_result_the_model_reads(tmp_path: Path) -> None:
    agent = Agent(model=_model("No lookup, sorry."), tools=[lookup], plugins=[Denier()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "price?"))
    [failed] = [e for e in events if e.type == "tool.failed"]
    assert failed.code == "tool-denied"  # type: ignore[union-attr]
    assert "denied by denier: lookups are off today" in failed.result.error  # type: ignore[union-attr]
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]


async def test_a_failing_plugin_is_audited_and_the_turn_goes_on(tmp_path: Path) -> None:
    agent = Agent(model=_model(), tools=[lookup], plugins=[Broken()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "price?"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]
    errors = [r.plugin_payloads["broken"] for r in rows if "broken" in r.plugin_payloads]
    assert errors[0] == {"hook": "after_model_response", "error": "RuntimeError('boom')"}


class Buggy(Plugin):
    name: ClassVar[str] = "buggy"

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        return {"tool": call.name}["name"]  # a bug: the key is "tool"


async def test_a_failing_hook_is_logged_with_its_exception_and_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's author debugging a bug reads the exception's type and where it raised."""
    caplog.set_level(logging.WARNING, logger="turnkit.plugins")
    agent = Agent(model=_model(), tools=[lookup], plugins=[Buggy()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "price?"))
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]
    [record] = [r for r in caplog.records if "buggy" in r.getMessage()]
    assert record.getMessage() == "plugin buggy failed in before_tool_call: KeyError: 'name'"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], KeyError)


class BuggyWatcher(Plugin):
    name: ClassVar[str] = "buggy-watcher"

    async def on_event(self, ctx: PluginContext, event: DurableStreamEvent) -> None:
        raise ValueError(f"cannot file {event.type}")


async def test_a_hook_that_fails_again_and_again_is_traced_once_an_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="turnkit.plugins")
    agent = Agent(model=_model(), tools=[lookup], plugins=[BuggyWatcher()])
    async with _runtime(tmp_path, agent) as rt:
        await collect_events(rt.execute_message("s1", "price?"))
    failed = [r for r in caplog.records if "buggy-watcher failed" in r.getMessage()]
    assert len(failed) > 5  # one line for each event it failed on
    assert [r.exc_info is not None for r in failed] == [True] + [False] * (len(failed) - 1)


class FlakyAnswerCheck(Plugin):
    name: ClassVar[str] = "flaky-answer-check"

    def __init__(self) -> None:
        self.asked = 0

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        self.asked += 1
        raise ConnectionError("moderation service down")


async def test_a_streaming_check_that_fails_is_recorded_once_per_block_not_per_chunk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="turnkit.plugins")
    answer = "word " * 40
    check = FlakyAnswerCheck()
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=5)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[check])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "go"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]
    deltas = [e.text for e in events if e.type == "message.delta"]  # type: ignore[union-attr]
    assert "".join(deltas) == answer  # it checked nothing: the text went on
    assert check.asked > 10  # still asked on every chunk (a later one may succeed)
    failures = [r.plugin_payloads for r in rows if "flaky-answer-check" in r.plugin_payloads]
    assert failures == [
        {
            "flaky-answer-check": {
                "hook": "check_answer",
                "error": "ConnectionError('moderation service down')",
            }
        }
    ]
    assert caplog.text.count("failed in check_answer") == 1


def test_a_plugin_class_or_settings_of_the_wrong_shape_are_refused_clearly() -> None:
    class Listed(Plugin):
        name: ClassVar[str] = "listed"

        def settings(self) -> Mapping[str, JsonValue]:
            return ["strict"]  # type: ignore[return-value]

    class Nothing(Plugin):
        name: ClassVar[str] = "nothing"

        def settings(self) -> Mapping[str, JsonValue]:
            return None  # type: ignore[return-value]

    class Broken(Plugin):
        name: ClassVar[str] = "broken"

        def settings(self) -> Mapping[str, JsonValue]:
            raise KeyError("limit")

    with pytest.raises(PluginValidationError, match=r"pass an instance, Denier\(\)"):
        validate_plugins([Denier])  # type: ignore[list-item]
    with pytest.raises(PluginValidationError, match="returns list; return a dict"):
        validate_plugins([Listed()])
    with pytest.raises(PluginValidationError, match="returns NoneType; return a dict"):
        validate_plugins([Nothing()])
    with pytest.raises(PluginValidationError, match=r"`settings\(\)` raised KeyError\('limit'\)"):
        validate_plugins([Broken()])


class Rewriter(Plugin):
    """Tries to change a result from a hook that only observes."""

    name: ClassVar[str] = "rewriter"

    async def after_tool_call(  # type: ignore[override]
        self, ctx: PluginContext, call: ToolCall, result: ToolResultBlock
    ) -> str:
        return "a better result"


class RequiredRewriter(Rewriter):
    name: ClassVar[str] = "required-rewriter"
    required: ClassVar[bool] = True


async def test_a_value_returned_by_an_observing_hook_is_reported_not_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="turnkit")
    agent = Agent(model=_model(), tools=[lookup], plugins=[RequiredRewriter()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "price?"))
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]  # not a failure
    told = [r.getMessage() for r in caplog.records if "required-rewriter" in r.getMessage()]
    assert told == [
        "plugin required-rewriter: after_tool_call returned str 'a better result', which "
        "changes nothing (it observes; return None)"
    ]


class PlanWatcher(Plugin):
    """Sees every model call by its stage; adds a note to the planning call only."""

    name: ClassVar[str] = "plan-watcher"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        self.seen.append(("before", call.stage_id, call.messages[-1][1]))
        return ["Plan in English."] if call.stage_id == "anchor-plan" else None

    async def after_model_response(self, ctx: PluginContext, call: ModelCallView) -> None:
        self.seen.append(("after", call.stage_id, call.response_text))


async def test_the_planning_call_is_hooked_too(tmp_path: Path) -> None:
    """A plugin sees the utility model's planning call, told apart by its stage: its note
    goes to that call only, and the plan still comes from the answer."""
    plan = '{"intent": "price", "depth": "task_list", "tasks": ["look it up"]}'
    utility = ScriptedModel([ModelStep.text_reply(plan)], name="utility", repeat_last=True)
    plugin, model = PlanWatcher(), _model()
    agent = Agent(model=model, utility_model=utility, tools=[lookup], planning=True)
    async with _runtime(tmp_path, agent, plugins=[plugin]) as rt:
        events = await collect_events(rt.execute_message("s1", "price of ACME?"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert [(when, stage) for when, stage, _ in plugin.seen] == [
        ("before", "anchor-plan"),
        ("after", "anchor-plan"),
        ("before", "tool-loop"),
        ("after", "tool-loop"),
        ("before", "tool-loop"),
        ("after", "tool-loop"),
    ]
    assert plugin.seen[0][2] == "price of ACME?"  # the message the plan is asked about
    assert plugin.seen[1][2] == plan
    planning = utility.calls[0]
    assert [(m.role, m.content) for m in planning.messages][-1] == ("system", "Plan in English.")
    assert "Plan in English." not in str(model.calls[0].messages)
    [row] = [r for r in rows if r.payloads.plan_generation is not None]
    assert row.payloads.plan_generation.tasks == ("look it up",)  # type: ignore[union-attr]


async def test_a_required_plugin_that_fails_fails_the_turn(tmp_path: Path) -> None:
    agent = Agent(model=_model(), tools=[lookup], plugins=[BrokenRequired()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "price?"))
    assert events[-1].error_code == "plugin-failed"  # type: ignore[union-attr]


def test_validation_refuses_bad_plugins() -> None:
    class Typo(Plugin):
        name: ClassVar[str] = "typo"

        async def before_tool_cal(self, ctx: PluginContext, call: ToolCall) -> None:
            return None

    class Sync(Plugin):
        name: ClassVar[str] = "sync"

        def on_event(self, ctx: PluginContext, event: DurableEvent) -> None:  # type: ignore[override]
            return None

    class Nameless(Plugin):
        pass

    with pytest.raises(PluginValidationError, match="before_tool_cal"):
        validate_plugins([Typo()])
    with pytest.raises(PluginValidationError, match="async def"):
        validate_plugins([Sync()])
    with pytest.raises(PluginValidationError, match="needs a `name`"):
        validate_plugins([Nameless()])
    with pytest.raises(PluginValidationError, match="two plugins"):
        validate_plugins([Denier(), Denier()])
    with pytest.raises(ConfigurationError, match="no installed plugin is named 'nope'"):
        discover_plugins(["nope"])


async def test_a_plugin_on_both_the_agent_and_the_runtime_is_refused_when_hosted(
    tmp_path: Path,
) -> None:
    def agent(name: str) -> Agent:
        return Agent(name=name, model=_model(), tools=[lookup], plugins=[Citations()])

    with pytest.raises(PluginValidationError, match="'citations' is registered on the agent"):
        _runtime(tmp_path, agent("a"), plugins=["citations"])
    async with _runtime(tmp_path, Agent(model=_model()), plugins=["citations"]) as rt:
        with pytest.raises(PluginValidationError, match="on the agent 'b' and on the runtime"):
            await collect_events(rt.execute_message("s1", "hi", agent=agent("b")))
        with pytest.raises(PluginValidationError, match="on the agent 'c'"):
            rt.agent = agent("c")
        rt.agents.add(agent("d"))  # hosted behind the runtime's back: refused when named
        with pytest.raises(PluginValidationError, match="on the agent 'd'"):
            await collect_events(rt.execute_message("s1", "hi", agent="d"))
        assert await rt.store.list_turns(SessionId("s1")) == []  # nothing was written


def test_installed_plugins_are_found_by_name_only_when_named() -> None:
    found = discover_plugins(["citations", "pii-redaction"])
    assert [type(p).name for p in found] == ["pii-redaction", "citations"]  # by order
    assert discover_plugins([]) == ()


async def test_a_guardrail_redacts_a_tool_result(tmp_path: Path) -> None:
    model = _model("Contact ACME at [email].")
    agent = Agent(model=model, tools=[lookup])
    async with _runtime(tmp_path, agent, plugins=["pii-redaction"]) as rt:
        events = await collect_events(rt.execute_message("s1", "contact for ACME?"))
    [finding] = [e for e in events if isinstance(e, GuardrailEvent)]
    assert (finding.checkpoint, finding.kind, finding.action) == ("tool_result", "email", "redact")
    assert "ceo@acme.example" not in str(model.calls[1].messages)  # the model never read it
    assert "ceo@acme.example" not in finding.model_dump_json()  # never the text
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert "[email]" in str(completed.result.output)  # type: ignore[union-attr]


class NoSecrets(Plugin):
    name: ClassVar[str] = "no-secrets"

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        if "secret" in text:
            return Verdict(action="block", kind="secret", subject="answer")
        return None


async def test_a_guardrail_blocks_the_answer_before_the_chunk_goes_out(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("The secret code is 1234.", chunk_size=4)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[NoSecrets()])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "code?"))
    shown = "".join(e.text for e in events if e.type == "message.delta")  # type: ignore[union-attr]
    assert "secret" not in shown
    assert events[-1].error_code == "guardrail-blocked"  # type: ignore[union-attr]
    [finding] = [e for e in events if isinstance(e, GuardrailEvent)]
    assert (finding.checkpoint, finding.action) == ("answer", "block")


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
async def test_no_part_of_a_redacted_value_is_ever_streamed(
    tmp_path: Path, chunk_size: int
) -> None:
    answer = (
        "Mail me at jane.doe@example.com or call +47 912 34 567 today, card 4111 1111 1111 1111."
    )
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=chunk_size)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[PiiRedaction()])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "contact?"))
    deltas = [e.text for e in events if e.type == "message.delta"]  # type: ignore[union-attr]
    shown = "".join(deltas)
    [complete] = [e for e in events if e.type == "message.complete"]
    masked = "Mail me at [email] or call [phone] today, card [card]."
    assert complete.block.text == masked  # type: ignore[union-attr]
    assert shown == masked  # every chunk shown is the masked answer's, in order, all of it
    assert len(deltas) > 3  # it still streams: the held words go out as they settle
    for part in ("jane", "example", "912", "567", "4111", "1111"):
        assert part not in shown


async def test_words_that_end_in_digits_still_stream(tmp_path: Path) -> None:
    """Chess moves, versions, row names: a digit that ends a word starts no number."""
    answer = "Play e4 e5 Nf3 Nc6 Bb5 a6, then compare v1 v2 v10 on rows A1 B12 C30."
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=1)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[PiiRedaction()])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "moves?"))
    deltas = [e.text for e in events if e.type == "message.delta"]  # type: ignore[union-attr]
    assert "".join(deltas) == answer
    assert len(deltas) > 10  # word by word, not held back to the end
    assert PiiRedaction().answer_hold("w0 w1 w2 w3 w4 w5 w6") == len("w6")
    assert PiiRedaction().answer_hold("rows A10 B20 C30") == len("C30")
    assert PiiRedaction().answer_hold("call 555 123 4567") >= len("555 123 4567")  # held whole


async def test_a_plugin_whose_answer_hold_fails_holds_the_rest_of_the_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenHold(Plugin):
        name: ClassVar[str] = "broken-hold"

        def answer_hold(self, text: str) -> int:
            if "secret" in text:
                raise ValueError("no idea")
            return 0

    answer = "Plain words first, then the secret part and more words after it."
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=5)])
    with caplog.at_level(logging.WARNING, logger="turnkit"):
        async with _runtime(tmp_path, Agent(model=model, plugins=[BrokenHold()])) as rt:
            events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "go"))
    deltas = [e.text for e in events if e.type == "message.delta"]  # type: ignore[union-attr]
    assert deltas[0].startswith("Plain")  # it streamed until the hold failed
    assert not any("secret" in d for d in deltas[:-1])
    # The rest went out once the guardrails saw the whole block: as its last delta.
    assert "".join(deltas) == answer
    [complete] = [e for e in events if e.type == "message.complete"]
    assert complete.block.text == answer  # type: ignore[union-attr]
    assert caplog.text.count("failed in answer_hold") == 1  # once, not once per chunk


def test_a_plugin_s_answer_hold_must_be_a_plain_function() -> None:
    class AsyncHold(Plugin):
        name: ClassVar[str] = "async-hold"

        async def answer_hold(self, text: str) -> int:  # type: ignore[override]
            return 0

    with pytest.raises(PluginValidationError, match="answer_hold must be a plain"):
        validate_plugins([AsyncHold()])


async def test_an_input_guardrail_blocks_before_any_model_call_now_or_later(
    tmp_path: Path,
) -> None:
    """The blocked message never reaches the model: not in its turn, nor in the next."""
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    agent = Agent(model=model, plugins=[PiiRedaction(block=True, check_input=True)])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "my card is 4111 1111 1111 1111"))
        assert model.calls == []
        await collect_events(rt.execute_message("s1", "hi"))
    assert events[-1].error_code == "guardrail-blocked"  # type: ignore[union-attr]
    sent = " ".join(str(m.content) for m in model.calls[0].messages)
    assert "4111" not in sent
    assert "[this message was blocked by a guardrail and is not shown]" in sent


async def test_a_session_is_not_named_by_what_an_input_guardrail_blocked_or_masked(
    tmp_path: Path,
) -> None:
    """Its first name is read off the message before any guardrail sees it: it goes."""
    model = ScriptedModel([ModelStep.text_reply("Noted.")])
    agent = Agent(model=model, plugins=[PiiRedaction(block=True, check_input=True)])
    masking = Agent(name="masking", model=model, plugins=[PiiRedaction(check_input=True)])
    async with _runtime(tmp_path, agent, agents=[masking]) as rt:
        await collect_events(rt.execute_message("s1", "my card 4111 1111 1111 1111 was charged"))
        await collect_events(rt.execute_message("s2", "write to ada@example.com", agent="masking"))
        named = await rt.session("s2")
        blocked = await rt.session("s1")
        await rt.create_session("s3", title="Card trouble")  # a name of the person's own
        await collect_events(rt.execute_message("s3", "my card 4111 1111 1111 1111 again"))
        kept = await rt.session("s3")
    assert blocked.title == "Blocked message"
    assert kept.title == "Card trouble"
    assert named.title is not None
    assert "ada@example.com" not in named.title
    assert named.title.startswith("write to ")


async def test_an_answer_blocked_mid_stream_still_counts_what_it_cost(tmp_path: Path) -> None:
    answer = "Sure. " + "Here is the long story. " * 40 + "Write to jane.doe@example.com."
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=12)])
    agent = Agent(model=model, plugins=[PiiRedaction(block=True)])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "tell me a story " * 50))
        turn_id = events[0].turn_id  # type: ignore[union-attr]
        rows = await rt.audit(turn_id)
        record = await rt.turn(turn_id)
    assert events[-1].error_code == "guardrail-blocked"  # type: ignore[union-attr]
    [call_row] = [r for r in rows if r.call is not None]
    assert call_row.call is not None
    assert call_row.call.error_code == "guardrail-blocked"
    # The provider read the request and wrote the story: both count, estimated.
    assert call_row.call.input_tokens > 150
    assert call_row.call.output_tokens > 200
    assert record.summary is not None
    assert record.summary.input_tokens == call_row.call.input_tokens
    assert record.summary.output_tokens == call_row.call.output_tokens


async def test_citations_and_entities_are_kept_with_the_answer_in_history(
    tmp_path: Path,
) -> None:
    agent = Agent(model=_model(), tools=[lookup], plugins=[Citations(), Entities()])
    async with _runtime(tmp_path, agent) as rt:
        await collect_events(rt.execute_message("s1", "price of ACME?"))
        [turn] = await rt.history("s1")
    [cited] = turn.citations
    assert cited.title == "lookup"
    assert cited.url == "https://example.com/acme"
    assert cited.quote == "ACME trades at 12.50 dollars today."
    assert cited.source.startswith("call_")
    assert turn.entities == ()  # the answer names no email, link, amount or date


def test_pii_masks_cards_only_when_the_checksum_holds() -> None:
    from turnkit.plugins.pii import _mask

    masked, found = _mask("card 4111 1111 1111 1111, order 1234 5678 9012 3456", ["card"])
    assert masked == "card [card], order 1234 5678 9012 3456"
    assert found == ["card"]
    with pytest.raises(ConfigurationError, match="unknown kinds"):
        PiiRedaction(kinds=["ssn"])


class _Named(Plugin):
    name: ClassVar[str] = "named"


def test_plugin_settings_of_the_wrong_shape_are_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"a list of kinds, such as \['email'\]"):
        PiiRedaction(kinds="email")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="`block` is True or False, not 'no'"):
        PiiRedaction(block="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="at least 1, not 0"):
        Citations(min_shared_words=0)
    with pytest.raises(ConfigurationError, match="a whole number, not '2'"):
        Citations(min_shared_words="2")  # type: ignore[arg-type]

    class Unordered(Plugin):
        name: ClassVar[str] = "unordered"
        order: ClassVar[int] = "first"  # type: ignore[assignment]

    with pytest.raises(PluginValidationError, match="`order` is a whole number"):
        validate_plugins([Unordered()])

    class NamedLate(Plugin):
        def __init__(self) -> None:
            self.name = "late"  # type: ignore[misc]

    with pytest.raises(PluginValidationError, match="on the class, not set in `__init__`"):
        validate_plugins([NamedLate()])
    with pytest.raises(PluginValidationError, match="plugins are a list"):
        validate_plugins(_Named())  # type: ignore[arg-type]
    with pytest.raises(PluginValidationError, match="'named' is a name: pass a plugin"):
        Agent(model=ScriptedModel([]), plugins=["named"])  # type: ignore[list-item]
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(
        PluginValidationError, match=r"`plugins` is a list, such as \['citations'\]"
    ):
        SessionRuntime(agent=Agent(model=ScriptedModel([])), plugins="citations", config=config)  # type: ignore[arg-type]
    with pytest.raises(PluginValidationError, match="plugin names are a list"):
        discover_plugins("citations")  # type: ignore[arg-type]


def test_installed_plugins_come_from_the_environment_for_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnkit import cli
    from turnkit.quickstart import runtime_from_env

    url = f"sqlite:///{tmp_path / 'env.db'}"
    runtime = runtime_from_env(
        {"TURNKIT_PLUGINS": " citations, pii-redaction ", "TURNKIT_DATABASE_URL": url}
    )
    assert sorted(type(p).name for p in runtime.plugins) == ["citations", "pii-redaction"]
    assert runtime_from_env({"TURNKIT_DATABASE_URL": url}).plugins == ()
    with pytest.raises(PluginValidationError, match="no installed plugin is named 'pii'"):
        runtime_from_env({"TURNKIT_PLUGINS": "pii", "TURNKIT_DATABASE_URL": url})
    # `turnkit run` (and the worker) read it too: the demo model's answer quotes the
    # question, and pii-redaction masks the address in it.
    monkeypatch.setenv("TURNKIT_PLUGINS", "pii-redaction")
    out = io.StringIO()
    assert (
        cli.main(
            ["run", "Count the words in write to ann@example.com", "--database-url", url], out=out
        )
        == 0
    )
    assert "ann@example.com" not in out.getvalue().split("▸ synthesize")[-1]
    assert "[email]" in out.getvalue()
    monkeypatch.setenv("TURNKIT_PLUGINS", "nope")
    assert cli.main(["worker", "--database-url", url], out=io.StringIO()) == 2
    assert "no installed plugin is named 'nope'" in capsys.readouterr().err


def test_an_entry_point_must_carry_its_plugins_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    alias = importlib.metadata.EntryPoint(
        name="cite", value="turnkit.plugins.citations:Citations", group="turnkit.plugins"
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [alias])
    with pytest.raises(PluginValidationError, match="'cite' loads a plugin named 'citations'"):
        discover_plugins(["cite"])


def test_a_plugins_settings_count_in_the_agents_version() -> None:
    model = ScriptedModel([], name="m")

    def version(*plugins: Plugin) -> str:
        return Agent(model=model, plugins=list(plugins)).version

    default = version(PiiRedaction(), Citations())
    assert version(PiiRedaction(kinds=("phone", "email", "card")), Citations()) == default
    assert version(PiiRedaction(kinds=("card", "email")), Citations()) == version(
        PiiRedaction(kinds=("email", "card", "email")), Citations()
    )
    changed = {
        version(PiiRedaction(block=True), Citations()),
        version(PiiRedaction(kinds=("email",)), Citations()),
        version(PiiRedaction(check_input=True), Citations()),
        version(PiiRedaction(), Citations(min_shared_words=3)),
    }
    assert default not in changed
    assert len(changed) == 4  # each setting makes a version of its own

    class Unserialisable(Plugin):
        name: ClassVar[str] = "unserialisable"

        def settings(self) -> dict[str, object]:  # type: ignore[override]
            return {"when": object()}

    with pytest.raises(PluginValidationError, match="`settings\\(\\)` returns what is not JSON"):
        validate_plugins([Unserialisable()])


class CustomerNote(Plugin):
    """A note about who asks, from the caller and the app's deps (a per-user prompt)."""

    name: ClassVar[str] = "customer-note"

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        assert ctx.caller is not None
        deps = ctx.deps
        assert isinstance(deps, dict)
        note = f"The customer is {deps['name']} ({ctx.caller.id}, {sorted(ctx.caller.roles)})."
        return None if ("system", note) in call.messages else [note]


async def test_a_note_may_depend_on_the_caller_and_the_turns_deps(tmp_path: Path) -> None:
    from turnkit import Principal

    model = ScriptedModel([ModelStep.text_reply("Hello, Ada.")])
    agent = Agent(model=model, plugins=[CustomerNote()], skip_stages=frozenset({"anchor-plan"}))
    ada = Principal(id="u1", roles=frozenset({"vip"}))
    async with _runtime(tmp_path, agent, deps=lambda scope: {"name": "Ada"}) as rt:
        await rt.create_session("s1", principal=ada)
        events = await collect_events(rt.execute_message("s1", "hi", principal=ada))
    assert events[-1].type == "done"
    assert ("system", "The customer is Ada (u1, ['vip']).") in [
        (m.role, str(m.content)) for m in model.calls[0].messages
    ]


def test_the_plugins_guide_names_the_fields_hooks_receive() -> None:
    """The hook table names `ToolCall` and `ModelCallView` fields that exist."""
    guide = (Path(__file__).parents[1] / "docs/guides/plugins.md").read_text()
    table = [line for line in guide.splitlines() if line.startswith("| `")]
    rows = {line.split("|")[1].strip(): line for line in table}
    tool_fields = {f.name for f in dataclasses.fields(ToolCall)}
    view_fields = {f.name for f in dataclasses.fields(ModelCallView)}
    for name in tool_fields:
        assert f"`{name}`" in rows["`before_tool_call`"]
    for name in ("stage_id", "messages"):
        assert name in view_fields
        assert f"`{name}`" in rows["`before_model_request`"]


@tool
async def find_customer(name: str) -> dict[str, object]:
    """Find a customer."""
    raise LookupError("two customers match: jane.doe@example.com and +47 912 34 567")


async def test_a_failed_tool_s_message_is_masked_before_the_model_reads_it(
    tmp_path: Path,
) -> None:
    """A tool's exception quotes what it looked up: it is a result the model reads too."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("find_customer", name="Jane")), ModelStep.text_reply("No.")]
    )
    agent = Agent(model=model, tools=[find_customer], plugins=[PiiRedaction()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "find Jane"))
    [failed] = [e for e in events if e.type == "tool.failed"]
    assert "[email]" in failed.model_dump_json()
    assert "[phone]" in failed.model_dump_json()
    for value in ("jane.doe@example.com", "912 34 567"):
        assert all(value not in e.model_dump_json() for e in events)
        assert value not in str(model.calls[-1].messages)  # the model never read it
    [finding] = [e for e in events if isinstance(e, GuardrailEvent)]
    assert (finding.checkpoint, finding.kind) == ("tool_result", "email+phone")


@pytest.mark.parametrize(
    ("value", "mask"),
    [
        ("+33\u202f6\u202f12\u202f34\u202f56\u202f78", "[phone]"),  # narrow no-break spaces
        ("555\u2011123\u20114567", "[phone]"),  # no-break hyphens
        ("4111\u00a01111\u00a01111\u00a01111", "[card]"),  # no-break spaces
        ("4111\u20131111\u20131111\u20131111", "[card]"),  # en dashes
    ],
)
async def test_numbers_written_with_typographic_spaces_and_dashes_are_masked(
    tmp_path: Path, value: str, mask: str
) -> None:
    """Models write numbers with no-break spaces and hyphens as often as with plain ones."""
    answer = f"Call {value} today."
    model = ScriptedModel([ModelStep.text_reply(answer, chunk_size=1)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[PiiRedaction()])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "number?"))
    shown = "".join(e.text for e in events if e.type == "message.delta")  # type: ignore[union-attr]
    [complete] = [e for e in events if e.type == "message.complete"]
    assert shown == complete.block.text == f"Call {mask} today."  # type: ignore[union-attr]


def test_a_streamed_table_of_numbers_is_masked_in_linear_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Line breaks settle what precedes them, also after a number (a column of figures)."""
    from turnkit.plugins import pii

    matched: list[int] = []
    real = pii._mask

    def counted(text: str, kinds: Sequence[str]) -> tuple[str, list[str]]:
        matched.append(len(text))
        return real(text, kinds)

    monkeypatch.setattr(pii, "_mask", counted)
    table = "12 34 56 78\n2026-01-02 2026-01-03\n" * 200  # 6,800 characters
    streaming = pii._Streaming()
    for end in range(1, len(table) + 1):  # as it streams, one character at a time
        streaming.mask("turn", table[:end], pii.KINDS)
    assert sum(matched) < 200 * len(table)  # not a rescan of the whole text per chunk
    assert streaming.mask("turn", table, pii.KINDS) == (table, [])
