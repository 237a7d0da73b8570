"""Spans and metrics of turns, on the GenAI semantic conventions (turnkit.otel)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from tests.conftest import RuntimeFactory
from tests.helpers import add
from tests.otel.conftest import Telemetry
from tests.support.openai_server import FakeOpenAIServer, Reply

from turnkit import (
    Agent,
    Approve,
    ModelFamily,
    ProviderError,
    RuntimeConfig,
    SessionRuntime,
    ToolClass,
    tool,
)
from turnkit.events import ApprovalRequestedEvent, DoneEvent
from turnkit.models.litellm import LiteLLMClient
from turnkit.otel import set_capture_content
from turnkit.otel._state import active
from turnkit.runtime.reader import KEEPALIVE
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

# The semantic-convention names turnkit emits, listed once.
INVOKE_AGENT = {
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.conversation.id",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "turnkit.turn_id",
    "turnkit.attempt",
    "turnkit.outcome",
    "turnkit.cost_usd",
    "turnkit.seq.first",
    "turnkit.seq.last",
}
STAGE = {"turnkit.stage", "turnkit.turn_id"}
CHAT = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.conversation.id",
    "turnkit.turn_id",
    "turnkit.stage",
    "turnkit.family",
    "turnkit.model",
    "turnkit.rung",
    "turnkit.fallback_index",
    "turnkit.cost_usd",
}
EXECUTE_TOOL = {
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.tool.type",
    "gen_ai.conversation.id",
    "turnkit.turn_id",
}
CONTENT = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}
METRICS = {
    "gen_ai.client.token.usage",
    "gen_ai.client.operation.duration",
    "gen_ai.client.operation.time_to_first_chunk",
    "turnkit.turns",
}


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def _attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_a_tool_using_turn_is_one_span_tree(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("Five.")],
        name="m-small",
    )
    agent = Agent(model=model, tools=[add])
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "2+3?"))
    assert isinstance(events[-1], DoneEvent)
    turn_id = events[0].turn_id

    [submit] = otel.named("turnkit.submit")
    [invoke] = otel.named("invoke_agent ")
    stages = otel.named("stage ")
    chats = otel.named("chat ")
    [tool_span] = otel.named("execute_tool ")
    assert len(otel.spans()) == 1 + 1 + len(stages) + len(chats) + 1  # nothing else

    # One trace, rooted at the submission.
    assert {_trace_id(s) for s in otel.spans()} == {_trace_id(submit)}
    assert submit.parent is None
    assert submit.attributes == {"gen_ai.conversation.id": "s1", "gen_ai.agent.name": agent.name}
    assert _parent(invoke) == _id(submit)
    assert invoke.name == f"invoke_agent {agent.name}"
    assert invoke.kind is SpanKind.INTERNAL
    assert set(_attrs(invoke)) >= INVOKE_AGENT
    attrs = _attrs(invoke)
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == agent.name
    assert attrs["gen_ai.conversation.id"] == "s1"
    assert attrs["turnkit.turn_id"] == turn_id
    assert attrs["turnkit.attempt"] == 1
    assert attrs["turnkit.outcome"] == "succeeded"
    seqs = [e.seq for e in events if hasattr(e, "seq")]  # type: ignore[union-attr]
    assert (attrs["turnkit.seq.first"], attrs["turnkit.seq.last"]) == (2, max(seqs))
    assert invoke.status.status_code is StatusCode.UNSET

    # The stages, in order, children of the attempt.
    assert [s.name for s in stages] == [
        "stage anchor-plan",
        "stage tool-loop",
        "stage tool-loop",
        "stage synthesize",
        "stage post-turn",
    ]
    assert all(_parent(s) == _id(invoke) and set(_attrs(s)) >= STAGE for s in stages)
    assert [_attrs(s).get("turnkit.iteration") for s in stages[1:3]] == [1, 2]
    loop_one, loop_two = stages[1], stages[2]

    # Two model calls, one per tool-loop iteration, and the tool inside the first.
    assert [c.name for c in chats] == ["chat m-small", "chat m-small"]
    assert [_parent(c) for c in chats] == [_id(loop_one), _id(loop_two)]
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert set(_attrs(chat)) >= CHAT
        assert _attrs(chat)["gen_ai.operation.name"] == "chat"
        assert _attrs(chat)["gen_ai.provider.name"] == "scripted"
        assert _attrs(chat)["gen_ai.conversation.id"] == "s1"
        assert (_attrs(chat)["turnkit.rung"], _attrs(chat)["turnkit.fallback_index"]) == (0, 0)
        assert "error.type" not in _attrs(chat)
    assert [_attrs(c)["gen_ai.response.finish_reasons"] for c in chats] == [
        ("tool_calls",),
        ("stop",),
    ]
    assert _parent(tool_span) == _id(loop_one)
    assert tool_span.name == "execute_tool add"
    assert set(_attrs(tool_span)) >= EXECUTE_TOOL
    assert _attrs(tool_span)["gen_ai.tool.name"] == "add"
    assert _attrs(tool_span)["gen_ai.operation.name"] == "execute_tool"
    # No contents unless asked for.
    assert not CONTENT & {k for s in otel.spans() for k in _attrs(s)}

    # The metrics.
    usage = otel.points("gen_ai.client.token.usage")
    assert {a["gen_ai.token.type"] for a, _ in usage} == {"input", "output"}
    assert all(a["gen_ai.request.model"] == "m-small" for a, _ in usage)
    [(duration_attrs, duration)] = otel.points("gen_ai.client.operation.duration")
    assert duration.count == 2
    assert "error.type" not in duration_attrs
    [(_, first_chunk)] = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert first_chunk.count == 2
    [(turn_attrs, turns)] = otel.points("turnkit.turns")
    assert (turn_attrs["turnkit.outcome"], turns.value) == ("succeeded", 1)


async def test_a_cascade_step_is_two_chat_spans_and_a_counted_step(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    first = ScriptedModel(
        [ModelStep.fail(ProviderError("slow down", status_code=429))], name="m-large"
    )
    second = ScriptedModel([ModelStep.text_reply("Answer from rung two.")], name="m-small")
    runtime = runtime_factory(Agent(model=ModelFamily("m", [first, second])))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"

    failed, answered = otel.named("chat ")
    assert (failed.name, answered.name) == ("chat m-large", "chat m-small")
    assert _parent(failed) == _parent(answered)  # the same stage
    assert _attrs(failed)["error.type"] == "provider-error"
    assert _attrs(failed)["http.response.status_code"] == 429  # which provider error it was
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert (_attrs(failed)["turnkit.rung"], _attrs(failed)["turnkit.fallback_index"]) == (0, 0)
    assert (_attrs(answered)["turnkit.rung"], _attrs(answered)["turnkit.fallback_index"]) == (1, 1)
    assert _attrs(answered)["turnkit.family"] == "m"
    assert "error.type" not in _attrs(answered)
    assert "http.response.status_code" not in _attrs(answered)
    [(step_attrs, steps)] = otel.points("turnkit.cascade.steps")
    assert steps.value == 1
    assert (step_attrs["turnkit.from_model"], step_attrs["turnkit.to_model"]) == (
        "m-large",
        "m-small",
    )
    durations = {
        a.get("error.type"): p.count for a, p in otel.points("gen_ai.client.operation.duration")
    }
    assert durations == {"provider-error": 1, None: 1}


async def test_the_requested_model_is_named_without_its_provider_prefix(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    # litellm routes by `provider/model`; the conventions put the provider in its own
    # attribute and the model's own name in `gen_ai.request.model` and the span's name.
    model = ScriptedModel([ModelStep.text_reply("Hi.")], name="scripted/m-small")
    runtime = runtime_factory(Agent(model=model))
    await collect_events(runtime.execute_message("s1", "hello"))

    [chat] = otel.named("chat ")
    assert chat.name == "chat m-small"
    attrs = _attrs(chat)
    assert (attrs["gen_ai.provider.name"], attrs["gen_ai.request.model"]) == ("scripted", "m-small")
    assert attrs["gen_ai.response.model"] == "m-small"
    assert attrs["turnkit.model"] == "scripted/m-small"  # the string the agent was given
    usage = otel.points("gen_ai.client.token.usage")
    assert {a["gen_ai.request.model"] for a, _ in usage} == {"m-small"}


async def test_a_chat_span_names_the_server_a_rung_reached(
    runtime_factory: RuntimeFactory, otel: Telemetry, openai_server: FakeOpenAIServer
) -> None:
    """Two endpoints serving one model name are told apart (`server.address`, `.port`)."""
    openai_server.script("gpt-fake", [Reply.text("Hello.")])
    client = LiteLLMClient("openai/gpt-fake", api_base=openai_server.base_url, api_key="sk")
    runtime = runtime_factory(Agent(model=client))
    await collect_events(runtime.execute_message("s1", "hello"))

    [chat] = otel.named("chat ")
    host, port = openai_server.base_url.split("//")[1].split("/")[0].split(":")
    assert (_attrs(chat)["server.address"], _attrs(chat)["server.port"]) == (host, int(port))


async def test_a_failed_turn_carries_error_type(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    model = ScriptedModel([ModelStep.fail(ProviderError("bad request", status_code=400))])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "failed"

    [chat] = otel.named("chat ")
    [invoke] = otel.named("invoke_agent ")
    assert _attrs(chat)["error.type"] == "provider-error"
    assert _attrs(invoke)["error.type"] == "provider-error"
    assert _attrs(invoke)["turnkit.outcome"] == "failed"
    assert invoke.status.status_code is StatusCode.ERROR
    [stage] = [s for s in otel.named("stage ") if s.status.status_code is StatusCode.ERROR]
    assert _parent(chat) == _id(stage)
    # Described by the type, as the chat span is (never the provider's own words).
    assert (invoke.status.description, stage.status.description) == ("provider-error",) * 2
    [(attrs, turns)] = otel.points("turnkit.turns")
    assert (attrs["turnkit.outcome"], attrs["error.type"], turns.value) == (
        "failed",
        "provider-error",
        1,
    )


async def test_a_thinking_summary_is_its_own_chat_span(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    model = ScriptedModel(
        [
            ModelStep(text="", thinking="maybe add", tool_calls=(call("add", a=2, b=2),)),
            ModelStep.text_reply("2 + 2 = 4. " * 20, thinking="done"),
        ],
        name="m-large",
    )
    utility = ScriptedModel(
        [
            ModelStep.text_reply('{"intent": "math", "depth": "none"}'),
            ModelStep.text_reply("The assistant added the numbers with the tool."),
            ModelStep.text_reply("Adding two and two"),
        ],
        name="m-background",
    )
    runtime = runtime_factory(Agent(model=model, utility_model=utility, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "2+2?"))
    assert isinstance(events[-1], DoneEvent)
    await runtime.wait_background()  # the thread's name, asked once the turn has settled
    utility.assert_complete()
    background = otel.named("chat m-background")
    # The plan (anchor-plan), the thinking summary, which is written while the loop runs,
    # and the thread's name (thread-naming): each its own chat span, none failed.
    stages = sorted(str(_attrs(span)["turnkit.stage"]) for span in background)
    assert stages[0] == "anchor-plan"
    assert "thread-naming" in stages
    assert len(stages) == 3
    assert set(stages) - {"anchor-plan", "thread-naming"}, stages  # the summary's stage
    for span in background:
        assert _attrs(span)["gen_ai.usage.output_tokens"] > 0  # type: ignore[operator]
        assert span.status.status_code is not StatusCode.ERROR


@tool
async def slow_add(a: int, b: int) -> int:
    """Add two numbers, slowly."""
    await asyncio.sleep(0.2)
    return a + b


async def test_a_live_reader_records_the_replay_buffers_lag(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_add", a=2, b=3)), ModelStep.text_reply("5.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[slow_add]))
    submission = await runtime.start("s1", "add 2 and 3")
    frames = []
    async with asyncio.timeout(10):
        async for frame in runtime.reader().follow(submission.turn_id):
            if frame is not KEEPALIVE:
                frames.append(frame)
    assert b'"type":"done"' in frames[-1].data
    # Events reached the reader through the buffer while the turn ran: their age was taken.
    [(_, lag)] = otel.points("turnkit.replay.lag")
    assert lag.count >= 1
    assert 0 <= lag.max < 5


@tool(approval="always")
async def send_email(to: str) -> str:
    """Send an email (needs a person's approval)."""
    return f"sent to {to}"


async def test_a_paused_turn_resumed_elsewhere_is_one_trace(
    tmp_path: Path, otel: Telemetry
) -> None:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'pause.db'}")
    before = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    first = SessionRuntime(agent=Agent(model=before, tools=[send_email]), config=config)
    async with first:
        events = await collect_events(first.execute_message("s1", "email Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)

    after = ScriptedModel([ModelStep.text_reply("Done: sent.")])
    second = SessionRuntime(agent=Agent(model=after, tools=[send_email]), config=config)
    tracer = otel.tracer_provider.get_tracer("tests")
    async with second:
        record = await second.turn(asked.turn_id)
        pinned = record.pinned["traceparent"]
        # The resume arrives in some other request's trace (an HTTP handler, say).
        with tracer.start_as_current_span("resume request") as request:
            await second.resume(asked.turn_id, asked.request_id, Approve())
        async with asyncio.timeout(20):
            while len(otel.named("invoke_agent ")) < 2:
                await asyncio.sleep(0.01)

    paused, resumed = otel.named("invoke_agent ")
    [submit] = otel.named("turnkit.submit")
    assert isinstance(pinned, str)
    assert pinned.startswith(f"00-{_trace_id(submit):032x}-{_id(submit):016x}-")
    assert _attrs(paused)["turnkit.outcome"] == "awaiting_approval"
    assert _attrs(resumed)["turnkit.outcome"] == "succeeded"
    assert _trace_id(paused) == _trace_id(resumed) == _trace_id(submit)
    assert _parent(paused) == _parent(resumed) == _id(submit)
    # The resumed attempt links to the request that resumed it.
    [link] = resumed.links
    assert link.context.span_id == request.get_span_context().span_id
    # The tool that waited for approval ran in the resumed attempt, inside its trace.
    [tool_span] = otel.named("execute_tool ")
    assert _trace_id(tool_span) == _trace_id(submit)
    stage_ids = {_id(s) for s in otel.named("stage ") if _parent(s) == _id(resumed)}
    assert _parent(tool_span) in stage_ids
    outcomes = sorted(a["turnkit.outcome"] for a, _ in otel.points("turnkit.turns"))
    assert outcomes == ["awaiting_approval", "succeeded"]
    # The stage that paused runs again in the resumed attempt: the same iteration, though
    # its `step.start` is not committed twice.
    again = [s for s in otel.named("stage tool-loop") if _parent(s) == _id(resumed)]
    assert [_attrs(s).get("turnkit.iteration") for s in again] == [1, 2]
    # A run after a pause is the same recovery attempt.
    assert _attrs(paused)["turnkit.attempt"] == _attrs(resumed)["turnkit.attempt"] == 1


async def test_message_contents_only_when_asked_for(
    runtime_factory: RuntimeFactory, otel: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("Five.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    await collect_events(runtime.execute_message("s1", "2+3?"))
    first, last = otel.named("chat ")
    sent = json.loads(str(_attrs(first)["gen_ai.input.messages"]))
    assert {"type": "text", "content": "2+3?"} in sent[-1]["parts"]
    answer = json.loads(str(_attrs(last)["gen_ai.output.messages"]))
    assert answer == [{"role": "assistant", "parts": [{"type": "text", "content": "Five."}]}]
    [tool_span] = otel.named("execute_tool ")
    assert json.loads(str(_attrs(tool_span)["gen_ai.tool.call.arguments"])) == {"a": 2, "b": 3}
    assert _attrs(tool_span)["gen_ai.tool.call.result"] == "5"


async def test_no_provider_no_spans(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert active() is None

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a span was started with no provider configured")

    monkeypatch.setattr(trace.ProxyTracer, "start_span", refuse)
    monkeypatch.setattr(trace.NoOpTracer, "start_span", refuse)
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("Five.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "2+3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    # The turn is still pinned to a trace, so processes that do trace share it.
    record = await runtime.turn(events[0].turn_id)
    traceparent = record.pinned["traceparent"]
    assert isinstance(traceparent, str)
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id), flags) == ("00", 32, 16, "01")


SLOW = {"seconds": 60.0}


@tool
async def fetch(n: int) -> int:
    """Fetch something slowly."""
    await asyncio.sleep(SLOW["seconds"])
    return n


async def test_a_turn_recovered_after_a_crash_stays_one_trace(
    tmp_path: Path, otel: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'app.db'}", lease_ttl_s=1.0, recover_in_process=True
    )
    before = ScriptedModel([ModelStep.tool_call_reply(call("fetch", n=7))])
    first = SessionRuntime(agent=Agent(model=before, tools=[fetch]), config=config)
    await first.open()
    submission = await first.start("s1", "fetch 7")
    async with asyncio.timeout(10):
        while not otel.named("chat "):  # until the tool runs
            await asyncio.sleep(0.02)

    async def gone(lease: object) -> bool:  # it died: it hands nothing over
        raise ConnectionError("the process is gone")

    monkeypatch.setattr(first.store, "hand_over", gone)
    await first.close()  # the process goes away mid-tool: its lease lapses

    SLOW["seconds"] = 0.0
    after = ScriptedModel([ModelStep.text_reply("Got 7.")])
    second = SessionRuntime(agent=Agent(model=after, tools=[fetch]), config=config)
    try:
        await second.open()  # takes the turn over once the lease has lapsed
        async with asyncio.timeout(20):
            while len(otel.named("invoke_agent ")) < 2:
                await asyncio.sleep(0.05)
    finally:
        await second.close()
        SLOW["seconds"] = 60.0

    crashed, recovered = otel.named("invoke_agent ")
    assert _trace_id(crashed) == _trace_id(recovered)
    assert _parent(crashed) == _parent(recovered)
    assert _attrs(crashed)["turnkit.outcome"] == "lease_lost"
    assert _attrs(recovered)["turnkit.attempt"] == 2
    assert _attrs(recovered)["turnkit.recovered"] is True
    assert _attrs(recovered)["turnkit.recovery.cause"] == "lease-expired"
    assert _attrs(recovered)["turnkit.outcome"] == "succeeded"
    assert _attrs(recovered)["turnkit.turn_id"] == submission.turn_id
    [(attributes, recoveries)] = otel.points("turnkit.recoveries")
    assert recoveries.value == 1
    assert attributes["turnkit.recovery.cause"] == "lease-expired"  # a crash, not a hand-over
    # The call the crash cut short does not look done; the one run again says why it ran.
    cut, again = otel.named("execute_tool fetch")
    assert (_attrs(cut)["error.type"], cut.status.status_code) == ("cancelled", StatusCode.ERROR)
    assert "turnkit.tool.in_doubt" not in _attrs(cut)
    assert _attrs(again)["turnkit.tool.in_doubt"] is True
    assert "error.type" not in _attrs(again)


async def test_the_attempt_span_says_how_long_the_turn_was_held(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    """A turn held for its stream's opening (`start(hold_until=…)`) marks the wait."""
    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")] * 2)))
    opening = asyncio.Event()
    held = await runtime.start("s1", "hello", hold_until=opening)
    await asyncio.sleep(0.05)
    opening.set()
    plain = await runtime.start("s2", "hello")
    for turn_id in (held.turn_id, plain.turn_id):
        async with asyncio.timeout(10):
            assert [e async for e in runtime.reader().events(turn_id)][-1].type == "done"
    async with asyncio.timeout(5):  # the attempt's span ends just after its `done`
        while len(spans := _by_turn(otel.named("invoke_agent "))) < 2:
            await asyncio.sleep(0.01)
    assert 40 <= float(spans[held.turn_id]["turnkit.held_ms"]) < 1000  # type: ignore[arg-type]
    assert "turnkit.held_ms" not in spans[plain.turn_id]


def _by_turn(spans: list[ReadableSpan]) -> dict[object, dict[str, object]]:
    return {_attrs(span)["turnkit.turn_id"]: _attrs(span) for span in spans}


@tool
async def lookup_owner(ticket: str) -> dict[str, str]:
    """Who owns a ticket."""
    if ticket == "bad":
        raise ValueError(f"cannot handle {ticket}-SECRETARG")
    return {"ticket": ticket, "owner": "jane.doe@example.com"}


async def test_without_content_capture_no_span_quotes_a_tool_or_a_provider(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup_owner", ticket="bad")),
            ModelStep.fail(
                ProviderError("your prompt 'SECRETPROMPT' is too long", status_code=400)
            ),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[lookup_owner]))
    await collect_events(runtime.execute_message("s1", "owner of bad?"))
    [tool_span] = otel.named("execute_tool ")
    assert tool_span.status.description == "tool-failed"
    failed = [s for s in otel.named("chat ") if s.status.status_code is StatusCode.ERROR]
    assert [s.status.description for s in failed] == ["provider-error"]
    exported = [
        (s.status.description, s.attributes, [e.attributes for e in s.events]) for s in otel.spans()
    ]
    assert "SECRET" not in str(exported)
    assert [dict(e.attributes or {}) for e in failed[0].events] == [
        {"exception.type": "provider-error"}
    ]


async def test_with_content_capture_the_exception_event_keeps_its_type_and_adds_the_words(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    set_capture_content(True)
    refused = ProviderError("your prompt 'SECRETPROMPT' is too long", status_code=400)
    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.fail(refused)])))
    await collect_events(runtime.execute_message("s1", "hi"))
    [failed] = [s for s in otel.named("chat ") if s.status.status_code is StatusCode.ERROR]
    [event] = [dict(e.attributes or {}) for e in failed.events]
    assert event["exception.type"] == "provider-error"  # as without capture: one grouping
    assert "SECRETPROMPT" in str(event["exception.message"])
    assert "ProviderError" in str(event["exception.stacktrace"])


