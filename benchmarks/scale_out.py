"""Turns per second as processes are added: N `turnkit serve` + M `turnkit worker` on loopback.

Every process shares one PostgreSQL (a fresh schema per run) and one Redis. The API
processes only commit and stream (`TURNKIT_RUN_IN_PROCESS=0`); the workers drive the
turns, each at most `--worker-concurrency` at once (otherwise at `turnkit worker`'s
defaults), with the offline demo agent (a plan
call, a tool call, then the answer). Its model waits `latency` seconds before each call,
as a provider would; `--latencies` lists the values run (default 0, so a turn is all CPU,
and 0.5). A load of `--turns` turns (`--in-flight` at once, more than the workers can
drive together), each `POST /sessions/{id}/execute` streamed to its `done`, is spread
over the API processes.

Each layout and latency runs once per round, in an order that rotates over `--rounds`.
Reported per layout and latency: turns/s, p50/p99 turn latency, the machine's CPU per
turn (all of it, from /proc/stat: the turnkit processes, PostgreSQL, Redis and the load
generator) and the API and worker processes' own, and turns/s relative to 1 API + 1 worker at
the same latency in the same round (median, min–max over rounds).

Run:  .venv/bin/python benchmarks/scale_out.py [--turns 200] [--in-flight 64]
      [--layouts 1+1,1+2,1+3,2+2] [--latencies 0,0.5] [--rounds 2] [--json PATH]
Needs PostgreSQL and Redis (`TURNKIT_BENCH_POSTGRES_URL`, `TURNKIT_BENCH_REDIS_URL`, else
the tests' `TURNKIT_TEST_*`, else 127.0.0.1:5432 database `test` and 127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

import _procs
import _services
from turnkit import Agent
from turnkit.demo import DemoModel, demo_agent
from turnkit.models import ModelChunk, ModelRequest

ROOT = Path(__file__).parent.parent
POSTGRES = _services.POSTGRES_URL
REDIS = _services.REDIS_URL
API = "/api/harness"
LATENCY_VAR = "TURNKIT_BENCH_MODEL_LATENCY_S"
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


class _SlowDemoModel(DemoModel):
    """The demo model, waiting `latency` seconds before each call's first chunk."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if self.latency:
            await asyncio.sleep(self.latency)
        async for chunk in super().stream(request):
            yield chunk


def bench_agent() -> Agent:
    """The agent every process of a layout hosts (`scale_out:AGENT`): the demo agent, slowed."""
    latency = float(os.environ.get(LATENCY_VAR, "0"))
    return dataclasses.replace(demo_agent(), model=_SlowDemoModel(latency))


def __getattr__(name: str) -> Any:  # `scale_out:AGENT`, built only in the processes that load it
    if name == "AGENT":
        return bench_agent()
    raise AttributeError(name)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_layout(
    apis: int,
    workers: int,
    latency: float,
    per_worker: int,
    schema: str,
    logs: Path,
    worker_args: tuple[str, ...] = (),
) -> tuple[list[str], list[subprocess.Popen[bytes]]]:
    env = {
        **os.environ,
        "TURNKIT_REDIS_URL": REDIS,
        "TURNKIT_RUN_IN_PROCESS": "0",
        "TURNKIT_DATABASE_SCHEMA": schema,
        "TURNKIT_AGENT": "scale_out:AGENT",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                    os.environ.get("PYTHONPATH")])),
        LATENCY_VAR: str(latency),
    }  # fmt: skip
    env.pop("TURNKIT_MODEL", None)
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(apis):
            port = _port()
            cmd = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
                   "--database-url", POSTGRES, "--database-schema", schema]  # fmt: skip
            procs.append(_procs.start(cmd, log=logs / f"api{i}.log", env=env, cwd=ROOT))
            urls.append(f"http://127.0.0.1:{port}")
        for i in range(workers):
            cmd = [sys.executable, "-m", "turnkit.cli", "worker", "--agent", "scale_out:AGENT",
                   "--concurrency", str(per_worker),
                   "--database-url", POSTGRES, "--database-schema", schema,
                   "--redis-url", REDIS, *worker_args]  # fmt: skip
            procs.append(_procs.start(cmd, log=logs / f"worker{i}.log", env=env, cwd=ROOT))
        deadline = time.monotonic() + 60
        for url in urls:
            while True:
                if any(proc.poll() is not None for proc in procs):  # a bad agent, port, URL
                    raise SystemExit(f"a process of the layout exited at start; see {logs}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} did not start; see {logs}")
                time.sleep(0.1)
    except BaseException:
        stop_layout(procs, schema)  # what did start must not outlive the run
        raise
    return urls, procs


