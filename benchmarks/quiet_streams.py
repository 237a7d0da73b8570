"""What quiet streams cost: a thousand readers following turns whose model is thinking.

A front end holds one stream per turn, and with a real model most of a turn is the wait for
the provider's first token. This script starts `--streams` turns in one process (each its
own session, driven in-process; the demo turn's model waits until released), attaches a
reader to each as the execute route does (`start`, then `reader().follow_batches`), and once
every stream has sent its `turn.started` measures `--window` seconds of that wait: the
process's CPU per stream per second, the readers' Store reads and the drivers' lease
renewals. Then it releases the model and checks that every stream ends with a `done` that
succeeded.

While they wait, each turn's driver renews its lease (every 8/3 s) and sends a heartbeat
(every 5 s), and each reader asks the Store where its turn stands once a second while its
stream is quiet (so a lost buffer message is caught up). Calls made in the same turn of
the event loop share one transaction (renewals come due together: drivers renew on a
shared grid), and a reader reads only its turn's status, seq and lease. `--modes` also
runs every read and renewal in a transaction of its own (`alone`), and that plus the whole
turn record per read (`record`, as readers read before), to show what each buys.
Contenders run in fresh interpreters, rotating over `--rounds`, on a SQLite file and on
PostgreSQL (a fresh schema in `TURNKIT_BENCH_POSTGRES_URL`, else `TURNKIT_TEST_POSTGRES_URL`).

Run:  .venv/bin/python benchmarks/quiet_streams.py [--streams 1000] [--window 10]
      [--rounds 2] [--stores sqlite,postgres] [--modes shared,alone,record] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/quiet_streams.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _procs
import _services

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from concurrent_turns import _SlowModel
from turn_overhead import add, write_json
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.ids import TurnId
from turnkit.runtime.reader import Frame
from turnkit.store import Lease, TurnProgress, _lease_sql as lease_sql
from turnkit.store._coalesce import Coalescer
from turnkit.store.sql import SqlStore

ROOT = Path(__file__).parent.parent
POSTGRES = _services.POSTGRES_URL
SHARED_BATCH = 256
"""Asks one shared read answers (as `SqlStore` does)."""


class _GatedModel(_SlowModel):
    """The demo turn's model, answering once the benchmark opens the gate (thinking)."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__(0.0)
        self.gate = gate

    async def first_byte(self) -> None:
        await asyncio.wait_for(self.gate.wait(), 600)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _follow(runtime: SessionRuntime, i: int, started: asyncio.Event) -> None:
    submission = await runtime.start(f"quiet-{i}", "What is 2 + 3?")
    last = b""
    async for batch in runtime.reader().follow_batches(submission.turn_id, submission=submission):
        if isinstance(batch, list):
            for frame in batch:
                if isinstance(frame, Frame):
                    last = frame.data
            started.set()
    if b'"type":"done"' not in last or b'"succeeded"' not in last:
        raise SystemExit(f"stream {i} did not end with a done that succeeded: {last[:200]!r}")


