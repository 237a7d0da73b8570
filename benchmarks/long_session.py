"""Does a turn cost more late in a long session? One session of N turns on the demo agent.

Runs `--turns` turns one after another in ONE session of the offline demo agent (a plan
call, then a calculator or word-count tool round, or a plain answer, in rotation) on
SQLite in a temporary directory (or `--database-url`: PostgreSQL, in a schema of its own
that is dropped after), and measures each turn's CPU (the whole process: the event loop
and the store's thread). It reports, for the first and the last `--window` turns:

- **framework CPU per turn**: the turn's CPU minus what the demo model spends on its own
  (it counts the whole request's tokens, which grows with the session) and minus encoding
  the request the model must receive (every message of the transcript becomes a
  `ModelMessage`, which no framework can avoid);
- the turn's whole CPU, for reference;
- the bytes the turn's checkpoints serialize (checkpoints and their writes), which must
  not grow with the session;
- the ratio last/first, with its spread over blocks of ten turns.

`--cold` holds no session transcript between turns, as when each turn of the session lands
on another worker: every turn then reads its whole history from the Store.

Run:  .venv/bin/python benchmarks/long_session.py [--turns 500] [--window 50] [--cold]
      [--database-url postgresql://…] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/long_session.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import turnkit.stages._message_list as message_list
from _patch import replace
from turnkit import RuntimeConfig, SessionRuntime
from turnkit.context.transcript import from_transcript
from turnkit.demo import DemoModel, demo_agent
from turnkit.events import DoneEvent
from turnkit.models import ModelChunk, ModelRequest
from turnkit.runtime._held import HeldTranscripts

MESSAGES = ("What is (12 + 3) * 7?", "Thanks, that helps.", "How many words are in this line?")
BLOCK = 10


class _Meter:
    """CPU spent outside the framework: the model's own work and the request's encoding."""

    def __init__(self) -> None:
        self.outside = 0.0


class _CountingSerde:
    """The checkpointer's serializer, counting the bytes it writes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bytes = 0

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = self.inner.dumps_typed(obj)
        self.bytes += len(data)
        return kind, data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _TimedDemoModel(DemoModel):
    """The demo model, with the CPU of its own work set aside."""

    def __init__(self, meter: _Meter) -> None:
        self._meter = meter

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        stream = super().stream(request)
        while True:
            start = time.process_time()
            try:
                chunk = await anext(stream)
            except StopAsyncIteration:
                self._meter.outside += time.process_time() - start
                return
            self._meter.outside += time.process_time() - start
            yield chunk


def _timed_encoding(meter: _Meter, encode: Callable[..., Any]) -> Callable[..., Any]:
    def timed(messages: Any) -> Any:
        start = time.process_time()
        try:
            return encode(messages)
        finally:
            meter.outside += time.process_time() - start

    return timed


async def run_session(
    turns: int, *, cold: bool = False, database_url: str | None = None
) -> list[dict[str, float]]:
    """Per turn: whole CPU ms, framework CPU ms, wall ms, checkpoint bytes.

    `cold`: the runtime holds no session transcript between turns, so each turn reads
    its whole history from the Store (as when every turn lands on another worker).
    `database_url`: PostgreSQL (a schema of its own, dropped after); else SQLite.
    """
    meter = _Meter()
    # the request's encoding, timed where the stages call it
    replace(message_list, "from_transcript", _timed_encoding(meter, from_transcript))
    agent = dataclasses.replace(demo_agent(), model=_TimedDemoModel(meter))
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        schema = f"tk_long_{os.getpid()}" if database_url else None
        if database_url:
            await _schema(database_url, f"CREATE SCHEMA {schema}")
        config = RuntimeConfig(
            database_url=database_url or f"sqlite:///{tmp}/long.db", database_schema=schema
        )
        try:
            await _run(config, agent, meter, rows, turns, cold=cold)
        finally:
            if database_url:
                await _schema(database_url, f"DROP SCHEMA {schema} CASCADE")
    return rows


