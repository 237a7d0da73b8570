"""CPU cost of one extra streamed text delta, end to end in one process, against a floor.

One turn's model (a `ModelClient` that never suspends, like `ScriptedModel`) streams N
one-character text deltas; the turn is run with few (`--low`, default 10) and many
(`--high`, default 2,010) deltas, and the CPU time (`time.process_time`) of the difference,
divided by the extra deltas, is the cost of one delta. Two turnkit paths, each consuming
every event and checking that the deltas add up to the answer:

a. `execute_message` in process (the caller's stream);
b. `start` + `reader().follow` through the in-memory replay buffer.

The floor is LangGraph's stream writer: one node calling `get_stream_writer()` N times,
consumed with `stream_mode="custom"` (the cheapest way a LangGraph app streams tokens).
Each runs twice: with a model (and floor node) that never suspends ("burst", like
`ScriptedModel`) and with one that suspends once per chunk ("suspending", as a client
reading a socket does); ratios are against the floor of the same kind.
Paths and sizes run interleaved, `--rounds` times; the table shows the median and the
spread (min-max) over rounds.

Run:  .venv/bin/python benchmarks/delta_cost.py [--rounds 7] [--json PATH]
Writes JSON (default benchmarks/results/delta_cost.json).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph

from turnkit import Agent, SessionRuntime
from turnkit.events import MessageDeltaEvent, decode_event
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, Usage
from turnkit.runtime.reader import Frame

DELTA = "a"


class BurstModel:
    """A `ModelClient` streaming `chunks` one-character deltas.

    `suspend`: suspend once per chunk (`asyncio.sleep(0)`), as a client reading a socket
    does; otherwise never suspend, like `ScriptedModel`.
    """

    def __init__(self) -> None:
        self.chunks = 10
        self.suspend = False

    @property
    def model(self) -> str:
        return "bench"

    @property
    def provider(self) -> str:
        return "bench"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for _ in range(self.chunks):
            if self.suspend:
                await asyncio.sleep(0)
            yield TextDelta(DELTA)
        yield Finish("end_turn", Usage(input_tokens=8, output_tokens=self.chunks))


class _Runner:
    def __init__(self) -> None:
        self.model = BurstModel()
        agent = Agent(model=self.model, skip_stages=frozenset({"anchor-plan"}))
        self.runtime = SessionRuntime(agent=agent)
        self.turn = 0

    def _session(self) -> str:
        self.turn += 1
        return f"s-{self.turn}"

    async def execute(self, n: int) -> int:
        self.model.chunks = n
        text: list[str] = []
        async for event in self.runtime.execute_message(self._session(), "go"):
            if isinstance(event, MessageDeltaEvent):
                text.append(event.text)
        return _check(text, n)

    async def follow(self, n: int) -> int:
        self.model.chunks = n
        submission = await self.runtime.start(self._session(), "go")
        text: list[str] = []
        async for frame in self.runtime.reader().follow(submission.turn_id):
            if isinstance(frame, Frame) and frame.seq is None:
                event = decode_event(frame.data)
                if isinstance(event, MessageDeltaEvent):
                    text.append(event.text)
        return _check(text, n)


def _check(text: list[str] | str, n: int) -> int:
    joined = "".join(text)
    if joined != DELTA * n:
        raise AssertionError(f"expected {n} deltas of text, got {len(joined)} characters")
    return n


class _State(TypedDict):
    n: int
    suspend: bool


def _floor_graph() -> Any:
    async def node(state: _State) -> dict[str, Any]:
        write = get_stream_writer()
        for _ in range(state["n"]):
            if state["suspend"]:
                await asyncio.sleep(0)
            write({"type": "message.delta", "text": DELTA})
        return {}

    graph = StateGraph(_State)
    graph.add_node("model", node)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    return graph.compile()


async def _floor(graph: Any, n: int, suspend: bool) -> int:
    state = {"n": n, "suspend": suspend}
    text = [c["text"] async for c in graph.astream(state, stream_mode="custom")]
    return _check(text, n)


async def _cpu(run: Callable[[int], Awaitable[int]], n: int) -> float:
    gc.collect()
    start = time.process_time()
    await run(n)
    return time.process_time() - start


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runner = _Runner()
    graph = _floor_graph()

    def model(
        suspend: bool, run: Callable[[int], Awaitable[int]]
    ) -> Callable[[int], Awaitable[int]]:
        def go(n: int) -> Awaitable[int]:
            runner.model.suspend = suspend
            return run(n)

        return go

    paths: dict[str, Callable[[int], Awaitable[int]]] = {}
    for suspend in (False, True):
        kind = "suspending" if suspend else "burst"
        paths[f"{kind}: floor LangGraph writer"] = functools.partial(_floor, graph, suspend=suspend)
        paths[f"{kind}: execute_message"] = model(suspend, runner.execute)
        paths[f"{kind}: start + follow"] = model(suspend, runner.follow)
    for run in paths.values():  # warm up imports and caches
        await run(args.low)
        await run(args.high)
    extra = args.high - args.low
    per_delta: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, run in paths.items():
            low = await _cpu(run, args.low)
            high = await _cpu(run, args.high)
            per_delta[name].append((high - low) / extra * 1e6)
    await runner.runtime.close()
    rows: list[dict[str, Any]] = [
        {
            "path": name,
            "us_per_delta_median": statistics.median(values),
            "us_per_delta_min": min(values),
            "us_per_delta_max": max(values),
            "rounds": values,
        }
        for name, values in per_delta.items()
    ]
    for row in rows:
        floor = next(r for r in rows if r["path"].startswith(row["path"].split(":")[0]))
        base = floor["us_per_delta_median"]
        row["vs_floor"] = row["us_per_delta_median"] / base if base > 0 else None
    return {
        "benchmark": "delta_cost",
        "when": datetime.now(UTC).isoformat(),
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "low": args.low,
        "high": args.high,
        "rounds": args.rounds,
        "rows": rows,
    }


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"CPU µs per extra streamed delta ({result['low']} vs {result['high']} deltas, "
        f"{result['rounds']} interleaved rounds)",
        f"{'path':34} {'median':>8} {'min-max':>15} {'× floor':>8}",
    ]
    for row in result["rows"]:
        spread = f"{row['us_per_delta_min']:.1f}-{row['us_per_delta_max']:.1f}"
        ratio = f"{row['vs_floor']:.2f}" if row["vs_floor"] is not None else "-"
        lines.append(f"{row['path']:34} {row['us_per_delta_median']:8.1f} {spread:>15} {ratio:>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low", type=int, default=10)
    parser.add_argument("--high", type=int, default=2010)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "delta_cost.json"
    )
    ns = parser.parse_args()
    outcome = asyncio.run(main(ns))
    print(_table(outcome))
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps(outcome, indent=2))
    print(f"wrote {ns.json}")
