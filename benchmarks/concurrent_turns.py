"""A thousand turns at once in one process, against bare LangGraph on the same fake model.

Every contender runs the turn-overhead benchmark's tool-using turn (two model calls and a
tool), but its model waits `--latency` seconds (default 0.2) before each call's chunks, as
a provider would. `--turns` turns (each its own session) start together; the contender
reads every event of every turn. Reported per contender:

- turns/s: turns over the wall time from the first start to the last `done`;
- turn p50 / p99: each turn's own wall time (two model calls are 0.4 s of it);
- CPU ms per turn under load, and the same turn run one at a time (`--sequential` turns)
  in the same process: the ratio is what concurrency costs per turn;
- event lag p99: when the reader got an event minus the event's own `ts` (its creation),
  over every event and over all but `turn.started` (whose lag is its message's commit, and
  all the messages arrive in one burst);
- peak RSS, and its growth over the process after warming up.

Then, once per round in a fresh interpreter, *admission alone*: the same number of
messages submitted at once to a turnkit runtime that runs none of their turns (each
message, its queued turn and its `turn.started` committed, nothing else in the process).
It reports the CPU each message costs and when each is committed after they all arrived:
a lower bound on `turn.started`'s lag in the burst above, whatever the turns then cost.

Each contender runs in a fresh interpreter (its own memory), in an order that rotates
over `--rounds`; ratios are against bare LangGraph in the same round, reported as the
median and min–max over rounds. `--gc tuned` runs every contender as `turnkit serve` and
`turnkit worker` run (start-up objects frozen, thresholds `GC_THRESHOLDS`); the default
keeps Python's collector. Either way the time spent collecting under load is reported.
turnkit runs three times: as it is (every turn driven at once); with
`max_running_turns=64` (the rest wait queued), to show what bounding the running turns
buys and costs; and with one transaction per commit (group commit off), to show what
committing many turns' writes together buys. The durable floor (the turn-overhead
benchmark's: events committed before they are sent, LangGraph's `SqliteSaver` in place,
nothing else) bounds what any durable runtime on LangGraph can reach.

Run:  .venv/bin/python benchmarks/concurrent_turns.py [--turns 1000] [--latency 0.2]
      [--rounds 3] [--sequential 30] [--gc python|tuned] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/concurrent_turns.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _procs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The turn-overhead benchmark's turn (run as a script, this folder is on the path).
import turn_overhead
from turn_overhead import _langgraph_graph, _reply, add, write_json
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.cli import GC_THRESHOLDS
from turnkit.events import DoneEvent
from turnkit.models import ModelChunk, ModelRequest
from turnkit.testing import ModelStep, ScriptedModel

CONTENDERS = (
    "bare LangGraph",
    "durable floor",
    "turnkit, SQLite",
    "turnkit, SQLite, at most 64 running",
    "turnkit, SQLite, no group commit",
)
BOUND = 64
"""`max_running_turns` of the bounded contender: about what one core keeps busy when a
turn costs ~10 ms of CPU and waits 0.4 s on its model (Little's law: 100/s × 0.5 s)."""
RunOne = Callable[[int, list[float]], Awaitable[None]]
_GROUPS: list[Any] = []
"""The store's group committer of a turnkit contender (for its batch sizes)."""


class _SlowModel:
    """ScriptedModel's chunks, after `latency` seconds (as a provider's first byte)."""

    def __init__(self, latency: float) -> None:
        self.inner = ScriptedModel([ModelStep.respond(_reply)], repeat_last=True)
        self.latency = latency

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def provider(self) -> str:
        return self.inner.provider

    async def first_byte(self) -> None:
        """Wait as a provider does before its first chunk."""
        await asyncio.sleep(self.latency)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await self.first_byte()
        async for chunk in self.inner.stream(request):
            yield chunk
        self.inner.calls.clear()  # the call log would grow with every turn


_STARTED: list[float] = []
"""Lags of `turn.started` events (each message's commit, all sent in one burst)."""


def _lag(event: Any, lags: list[float]) -> None:
    ts = getattr(event, "ts", None)
    if isinstance(ts, datetime):
        lag = (datetime.now(UTC) - ts).total_seconds() * 1000
        lags.append(lag)
        if getattr(event, "type", None) == "turn.started":
            _STARTED.append(lag)


async def _langgraph(latency: float, tmp: Path) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    return await _on_langgraph(latency, _langgraph_graph(), {})


async def _durable_floor(latency: float, tmp: Path) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    """The turn-overhead benchmark's durable floor: event commits and LangGraph's SqliteSaver."""
    saver = turn_overhead._in_place_sqlite_saver(tmp / "floor.checkpoints.db")
    graph = _langgraph_graph(saver, commit=turn_overhead._raw_event_log(tmp / "floor.db"))
    return await _on_langgraph(latency, graph, {"durability": "sync"})


async def _on_langgraph(
    latency: float, graph: Any, options: dict[str, Any]
) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    original = turn_overhead._fake_stream

    async def slow_stream(kind: str) -> AsyncIterator[tuple[str, Any]]:
        await asyncio.sleep(latency)
        async for chunk in original(kind):
            yield chunk

    turn_overhead._fake_stream = slow_stream

    async def run(i: int, lags: list[float]) -> None:
        config = {"configurable": {"thread_id": f"t{i}"}}
        state = {"transcript": [{"role": "user", "content": "2+3?"}], "route": "", "turn": i}
        async for event in graph.astream(state, config, stream_mode="custom", **options):
            _lag(event, lags)

    async def close() -> None:
        turn_overhead._fake_stream = original

    return run, close


async def _runtime(latency: float, tmp: Path, **config: Any) -> SessionRuntime:
    """An open turnkit runtime on SQLite in `tmp`, driving the benchmark's agent."""
    agent = Agent(model=_SlowModel(latency), tools=[add], skip_stages=frozenset({"anchor-plan"}))
    runtime = SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{tmp / 'tk.db'}", **config)
    )
    await runtime.open()
    return runtime


