"""One durable turn on PostgreSQL against the same turn on SQLite, interleaved.

The turn is `turn_overhead.py`'s tool-using turn (a zero-latency fake model: a call that
asks for a tool, the tool, a call that answers; `anchor-plan` skipped), run with
`execute_message` on one runtime per contender, with turnkit's checkpointer
(`AsyncPgSaver` on PostgreSQL, on asyncpg like the store). Each runtime writes
checkpoints as its database's default has it (`sync` on SQLite, `async` on PostgreSQL:
while the next step runs) unless its name says otherwise: PostgreSQL also runs with
`sync` checkpoints (before the next step), with LangGraph's own `AsyncPostgresSaver` on a
psycopg pool (`sync`, as turnkit used before), and with one checkpoint when the run ends
(`exit`), which shows what the turn costs without a checkpoint per step. Each
PostgreSQL contender gets a fresh schema, dropped afterwards. Besides time and CPU it
counts what each PostgreSQL turn costs the server: transactions committed and rolled back
(`pg_stat_database`, so other clients of the same database add noise: use a quiet one),
and how long after a turn begins its first model call starts (`call at`, p50): with a
real provider the whole turn waits that long before the model can answer.

Run:  .venv/bin/python benchmarks/postgres_turn.py [--turns 300] [--rounds 10] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/postgres_turn.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _services

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncpg
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

import turnkit.runtime._core as runtime_module

# The same tool-using turn the turn-overhead benchmark measures (run as a script, this
# folder is on the path).
from _patch import patched
from turn_overhead import ANSWER, _reply, add, write_json
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.config import Durability
from turnkit.events import DoneEvent, MessageCompleteEvent
from turnkit.models import ModelChunk, ModelRequest
from turnkit.testing import ModelStep, ScriptedModel

POSTGRES = _services.POSTGRES_URL


@dataclass(slots=True)
class _TimedModel(ScriptedModel):
    """Notes when each call starts: how long a turn kept its first call waiting."""

    started: list[float] = field(default_factory=list[float])

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.started.append(time.perf_counter())
        return ScriptedModel.stream(self, request)


async def _langgraph_saver(
    database_url: str, *, schema: str | None = None
) -> tuple[BaseCheckpointSaver[Any], Callable[[], Awaitable[None]]]:
    """LangGraph's own `AsyncPostgresSaver` on a psycopg pool, as turnkit used it before."""
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row,
              "options": f"-c search_path={schema}"}  # fmt: skip
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        "postgresql://" + database_url.split("://", 1)[1],
        min_size=1,
        max_size=10,
        kwargs=kwargs,
        check=AsyncConnectionPool.check_connection,
        open=False,
    )
    await pool.open(wait=True, timeout=10)
    saver = AsyncPostgresSaver(pool)
    await saver.setup()
    return saver, pool.close


async def _runtime(
    url: str,
    schema: str | None,
    *,
    langgraph_saver: bool = False,
    durability: Durability | None = None,
) -> tuple[SessionRuntime, _TimedModel]:
    model = _TimedModel([ModelStep.respond(_reply)], repeat_last=True)
    agent = Agent(model=model, tools=[add], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        checkpoint_durability=durability,
    )
    runtime = SessionRuntime(agent=agent, config=config)
    if langgraph_saver:  # the runtime opens its checkpointer by this name, imported there
        with patched(runtime_module, "open_checkpointer", _langgraph_saver):
            await runtime.open()
    else:
        await runtime.open()
    return runtime, model


async def _turn(runtime: SessionRuntime, model: _TimedModel, session: str) -> float:
    """Run one turn; return how long after it began its first model call started (ms)."""
    answer = None
    model.started.clear()
    began = time.perf_counter()
    async for event in runtime.execute_message(session, "What is 2 + 3?"):
        if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
            answer = event.block.text
        if isinstance(event, DoneEvent) and event.status != "succeeded":
            raise RuntimeError(f"benchmark turn ended {event.status}: {event.error_code}")
    if answer != ANSWER:
        raise RuntimeError(f"benchmark turn answered {answer!r}")
    model.calls.clear()
    return (model.started[0] - began) * 1000