async def _schema(database_url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _run(
    config: RuntimeConfig,
    agent: Any,
    meter: _Meter,
    rows: list[dict[str, float]],
    turns: int,
    *,
    cold: bool,
) -> None:
    async with SessionRuntime(agent=agent, config=config) as runtime:
        if cold:
            runtime._held = HeldTranscripts(max_bytes=0)  # holds nothing
        await runtime.open()
        saver: Any = runtime._graph.checkpointer  # type: ignore[union-attr]
        serde = saver.serde = _CountingSerde(saver.serde)
        for index in range(turns):
            meter.outside = 0.0
            serde.bytes = 0
            wall, cpu = time.perf_counter(), time.process_time()
            last = None
            async for event in runtime.execute_message("long", MESSAGES[index % 3]):
                last = event
            cpu = time.process_time() - cpu
            wall = time.perf_counter() - wall
            if not isinstance(last, DoneEvent) or last.status != "succeeded":
                raise SystemExit(f"turn {index + 1} did not succeed: {last!r}")
            rows.append(
                {
                    "cpu_ms": cpu * 1000,
                    "framework_ms": (cpu - meter.outside) * 1000,
                    "wall_ms": wall * 1000,
                    "checkpoint_bytes": float(serde.bytes),
                }
            )
            if (index + 1) % 100 == 0:
                print(f"  … {index + 1} turns", file=sys.stderr)


def _summary(first: list[float], last: list[float]) -> dict[str, float]:
    blocks = [
        statistics.fmean(last[i : i + BLOCK]) / statistics.fmean(first[i : i + BLOCK])
        for i in range(0, min(len(first), len(last)), BLOCK)
    ]
    return {
        "first_mean_ms": statistics.fmean(first),
        "first_median_ms": statistics.median(first),
        "last_mean_ms": statistics.fmean(last),
        "last_median_ms": statistics.median(last),
        "ratio": statistics.fmean(last) / statistics.fmean(first),
        "ratio_min": min(blocks),
        "ratio_max": max(blocks),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--label", default="", help="a note stored with the results")
    parser.add_argument(
        "--cold", action="store_true", help="hold no transcript between turns (many workers)"
    )
    default_json = Path(__file__).parent / "results" / "long_session.json"
    parser.add_argument("--json", default=str(default_json))
    parser.add_argument(
        "--database-url", default=None, help="PostgreSQL (a schema of its own); else SQLite"
    )
    args = parser.parse_args()
    if args.turns < 2 * args.window:
        raise SystemExit("--turns must be at least twice --window")
    rows = await run_session(args.turns, cold=args.cold, database_url=args.database_url)
    head, tail = rows[: args.window], rows[-args.window :]
    results = {
        metric: _summary([r[metric] for r in head], [r[metric] for r in tail])
        for metric in ("framework_ms", "cpu_ms", "wall_ms", "checkpoint_bytes")
    }
    w, n = args.window, args.turns
    database = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"\none session of {n} turns, demo agent on {database}"
        f"{' (cold: no transcript held)' * args.cold}"
        f" — {platform.python_version()} on {os.cpu_count()} cores\n"
    )
    print(
        f"{'per turn':34} {f'turns 1–{w}':>12} {f'turns {n - w + 1}–{n}':>14} "
        f"{'ratio':>7} {'spread':>13}"
    )
    names = {
        "framework_ms": "framework CPU ms (mean)",
        "cpu_ms": "whole CPU ms (mean)",
        "wall_ms": "wall ms (mean)",
        "checkpoint_bytes": "checkpoint bytes (mean)",
    }
    for metric, r in results.items():
        print(
            f"{names[metric]:34} {r['first_mean_ms']:12.2f} {r['last_mean_ms']:14.2f} "
            f"{r['ratio']:7.2f} {r['ratio_min']:6.2f}–{r['ratio_max']:<6.2f}"
        )
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "label": args.label,
        "cold": args.cold,
        "database": database,
        "turns": n,
        "window": w,
        "results": results,
        "per_turn": rows,
    }
    _write(Path(args.json), payload)
    print(f"\nwrote {args.json}")


def _write(out: Path, payload: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
