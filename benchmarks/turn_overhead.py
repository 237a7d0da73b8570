"""Framework overhead of one tool-using turn, against a plain-asyncio floor and peers.

Every contender does the same work with a zero-latency fake model: a model call that asks
for a tool, the tool, and a model call that answers without tools — 2 model calls + 1 tool
for turnkit (whose answer is that last call's text), the floor, the bare LangGraph graph
and the peers alike: PydanticAI, the OpenAI Agents SDK and LangChain's `create_agent`, each
on a fake model of its own kind (installed by the `benchmarks` extra; a missing one is
left out).

Floors bound what durability can cost on LangGraph: the bare graph with LangGraph's
`InMemorySaver` (its checkpoint machinery alone), and the "durable floor": the bare graph
committing each model step's events in one raw `sqlite3` transaction before emitting them,
with LangGraph's own `SqliteSaver` writing in place (no thread hop). The durable floor has
no leases, audit rows, usage, replay buffer or turn bookkeeping; no durable runtime built
on LangGraph's SQLite checkpointer can cost less. A third variant keeps its checkpoints in
an `InMemorySaver`, as if storing them durably cost nothing: a bound for any checkpointer.

Then it runs `--concurrency` turns at once (each in its own session) for throughput.

Run:  .venv/bin/python benchmarks/turn_overhead.py [--turns 300] [--rounds 10]
      [--concurrency 20] [--json PATH]
Prints two tables and writes JSON (default benchmarks/results/turn_overhead.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import operator
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.blocks import ToolResultBlock
from turnkit.events import (
    DoneEvent,
    MessageDeltaEvent,
    StepStartEvent,
    ToolCompletedEvent,
    encode_event,
)
from turnkit.models import ModelRequest
from turnkit.testing import ModelStep, ScriptedModel, call

Turn = Callable[[int], Awaitable[int]]
_SEQUENTIAL_ONLY = ("exit", "pydantic", "openai", "langchain", "floor:", "InMemory")
"""Contenders measured one turn at a time only (not in the throughput run)."""
ANSWER = "The sum of two and three is five."


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def _fake_stream(kind: str) -> AsyncIterator[tuple[str, Any]]:
    """The fake model the baselines use: chunks like ScriptedModel's, zero latency."""
    if kind == "tool":
        yield ("tool", ("add", '{"a": 2, "b": 3}'))
    else:
        for start in range(0, len(ANSWER), 8):
            yield ("text", ANSWER[start : start + 8])


def _ev(cls: Any, turn: int, seq: int, **fields: Any) -> Any:
    return cls(
        session_id=f"s{turn}",
        turn_id=f"t{turn}",
        stage_id="tool-loop",
        ts=datetime.now(UTC),
        seq=seq,
        **fields,
    )


# ── the plain-asyncio floor ──────────────────────────────────────────────────────────


async def _model_step(i: int, kind: str, emit: Any, commit: Any = None) -> None:
    """One fake model call and its tool, as events: what every baseline does per call.

    `commit`, when given, receives the step's events (one transaction) before any is
    emitted: the least a durable turn must do.
    """
    if commit is not None:
        staged: list[Any] = []
        await _model_step(i, kind, staged.append)
        commit(i, staged)
        for event in staged:
            emit(event)
        return
    emit(_ev(StepStartEvent, i, 1, step="tool-loop"))
    async for chunk_kind, value in _fake_stream(kind):
        if chunk_kind == "text":
            emit(
                MessageDeltaEvent(
                    session_id=f"s{i}",
                    turn_id=f"t{i}",
                    stage_id="tool-loop",
                    ts=datetime.now(UTC),
                    block_id="b",
                    text=value,
                )
            )
        else:
            result = await add.invoke(json.loads(value[1]), None)  # type: ignore[arg-type]
            emit(_tool_event(i, 2, result))


async def floor_turn(i: int) -> int:
    events: list[Any] = []
    transcript: list[dict[str, str]] = [{"role": "user", "content": "2+3?"}]
    for kind in ("tool", "text"):
        await _model_step(i, kind, events.append)
        transcript.append({"role": "assistant", "content": kind})
    return len(events)


