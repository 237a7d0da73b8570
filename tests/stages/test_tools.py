"""Tools: schema from signature, readable validation failures, context, jobs, finishing."""

from __future__ import annotations

import re

import pytest
from tests.conftest import RuntimeFactory
from tests.helpers import add

from turnkit import Agent, ConfigurationError, DuplicateToolError, ToolContext, tool
from turnkit.events import (
    DoneEvent,
    ErrorEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    ToolFailedEvent,
    ToolStartedEvent,
)
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events, raw_call


def test_schema_comes_from_the_signature() -> None:
    @tool
    async def lookup(city: str, days: int = 3, ctx: ToolContext | None = None) -> str:
        """Weather for a city.

        Args:
            city: Which city.
            days: How many days ahead.
        """
        return city

    spec = lookup.spec()
    assert spec.name == "lookup"
    assert spec.description == "Weather for a city."
    params = spec.parameters
    assert params["required"] == ["city"]
    props = params["properties"]
    assert isinstance(props, dict)
    assert set(props) == {"city", "days"}
    assert props["city"]["description"] == "Which city."
    assert props["days"]["default"] == 3


def test_context_parameter_is_left_out_of_the_schema() -> None:
    @tool
    async def whoami(ctx: ToolContext) -> str:
        """Say the turn id."""
        return ctx.turn_id

    assert whoami.spec().parameters["properties"] == {}


def test_two_tools_of_one_name_are_refused() -> None:
    @tool(name="add")
    async def other_add(a: int) -> int:
        """Another add."""
        return a

    with pytest.raises(DuplicateToolError, match="'add'"):
        Agent(model=ScriptedModel([]), tools=[add, other_add])


def test_untyped_star_args_are_refused() -> None:
    def loose(*args: int) -> int:
        return 0

    with pytest.raises(ConfigurationError, match=r"\*args"):
        tool(loose)


async def test_invalid_arguments_become_a_failed_result_and_the_turn_answers(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a="two", b=3)),
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
            ModelStep.text_reply("5"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "2+3"))
    failed = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert len(failed) == 1
    assert failed[0].code == "tool-arguments-invalid"
    assert failed[0].result.error is not None
    assert "a:" in failed[0].result.error
    # The model read the failure as a tool message and tried again.
    second_request = model.calls[1].messages
    assert second_request[-1].role == "tool"
    assert second_request[-1].content.startswith("Error:")
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert (await runtime.history("s1"))[0].answer == "5"


async def test_unknown_tool_and_malformed_json_are_failed_results(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("nope", x=1), raw_call("add", '{"a": 1, "b":')),
            ModelStep.text_reply("Gave up."),
            ModelStep.text_reply("I could not compute it."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "hm"))
    codes = sorted(e.code for e in events if isinstance(e, ToolFailedEvent))
    assert codes == ["tool-arguments-invalid", "tool-not-found"]
    [missing] = [e for e in events if isinstance(e, ToolFailedEvent) and e.code == "tool-not-found"]
    # It lists every tool the model was offered, the built-in one included.
    assert missing.result.error is not None
    assert missing.result.error.endswith("available: ['add', 'read_tool_result']")
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


async def test_output_limit_while_writing_a_call_fails_the_call_not_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.truncated("", raw_call("add", '{"a": 1')),
            ModelStep.tool_call_reply(call("add", a=1, b=1)),
            ModelStep.text_reply("ok"),
            ModelStep.text_reply("2"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "1+1"))
    failed = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert len(failed) == 1
    assert "output limit" in (failed[0].result.error or "")
    assert [e.result.output for e in events if isinstance(e, ToolCompletedEvent)] == [2]


async def test_output_limit_with_no_call_named_is_fatal(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.truncated("The answer is that the")])
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "explain"))
    assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["agent_output_limit_exceeded"]
    assert (await runtime.history("s1"))[0].answer is None
    # The call the turn failed on is audited as that failure, not as fine.
    [row] = [r.call for r in await runtime.audit(events[0].turn_id) if r.call is not None]
    assert (row.outcome, row.error_code) == ("error", "agent_output_limit_exceeded")


