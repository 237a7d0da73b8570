"""One trace per turn: the trace context pinned at submit, and each attempt's spans.

Every attempt of a turn (the first run, a resume after a pause, a takeover after a crash)
opens an `invoke_agent {agent}` span whose parent is the context stored when the message
was submitted, so all attempts of a turn land in one trace, whichever process runs them.
Stage spans open and close as the attempt's `step.start` / `step.end` events commit.
"""

from __future__ import annotations

import random
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextvars import Token
from typing import Any, Final

from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from turnkit.events import (
    DoneEvent,
    DurableEvent,
    TurnRecoveringEvent,
)
from turnkit.otel._state import Active, active
from turnkit.states import awaiting
from turnkit.store import Lease, TurnRecord
from turnkit.telemetry import Recorder

__all__ = (
    "TurnTrace",
    "attempt",
    "note_resume",
    "resume_cause",
    "stage_ended",
    "stage_span",
    "stage_started",
    "submit_trace",
    "submit_traceparent",
)

_PROPAGATOR = TraceContextTextMapPropagator()
_TURNS: weakref.WeakKeyDictionary[Recorder, _LiveTurn] = weakref.WeakKeyDictionary()
"""The live attempt trace of each watched Recorder (stages find their parent span here)."""

OnCommit = Callable[[Sequence[DurableEvent]], Awaitable[None]]


INVENTED: Final = "trace_invented"
"""The pinned key saying the turn's `traceparent` was made up by a process that traces
nothing: whoever drives the turn samples it as a trace of its own (`_decided_here`)."""


def submit_trace(*, session_id: str, agent: str) -> dict[str, Any]:
    """What a new turn pins of its trace: its W3C `traceparent` (and `INVENTED`).

    The current span's, if there is one (an HTTP request, the caller's own span). Else,
    with tracing on, a `turnkit.submit` span marks the submission and roots the trace
    (named by its session and agent: not by the turn, since a retried request is answered
    with the turn it made the first time); with it off, fresh random ids, pinned as
    `INVENTED`, so processes that do trace still share one trace.
    """
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        found = active()
        if found is None:
            trace_id, span_id = random.getrandbits(128) or 1, random.getrandbits(64) or 1
            return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01", INVENTED: True}
        span = found.tracer.start_span(
            "turnkit.submit",
            kind=SpanKind.INTERNAL,
            attributes={"gen_ai.conversation.id": session_id, "gen_ai.agent.name": agent},
        )
        span.end()
        current = span.get_span_context()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(current)))
    return {"traceparent": carrier["traceparent"]}


def submit_traceparent(*, session_id: str, agent: str) -> str:
    """The W3C `traceparent` a new turn is pinned to (`submit_trace`'s)."""
    return str(submit_trace(session_id=session_id, agent=agent)["traceparent"])


class TurnTrace:
    """An attempt's trace; this base is the no-op used when no provider is configured."""

    def watch(self, recorder: Recorder, then: OnCommit | None = None) -> None:
        """Observe what `recorder` commits, then hand it to `then` (plugins' `on_event`)."""
        if then is not None:
            recorder.on_commit = then

    def held(self, seconds: float) -> None:
        """The attempt waited `seconds` for its stream's opening before its first step."""

    def ids(self) -> tuple[str, str] | None:
        """The attempt span's trace id (32 hex digits) and span id (16); None untraced.

        For a log line about the attempt written after its span ended (its ending).
        """
        return None

    def end(self, recorder: Recorder | None, *, lease_lost: bool) -> None:
        """The attempt is over: close its spans and count its outcome."""


NO_TURN = TurnTrace()


_CAUSES: OrderedDict[str, SpanContext] = OrderedDict()
"""Per turn, the span that answered its pause in this process (the newest 1,000)."""


def resume_cause() -> SpanContext | None:
    """The span of the code answering a pause (None without tracing or a current span)."""
    if active() is None:
        return None
    current = trace.get_current_span().get_span_context()
    return current if current.is_valid else None