def _tool_event(i: int, seq: int, result: Any) -> Any:
    return _ev(
        ToolCompletedEvent,
        i,
        seq,
        tool_call_id="c1",
        tool_name="add",
        duration_ms=0.0,
        result=ToolResultBlock(tool_call_id="c1", tool_name="add", output=result),
    )


# ── a bare LangGraph graph doing the same work ──────────────────────────────────────


def _langgraph_graph(checkpointer: Any = None, commit: Any = None) -> Any:
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        transcript: Annotated[list[dict[str, str]], operator.add]
        route: str
        turn: int

    async def call_model(state: State, kind: str) -> None:
        await _model_step(state["turn"], kind, get_stream_writer(), commit)

    async def anchor(state: State) -> dict[str, Any]:
        return {"route": "tool"}

    async def loop(state: State) -> dict[str, Any]:
        kind = state["route"]
        await call_model(state, "tool" if kind == "tool" else "text")
        return {
            "transcript": [{"role": "assistant", "content": kind}],
            "route": "text" if kind == "tool" else "synth",
        }

    async def synth(state: State) -> dict[str, Any]:
        # The loop's last call wrote the answer: finalize it, no call of its own.
        return {"transcript": [{"role": "assistant", "content": ANSWER}]}

    async def post(state: State) -> dict[str, Any]:
        return {}

    g = StateGraph(State)
    g.add_node("anchor", anchor)
    g.add_node("loop", loop)
    g.add_node("synth", synth)
    g.add_node("post", post)
    g.add_edge(START, "anchor")
    g.add_edge("anchor", "loop")

    async def route(state: Any) -> str:
        # async: LangGraph runs a sync edge function in a thread pool, which costs a hop
        return "synth" if state["route"] == "synth" else "loop"

    g.add_conditional_edges("loop", route)
    g.add_edge("synth", "post")
    g.add_edge("post", END)
    return g.compile(checkpointer=checkpointer)


def langgraph_turn(graph: Any, **kwargs: Any) -> Turn:
    async def run(i: int) -> int:
        n = 0
        config = {"configurable": {"thread_id": f"t{i}"}}
        state = {"transcript": [{"role": "user", "content": "2+3?"}], "route": "", "turn": i}
        async for _ in graph.astream(state, config, stream_mode="custom", **kwargs):
            n += 1
        return n

    return run


# ── the durable floor: LangGraph, its SQLite checkpointer and raw event commits ──────


def _wal_connection(path: Path) -> sqlite3.Connection:
    """A sqlite3 connection as turnkit tunes its own: WAL, synchronous=NORMAL."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _in_place_sqlite_saver(path: Path) -> Any:
    """LangGraph's `SqliteSaver`, its async methods run in place (no thread hop)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    class InPlace(SqliteSaver):
        async def aget_tuple(self, config: Any) -> Any:
            return self.get_tuple(config)

        async def aput(self, *args: Any) -> Any:
            return self.put(*args)

        async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
            self.put_writes(*args, **kwargs)

    saver = InPlace(_wal_connection(path))
    saver.setup()
    return saver


def _raw_event_log(path: Path) -> Callable[[int, list[Any]], None]:
    """One sqlite3 transaction per model step, inserting its events as JSON."""
    conn = _wal_connection(path)
    conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, turn INT, data BLOB)")
    ids = itertools.count(1)

    def commit(turn: int, events: list[Any]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (id, turn, data) VALUES (?, ?, ?)",
            [(next(ids), turn, encode_event(e)) for e in events],
        )
        conn.execute("COMMIT")

    return commit


def durable_floor(tmp: Path, durability: str, *, checkpoints_in_memory: bool = False) -> Turn:
    """The least a durable LangGraph turn does: events committed before they are sent,
    LangGraph's own SQLite checkpointer writing in place. No leases, audit, usage,
    replay buffer or turn bookkeeping: a floor, not a competitor.

    `checkpoints_in_memory`: LangGraph's `InMemorySaver` instead, as if storing a
    checkpoint durably cost nothing (a bound for any checkpointer, not just SQLite's).
    """
    from langgraph.checkpoint.memory import InMemorySaver

    name = f"floor-{durability}-{'memory' if checkpoints_in_memory else 'sqlite'}"
    saver = (
        InMemorySaver()
        if checkpoints_in_memory
        else _in_place_sqlite_saver(tmp / f"{name}.checkpoints.db")
    )
    graph = _langgraph_graph(saver, commit=_raw_event_log(tmp / f"{name}.db"))
    return langgraph_turn(graph, durability=durability)


