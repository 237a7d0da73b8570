"""Does a long-running process's memory grow? Many turns in one process, in batches.

Runs `--batches` batches of `--turns` turns each in ONE process (after a warm-up batch),
with a fake model (no network) and a mix of what a production server sees:

- plain answers; a tool call then the answer;
- Stop mid-answer: half by closing the stream (`aclose`), half with `runtime.cancel`;
- failed turns (the model raises a non-retriable `ProviderError`);
- pauses answered later (a tool needing approval, approved by a second call);
- readers that disconnect after a few events and reconnect with the cursor they had.

Each scenario runs with many sessions (one turn each) and with one long session:

- `sqlite`: `execute_message` on SQLite in a temporary directory, in-memory replay;
- `postgres`: the same on PostgreSQL (a schema of its own, dropped after) with the Redis
  replay buffer (`--database-url`, `--redis-url`; default from `TURNKIT_BENCH_POSTGRES_URL`
  and `TURNKIT_BENCH_REDIS_URL`, else the `TURNKIT_TEST_*` ones, skipped without them);
- `http`: the quickstart app under uvicorn in this process, driven over HTTP/SSE
  (execute, resume with `Last-Event-ID`, approve, cancel) by an httpx client.

After each batch it waits out the replay buffer's grace period, collects garbage and
records: RSS, live objects by type, asyncio tasks alive, the sizes of the runtime's
per-turn structures and (PostgreSQL) the Redis keys left under its prefix. Growth is the
slope from the first measured batch to the last (per turn). A short run shrinks two
bounded caches that take thousands of turns to fill (each SQLite connection's compiled
statements, 512; messages kept by value, 16,384) so that what it measures is what grows
without bound; `--full-caches` keeps their real sizes. `--trace` also traces the heap with
tracemalloc and prints the top growth by traceback (slow; its tables then count in RSS).

Run:  .venv/bin/python benchmarks/soak_memory.py [--turns 35] [--batches 3]
      [--scenarios sqlite,postgres,http,otel] [--database-url URL] [--redis-url URL]
      [--large] [--full-caches] [--trace] [--json PATH]
`--large`: 2,000 turns a batch, 8 batches (long). The default takes about two minutes.
Prints a table and writes JSON (default benchmarks/results/soak_memory.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import socket
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import _services

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from _patch import replace
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.context import transcript
from turnkit.errors import ProviderError
from turnkit.events import ApprovalRequestedEvent
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
    text_of,
)
from turnkit.pauses import Approve
from turnkit.replay import ReplayBuffer, ReplaySettings
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime.reader import Frame, KeepAlive
from turnkit.store import _sqlite as sqlite_store

GRACE_S = 0.1
"""The replay buffer's grace period for a finished turn (short, so a batch can wait it out)."""
KINDS = ("plain", "tool", "stop", "cancel", "fail", "approve", "reconnect")
ANSWER = "The answer, streamed in a few pieces so readers see deltas. " * 3
TRACE_FRAMES = 6
SMALL_CACHE = 32
"""A short run's size of the bounded caches that fill over thousands of turns (see main)."""


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(approval="always")
async def send_email(to: str) -> str:
    """Send an email (a person approves it first)."""
    return f"sent to {to}"


class SoakModel:
    """A fake model that acts on the last user message's first word (no state kept)."""

    model = "soak"
    provider = "soak"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        user = next((m for m in reversed(request.messages) if m.role == "user"), None)
        kind = text_of(user.content).split(" ", 1)[0] if user is not None else "plain"
        answered = request.messages and request.messages[-1].role == "tool"
        if request.purpose == "tool-loop" and not answered and kind in ("tool", "approve"):
            name, args = (
                ("lookup", '{"key": "k"}') if kind == "tool" else ("send_email", '{"to": "a"}')
            )
            yield ToolCallDelta(index=0, tool_call_id=f"c{id(request)}", name=name, arguments=args)
            yield Finish(stop_reason="tool_use", usage=Usage(input_tokens=10, output_tokens=5))
            return
        if kind == "fail" and request.purpose == "tool-loop":
            raise ProviderError("the soak model refuses", status_code=400, is_retriable=False)
        for start in range(0, len(ANSWER), 32):
            yield TextDelta(ANSWER[start : start + 32])
            await asyncio.sleep(0)
        if kind in ("stop", "cancel") and request.purpose == "tool-loop":
            await asyncio.Event().wait()  # until Stop cancels the call
        yield Finish(stop_reason="end_turn", usage=Usage(input_tokens=10, output_tokens=20))