async def _server_counts(conn: Any) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(row["xact_commit"]), int(row["xact_rollback"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=10)
    default_json = Path(__file__).parent / "results" / "postgres_turn.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()

    schemas = [f"tk_bench_{uuid.uuid4().hex[:8]}" for _ in range(4)]
    admin = await asyncpg.connect(POSTGRES)
    tmp = Path(tempfile.mkdtemp())
    contenders = {
        "SQLite (sync checkpoints)": await _runtime(f"sqlite:///{tmp / 'bench.db'}", None),
        "PostgreSQL (async checkpoints)": await _runtime(POSTGRES, schemas[0]),
        "PostgreSQL, sync checkpoints": await _runtime(POSTGRES, schemas[1], durability="sync"),
        "PostgreSQL, LangGraph's saver": await _runtime(
            POSTGRES, schemas[2], langgraph_saver=True, durability="sync"
        ),
        "PostgreSQL, checkpoints at exit": await _runtime(POSTGRES, schemas[3], durability="exit"),
    }
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    first_call: dict[str, list[float]] = {name: [] for name in contenders}
    cpu = dict.fromkeys(contenders, 0.0)
    server = {
        name: {"commits": 0, "rollbacks": 0} for name in contenders if not name.startswith("SQLite")
    }
    try:
        for n, (rt, model) in enumerate(contenders.values()):
            for i in range(args.warmup):
                await _turn(rt, model, f"warm-{n}-{i}")
        per_round = max(1, args.turns // args.rounds)
        counter = 0
        names = list(contenders)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rt, model = contenders[name]
                gc.collect()
                before = await _server_counts(admin) if name in server else (0, 0)
                cpu0 = time.process_time()
                for _ in range(per_round):
                    counter += 1
                    t0 = time.perf_counter()
                    first_call[name].append(await _turn(rt, model, f"s-{counter}"))
                    wall[name].append((time.perf_counter() - t0) * 1000)
                cpu[name] += time.process_time() - cpu0
                if name in server:
                    await asyncio.sleep(0.6)  # the server publishes its counters every 0.5 s
                    after = await _server_counts(admin)
                    server[name]["commits"] += after[0] - before[0] - 1  # the count's own
                    server[name]["rollbacks"] += after[1] - before[1]
    finally:
        for rt, _ in contenders.values():
            await rt.close()
        for schema in schemas:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()

    rows: list[dict[str, Any]] = []
    for name, times in wall.items():
        rows.append(
            {
                "name": name,
                "turns": len(times),
                "median_ms": statistics.median(times),
                "p90_ms": sorted(times)[int(len(times) * 0.9) - 1],
                "cpu_ms_per_turn": cpu[name] * 1000 / len(times),
                "first_call_p50_ms": statistics.median(first_call[name]),
            }
        )
    base = rows[0]
    print(
        f"{'contender':<32} {'median ms':>10} {'p90 ms':>8} {'CPU ms':>8} {'× SQLite':>9} "
        f"{'× CPU':>7} {'call at':>8} {'commits':>8} {'rollbacks':>9}"
    )
    for row in rows:
        row["x_sqlite_median"] = row["median_ms"] / base["median_ms"]
        row["x_sqlite_cpu"] = row["cpu_ms_per_turn"] / base["cpu_ms_per_turn"]
        counts = server.get(row["name"])
        if counts is not None:
            row["server_commits_per_turn"] = counts["commits"] / row["turns"]
            row["server_rollbacks_per_turn"] = counts["rollbacks"] / row["turns"]
        commits = f"{row['server_commits_per_turn']:.1f}" if counts else "-"
        rollbacks = f"{row['server_rollbacks_per_turn']:.1f}" if counts else "-"
        print(
            f"{row['name']:<32} {row['median_ms']:>10.2f} {row['p90_ms']:>8.2f} "
            f"{row['cpu_ms_per_turn']:>8.2f} {row['x_sqlite_median']:>9.2f} "
            f"{row['x_sqlite_cpu']:>7.2f} {row['first_call_p50_ms']:>8.2f} "
            f"{commits:>8} {rollbacks:>9}"
        )
    write_json(Path(args.json), {
        "when": datetime.now(UTC).isoformat(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "turns": args.turns,
        "rounds": args.rounds,
        "results": rows,
    })  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