async def test_a_call_without_a_tool_name_is_audited_as_the_failure(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(raw_call("", "{}"))])
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "add"))
    assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["tool-call-malformed"]
    [row] = [r.call for r in await runtime.audit(events[0].turn_id) if r.call is not None]
    assert (row.outcome, row.error_code) == ("error", "tool-call-malformed")


async def test_context_carries_ids_and_progress_becomes_job_events(
    runtime_factory: RuntimeFactory,
) -> None:
    seen: list[ToolContext] = []

    @tool
    async def crunch(n: int, ctx: ToolContext) -> int:
        """Crunch numbers for a while."""
        seen.append(ctx)
        await ctx.report_progress(0.5, "half way")
        await ctx.report_progress(1.0)
        return n * 2

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("crunch", n=21, tool_call_id="call_x")),
            ModelStep.text_reply("done"),
            ModelStep.text_reply("42"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[crunch]))
    events = await collect_events(runtime.execute_message("s1", "crunch"))
    [ctx] = seen
    assert ctx.tool_call_id == "call_x"
    assert ctx.session_id == "s1"
    assert ctx.turn_id == events[0].turn_id
    assert ctx.idempotency_key.startswith("idem_")
    kinds = [
        type(e)
        for e in events
        if isinstance(e, JobDispatchedEvent | JobProgressEvent | JobCompletedEvent)
    ]
    assert kinds == [JobDispatchedEvent, JobProgressEvent, JobProgressEvent, JobCompletedEvent]
    progress = [e for e in events if isinstance(e, JobProgressEvent)]
    assert progress[0].progress == 0.5
    assert progress[0].message == "half way"


