"""SIGKILL `turnkit worker` processes at random points while turns stream; others take over.

The scale-out layout: an API process that only commits and streams
(`TURNKIT_RUN_IN_PROCESS=0`) and two workers that drive the turns, on PostgreSQL (a private
schema, Redis for the live tail) and on one SQLite file (no Redis: readers follow the
Store). Each trial streams two tool-using turns through the API, waits for a randomly
chosen event of the first one plus a random delay (before, during or after the tool, or
between the answer and the settle), SIGKILLs the worker driving it and starts a fresh
worker. The streams stay open on the API process: the turns go on under another worker
(`turn.recovering`). It prints the fault table and fails on any loss, duplicate, stuck turn
or effect applied twice.

Bounded: `TURNKIT_FAULT_TRIALS` (default 3) trials of two turns, each wait bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import POSTGRES_URL, REDIS_URL
from tests.faults._cluster import (
    API,
    TERMINAL,
    Apis,
    Turn,
    Workers,
    follow,
    follow_to_done,
    pid_of,
)
from tests.faults._table import FaultTable, percentile, seq_faults, tool_effects
from tests.http.test_multiprocess import Servers, servers
from turnkit.ids import TurnId
from turnkit.store.sql import SqlStore

pytestmark = [pytest.mark.slow, pytest.mark.faults]
TRIALS = int(os.environ.get("TURNKIT_FAULT_TRIALS", "3"))
TURNS_PER_TRIAL = 2
KILL_AT = ("turn.started", "step.start", "tool.started", "tool.completed", "message.complete")
WORKER_ENV = {"TK_TOOL_SLEEP": "1", "TK_ENRICH_SLEEP": "0.5"}
__all__ = ("servers",)  # the fixture, re-exported for pytest


async def _victim(store: SqlStore, turn: Turn, workers: Workers, rng: random.Random) -> int:
    """The worker driving `turn` (waiting up to 2 s for a claim), else a random live one."""
    live = {p.pid: p for p in workers.live}
    deadline = time.monotonic() + 2
    while turn.turn_id is not None and time.monotonic() < deadline:
        record = await store.get_turn(TurnId(turn.turn_id))
        if record is None or record.status in TERMINAL:
            break
        pid = pid_of(record.lease_owner)
        if pid in live:
            return pid
        await asyncio.sleep(0.05)
    return rng.choice(sorted(live))


async def _storm(
    *, api: str, workers: Workers, store: SqlStore, log: Path, prefix: str
) -> tuple[FaultTable, int]:
    """Run the trials; the table and how many turns ended other than `succeeded`."""
    rng = random.Random(int(os.environ.get("TURNKIT_FAULT_SEED", "17")))
    turns: list[Turn] = []
    kill_points: list[str] = []
    recovery_s: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for trial in range(TRIALS):
            batch = [
                Turn(session=f"{prefix}-{trial}-{i}", request_id=f"{prefix}-req-{trial}-{i}")
                for i in range(TURNS_PER_TRIAL)
            ]
            turns += batch
            kill_at, delay = rng.choice(KILL_AT), rng.uniform(0.0, 0.4)
            kill_points.append(f"{kill_at}+{delay:.1f}s")
            seen = asyncio.Event()
            streams = [
                asyncio.create_task(
                    follow(http, turn, api, seen=seen if i == 0 else None, kill_at=kill_at)
                )
                for i, turn in enumerate(batch)
            ]
            async with asyncio.timeout(30):
                await seen.wait()
            await asyncio.sleep(delay)
            pid = await _victim(store, batch[0], workers, rng)
            os.kill(pid, signal.SIGKILL)
            next(p for p in workers.procs if p.pid == pid).wait(timeout=10)
            killed = time.monotonic()
            workers.start(**WORKER_ENV)  # a fresh worker; the other one is still there
            async with asyncio.timeout(60):
                await asyncio.gather(*streams)
                await asyncio.gather(*(follow_to_done(http, t, api) for t in batch))
            for turn in batch:
                recovered = turn.first("turn.recovering")
                if recovered is not None and recovered > killed:
                    recovery_s.append(recovered - killed)
        lost = duplicated = stuck = failed = taken_over = 0
        for turn in turns:
            stored = (await http.get(f"{api}{API}/turns/{turn.turn_id}")).json()
            gone, twice = seq_faults(turn.seqs, stored["lastSeq"])
            lost, duplicated = lost + gone, duplicated + twice
            stuck += stored["status"] not in TERMINAL
            failed += stored["status"] in TERMINAL and stored["status"] != "succeeded"
            taken_over += "turn.recovering" in turn.types
    reruns, applied_twice = tool_effects(log)
    table = FaultTable(
        trials=TRIALS,
        lost=lost,
        duplicated=duplicated,
        stuck=stuck,
        tool_reruns=reruns,
        applied_twice=applied_twice,
        extra={
            "turns": len(turns),
            "turns taken over": taken_over,
            "ended not succeeded": failed,
            "recovery p50 s": round(statistics.median(recovery_s), 2) if recovery_s else "-",
            "recovery p95 s": round(percentile(recovery_s, 0.95), 2) if recovery_s else "-",
            "killed at": ", ".join(kill_points),
        },
    )
    return table, failed


async def test_killing_workers_on_postgres_loses_nothing(
    servers: Servers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api, _ = servers.start(TURNKIT_RUN_IN_PROCESS="0", TURNKIT_IDLE_WINDOW_S="60")
    workers = Workers(
        database_url=POSTGRES_URL, schema=servers.schema, redis_url=REDIS_URL, log=servers.log
    )
    store = SqlStore.from_url(POSTGRES_URL, schema=servers.schema)
    try:
        for _ in range(2):
            workers.start(**WORKER_ENV)
        table, failed = await _storm(
            api=api, workers=workers, store=store, log=servers.log, prefix="pgw"
        )
    finally:
        workers.stop()
        await store.close()
    table.show(
        "worker kill storm (PostgreSQL + Redis, 1 API + 2 workers)",
        capsys,
        save=tmp_path / "worker_kill_storm_pg.json",
    )
    assert table.failures == (0, 0, 0, 0), table
    assert failed == 0, table
    assert table.extra["turns taken over"], "no kill landed on a running turn"


async def test_killing_workers_on_sqlite_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    log = tmp_path / "calls.jsonl"
    apis = Apis(database_url=url, log=log)
    workers = Workers(database_url=url, log=log)
    store = SqlStore.from_url(url)
    try:
        api, _ = apis.start(TURNKIT_RUN_IN_PROCESS="0", TURNKIT_IDLE_WINDOW_S="60")
        for _ in range(2):
            workers.start(**WORKER_ENV)
        table, failed = await _storm(api=api, workers=workers, store=store, log=log, prefix="sqw")
    finally:
        workers.stop()
        apis.stop()
        await store.close()
    table.show(
        "worker kill storm (SQLite, no Redis, 1 API + 2 workers)",
        capsys,
        save=tmp_path / "worker_kill_storm_sqlite.json",
    )
    assert table.failures == (0, 0, 0, 0), table
    assert failed == 0, table
    assert table.extra["turns taken over"], "no kill landed on a running turn"