def soak_agent() -> Agent:
    """The agent every scenario runs."""
    return Agent(model=SoakModel(), tools=[lookup, send_email])


# ── one turn of each kind, in process ───────────────────────────────────────────────


async def _drain(stream: AsyncIterator[Any]) -> list[Any]:
    events = []
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for event in stream:
            events.append(event)
    return events


async def _stop_mid_answer(runtime: SessionRuntime, session: str, message: str, kind: str) -> None:
    """`stop`: the reader goes away mid-answer (closing the stream is a Stop); `cancel`:
    Stop is pressed elsewhere while the stream is read."""
    stream = runtime.execute_message(session, message)
    async with contextlib.aclosing(stream):
        async for event in stream:
            if event.type == "message.delta":
                if kind == "stop":
                    break
                await runtime.cancel(event.turn_id)


async def _reconnect(runtime: SessionRuntime, session: str, message: str) -> None:
    """A detached turn; its reader drops after 3 events and comes back with its cursor."""
    submission = await runtime.start(session, message)
    seq = 0
    frames = runtime.reader().follow(submission.turn_id)
    stream = cast(AsyncGenerator[Frame | KeepAlive, None], frames)  # closed when it drops
    async with contextlib.aclosing(stream):
        async for frame in stream:
            if isinstance(frame, Frame) and frame.seq is not None:
                seq = frame.seq
                if seq >= 3:
                    break
    await _drain(runtime.reader().follow(submission.turn_id, after_seq=seq))


async def _one_in_process(runtime: SessionRuntime, session: str, kind: str, index: int) -> None:
    message = f"{kind} turn {index}"
    if kind in ("plain", "tool", "fail"):
        await _drain(runtime.execute_message(session, message))
    elif kind in ("stop", "cancel"):
        await _stop_mid_answer(runtime, session, message, kind)
    elif kind == "approve":  # pauses; answered later, followed with a reader
        events = await _drain(runtime.execute_message(session, message))
        asked = next(e for e in events if isinstance(e, ApprovalRequestedEvent))
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await _drain(runtime.reader().follow(asked.turn_id, after_seq=events[-1].seq))
    elif kind == "reconnect":
        await _reconnect(runtime, session, message)


# ── one turn of each kind, over HTTP ───────────────────────────────────────────────