def _tune_gc(gc_mode: str) -> None:
    """Collect, then (`tuned`) collect as `turnkit serve` and `turnkit worker` do."""
    gc.collect()
    if gc_mode == "tuned":
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)


async def _turnkit(
    latency: float, tmp: Path, **config: Any
) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    runtime = await _runtime(latency, tmp, **config)
    _GROUPS.append(getattr(runtime.store, "_group", None))

    async def run(i: int, lags: list[float]) -> None:
        async for event in runtime.execute_message(f"s-{i}", "What is 2 + 3?"):
            _lag(event, lags)
            if isinstance(event, DoneEvent) and event.status != "succeeded":
                raise RuntimeError(f"benchmark turn ended {event.status}: {event.error_code}")

    return run, runtime.close


async def _turnkit_alone(latency: float, tmp: Path) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    """turnkit with one transaction per commit, as before group commit."""
    import turnkit.store._group_commit as group_commit

    group_commit.MAX_BATCH = 1
    group_commit.BEHIND_SHARE = 0  # running turns' writes first, one transaction each
    return await _turnkit(latency, tmp)


async def _turnkit_bounded(
    latency: float, tmp: Path
) -> tuple[RunOne, Callable[[], Awaitable[None]]]:
    """turnkit driving at most `BOUND` turns at once; the rest wait queued."""
    return await _turnkit(latency, tmp, max_running_turns=BOUND)


BUILDERS = {
    "bare LangGraph": _langgraph,
    "durable floor": _durable_floor,
    "turnkit, SQLite": _turnkit,
    "turnkit, SQLite, at most 64 running": _turnkit_bounded,
    "turnkit, SQLite, no group commit": _turnkit_alone,
}