# ── PydanticAI ───────────────────────────────────────────────────────────────────────


def pydantic_ai_turn() -> Turn | None:
    try:
        from pydantic_ai import Agent as PAgent
        from pydantic_ai.messages import ModelMessage, ToolReturnPart
        from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
    except ImportError:
        return None

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        last = messages[-1]
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            for start in range(0, len(ANSWER), 8):
                yield ANSWER[start : start + 8]
        else:
            yield {0: DeltaToolCall(name="add", json_args='{"a": 2, "b": 3}', tool_call_id="c1")}

    agent = PAgent(FunctionModel(stream_function=stream))

    @agent.tool_plain(name="add")
    async def add_tool(a: int, b: int) -> int:
        return a + b

    async def run(i: int) -> int:
        n = 0
        async with agent.run_stream_events("2+3?") as events:
            async for _event in events:
                n += 1
        return n

    return run


# ── the OpenAI Agents SDK ─────────────────────────────────────────────────────────────


def openai_agents_turn() -> Turn | None:
    """`Runner.run_streamed` on the SDK's own scripted model: tool call, then the answer."""
    try:
        from agents import Agent as OAgent, Runner, function_tool, set_tracing_disabled
        from agents.testing import (
            ModelCall,
            ModelStep as OStep,
            ScriptedModel as OModel,
            assistant_message,
            function_call,
        )
    except ImportError:
        return None
    set_tracing_disabled(True)  # its default exports traces to OpenAI: loopback only here

    def reply(call: ModelCall) -> Any:
        answered = any(
            isinstance(item, dict) and item.get("type") == "function_call_output"
            for item in call.input
        )
        if answered:
            return [assistant_message(ANSWER)]
        return [function_call("add", {"a": 2, "b": 3}, call_id="c1")]

    @function_tool(name_override="add")
    async def add_tool(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = OModel()
    agent = OAgent(name="bench", model=model, tools=[add_tool])

    async def run(i: int) -> int:
        model.extend([OStep.respond(reply), OStep.respond(reply)])
        result = Runner.run_streamed(agent, "2+3?")
        n = 0
        async for _event in result.stream_events():
            n += 1
        if result.final_output != ANSWER:
            raise RuntimeError(f"openai-agents turn answered {result.final_output!r}")
        model._calls.clear()  # its call log would grow with every turn
        return n

    return run


# ── LangChain create_agent ─────────────────────────────────────────────────────────


def create_agent_turn() -> Turn | None:
    """LangChain's `create_agent` (a LangGraph graph, no checkpointer), streamed."""
    try:
        from langchain.agents import create_agent
        from langchain.agents.middleware.types import InputAgentState
        from langchain_core.language_models import BaseChatModel
        from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
        from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
        from langchain_core.tools import tool as lc_tool
    except ImportError:
        return None

    class FakeChat(BaseChatModel):
        """The same fake model: ask for `add`, then stream the answer in 8-character chunks."""

        @property
        def _llm_type(self) -> str:
            return "turnkit-benchmark-fake"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], *args: Any, **kw: Any) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                message = AIMessage(content=ANSWER)
            else:
                tool_call = {"name": "add", "args": {"a": 2, "b": 3}, "id": "c1"}
                message = AIMessage(content="", tool_calls=[tool_call])
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _astream(
            self, messages: list[BaseMessage], *args: Any, **kw: Any
        ) -> AsyncIterator[ChatGenerationChunk]:
            if isinstance(messages[-1], ToolMessage):
                for start in range(0, len(ANSWER), 8):
                    chunk = AIMessageChunk(content=ANSWER[start : start + 8])
                    yield ChatGenerationChunk(message=chunk)
                return
            call_chunk = {"name": "add", "args": '{"a": 2, "b": 3}', "id": "c1", "index": 0}
            chunk = AIMessageChunk(content="", tool_call_chunks=[call_chunk])
            yield ChatGenerationChunk(message=chunk)

    @lc_tool("add")
    async def lc_add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    graph = create_agent(FakeChat(), tools=[lc_add])

    async def run(i: int) -> int:
        n = 0
        request: InputAgentState = {"messages": [{"role": "user", "content": "2+3?"}]}
        async for _chunk in graph.astream(request, stream_mode="messages"):
            n += 1
        return n

    return run