def note_resume(turn_id: str, cause: SpanContext | None) -> None:
    """A pause of `turn_id` was answered here, in `cause`: link the attempt that follows.

    Called once the answer is stored (a second answer refused leaves the first's link).
    Whichever task of this process drives that attempt (the request's own, the recovery
    loop's) links to `cause`; an entry no attempt here takes is dropped after 1,000 more.
    """
    if cause is None:
        return
    _CAUSES[turn_id] = cause
    _CAUSES.move_to_end(turn_id)
    while len(_CAUSES) > 1000:
        _CAUSES.popitem(last=False)


def attempt(record: TurnRecord, lease: Lease, traceparent: str | None) -> TurnTrace:
    """Start the attempt's `invoke_agent` span (a no-op without a provider)."""
    found = active()
    if found is None:
        return NO_TURN
    return _LiveTurn(found, record, lease, traceparent)


def stage_started(recorder: Recorder, stage: str, iteration: int | None) -> None:
    """A stage began in the attempt `recorder` belongs to: its span, with its iteration.

    Called by the graph as the stage runs, not only when its `step.start` commits: a stage
    that runs again after a pause commits no second `step.start`.
    """
    turn = _TURNS.get(recorder)
    if turn is not None:
        span = turn.stage(stage, fresh=True)
        if iteration is not None:
            span.set_attribute("turnkit.iteration", iteration)


def stage_ended(recorder: Recorder, stage: str) -> None:
    """A stage's work is done: its span ends now, not when its `step.end` commits.

    Where a stage's events ride on the next checkpoint (PostgreSQL), the commit comes while
    the next stage already runs.
    """
    turn = _TURNS.get(recorder)
    if turn is not None:
        turn.end_stage(stage)


def stage_span(recorder: Recorder, stage: str) -> Span | None:
    """The open span of `stage` in the attempt `recorder` belongs to (opened if needed)."""
    turn = _TURNS.get(recorder)
    return turn.stage(stage) if turn is not None else None


def _decided_here(found: Active, parent: Context, agent: str) -> Context:
    """`parent`, sampled as this process's sampler samples a trace of its own.

    The submitter traced nothing, so its sampled flag is no decision: a parent-based
    sampler here (the SDK's default) would follow it and keep every such turn, whatever
    ratio it was given.
    """
    invented = trace.get_current_span(parent).get_span_context()
    sampler = getattr(found.tracer, "sampler", None)
    if sampler is None:  # not the SDK's tracer: it samples as it does
        return parent
    # An empty context, not None: a parent-based sampler given None reads the current
    # span (say, the request answering a pause) and follows its flag, not its root's.
    decision = sampler.should_sample(Context(), invented.trace_id, f"invoke_agent {agent}")
    flags = TraceFlags(TraceFlags.SAMPLED if decision.decision.is_sampled() else TraceFlags.DEFAULT)
    decided = SpanContext(invented.trace_id, invented.span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(decided))