class _GcClock:
    """Wall time spent in the collector (it holds the GIL, so it is CPU this process spent)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


async def one(
    name: str, turns: int, latency: float, sequential: int, gc_mode: str
) -> dict[str, Any]:
    """Measure one contender in this process."""
    tmp = Path(tempfile.mkdtemp())
    run, close = await BUILDERS[name](latency, tmp)
    clock = _GcClock()
    try:
        for i in range(5):  # warm up
            await run(10_000_000 + i, [])
        _tune_gc(gc_mode)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu0 = time.process_time()
        for i in range(sequential):
            await run(20_000_000 + i, [])
        sequential_cpu = (time.process_time() - cpu0) * 1000 / max(1, sequential)

        lags: list[float] = []
        durations: list[float] = []
        _STARTED.clear()

        async def timed(i: int) -> None:
            t0 = time.perf_counter()
            await run(i, lags)
            durations.append((time.perf_counter() - t0) * 1000)

        gc.collect()
        group = _GROUPS[0] if _GROUPS else None
        before = (group.committed, group.batches) if group is not None else (0, 0)
        cpu0, wall0, gc0 = time.process_time(), time.perf_counter(), clock.seconds
        await asyncio.gather(*(timed(i) for i in range(turns)))
        wall = time.perf_counter() - wall0
        loaded_cpu = (time.process_time() - cpu0) * 1000 / turns
        gc_ms = (clock.seconds - gc0) * 1000 / turns
        if group is not None:  # writes that went to the store's thread, per transaction there
            committed, batches = group.committed - before[0], group.batches - before[1]
            per_transaction = committed / batches if batches else 0.0
        else:
            per_transaction = None
    finally:
        await close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    durations.sort()
    lags.sort()
    started = sorted(_STARTED)
    rest = sorted(set_difference(lags, started))
    return {
        "name": name,
        "turns": turns,
        "turns_per_s": turns / wall,
        "turn_p50_ms": statistics.median(durations),
        "turn_p99_ms": durations[int(len(durations) * 0.99) - 1],
        "cpu_ms_per_turn_loaded": loaded_cpu,
        "cpu_ms_per_turn_sequential": sequential_cpu,
        "cpu_loaded_over_sequential": loaded_cpu / sequential_cpu,
        "gc_ms_per_turn_loaded": gc_ms,
        "event_lag_p50_ms": statistics.median(lags),
        "event_lag_p99_ms": lags[int(len(lags) * 0.99) - 1],
        "started_lag_p99_ms": started[int(len(started) * 0.99) - 1] if started else None,
        "rest_lag_p99_ms": rest[int(len(rest) * 0.99) - 1],
        "peak_rss_mib": peak / 1024,
        "rss_growth_mib": (peak - rss_before) / 1024,
        "thread_writes_per_transaction": per_transaction,
    }


async def admission(messages: int, gc_mode: str) -> dict[str, Any]:
    """Admit `messages` messages at once (no turn run); when each is committed."""
    runtime = await _runtime(0.0, Path(tempfile.mkdtemp()))
    try:
        for i in range(20):  # warm up
            await runtime.submit(f"w-{i}", "What is 2 + 3?")
        _tune_gc(gc_mode)
        cpu0 = time.process_time()
        for i in range(messages):
            await runtime.submit(f"alone-{i}", "What is 2 + 3?")
        alone = (time.process_time() - cpu0) * 1000 / messages

        committed: list[float] = []

        async def submit(i: int) -> None:
            await runtime.submit(f"burst-{i}", "What is 2 + 3?")
            committed.append(time.perf_counter())

        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(submit(i) for i in range(messages)))
        at_once = (time.process_time() - cpu0) * 1000 / messages
    finally:
        await runtime.close()
    after = sorted((t - wall0) * 1000 for t in committed)
    return {
        "messages": messages,
        "cpu_ms_per_message_alone": alone,
        "cpu_ms_per_message_at_once": at_once,
        "committed_p50_ms": statistics.median(after),
        "committed_p99_ms": after[int(len(after) * 0.99) - 1],
        "committed_last_ms": after[-1],
    }


def set_difference(values: list[float], removed: list[float]) -> list[float]:
    """`values` without one occurrence of each of `removed` (a multiset difference)."""
    left = Counter(removed)
    kept = []
    for value in values:
        if left[value]:
            left[value] -= 1
        else:
            kept.append(value)
    return kept


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=30)
    parser.add_argument("--gc", choices=("python", "tuned"), default="python")
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--admission", action="store_true", help=argparse.SUPPRESS)
    default_json = Path(__file__).parent / "results" / "concurrent_turns.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()
    if args.one:
        result = asyncio.run(one(args.one, args.turns, args.latency, args.sequential, args.gc))
        print(json.dumps(result))
        return
    if args.admission:
        print(json.dumps(asyncio.run(admission(args.turns, args.gc))))
        return

    rounds: list[dict[str, dict[str, Any]]] = []
    admitted: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
        got: dict[str, dict[str, Any]] = {}
        for name in order:
            out = subprocess.run(
                [sys.executable, __file__, "--one", name, "--turns", str(args.turns),
                 "--latency", str(args.latency), "--sequential", str(args.sequential),
                 "--gc", args.gc],
                check=True, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            got[name] = json.loads(out.stdout.strip().splitlines()[-1])
        rounds.append(got)
        out = subprocess.run(
            [sys.executable, __file__, "--admission", "--turns", str(args.turns), "--gc", args.gc],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        admitted.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}: " + ", ".join(
            f"{n} {got[n]['turns_per_s']:.0f} turns/s" for n in CONTENDERS
        ))  # fmt: skip

    metrics = ("turns_per_s", "turn_p50_ms", "turn_p99_ms", "cpu_ms_per_turn_loaded",
               "cpu_ms_per_turn_sequential", "cpu_loaded_over_sequential", "gc_ms_per_turn_loaded",
               "event_lag_p50_ms", "event_lag_p99_ms", "rest_lag_p99_ms",
               "peak_rss_mib", "rss_growth_mib")  # fmt: skip
    summary: dict[str, dict[str, Any]] = {}
    for name in CONTENDERS:
        summary[name] = {m: statistics.median(r[name][m] for r in rounds) for m in metrics}
        summary[name]["throughput_vs_langgraph"] = [
            r[name]["turns_per_s"] / r["bare LangGraph"]["turns_per_s"] for r in rounds
        ]
    print(f"\n{args.turns} turns at once, {args.latency:g} s per model call, "
          f"median over {args.rounds} rounds, {args.gc} GC")  # fmt: skip
    header = ("contender", "turns/s", "× LangGraph", "p50 ms", "p99 ms", "CPU ms loaded",
              "CPU ms alone", "loaded/alone", "GC ms", "lag p50 ms", "lag p99 ms",
              "lag p99 ms after turn.started", "peak MiB")  # fmt: skip
    print(" | ".join(header))
    for name in CONTENDERS:
        batched = [r[name]["thread_writes_per_transaction"] for r in rounds]
        if all(b is not None for b in batched):
            summary[name]["thread_writes_per_transaction"] = statistics.median(batched)
    for name in CONTENDERS:
        s = summary[name]
        print(" | ".join([
            name, f"{s['turns_per_s']:.0f}", _spread(s["throughput_vs_langgraph"]),
            f"{s['turn_p50_ms']:.0f}", f"{s['turn_p99_ms']:.0f}",
            f"{s['cpu_ms_per_turn_loaded']:.2f}", f"{s['cpu_ms_per_turn_sequential']:.2f}",
            f"{s['cpu_loaded_over_sequential']:.2f}", f"{s['gc_ms_per_turn_loaded']:.2f}",
            f"{s['event_lag_p50_ms']:.0f}", f"{s['event_lag_p99_ms']:.0f}",
            f"{s['rest_lag_p99_ms']:.0f}", f"{s['peak_rss_mib']:.0f}",
        ]))  # fmt: skip
    admission_summary = {
        key: [a[key] for a in admitted]
        for key in ("cpu_ms_per_message_alone", "cpu_ms_per_message_at_once",
                    "committed_p50_ms", "committed_p99_ms", "committed_last_ms")
    }  # fmt: skip
    print(f"\nadmission alone: {args.turns} messages at once, no turn run (median, min–max)")
    print("CPU ms per message, alone | at once | committed after arrival p50 ms | p99 ms | last ms")
    print(" | ".join(_spread(v) for v in admission_summary.values()))
    write_json(Path(args.json), {
        "when": datetime.now(UTC).isoformat(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "turns": args.turns,
        "latency_s": args.latency,
        "gc": args.gc,
        "rounds": rounds,
        "summary": summary,
        "admission": {"rounds": admitted, "summary": admission_summary},
    })  # fmt: skip


if __name__ == "__main__":
    with _procs.stopped_at_end():  # a child `subprocess.run` waits for is stopped too
        main()