# ── turnkit ──────────────────────────────────────────────────────────────────────────


def _reply(request: ModelRequest) -> ModelStep:
    """The fake model's answer, from the request alone (so concurrent turns all do the same
    work): ask for the tool, then answer once its result is in."""
    if any(m.role == "tool" for m in request.messages):
        return ModelStep.text_reply(ANSWER)
    return ModelStep.tool_call_reply(call("add", a=2, b=3))


async def turnkit_contender(durability: str, tmp: Path) -> tuple[Turn, SessionRuntime]:
    steps = [ModelStep.respond(_reply)]
    model = ScriptedModel(steps, repeat_last=True)
    agent = Agent(model=model, tools=[add], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp / f'tk-{durability}.db'}",
        checkpoint_durability=durability,  # type: ignore[arg-type]
    )
    runtime = SessionRuntime(agent=agent, config=config)
    await runtime.open()

    async def run(i: int) -> int:
        n = 0
        async for event in runtime.execute_message(f"s-{durability}-{i}", "What is 2 + 3?"):
            n += 1
            if isinstance(event, DoneEvent) and event.status != "succeeded":
                raise RuntimeError(f"benchmark turn ended {event.status}: {event.error_code}")
        model.calls.clear()  # the fake model's call log would grow with every turn
        return n

    return run, runtime


# ── measurement ──────────────────────────────────────────────────────────────────────