def _raised_from_a_raw_error() -> ProviderError:
    """turnkit's error, raised from the provider's raw one (which quotes a credential)."""
    try:
        try:
            raise RuntimeError("header Authorization: Bearer sk-RAWKEY0123456789abcdef")
        except RuntimeError as raw:
            raise ProviderError(
                "the provider refused the key (Bearer ***)", status_code=401
            ) from raw
    except ProviderError as exc:
        return exc


async def test_with_content_capture_the_stack_leaves_out_the_raw_error_turnkits_came_from(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    set_capture_content(True)
    runtime = runtime_factory(
        Agent(model=ScriptedModel([ModelStep.fail(_raised_from_a_raw_error())]))
    )
    await collect_events(runtime.execute_message("s1", "hi"))
    [failed] = [s for s in otel.named("chat ") if s.status.status_code is StatusCode.ERROR]
    [event] = [dict(e.attributes or {}) for e in failed.events]
    assert "Bearer ***" in str(event["exception.message"])
    assert "ProviderError" in str(event["exception.stacktrace"])
    exported = [
        (s.status.description, s.attributes, [e.attributes for e in s.events]) for s in otel.spans()
    ]
    assert "RAWKEY" not in str(exported)


async def test_a_captured_tool_result_is_the_one_past_the_guardrails(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    from turnkit.plugins.pii import PiiRedaction

    set_capture_content(True)
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("lookup_owner", ticket="T1")), ModelStep.text_reply("ok")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[lookup_owner], plugins=[PiiRedaction()]))
    await collect_events(runtime.execute_message("s1", "owner of T1?"))
    [tool_span] = otel.named("execute_tool ")
    result = json.loads(str(_attrs(tool_span)["gen_ai.tool.call.result"]))
    assert result == {"ticket": "T1", "owner": "[email]"}