def _machine_busy_ticks() -> int:
    """CPU ticks the whole machine spent busy (not idle, not waiting on I/O) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def _process_ticks(procs: list[subprocess.Popen[bytes]]) -> int:
    """User + system CPU ticks of `procs` so far."""
    total = 0
    for proc in procs:
        with open(f"/proc/{proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


async def _load(
    urls: list[str], turns: int, in_flight: int, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    gate = asyncio.Semaphore(in_flight)
    latencies: list[float] = []

    async def one(i: int, http: httpx.AsyncClient) -> None:
        async with gate:
            started = time.perf_counter()
            url = urls[i % len(urls)]
            body = {"content": "What is 6 * 7?"}
            async with http.stream("POST", f"{url}{API}/sessions/load-{i}/execute", json=body) as r:
                text = "".join([chunk async for chunk in r.aiter_text()])
            if '"type":"done"' not in text or '"status":"succeeded"' not in text:
                raise SystemExit(f"turn {i} did not succeed:\n{text[-400:]}")
            latencies.append((time.perf_counter() - started) * 1000)

    limits = httpx.Limits(max_connections=in_flight + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        for warm in range(len(urls) * 4):  # every path once, on every API process
            await one(-1 - warm, http)
        latencies.clear()
        apis, workers = procs[: len(urls)], procs[len(urls) :]
        machine0 = _machine_busy_ticks()
        api0, worker0 = _process_ticks(apis), _process_ticks(workers)
        began = time.perf_counter()
        await asyncio.gather(*(one(i, http) for i in range(turns)))
        elapsed = time.perf_counter() - began
        machine = _machine_busy_ticks() - machine0
        api, worker = _process_ticks(apis) - api0, _process_ticks(workers) - worker0
    latencies.sort()
    return {
        "turns_per_s": turns / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "machine_cpu_ms_per_turn": machine * TICK_MS / turns,
        "api_cpu_ms_per_turn": api * TICK_MS / turns,
        "worker_cpu_ms_per_turn": worker * TICK_MS / turns,
    }


def run_layout(
    apis: int, workers: int, latency: float, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    """One layout at one latency, on a schema of its own, its processes stopped after."""
    schema = f"tk_scale_{uuid.uuid4().hex[:8]}"
    urls, procs = start_layout(apis, workers, latency, args.worker_concurrency, schema, logs)
    try:
        result = asyncio.run(_load(urls, args.turns, args.in_flight, procs))
    finally:
        stop_layout(procs, schema)
    return {"api_processes": apis, "workers": workers, "latency_s": latency, **result}


def stop_layout(procs: list[subprocess.Popen[bytes]], schema: str) -> None:
    """SIGTERM every process of a layout, wait for them, drop its schema."""
    _procs.stop(procs)
    try:
        subprocess.run(["psql", POSTGRES, "-q", "-c", f'DROP SCHEMA "{schema}" CASCADE'],
                       capture_output=True, check=False, timeout=60)  # fmt: skip
    except FileNotFoundError:  # no PostgreSQL client here
        print(f"psql not found: drop schema {schema!r} by hand", file=sys.stderr)


def write_json(args: argparse.Namespace, summary: list[Any], rows: list[Any]) -> None:
    """Write a run's summary and rows to `--json`, and say where."""
    Path(args.json).write_text(json.dumps(
        {"summary": summary, "rows": rows, "cores": os.cpu_count(), "args": vars(args)}, indent=2
    ))  # fmt: skip
    print(f"\nwrote {args.json}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--worker-concurrency", type=int, default=16)
    parser.add_argument("--layouts", default="1+1,1+2,1+3,2+2")
    parser.add_argument("--latencies", default="0,0.5")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/scale_out.json"))
    args = parser.parse_args()
    layouts = [tuple(int(n) for n in item.split("+")) for item in args.layouts.split(",")]
    if (1, 1) not in layouts:
        raise SystemExit("--layouts must include 1+1 (the ratios are against it)")
    runs = [(a, w, float(lat)) for lat in args.latencies.split(",") for a, w in layouts]
    logs = Path(args.json).parent / "scale_out_logs"  # beside the results
    logs.mkdir(parents=True, exist_ok=True)

    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        shift = r % len(runs)
        for apis, workers, latency in runs[shift:] + runs[:shift]:
            row = run_layout(apis, workers, latency, args, logs)
            rows.append({**row, "round": r + 1})
            print(f"round {r + 1}: {apis} API + {workers} worker(s), model latency "
                  f"{latency:g} s: {row['turns_per_s']:.1f} turns/s", flush=True)  # fmt: skip

    summary = []
    for apis, workers, latency in runs:
        mine = [x for x in rows if (x["api_processes"], x["workers"], x["latency_s"])
                == (apis, workers, latency)]  # fmt: skip
        ratios = []
        for x in mine:
            base = next(b for b in rows if (b["api_processes"], b["workers"], b["latency_s"],
                                            b["round"]) == (1, 1, latency, x["round"]))  # fmt: skip
            ratios.append(x["turns_per_s"] / base["turns_per_s"])
        summary.append({
            "api_processes": apis, "workers": workers, "latency_s": latency,
            **{key: statistics.median(x[key] for x in mine)
               for key in ("turns_per_s", "p50_ms", "p99_ms", "machine_cpu_ms_per_turn",
                           "api_cpu_ms_per_turn", "worker_cpu_ms_per_turn")},
            "vs_1_1": statistics.median(ratios), "vs_1_1_min": min(ratios),
            "vs_1_1_max": max(ratios), "vs_1_1_text": _spread(ratios),
        })  # fmt: skip

    print(f"\nscale-out — Python {platform.python_version()} on {os.cpu_count()} cores, "
          f"{args.turns} turns, {args.in_flight} in flight, at most "
          f"{args.worker_concurrency} per worker, {args.rounds} rounds (medians)\n")  # fmt: skip
    print(
        "| model latency | layout | turns/s | × 1 + 1 | p50 / p99 ms | machine CPU ms per turn "
        "| API / worker processes' CPU ms per turn |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['latency_s']:g} s | {s['api_processes']} API + {s['workers']} worker"
              f"{'s' if s['workers'] > 1 else ''} | {s['turns_per_s']:.1f} | {s['vs_1_1_text']} "
              f"| {s['p50_ms']:,.0f} / {s['p99_ms']:,.0f} | {s['machine_cpu_ms_per_turn']:.1f} "
              f"| {s['api_cpu_ms_per_turn']:.1f} / {s['worker_cpu_ms_per_turn']:.1f} |"
              )  # fmt: skip
    write_json(args, summary, rows)


if __name__ == "__main__":
    with _procs.stopped_at_end():
        main()
