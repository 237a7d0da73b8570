"""What OpenTelemetry costs a turn: no provider, providers installed, instrumentation stubbed.

One runtime on one SQLite file runs the same tool-using turn (2 model calls on a
zero-latency ScriptedModel + 1 tool) under four set-ups, interleaved round by round so
machine noise lands on all of them alike:

- `stubbed`: turnkit's instrumentation entry points replaced by functions that return the
  no-op objects at once (the closest thing to a build without instrumentation);
- `no provider`: the shipped code with no tracer or meter provider (the default);
- `sdk, in-memory`: the SDK's TracerProvider with a SimpleSpanProcessor into an
  InMemorySpanExporter, and a MeterProvider with an InMemoryMetricReader;
- `sdk, batch`: a BatchSpanProcessor into an exporter that drops the spans (what an OTLP
  set-up does on the turn's path, minus the network).

Run:  .venv/bin/python benchmarks/otel_overhead.py [--turns 300] [--rounds 10] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/otel_overhead.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import turnkit.otel
import turnkit.runtime.driver

# The same tool-using turn the turn-overhead benchmark measures (run as a script, this
# folder is on the path).
from _patch import patched
from turn_overhead import _reply, add
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import DoneEvent
from turnkit.models import ModelRequest, ToolCallPart
from turnkit.otel import ChatTrace, TurnTrace, use_providers
from turnkit.otel._chat import NO_CHAT, ToolOutcome
from turnkit.otel._turn import INVENTED, NO_TURN
from turnkit.store import Lease, TurnRecord
from turnkit.telemetry import Recorder
from turnkit.testing import ModelStep, ScriptedModel


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_CALLS: Counter[str] = Counter()
"""How often each stub ran: one that never runs replaces a name the runtime no longer calls."""


def _attempt(record: TurnRecord, lease: Lease, traceparent: str | None) -> TurnTrace:
    _CALLS["attempt"] += 1
    return NO_TURN


def _chat(recorder: Recorder, stage: str, family: str, request: ModelRequest) -> ChatTrace:
    _CALLS["chat"] += 1
    return NO_CHAT


def _traced_tool(
    recorder: Recorder, call: ToolCallPart, run: Awaitable[ToolOutcome], *, in_doubt: bool = False
) -> Awaitable[ToolOutcome]:
    _CALLS["traced_tool"] += 1
    return run


def _submit_trace(*, session_id: str, agent: str) -> dict[str, Any]:
    _CALLS["submit_trace"] += 1
    return {"traceparent": _TRACEPARENT, INVENTED: True}


def _stage_started(recorder: Recorder, stage: str, iteration: int | None) -> None:
    _CALLS["stage_started"] += 1


def _stage_ended(recorder: Recorder, stage: str) -> None:
    _CALLS["stage_ended"] += 1


if TYPE_CHECKING:  # each stub has the signature of what it replaces
    turnkit.otel.attempt = _attempt
    turnkit.otel.chat = _chat
    turnkit.otel.traced_tool = _traced_tool
    turnkit.otel.submit_trace = _submit_trace
    turnkit.otel.stage_started = _stage_started
    turnkit.otel.stage_ended = _stage_ended

_STUBS: list[tuple[ModuleType, str, Callable[..., object]]] = [
    (turnkit.runtime.driver, "attempt", _attempt),  # imported by name there
    (turnkit.otel, "chat", _chat),
    (turnkit.otel, "traced_tool", _traced_tool),
    (turnkit.otel, "submit_trace", _submit_trace),
    (turnkit.otel, "stage_started", _stage_started),
    (turnkit.otel, "stage_ended", _stage_ended),
]
"""The instrumentation entry points a turn calls, where the runtime looks them up."""


@contextmanager
def _stubbed() -> Iterator[None]:
    with ExitStack() as stack:
        for owner, name, stub in _STUBS:
            stack.enter_context(patched(owner, name, stub))
        yield


def _check_stubs_ran() -> None:
    """Fail if a stub never ran: the runtime calls something else now, unstubbed."""
    idle = [f"{owner.__name__}.{name}" for owner, name, _ in _STUBS if not _CALLS[name]]
    if idle:
        raise RuntimeError(f"stubs never called (the runtime no longer calls them): {idle}")


def _contenders() -> tuple[list[tuple[str, Callable[[], AbstractContextManager[None]]]], Any]:
    memory = InMemorySpanExporter()
    in_memory = TracerProvider()
    in_memory.add_span_processor(SimpleSpanProcessor(memory))
    batch = TracerProvider()
    batch.add_span_processor(BatchSpanProcessor(_Drop()))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    setups: list[tuple[str, Callable[[], AbstractContextManager[None]]]] = [
        ("stubbed (no instrumentation)", _stubbed),
        ("no provider (default)", nullcontext),
        ("sdk, in-memory exporter", lambda: use_providers(in_memory, meters)),
        ("sdk, batch processor", lambda: use_providers(batch, meters)),
    ]

    def close() -> None:
        memory.clear()
        in_memory.shutdown()
        batch.shutdown()
        meters.shutdown()

    return setups, (memory, close)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20)
    default_json = Path(__file__).parent / "results" / "otel_overhead.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()

    model = ScriptedModel([ModelStep.respond(_reply)], repeat_last=True)
    agent = Agent(model=model, tools=[add], skip_stages=frozenset({"anchor-plan"}))
    setups, (memory, close) = _contenders()
    with tempfile.TemporaryDirectory() as tmp:
        runtime = SessionRuntime(
            agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{Path(tmp) / 'o.db'}")
        )
        await runtime.open()

        async def turn(i: int) -> int:
            n = 0
            async for event in runtime.execute_message(f"s-{i}", "What is 2 + 3?"):
                n += 1
                if isinstance(event, DoneEvent) and event.status != "succeeded":
                    raise RuntimeError(f"turn ended {event.status}: {event.error_code}")
            model.calls.clear()
            return n

        try:
            for _, setup in setups:
                with setup():
                    for i in range(args.warmup):
                        await turn(10_000_000 + i)
            wall: dict[str, list[float]] = {name: [] for name, _ in setups}
            cpu: dict[str, float] = dict.fromkeys(wall, 0.0)
            per_round, counter = max(1, args.turns // args.rounds), 0
            for r in range(args.rounds):
                order = setups[r % len(setups) :] + setups[: r % len(setups)]
                for name, setup in order:
                    memory.clear()
                    gc.collect()
                    with setup():
                        cpu0 = time.process_time()
                        for _ in range(per_round):
                            counter += 1
                            t0 = time.perf_counter()
                            await turn(counter)
                            wall[name].append((time.perf_counter() - t0) * 1000)
                        cpu[name] += time.process_time() - cpu0
        finally:
            await runtime.close()
            close()
    _check_stubs_ran()
    _report(args, [name for name, _ in setups], wall, cpu)


def _report(
    args: argparse.Namespace, names: list[str], wall: dict[str, list[float]], cpu: dict[str, float]
) -> None:
    base = statistics.median(wall[names[0]])
    base_cpu = cpu[names[0]] / len(wall[names[0]])
    results = []
    print(
        f"\notel overhead — Python {platform.python_version()} on {os.cpu_count()} cores, "
        f"{args.turns} turns each in {args.rounds} interleaved rounds\n"
    )
    print(
        f"{'set-up':32} {'median ms':>10} {'p90 ms':>8} {'cpu ms':>8} {'Δ median':>10} {'Δ cpu':>8}"
    )
    for name in names:
        times = sorted(wall[name])
        median, cpu_ms = statistics.median(times), cpu[name] * 1000 / len(times)
        row = {
            "name": name,
            "turns": len(times),
            "median_ms": median,
            "p90_ms": times[int(len(times) * 0.9) - 1],
            "cpu_ms_per_turn": cpu_ms,
            "delta_median_ms": median - base,
            "delta_cpu_ms": cpu_ms - base_cpu * 1000,
        }
        results.append(row)
        print(
            f"{name:32} {median:10.3f} {row['p90_ms']:8.3f} {cpu_ms:8.3f} "
            f"{row['delta_median_ms']:+10.3f} {row['delta_cpu_ms']:+8.3f}"
        )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "turn": "tool-loop with 2 model calls + 1 tool, SQLite, sync checkpoints",
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