async def _sse(
    response: Any, *, until: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """The events of an SSE response (stops early when `until` says so)."""
    events: list[dict[str, Any]] = []
    lines = response.extensions.setdefault("soak_lines", response.aiter_lines())
    async for line in lines:
        if line.startswith("data:"):
            event = json.loads(line[5:])
            event["_seq"] = event.get("seq")
            events.append(event)
            if until is not None and until(event):
                break
    return events


async def _one_http(client: Any, session: str, kind: str, index: int) -> None:
    api = "/api/harness"
    body = {"content": f"{kind} turn {index}"}
    url = f"{api}/sessions/{session}/execute"
    if kind in ("plain", "tool", "fail"):
        async with client.stream("POST", url, json=body) as response:
            await _sse(response)
    elif kind == "stop":  # the tab closes mid-answer (the turn goes on), then Stop is pressed
        async with client.stream("POST", url, json=body) as response:
            turn_id = response.headers["x-turn-id"]
            await _sse(response, until=lambda e: e["type"] == "message.delta")
        await client.post(f"{api}/turns/{turn_id}/cancel")
    elif kind == "cancel":
        async with client.stream("POST", url, json=body) as response:
            turn_id = response.headers["x-turn-id"]
            await _sse(response, until=lambda e: e["type"] == "message.delta")
            await client.post(f"{api}/turns/{turn_id}/cancel")
            await _sse(response)
    elif kind == "approve":
        async with client.stream("POST", url, json=body) as response:  # a paused stream waits
            events = await _sse(response, until=lambda e: e["type"] == "approval.requested")
        asked = events[-1]
        turn_id, request_id = asked["turn_id"], asked["request_id"]
        answer = await client.post(
            f"{api}/turns/{turn_id}/approvals/{request_id}", json={"decision": "approve"}
        )
        answer.raise_for_status()
        headers = {"Last-Event-ID": str(events[-1]["seq"])}
        async with client.stream(
            "GET", f"{api}/turns/{turn_id}/stream", headers=headers
        ) as response:
            await _sse(response)
    elif kind == "reconnect":
        async with client.stream("POST", url, json=body) as response:
            turn_id = response.headers["x-turn-id"]
            events = await _sse(response, until=lambda e: (e.get("seq") or 0) >= 3)
        seq = max(e.get("seq") or 0 for e in events)
        headers = {"Last-Event-ID": str(seq)}
        async with client.stream(
            "GET", f"{api}/turns/{turn_id}/stream", headers=headers
        ) as response:
            await _sse(response)


# ── measuring ────────────────────────────────────────────────────────────────────────


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _structures(runtime: SessionRuntime) -> dict[str, int]:
    """Sizes of the runtime's per-turn structures (private: this is a benchmark)."""
    sizes: dict[str, int] = {}
    replay = runtime.replay
    if isinstance(replay, InMemoryReplayBuffer):
        sizes["replay.turns"] = replay.turns
    sizes["held_transcript_bytes"] = runtime._held.size  # bounded: 64 MiB by default
    host: Any = runtime.host
    for name, obj in (("runtime", runtime), ("host", host)):
        for attr, value in vars(obj).items():
            if isinstance(value, dict | set | list) or hasattr(value, "__len__"):
                with contextlib.suppress(TypeError):
                    sizes[f"{name}.{attr}"] = len(value)
    return sizes


def _types() -> Counter[str]:
    """Live objects the collector tracks, by type."""
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _measure(runtime: SessionRuntime, turns_done: int) -> dict[str, Any]:
    gc.collect()
    traced, _peak = tracemalloc.get_traced_memory()
    types = _types()
    return {
        "turns": turns_done,
        "rss_kib": _rss_kib(),
        "traced_bytes": traced,
        "tasks": len(asyncio.all_tasks()),
        "gc_objects": sum(types.values()),
        "types": types,
        "structures": _structures(runtime),
    }


def _top_growth(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, turns: int
) -> list[dict[str, Any]]:
    """The tracebacks that grew most, with their turnkit frames."""
    keep = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
        tracemalloc.Filter(False, __file__, lineno=None, all_frames=False),  # its own counts
    ]
    diff = after.filter_traces(keep).compare_to(before.filter_traces(keep), "traceback")
    rows = []
    for stat in diff[:8]:
        if stat.size_diff <= 0:
            break
        frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback]
        ours = [
            f"{f.filename.split('turnkit/', 1)[-1]}:{f.lineno}"
            for f in stat.traceback
            if "/turnkit/" in f.filename
        ]
        rows.append(
            {
                "bytes_per_turn": stat.size_diff / turns,
                "count_diff": stat.count_diff,
                "where": frames[-1] if frames else "?",
                "turnkit_frames": ours[-4:],
            }
        )
    return rows


async def _settle() -> None:
    """Wait out the buffer's grace period and let stragglers end."""
    await asyncio.sleep(GRACE_S * 2 + 1.1)  # the in-memory buffer expires at most once a second


