"""Log lines as JSON, joined to their turn and to the trace a collector holds."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from tests.conftest import RuntimeFactory
from tests.otel.conftest import Telemetry

from turnkit import Agent, Approve, tool
from turnkit.errors import ProviderError
from turnkit.events import ApprovalRequestedEvent, DoneEvent
from turnkit.models.family import ModelFamily
from turnkit.runtime.logs import JsonLogFormatter
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonLogFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def json_lines() -> Iterator[_Lines]:
    handler, logger = _Lines(), logging.getLogger("turnkit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_a_turns_lines_name_it_and_the_span_they_were_written_in(
    runtime_factory: RuntimeFactory, otel: Telemetry, json_lines: _Lines
) -> None:
    broken = ProviderError("overloaded", status_code=503, is_retriable=True)
    first = ScriptedModel([ModelStep.cut("Partial ", broken)], name="first")
    second = ScriptedModel([ModelStep.text_reply("Hello.")], name="second")
    agent = Agent(model=ModelFamily("f", [first, second]), skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s-json", "hi"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    lines = [json.loads(line) for line in json_lines.lines]
    [fallback] = [line for line in lines if "model first failed" in line["message"]]
    [finished] = [line for line in lines if line["message"].startswith("finished turn")]
    for line in (fallback, finished):
        assert line["turn_id"] == done.turn_id
        assert line["session_id"] == "s-json"
        assert line["logger"] == "turnkit.runtime"
        assert line["time"].endswith("Z")
    [turn_span] = otel.named("invoke_agent")
    spans = {format(s.context.span_id, "016x"): s for s in otel.spans()}
    # Written while the model call failed: inside the turn's trace, in one of its spans.
    assert fallback["trace_id"] == format(turn_span.context.trace_id, "032x")
    assert spans[fallback["span_id"]].context.trace_id == turn_span.context.trace_id


def test_a_line_with_an_exception_stays_one_line() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("turnkit.x", logging.ERROR, __file__, 1, "it %s", ("broke",),
                                   exc_info=sys.exc_info())  # fmt: skip
    for tracebacks in (True, False):
        text = JsonLogFormatter(tracebacks=tracebacks).format(record)
        assert "\n" not in text
        line = json.loads(text)
        assert (line["level"], line["message"]) == ("ERROR", "it broke")
        assert line["error"] == "ValueError: bad\nvalue"
        assert ("traceback" in line) is tracebacks
        assert "turn_id" not in line
        assert "trace_id" not in line


def test_a_notice_written_in_pieces_is_one_json_line(json_lines: _Lines) -> None:
    from turnkit.cli._logs import notices

    said = notices("json")
    print("turnkit: OpenTelemetry on", "(console spans)", file=said)
    said.write("half a ")
    said.write("line\nand the rest")
    said.flush()
    messages = [json.loads(line)["message"] for line in json_lines.lines]
    assert messages == ["OpenTelemetry on (console spans)", "half a line", "and the rest"]


@tool(approval="always")
async def send_email(to: str) -> str:
    """Send an email (needs a person's approval)."""
    return f"sent to {to}"


async def test_a_turns_ending_line_joins_its_attempt_not_the_request_that_resumed_it(
    runtime_factory: RuntimeFactory, otel: Telemetry, json_lines: _Lines
) -> None:
    """`finished turn` is written once the attempt's span has ended: it still names it."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="ada@example.com")),
            ModelStep.text_reply("Sent."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[send_email]))
    events = await collect_events(runtime.execute_message("s1", "email Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    tracer = otel.tracer_provider.get_tracer("tests")
    with tracer.start_as_current_span("POST /approvals"):  # the approval route's request
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
    async with asyncio.timeout(10):
        async for _ in runtime.reader().follow(asked.turn_id):
            pass
        while len(otel.named("invoke_agent ")) < 2:
            await asyncio.sleep(0.01)
    lines = [json.loads(line) for line in json_lines.lines]
    finished = [line for line in lines if line["message"].startswith("finished turn")]
    assert [line["message"].split(": ")[1].split(" in ")[0] for line in finished] == [
        "awaiting_approval",
        "succeeded",
    ]
    for line, span in zip(finished, otel.named("invoke_agent "), strict=True):
        assert line["trace_id"] == format(span.context.trace_id, "032x")
        assert line["span_id"] == format(span.context.span_id, "016x")