async def child(store: str, mode: str, streams: int, window: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tk-quiet-"))
    schema = None
    if store == "sqlite":
        url = f"sqlite:///{tmp / 'tk.db'}"
    else:
        import asyncpg

        schema = "quiet_" + uuid.uuid4().hex[:10]
        conn = await asyncpg.connect(POSTGRES)
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.close()
        url = POSTGRES
    gate = asyncio.Event()
    agent = Agent(model=_GatedModel(gate), tools=[add], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=url, database_schema=schema)
    runtime = SessionRuntime(agent=agent, config=config)
    await runtime.open()
    store_impl = runtime.store
    assert isinstance(store_impl, SqlStore), type(store_impl)
    asks, reads, renewals, renewal_txs = [0], [0], [0], [0]
    read_many, renew_many = store_impl._read_progress, store_impl._renew_many

    async def records(turn_ids: Sequence[TurnId]) -> dict[TurnId, TurnProgress]:
        found = {}
        for turn_id in turn_ids:  # the whole record, as readers read it before
            record = await runtime.store.get_turn(turn_id)
            if record is not None:
                found[turn_id] = TurnProgress.of(record)
        return found

    async def counted_reads(turn_ids: Sequence[TurnId]) -> dict[TurnId, TurnProgress]:
        reads[0] += 1
        asks[0] += len(turn_ids)
        return await (records if mode == "record" else read_many)(turn_ids)

    async def counted_renewals(
        asked: Sequence[lease_sql.Renewal],
    ) -> dict[lease_sql.Renewal, Lease | lease_sql.Refusal]:
        renewal_txs[0] += 1
        renewals[0] += len(asked)
        return await renew_many(asked)

    most = SHARED_BATCH if mode == "shared" else 1
    store_impl._progress = Coalescer(counted_reads, most=most)
    store_impl._renewals = Coalescer(counted_renewals, most=most)
    try:
        events = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.create_task(_follow(runtime, i, events[i])) for i in range(streams)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 300)
        await asyncio.sleep(min(2.0, window))  # the start-up burst settles
        asks[0] = reads[0] = renewals[0] = renewal_txs[0] = 0
        cpu, wall = _cpu_s(), time.perf_counter()
        await asyncio.sleep(window)
        cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
        measured = {
            "asks": asks[0],
            "reads": reads[0],
            "renewals": renewals[0],
            "renewal_txs": renewal_txs[0],
        }
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 600)
    finally:
        await runtime.close()
        if schema is not None:
            import asyncpg

            conn = await asyncpg.connect(POSTGRES)
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
            await conn.close()
    return {
        "store": store,
        "mode": mode,
        "streams": streams,
        "window_s": wall,
        "cpu_ms_per_stream_s": cpu * 1000 / streams / wall,
        "cpu_share_of_a_core": cpu / wall,
        "asks_per_s": measured["asks"] / wall,
        "reads_per_s": measured["reads"] / wall,
        "renewals_per_s": measured["renewals"] / wall,
        "renewal_txs_per_s": measured["renewal_txs"] / wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


NAMES = {
    "shared": "calls made together shared",
    "alone": "one transaction per call",
    "record": "... and whole turn records",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--modes", default="shared,alone,record")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/quiet_streams.json"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        store, mode = args.child
        result = asyncio.run(child(store, mode, args.streams, args.window))
        print(json.dumps(result))
        return
    stores, modes = args.stores.split(","), args.modes.split(",")
    contenders = [(s, m) for s in stores for m in modes]
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        k = rnd % len(contenders)
        for store, mode in contenders[k:] + contenders[:k]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", store, mode, "--streams",
                 str(args.streams), "--window", str(args.window)],
                check=True, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1]) | {"round": rnd}
            rows.append(row)
            cost = row["cpu_ms_per_stream_s"]
            print(f"  round {rnd}  {store:9} {NAMES[mode]:32} {cost:.3f} CPU ms per stream-second",
                  flush=True)  # fmt: skip
    print(f"\nquiet streams — {platform.python_version()} on {os.cpu_count()} cores, "
          f"{args.streams} streams, {args.window:g} s window, {args.rounds} rounds\n")  # fmt: skip
    header = (f"{'store':9} {'calls':32} {'CPU ms/stream·s':>16} {'× shared':>17} "
              f"{'core':>5} {'asks/s':>7} {'reads/s':>7} {'renew/s':>7} {'tx/s':>5} "
              f"{'RSS MiB':>7}")  # fmt: skip
    print(header)
    summary = []
    for store, mode in contenders:
        mine = [r for r in rows if (r["store"], r["mode"]) == (store, mode)]
        base = {r["round"]: r for r in rows if (r["store"], r["mode"]) == (store, "shared")}
        ratios = [r["cpu_ms_per_stream_s"] / base[r["round"]]["cpu_ms_per_stream_s"]
                  for r in mine if r["round"] in base]  # fmt: skip
        line = {
            "store": store,
            "mode": mode,
            "cpu_ms_per_stream_s": statistics.median(r["cpu_ms_per_stream_s"] for r in mine),
            "x_shared": statistics.median(ratios) if ratios else None,
            "x_shared_range": [min(ratios), max(ratios)] if ratios else None,
            "cpu_share_of_a_core": statistics.median(r["cpu_share_of_a_core"] for r in mine),
            "asks_per_s": statistics.median(r["asks_per_s"] for r in mine),
            "reads_per_s": statistics.median(r["reads_per_s"] for r in mine),
            "renewals_per_s": statistics.median(r["renewals_per_s"] for r in mine),
            "renewal_txs_per_s": statistics.median(r["renewal_txs_per_s"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
        }
        summary.append(line)
        ratio = ""
        if ratios:
            ratio = f"{line['x_shared']:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
        print(f"{store:9} {NAMES[mode]:32} {line['cpu_ms_per_stream_s']:16.3f} {ratio:>17} "
              f"{line['cpu_share_of_a_core']:5.2f} {line['asks_per_s']:7.0f} "
              f"{line['reads_per_s']:7.0f} {line['renewals_per_s']:7.0f} "
              f"{line['renewal_txs_per_s']:5.0f} {line['peak_rss_mib']:7.0f}")  # fmt: skip
    write_json(Path(args.json), {"python": platform.python_version(), "cores": os.cpu_count(),
               "streams": args.streams, "window_s": args.window, "rows": rows,
               "summary": summary})  # fmt: skip


if __name__ == "__main__":
    with _procs.stopped_at_end():  # a child `subprocess.run` waits for is stopped too
        main()