async def _soak(
    name: str,
    runtime: SessionRuntime,
    run_one: Callable[[str, str, int], Awaitable[None]],
    *,
    turns: int,
    batches: int,
    long_session: bool,
) -> dict[str, Any]:
    index = 0
    points: list[dict[str, Any]] = []
    snapshots: list[tracemalloc.Snapshot] = []
    started = time.perf_counter()
    for batch in range(batches + 1):  # batch 0 warms up
        for _ in range(turns):
            kind = KINDS[index % len(KINDS)]
            tag = name.split(",")[0]
            session = f"{tag}-long" if long_session else f"{tag}-{index}"
            await run_one(session, kind, index)
            index += 1
        await _settle()
        # Every turn started must have ended (a paused one was answered).
        point = _measure(runtime, index)
        replay: Any = runtime.replay
        if hasattr(replay, "client") and hasattr(replay, "prefix"):  # Redis: keys left over
            keys = [k async for k in replay.client.scan_iter(match=f"{replay.prefix}*", count=1000)]
            point["structures"]["redis.keys"] = len(keys)
        points.append(point)
        if tracemalloc.is_tracing():
            snapshots.append(tracemalloc.take_snapshot())
        print(
            f"  {name:28} batch {batch}: {index:6} turns  rss {point['rss_kib'] / 1024:7.1f} MiB  "
            f"traced {point['traced_bytes'] / 1e6:7.2f} MB  tasks {point['tasks']}",
            file=sys.stderr,
        )
        del snapshots[2:-1]  # the warm-up's, the first measured and the newest
    measured = points[1:]
    span = measured[-1]["turns"] - measured[0]["turns"]
    growth = {
        key: (measured[-1][key] - measured[0][key]) / span
        for key in ("traced_bytes", "tasks", "gc_objects")
    }
    growth["rss_bytes"] = (measured[-1]["rss_kib"] - measured[0]["rss_kib"]) * 1024 / span
    grew = {
        key: measured[-1]["structures"].get(key, 0) - value
        for key, value in measured[0]["structures"].items()
        if measured[-1]["structures"].get(key, 0) != value
    }
    first, last = measured[0].pop("types"), measured[-1].pop("types")
    for point in points:
        point.pop("types", None)
    grown_types = {t: (last[t] - first.get(t, 0)) / span for t, _ in (last - first).most_common(8)}
    return {
        "scenario": name,
        "types_per_turn": grown_types,
        "turns_measured": span,
        "seconds": time.perf_counter() - started,
        "per_turn": growth,
        "structures_grew": grew,
        "points": points,
        "top_growth": _top_growth(snapshots[1], snapshots[-1], span) if len(snapshots) > 2 else [],
    }


async def _sqlite_runtime(tmp: str) -> SessionRuntime:
    buffer = InMemoryReplayBuffer(ReplaySettings(terminal_grace_s=GRACE_S))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp}/soak.db")
    return SessionRuntime(agent=soak_agent(), config=config, replay=buffer)


async def _postgres_runtime(database_url: str, redis_url: str, schema: str) -> SessionRuntime:
    import redis.asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    buffer: ReplayBuffer = RedisReplayBuffer(
        aioredis.Redis.from_url(redis_url),
        settings=ReplaySettings(terminal_grace_s=GRACE_S),
        prefix=f"soak{os.getpid()}",
        owns_client=True,
    )
    config = RuntimeConfig(database_url=database_url, database_schema=schema)
    return SessionRuntime(agent=soak_agent(), config=config, replay=buffer)