async def test_a_raising_tool_is_a_failed_result(runtime_factory: RuntimeFactory) -> None:
    @tool
    def flaky(x: int) -> int:
        """Always fails."""
        raise RuntimeError("disk full")

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("flaky", x=1)),
            ModelStep.text_reply("no"),
            ModelStep.text_reply("Sorry."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[flaky]))
    events = await collect_events(runtime.execute_message("s1", "go"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-failed"
    assert "disk full" in (failed.result.error or "")


async def test_a_result_with_a_surrogate_or_a_nan_is_stored_as_the_model_reads_it(
    runtime_factory: RuntimeFactory,
) -> None:
    """A file name decoded with surrogateescape could not be written: the turn stuck."""
    name = b"report-\xff.txt".decode("utf-8", "surrogateescape")

    @tool
    def listing() -> dict[str, object]:
        """List the folder."""
        return {"files": [name], "ratio": float("nan")}

    @tool
    def broken() -> int:
        """Fails with a surrogate in its message."""
        raise OSError(f"cannot open {name}")

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("listing"), call("broken")),
            ModelStep.text_reply("Done."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[listing, broken]))
    events = await collect_events(runtime.execute_message("s1", "list"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == {"files": ["report-\ufffd.txt"], "ratio": None}
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "cannot open report-\ufffd.txt" in (failed.result.error or "")
    read = [m.content for m in model.calls[1].messages if m.role == "tool"]
    assert '{"files":["report-\ufffd.txt"],"ratio":null}' in read


@pytest.mark.parametrize(
    ("value", "kind"), [(b"\xff\xfe", "bytes"), (object(), "object")], ids=["bytes", "object"]
)
async def test_a_result_that_cannot_be_json_says_so(
    runtime_factory: RuntimeFactory, value: object, kind: str
) -> None:
    @tool
    def odd() -> object:
        """Returns something odd."""
        return value

    model = ScriptedModel([ModelStep.tool_call_reply(call("odd")), ModelStep.text_reply("ok")])
    runtime = runtime_factory(Agent(model=model, tools=[odd]))
    events = await collect_events(runtime.execute_message("s1", "go"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-failed"
    assert (failed.result.error or "").startswith(f"the tool returned {kind}, which cannot be sent")


async def test_a_tool_writing_to_langgraphs_stream_does_not_disturb_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    """What a tool writes to LangGraph's stream writer is dropped; the turn streams as usual."""
    from langgraph.config import get_stream_writer

    @tool
    async def noisy(x: int) -> int:
        """Write something of its own to LangGraph's stream writer."""
        get_stream_writer()({"progress": "half"})
        return x

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("noisy", x=7)),
            ModelStep.text_reply("Done."),
            ModelStep.text_reply("7"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[noisy]))
    events = await collect_events(runtime.execute_message("s1", "go"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert all(hasattr(e, "type") for e in events)


async def test_a_call_id_used_before_in_the_turn_gets_a_new_one(
    runtime_factory: RuntimeFactory,
) -> None:
    """Some servers number calls per response: `call_0` every round is two calls."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=1, b=1, tool_call_id="call_0")),
            ModelStep.tool_call_reply(call("add", a=5, b=5, tool_call_id="call_0")),
            ModelStep.text_reply("2 and 10"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "two sums"))
    started = [e for e in events if isinstance(e, ToolStartedEvent)]
    ids = [e.block.tool_call_id for e in started]
    assert ids == ["call_0", "call_0_r2_1"]  # renamed after the loop round it came in
    # Its arguments streamed under the id it got: a client joins them to its own card.
    deltas = [e.tool_call_id for e in events if isinstance(e, ToolDeltaEvent)]
    assert deltas
    assert set(deltas) == set(ids)
    assert len({e.idempotency_key for e in started}) == 2  # two actions, two keys
    assert [e.result.output for e in events if isinstance(e, ToolCompletedEvent)] == [2, 10]
    assert [e for e in events if e.type == "tool.in_doubt"] == []
    # The model reads each result under the id it now has.
    assert [m.tool_call_id for m in model.calls[2].messages if m.role == "tool"] == ids


async def test_a_call_id_an_earlier_turn_used_gets_a_new_one(
    runtime_factory: RuntimeFactory,
) -> None:
    """Anthropic refuses a request that carries one id twice, as after a cascade fell back."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=1, b=1, tool_call_id="call_0")),
            ModelStep.text_reply("2"),
            ModelStep.tool_call_reply(call("add", a=5, b=5, tool_call_id="call_0")),
            ModelStep.text_reply("10"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    await collect_events(runtime.execute_message("s1", "1 + 1"))
    events = await collect_events(runtime.execute_message("s1", "5 + 5"))
    started = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
    assert started == ["call_0_r1_1"]
    assert {e.tool_call_id for e in events if isinstance(e, ToolDeltaEvent)} == {"call_0_r1_1"}
    sent = model.calls[3].messages
    asked = [c.tool_call_id for m in sent if m.role == "assistant" for c in m.tool_calls]
    answered = [m.tool_call_id for m in sent if m.role == "tool"]
    assert asked == answered == ["call_0", "call_0_r1_1"]


async def test_a_call_id_a_provider_would_refuse_is_made_safe(
    runtime_factory: RuntimeFactory,
) -> None:
    """Ids move between providers in a cascade: Anthropic takes `[A-Za-z0-9_-]` only,
    OpenAI at most 40 characters."""
    dotted = "functions.add:0"
    long = "fc_0f0e50a1476a6c35006912c58dc9f8819192c25864eb16f07f"
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("add", a=1, b=1, tool_call_id=dotted),
                call("add", a=2, b=2, tool_call_id=long),
            ),
            ModelStep.text_reply("2 and 4"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "two sums"))
    ids = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
    assert ids[0] == "functions_add_0"
    assert ids[1].startswith("fc_0f0e50a1476a6c35006912c5")
    assert len(ids[1]) == 40
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}", i) for i in ids)
    assert {e.tool_call_id for e in events if isinstance(e, ToolDeltaEvent)} == set(ids)
    assert [m.tool_call_id for m in model.calls[1].messages if m.role == "tool"] == ids


async def test_two_ids_made_safe_alike_stream_as_they_start(
    runtime_factory: RuntimeFactory,
) -> None:
    """`a.b` and `a:b` are both `a_b` made safe: the second call is renamed, and its
    arguments stream under the id it starts with."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("add", a=1, b=1, tool_call_id="a.b"),
                call("add", a=2, b=2, tool_call_id="a:b"),
            ),
            ModelStep.text_reply("2 and 4"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "two sums"))
    started = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
    assert started == ["a_b", "a_b_r1_1"]
    by_id: dict[str, str] = {}
    for delta in (e for e in events if isinstance(e, ToolDeltaEvent)):
        by_id[delta.tool_call_id] = by_id.get(delta.tool_call_id, "") + delta.arguments_delta
    assert set(by_id) == set(started)
    assert '{"a": 1, "b": 1}'.startswith(by_id["a_b"])  # each call's own arguments
    assert '{"a": 2, "b": 2}'.startswith(by_id["a_b_r1_1"])


async def test_a_long_tool_loop_runs_until_the_model_answers(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No round limit unless the agent sets one: 60 rounds, past the 50 turnkit once
    stopped at and past the 25 super-steps some LangGraph releases allow by default."""
    from langgraph._internal import _config

    limit = type(_config.DEFAULT_RECURSION_LIMIT)(25)  # as LangGraph 1.0 had it
    monkeypatch.setattr(_config, "DEFAULT_RECURSION_LIMIT", limit)
    rounds = 60
    model = ScriptedModel(
        [
            *(ModelStep.tool_call_reply(call("add", a=n, b=1)) for n in range(rounds)),
            ModelStep.text_reply("Counted to sixty."),
        ]
    )
    agent = Agent(model=model, tools=[add])
    assert agent.max_tool_rounds is None
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "count to sixty, one by one"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("succeeded", None)
    outputs = [e.result.output for e in events if isinstance(e, ToolCompletedEvent)]
    assert outputs == list(range(1, rounds + 1))
    assert (await runtime.history("s1"))[0].answer == "Counted to sixty."
    assert all(c.tool_choice != "none" for c in model.calls)  # never made to stop
    model.assert_complete()


def test_the_default_round_limit_keeps_agent_versions_and_resumes_older_pins() -> None:
    """Agents that keep the default keep their version; one that sets the old default of
    50 gets a version of its own, and still resumes turns pinned to the one it had."""
    before = {  # as the releases that stopped at 50 unless told otherwise hashed them
        "default": "1326b40e48a9d0a2",
        "None": "b0767fb776a11f05",
        "12": "25502e552197a019",
    }
    kept = Agent(name="digest", model="openai/gpt-4o-mini")
    assert kept.version == before["default"]
    unbounded = Agent(name="digest", model="openai/gpt-4o-mini", max_tool_rounds=None)
    assert unbounded.version == kept.version  # the same bundle now
    assert before["None"] in unbounded.earlier_versions
    fifty = Agent(name="digest", model="openai/gpt-4o-mini", max_tool_rounds=50)
    assert fifty.version != kept.version  # it stops where the default does not
    assert fifty.earlier_versions == (before["default"],)
    twelve = Agent(name="digest", model="openai/gpt-4o-mini", max_tool_rounds=12)
    assert (twelve.version, twelve.earlier_versions) == (before["12"], ())


async def test_a_model_that_keeps_calling_tools_answers_after_the_most_rounds(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            *(ModelStep.tool_call_reply(call("add", a=n, b=n)) for n in range(3)),
            ModelStep.text_reply("0, 2 and 4."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=3))
    events = await collect_events(runtime.execute_message("s1", "add forever"))
    assert [e.result.output for e in events if isinstance(e, ToolCompletedEvent)] == [0, 2, 4]
    assert (await runtime.history("s1"))[0].answer == "0, 2 and 4."
    assert model.calls[-1].tool_choice == "none"  # the last call could only answer
    assert len(model.calls) == 4
    with pytest.raises(ConfigurationError, match="max_tool_rounds"):
        Agent(model=model, max_tool_rounds=0)