class _LiveTurn(TurnTrace):
    def __init__(
        self, found: Active, record: TurnRecord, lease: Lease, traceparent: str | None
    ) -> None:
        self.found = found
        self.turn_id = record.turn_id
        self.agent = record.agent
        parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        if parent is not None and record.pinned.get(INVENTED) is True:
            parent = _decided_here(found, parent, record.agent)
        current = _CAUSES.pop(record.turn_id, None) or trace.get_current_span().get_span_context()
        stored = trace.get_current_span(parent).get_span_context() if parent else None
        links = (
            [Link(current, {"turnkit.link": "caused_by"})]
            if current.is_valid and (stored is None or current.trace_id != stored.trace_id)
            else None
        )
        self.span = found.tracer.start_span(
            f"invoke_agent {record.agent}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": record.agent,
                "gen_ai.conversation.id": record.session_id,
                "gen_ai.request.model": record.model,
                "turnkit.turn_id": record.turn_id,
                "turnkit.attempt": lease.attempt,
            },
            links=links,
        )
        version = record.pinned.get("agent_version")
        if isinstance(version, str):
            self.span.set_attribute("gen_ai.agent.version", version)
        self.token: Token[Context] = otel_context.attach(trace.set_span_in_context(self.span))
        self.open: tuple[str, Span] | None = None
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.done: DoneEvent | None = None
        self.ended = False

    def watch(self, recorder: Recorder, then: OnCommit | None = None) -> None:
        _TURNS[recorder] = self

        async def observe(events: Sequence[DurableEvent]) -> None:
            self.saw(events)
            if then is not None:
                await then(events)

        recorder.on_commit = observe

    def saw(self, events: Sequence[DurableEvent]) -> None:
        """Committed events: stage brackets, recoveries, the ending."""
        if events:
            if self.first_seq is None:
                self.first_seq = events[0].seq
            self.last_seq = events[-1].seq
        for event in events:  # stage spans open and end with the stages' work, not here
            if isinstance(event, DoneEvent):
                self.done = event
            elif isinstance(event, TurnRecoveringEvent):
                self.span.set_attribute("turnkit.recovered", True)
                self.span.set_attribute("turnkit.recovery.cause", event.cause)
                self.found.recoveries.add(
                    1, {"gen_ai.agent.name": self.agent, "turnkit.recovery.cause": event.cause}
                )

    def held(self, seconds: float) -> None:
        self.span.set_attribute("turnkit.held_ms", round(seconds * 1000, 3))

    def ids(self) -> tuple[str, str] | None:
        context = self.span.get_span_context()
        if not context.is_valid:
            return None
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    def stage(self, name: str, *, fresh: bool = False) -> Span:
        """The open span of stage `name`; a new one when `fresh` (the stage starts again)."""
        if self.ended:  # work the attempt left running (a background call): no new stage
            return self.span
        if self.open is not None:
            if self.open[0] == name and not fresh:
                return self.open[1]
            self._close_stage(None)
        span = self.found.tracer.start_span(
            f"stage {name}",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.INTERNAL,
            attributes={"turnkit.stage": name, "turnkit.turn_id": self.turn_id},
        )
        self.open = (name, span)
        return span

    def end_stage(self, name: str) -> None:
        """End the open span of stage `name`, if it is the one open."""
        if self.open is not None and self.open[0] == name:
            self._close_stage(None)

    def _close_stage(self, error: str | None) -> None:
        assert self.open is not None
        span = self.open[1]
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()
        self.open = None

    def end(self, recorder: Recorder | None, *, lease_lost: bool) -> None:
        if self.ended:
            return
        self.ended = True
        outcome, error = self._outcome(recorder, lease_lost)
        if self.open is not None:
            self._close_stage(error)
        span = self.span
        span.set_attribute("turnkit.outcome", outcome)
        if self.first_seq is not None and self.last_seq is not None:
            span.set_attribute("turnkit.seq.first", self.first_seq)
            span.set_attribute("turnkit.seq.last", self.last_seq)
        if recorder is not None:
            usage = recorder.usage
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
            span.set_attribute("turnkit.cost_usd", usage.cost_usd)
        attributes: dict[str, Any] = {"gen_ai.agent.name": self.agent, "turnkit.outcome": outcome}
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
            attributes["error.type"] = error
        span.end()
        self.found.turns.add(1, attributes)
        otel_context.detach(self.token)

    def _outcome(self, recorder: Recorder | None, lease_lost: bool) -> tuple[str, str | None]:
        """What this attempt ended in, and the error type if it failed."""
        if self.done is not None:
            status = self.done.status
            failed = status in ("failed", "timed_out")
            return status, (self.done.error_code or status) if failed else None
        if lease_lost:
            return "lease_lost", None
        pause = recorder.notes.pending_pause if recorder is not None else None
        if pause is not None:
            return awaiting(pause.kind), None
        return "ended", None