async def _schema(database_url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def run_in_process(
    backend: str, args: argparse.Namespace, *, long_session: bool
) -> dict[str, Any]:
    """`execute_message` and friends, on one runtime."""
    name = f"{backend}, {'one session' if long_session else 'many sessions'}"
    with tempfile.TemporaryDirectory() as tmp:
        schema = f"tk_soak_{os.getpid()}_{int(long_session)}"
        if backend == "postgres":
            await _schema(args.database_url, f"CREATE SCHEMA {schema}")
            runtime = await _postgres_runtime(args.database_url, args.redis_url, schema)
        else:
            runtime = await _sqlite_runtime(tmp)
        try:
            async with runtime:
                await runtime.open()

                async def one(session: str, kind: str, index: int) -> None:
                    await _one_in_process(runtime, session, kind, index)

                return await _soak(
                    name,
                    runtime,
                    one,
                    turns=args.turns,
                    batches=args.batches,
                    long_session=long_session,
                )
        finally:
            if backend == "postgres":
                await _schema(args.database_url, f"DROP SCHEMA {schema} CASCADE")


async def run_http(args: argparse.Namespace, *, long_session: bool) -> dict[str, Any]:
    """The quickstart app under uvicorn in this process, over HTTP/SSE."""
    import httpx
    import uvicorn

    from turnkit.quickstart import create_app

    name = f"http, {'one session' if long_session else 'many sessions'}"
    with tempfile.TemporaryDirectory() as tmp:
        runtime = await _sqlite_runtime(tmp)
        app = create_app(runtime)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        serving = asyncio.create_task(server.serve())
        try:
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

                async def one(session: str, kind: str, index: int) -> None:
                    await _one_http(client, session, kind, index)

                return await _soak(
                    name,
                    runtime,
                    one,
                    turns=args.turns,
                    batches=args.batches,
                    long_session=long_session,
                )
        finally:
            server.should_exit = True
            await serving


def _install_otel() -> Any:
    """The OpenTelemetry SDK, spans dropped as they end and metrics read in memory."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class _Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_Drop()))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _write(out: Path, payload: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str))


def _print(results: list[dict[str, Any]]) -> None:
    print(f"\nmemory over a long run — {platform.python_version()} on {os.cpu_count()} cores\n")
    print(
        f"{'scenario':34} {'turns':>6} {'heap B/turn':>12} {'RSS B/turn':>11} "
        f"{'objects/turn':>13} {'tasks/turn':>11}"
    )

    def heap(value: float) -> str:
        return f"{value:.1f}" if tracemalloc.is_tracing() else "-"

    for r in results:
        g = r["per_turn"]
        print(
            f"{r['scenario']:34} {r['turns_measured']:6} {heap(g['traced_bytes']):>12} "
            f"{g['rss_bytes']:11.1f} {g['gc_objects']:13.3f} {g['tasks']:11.4f}"
        )
    print(
        "\n(RSS moves in allocator pages: over a few hundred turns its slope is noise; live"
        "\nobjects per turn and the structures below are what show a leak)"
    )
    for r in results:
        if r["structures_grew"]:
            print(f"\n{r['scenario']}: structures that grew: {r['structures_grew']}")
        grown = ", ".join(f"{t} {n:.2f}" for t, n in r["types_per_turn"].items() if n > 0.01)
        if grown:
            print(f"{r['scenario']}: objects per turn by type: {grown}")
    worst = max(results, key=lambda r: r["per_turn"]["traced_bytes"])
    if not worst["top_growth"]:
        return
    print(f"\ntop heap growth by traceback ({worst['scenario']}):")
    for row in worst["top_growth"]:
        print(
            f"  {row['bytes_per_turn']:9.1f} B/turn  {row['count_diff']:6} blocks  "
            f"{row['where']}  {' < '.join(reversed(row['turnkit_frames']))}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=35, help="turns per batch (5 of each kind)")
    parser.add_argument(
        "--batches", type=int, default=3, help="measured batches (after one warm-up)"
    )
    parser.add_argument(
        "--scenarios",
        default="sqlite,postgres,http",
        help="of sqlite, postgres, http, otel (sqlite with the OpenTelemetry SDK installed)",
    )
    parser.add_argument("--large", action="store_true", help="2,000 turns a batch, 8 batches")
    parser.add_argument(
        "--full-caches", action="store_true", help="keep the bounded caches at their real sizes"
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="tracemalloc the heap (slow; RSS then counts its own tables)",
    )
    parser.add_argument("--database-url", default=_services.GIVEN_POSTGRES_URL)
    parser.add_argument("--redis-url", default=_services.GIVEN_REDIS_URL)
    parser.add_argument(
        "--json", default=str(Path(__file__).parent / "results" / "soak_memory.json")
    )
    args = parser.parse_args()
    if args.batches < 2 or args.turns < 1:
        parser.error("--batches must be at least 2 (growth is between two), --turns at least 1")
    if args.large:
        args.turns, args.batches = 2000, 8
    elif (
        not args.full_caches
    ):  # bounded caches that take thousands of turns to fill: made small, so that
        # what a short run measures is what grows without bound
        replace(sqlite_store, "_CACHE_SIZE", SMALL_CACHE)  # 512 statements
        replace(transcript, "_CACHE_SIZE", SMALL_CACHE)  # 16,384 messages
    if args.trace:
        tracemalloc.start(TRACE_FRAMES)
    results = []
    scenarios = args.scenarios.split(",")
    if "otel" in scenarios:  # process-wide: every scenario after it runs with it too
        _install_otel()
        scenarios = ["otel", *(x for x in scenarios if x != "otel")]
    for scenario in scenarios:
        if scenario == "postgres" and not (args.database_url and args.redis_url):
            print("postgres: skipped (no --database-url / --redis-url)", file=sys.stderr)
            continue
        for long_session in (False, True):
            if scenario == "otel":
                result = await run_in_process("sqlite", args, long_session=long_session)
                result["scenario"] = result["scenario"].replace("sqlite", "sqlite + OTel SDK")
                results.append(result)
            elif scenario == "http":
                results.append(await run_http(args, long_session=long_session))
            else:
                results.append(await run_in_process(scenario, args, long_session=long_session))
    _print(results)
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "turns_per_batch": args.turns,
        "batches": args.batches,
        "kinds": KINDS,
        "results": results,
    }
    _write(Path(args.json), payload)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