async def measure(
    contenders: list[tuple[str, Turn]], turns: int, warmup: int, rounds: int
) -> list[dict[str, Any]]:
    """Time every contender in the same rounds, interleaved.

    Each round runs `turns / rounds` turns of every contender, in a rotating order, so
    noise from the machine (other processes, frequency changes) lands on all of them
    alike instead of on whichever ran at the wrong moment.
    """
    for _, turn in contenders:
        for i in range(warmup):
            await turn(10_000_000 + i)
    wall: dict[str, list[float]] = {name: [] for name, _ in contenders}
    cpu: dict[str, float] = dict.fromkeys(wall, 0.0)
    per_round = max(1, turns // rounds)
    counter = 0
    for r in range(rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for name, turn in order:
            gc.collect()
            cpu0 = time.process_time()
            for _ in range(per_round):
                counter += 1
                t0 = time.perf_counter()
                await turn(counter)
                wall[name].append((time.perf_counter() - t0) * 1000)
            cpu[name] += time.process_time() - cpu0
    results = []
    for name, turn in contenders:
        tracemalloc.start()
        for i in range(10):
            await turn(20_000_000 + i)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        times = sorted(wall[name])
        results.append(
            {
                "name": name,
                "turns": len(times),
                "median_ms": statistics.median(times),
                "p90_ms": times[int(len(times) * 0.9) - 1],
                "cpu_ms_per_turn": cpu[name] * 1000 / len(times),
                "peak_alloc_kib_10_turns": peak / 1024,
            }
        )
    return results


async def _timed(turn: Turn, i: int, gate: asyncio.Semaphore, latencies: list[float]) -> None:
    async with gate:
        t0 = time.perf_counter()
        await turn(i)
        latencies.append((time.perf_counter() - t0) * 1000)


async def throughput(
    contenders: list[tuple[str, Turn]], turns: int, concurrency: int, start: int
) -> list[dict[str, Any]]:
    """Turns per second with `concurrency` turns in flight at once (each its own session)."""
    results = []
    for name, turn in contenders:
        gate = asyncio.Semaphore(concurrency)
        latencies: list[float] = []
        gc.collect()
        t0 = time.perf_counter()
        await asyncio.gather(*(_timed(turn, start + i, gate, latencies) for i in range(turns)))
        elapsed = time.perf_counter() - t0
        start += turns
        latencies.sort()
        results.append(
            {
                "name": name,
                "concurrency": concurrency,
                "turns_per_s": turns / elapsed,
                "p50_ms": statistics.median(latencies),
                "p99_ms": latencies[int(len(latencies) * 0.99) - 1],
            }
        )
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=20)
    default_json = Path(__file__).parent / "results" / "turn_overhead.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        async with AsyncSqliteSaver.from_conn_string(str(tmp / "lg.db")) as saver:
            contenders: list[tuple[str, Turn]] = [
                ("plain asyncio (floor)", floor_turn),
                ("langgraph bare, no checkpointer", langgraph_turn(_langgraph_graph())),
                (
                    "langgraph + AsyncSqliteSaver (sync)",
                    langgraph_turn(_langgraph_graph(saver), durability="sync"),
                ),
            ]
            from langgraph.checkpoint.memory import InMemorySaver

            contenders += [
                (
                    "langgraph + InMemorySaver (sync)",
                    langgraph_turn(_langgraph_graph(InMemorySaver()), durability="sync"),
                ),
                ("durable floor: LG + SqliteSaver + event tx (sync)", durable_floor(tmp, "sync")),
                ("durable floor: LG + SqliteSaver + event tx (exit)", durable_floor(tmp, "exit")),
                (
                    "floor: LG + InMemorySaver + event tx (sync)",
                    durable_floor(tmp, "sync", checkpoints_in_memory=True),
                ),
            ]
            peers = (
                ("pydantic-ai run_stream_events (2 calls)", pydantic_ai_turn()),
                ("openai-agents run_streamed (2 calls)", openai_agents_turn()),
                ("langchain create_agent, no checkpointer (2 calls)", create_agent_turn()),
            )
            contenders += [(name, peer) for name, peer in peers if peer is not None]
            runtimes: list[SessionRuntime] = []
            try:
                for durability in ("sync", "exit"):
                    run, runtime = await turnkit_contender(durability, tmp)
                    runtimes.append(runtime)
                    contenders.append((f"turnkit durable ({durability} checkpoints)", run))
                results = await measure(contenders, args.turns, args.warmup, args.rounds)
                loaded = await throughput(
                    [c for c in contenders if not any(k in c[0] for k in _SEQUENTIAL_ONLY)],
                    args.turns,
                    args.concurrency,
                    start=30_000_000,
                )
            finally:
                for runtime in runtimes:
                    await runtime.close()

    bare_row = next(r for r in results if r["name"].startswith("langgraph bare"))
    bare, bare_cpu = bare_row["median_ms"], bare_row["cpu_ms_per_turn"]
    saver = next(r for r in results if "AsyncSqliteSaver" in r["name"])["median_ms"]
    floor = results[0]["median_ms"]
    print(
        f"\nturn overhead — {platform.python_version()} on {os.cpu_count()} cores, "
        f"{args.turns} turns each in {args.rounds} interleaved rounds\n"
    )
    print(
        f"{'contender':50} {'median ms':>10} {'p90 ms':>8} {'cpu ms':>8} {'× bare LG':>10} "
        f"{'(cpu)':>6} {'× LG+saver':>11} {'× floor':>8} {'peak KiB':>9}"
    )
    for r in results:
        r["x_bare_langgraph"] = r["median_ms"] / bare
        r["x_bare_langgraph_cpu"] = r["cpu_ms_per_turn"] / bare_cpu
        r["x_langgraph_sqlite_saver"] = r["median_ms"] / saver
        r["x_floor"] = r["median_ms"] / floor
        print(
            f"{r['name']:50} {r['median_ms']:10.3f} {r['p90_ms']:8.3f} "
            f"{r['cpu_ms_per_turn']:8.3f} {r['x_bare_langgraph']:10.2f} "
            f"{r['x_bare_langgraph_cpu']:6.2f} {r['x_langgraph_sqlite_saver']:11.2f} "
            f"{r['x_floor']:8.1f} "
            f"{r['peak_alloc_kib_10_turns']:9.0f}"
        )
    print(f"\n{args.concurrency} turns in flight at once, {args.turns} turns each\n")
    print(f"{'contender':50} {'turns/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for r in loaded:
        print(f"{r['name']:50} {r['turns_per_s']:10.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f}")
    _write(Path(args.json), results, loaded)
    print(f"\nwrote {args.json}")


def _write(out: Path, results: list[dict[str, Any]], loaded: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "results": results,
        "throughput": loaded,
    }
    out.write_text(json.dumps(payload, indent=2))


def write_json(out: Path, payload: dict[str, Any]) -> None:
    """Write a benchmark's results (the scripts that reuse this turn write theirs here too)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
