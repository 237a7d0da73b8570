"""Turns per second as processes are added: N `turnkit serve` + M `turnkit worker` on loopback.

Every process shares one PostgreSQL (a fresh schema) and one Redis. The API processes only
commit and stream (`TURNKIT_RUN_IN_PROCESS=0`); the workers drive the turns with the offline
demo agent (a tool call, then the answer; zero model latency). A load of `--turns` turns
(`--concurrency` in flight), each `POST /sessions/{id}/execute` streamed to its `done`, is
spread over the API processes. Reported per layout: turns/s, p50/p99 turn latency, and
turns/s per process relative to the 1 + 1 layout.

Run:  .venv/bin/python benchmarks/scale_out.py [--turns 200] [--concurrency 20] [--json PATH]
Needs PostgreSQL on 127.0.0.1:5432 (database `test`) and Redis on 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).parent.parent
POSTGRES = os.environ.get("TURNKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("TURNKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
API = "/api/harness"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out)


def _layout(
    apis: int, workers: int, schema: str, logs: Path
) -> tuple[list[str], list[subprocess.Popen[bytes]]]:
    env = {
        **os.environ,
        "TURNKIT_REDIS_URL": REDIS,
        "TURNKIT_RUN_IN_PROCESS": "0",
        "TURNKIT_DATABASE_SCHEMA": schema,
    }
    env.pop("TURNKIT_MODEL", None)
    procs, urls = [], []
    for i in range(apis):
        port = _port()
        cmd = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
               "--database-url", POSTGRES, "--database-schema", schema]  # fmt: skip
        procs.append(_start(cmd, env, logs / f"api{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    for i in range(workers):
        cmd = [sys.executable, "-m", "turnkit.cli", "worker", "--concurrency", "16",
               "--poll-interval", "0.02", "--database-url", POSTGRES, "--database-schema",
               schema, "--redis-url", REDIS]  # fmt: skip
        procs.append(_start(cmd, env, logs / f"worker{i}.log"))
    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not start; see {logs}")
            time.sleep(0.1)
    return urls, procs


async def _load(urls: list[str], turns: int, concurrency: int) -> tuple[float, list[float]]:
    gate = asyncio.Semaphore(concurrency)
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

    async with httpx.AsyncClient(timeout=120) as http:
        await one(-1, http)  # warm up every path once
        latencies.clear()
        began = time.perf_counter()
        await asyncio.gather(*(one(i, http) for i in range(turns)))
        elapsed = time.perf_counter() - began
    return turns / elapsed, latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/scale_out.json"))
    args = parser.parse_args()
    logs = ROOT / "benchmarks/results/scale_out_logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for apis, workers in ((1, 1), (2, 2)):
        schema = f"tk_scale_{uuid.uuid4().hex[:8]}"
        urls, procs = _layout(apis, workers, schema, logs)
        try:
            rate, lat = asyncio.run(_load(urls, args.turns, args.concurrency))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            subprocess.run(["psql", POSTGRES, "-q", "-c", f'DROP SCHEMA "{schema}" CASCADE'],
                           capture_output=True, check=False, timeout=60)  # fmt: skip
        lat.sort()
        rows.append({
            "api_processes": apis, "workers": workers, "turns_per_s": round(rate, 1),
            "p50_ms": round(statistics.median(lat), 1),
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
        })  # fmt: skip
    base = rows[0]["turns_per_s"] / 2
    print(f"\nscale-out — Python {platform.python_version()} on {os.cpu_count()} cores, "
          f"{args.turns} turns, {args.concurrency} in flight\n")  # fmt: skip
    print(f"{'layout':22}{'turns/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'per process vs 1+1':>22}")
    for row in rows:
        per = row["turns_per_s"] / (row["api_processes"] + row["workers"]) / base
        row["per_process_vs_1_1"] = round(per, 2)
        layout = f"{row['api_processes']} API + {row['workers']} worker(s)"
        print(f"{layout:22}{row['turns_per_s']:>10}{row['p50_ms']:>10}{row['p99_ms']:>10}"
              f"{row['per_process_vs_1_1']:>22}")  # fmt: skip
    Path(args.json).write_text(json.dumps({"rows": rows, "cores": os.cpu_count()}, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