async def test_each_tool_loop_iteration_is_its_own_stage_span_on_either_store(
    db: tuple[str, str | None], otel: Telemetry
) -> None:
    """On PostgreSQL a stage's `step.end` commits with the next checkpoint, while the next
    stage already runs: a stage's span still ends with its own work."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
            ModelStep.tool_call_reply(call("send_email", to="ada@example.com")),
            ModelStep.text_reply("Sent."),
        ]
    )
    agent = Agent(model=model, tools=[add, send_email], skip_stages=frozenset({"anchor-plan"}))
    async with SessionRuntime(agent=agent, config=config) as rt:
        events = await collect_events(rt.execute_message("s1", "add, then email Ada"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await rt.resume(asked.turn_id, asked.request_id, Approve())
        async for _ in rt.reader().follow(asked.turn_id):
            pass
    paused, resumed = otel.named("invoke_agent ")

    def loops(attempt: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in otel.named("stage tool-loop") if _parent(s) == _id(attempt)]

    assert [_attrs(s).get("turnkit.iteration") for s in loops(paused)] == [1, 2]
    assert [_attrs(s).get("turnkit.iteration") for s in loops(resumed)] == [2, 3]
    add_span, email_span = otel.named("execute_tool ")
    assert _parent(add_span) == _id(loops(paused)[0])
    assert _parent(email_span) == _id(loops(resumed)[0])  # the approved call, resumed
    chats = otel.named("chat ")
    assert [_parent(c) for c in chats] == [
        _id(loops(paused)[0]),
        _id(loops(paused)[1]),
        _id(loops(resumed)[1]),
    ]
    for span in otel.named("stage "):  # each ended, and before the next of its attempt began
        assert span.end_time is not None
    for attempt in (paused, resumed):
        spans = sorted(
            (s for s in otel.named("stage ") if _parent(s) == _id(attempt)),
            key=lambda s: s.start_time or 0,
        )
        for before, after in zip(spans, spans[1:], strict=False):
            assert (before.end_time or 0) <= (after.start_time or 0), (before.name, after.name)


async def test_a_resume_answered_in_a_request_links_the_attempt_another_task_runs(
    tmp_path: Path, otel: Telemetry
) -> None:
    """The approval route answers; the process's recovery loop, not the request, drives."""
    url = f"sqlite:///{tmp_path / 'link.db'}"
    before = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    async with SessionRuntime(
        agent=Agent(model=before, tools=[send_email]), config=RuntimeConfig(database_url=url)
    ) as first:
        events = await collect_events(first.execute_message("s1", "email Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)

    after = ScriptedModel([ModelStep.text_reply("Done: sent.")])
    config = RuntimeConfig(database_url=url, run_in_process=False, recover_in_process=True)
    tracer = otel.tracer_provider.get_tracer("tests")
    async with SessionRuntime(agent=Agent(model=after, tools=[send_email]), config=config) as rt:
        with tracer.start_as_current_span("POST /approvals") as request:
            await rt.resume(asked.turn_id, asked.request_id, Approve())
        async with asyncio.timeout(20):
            while len(otel.named("invoke_agent ")) < 2:
                await asyncio.sleep(0.01)
    _, resumed = otel.named("invoke_agent ")
    [link] = resumed.links
    assert link.context.span_id == request.get_span_context().span_id
    assert _attrs(resumed)["turnkit.outcome"] == "succeeded"


async def test_a_call_whose_asked_agent_waits_for_a_person_is_no_error(
    otel: Telemetry, runtime_factory: RuntimeFactory
) -> None:
    @tool(approval="always")
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    refunds = Agent(
        name="refunds",
        model=ScriptedModel(
            [ModelStep.tool_call_reply(call("refund", order_id="A1")), ModelStep.text_reply("ok")]
        ),
        tools=[refund],
    )
    front = Agent(
        name="front",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refunds", message="refund A1")),
                ModelStep.text_reply(""),
            ]
        ),
        tools=[refunds.as_tool()],
    )
    runtime = runtime_factory(front)
    events = await collect_events(runtime.execute_message("s1", "refund A1"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    [span] = [s for s in otel.named("execute_tool refunds") if s.attributes]
    assert _attrs(span)["turnkit.tool.waits_for_person"] is True
    assert span.status.status_code != StatusCode.ERROR
    assert "error.type" not in _attrs(span)


@tool
async def quote_primary(symbol: str) -> str:
    """Quote a symbol."""
    raise RuntimeError(f"primary feed down for {symbol}")


@tool
async def quote_backup(symbol: str) -> str:
    """Quote a symbol from the backup feed."""
    return f"{symbol} 101.5"


@pytest.mark.parametrize("captured", [False, True])
async def test_a_tool_class_fallback_step_is_an_event_on_its_calls_span(
    runtime_factory: RuntimeFactory,
    otel: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    captured: bool,
) -> None:
    if captured:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    quote = ToolClass("quote", [quote_primary, quote_backup])
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("quote", symbol="ACME")), ModelStep.text_reply("101.5")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[quote]))
    events = await collect_events(runtime.execute_message("s1", "ACME?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"

    [tool_span] = otel.named("execute_tool ")
    assert _attrs(tool_span)["turnkit.tool.answered_by"] == "quote_backup"
    assert tool_span.status.status_code is StatusCode.UNSET  # the class answered
    [step] = [e for e in tool_span.events if e.name == "turnkit.tool.fallback"]
    attrs = dict(step.attributes or {})
    assert attrs["turnkit.tool.from"] == "quote_primary"
    assert attrs["turnkit.tool.to"] == "quote_backup"
    if captured:
        assert "primary feed down for ACME" in str(attrs["turnkit.tool.fallback.reason"])
    else:  # the member's words may quote the arguments
        assert "turnkit.tool.fallback.reason" not in attrs
        assert "ACME" not in json.dumps(attrs)
