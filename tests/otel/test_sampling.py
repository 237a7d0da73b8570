"""A turn submitted by a process that traces nothing is sampled where it is driven."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent
from turnkit.otel import use_providers
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool(approval="always")
async def send_email(to: str) -> str:
    """Send an email (needs a person's approval)."""
    return f"sent to {to}"


async def _resumed_where_traced(
    tmp_path: Path, sampler: Sampler, *, answered_in: SpanContext | None = None
) -> tuple[str, list[ReadableSpan]]:
    """A turn paused with tracing off, resumed in a process sampling with `sampler` (the
    answer given inside `answered_in`, when set): its pinned traceparent and the spans kept.
    """
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 's.db'}")
    before = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    async with SessionRuntime(agent=Agent(model=before, tools=[send_email]), config=config) as rt:
        events = await collect_events(rt.execute_message("s1", "email Ada"))  # no tracing
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(root=sampler))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    meters = MeterProvider()
    after = Agent(model=ScriptedModel([ModelStep.text_reply("Done: sent.")]), tools=[send_email])
    with use_providers(provider, meters):
        async with SessionRuntime(agent=after, config=config) as rt:
            pinned = (await rt.turn(asked.turn_id)).pinned["traceparent"]
            current = NonRecordingSpan(answered_in) if answered_in else trace.INVALID_SPAN
            with trace.use_span(current):
                await rt.resume(asked.turn_id, asked.request_id, Approve())
            async with asyncio.timeout(20):
                while (await rt.turn(asked.turn_id)).status != "succeeded":
                    await asyncio.sleep(0.02)
    provider.shutdown()
    meters.shutdown()
    assert isinstance(pinned, str)
    return pinned, list(exporter.get_finished_spans())


@pytest.mark.parametrize(("sampler", "kept"), [(TraceIdRatioBased(0.0), False), (ALWAYS_ON, True)])
async def test_the_driving_process_samples_a_turn_whose_submitter_traced_nothing(
    tmp_path: Path, sampler: Sampler, kept: bool
) -> None:
    pinned, spans = await _resumed_where_traced(tmp_path, sampler)
    # A worker sampling nothing keeps nothing; one keeping all keeps the pinned trace.
    assert bool(spans) is kept
    assert all(f"{s.context.trace_id:032x}" in pinned for s in spans)


async def test_a_turn_whose_submitter_traced_nothing_is_sampled_as_a_trace_of_its_own(
    tmp_path: Path,
) -> None:
    """The driving process decides as its sampler does for a trace of its own, whatever
    span the code answering the pause runs in (here an upstream's unsampled request): the
    turn's trace is the pinned one, that span is only linked."""
    upstream = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0))
    _, spans = await _resumed_where_traced(tmp_path, ALWAYS_ON, answered_in=upstream)
    names = [s.name for s in spans]
    assert "invoke_agent assistant" in names, names  # every trace of its own is kept
