"""SIGKILL the API process on SQLite at random points while turns stream; restart it.

The single-process deployment: one `turnkit serve` on a SQLite file, no Redis (the
in-memory replay buffer), the quickstart's defaults otherwise (turns run in the process
and its recovery loop is on). Each trial streams two tool-using turns, kills the process
at a random point (when the first stream sees a randomly chosen event, plus a random
delay: before, during or after the tool, or between the answer and the settle), restarts
it on the same file, and follows every turn from the last event its client received. The
restarted process takes its own turns over. It prints a table — trials, turns, turns cut
mid-stream, lost, duplicated, stuck, tool re-runs, effects applied twice, recovery p50/p95
— and fails on any loss, duplicate or stuck turn.

Bounded: `TURNKIT_FAULT_TRIALS` (default 3) trials of two turns, each wait bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults._cluster import API, TERMINAL, Apis, Turn, follow, follow_to_done
from tests.faults._table import FaultTable, percentile, seq_faults, tool_effects

pytestmark = [pytest.mark.slow, pytest.mark.faults]
TRIALS = int(os.environ.get("TURNKIT_FAULT_TRIALS", "3"))
TURNS_PER_TRIAL = 2
KILL_AT = ("turn.started", "step.start", "tool.started", "tool.completed", "message.complete")
ENV = {
    "TURNKIT_LEASE_TTL_S": "2",  # recovery within seconds: the test stays short
    "TURNKIT_IDLE_WINDOW_S": "60",  # readers wait for the restart, never time out
    "TK_TOOL_SLEEP": "1",
}


class SqliteServer:
    """One `turnkit serve` process on a SQLite file, killed and restarted by the test."""

    def __init__(self, db: Path, log: Path) -> None:
        self.apis = Apis(database_url=f"sqlite:///{db}", log=log)
        self.log = log

    def start(self) -> str:
        url, _ = self.apis.start(**ENV)
        return url

    def kill(self) -> None:
        proc = self.apis.procs[-1]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        self.apis.stop()


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[SqliteServer]:
    server = SqliteServer(tmp_path / "storm.db", tmp_path / "calls.jsonl")
    try:
        yield server
    finally:
        server.stop()


async def test_killing_the_sqlite_api_process_at_random_points_loses_nothing(
    sqlite_server: SqliteServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(int(os.environ.get("TURNKIT_FAULT_SEED", "13")))
    url = sqlite_server.start()
    turns: list[Turn] = []
    cut = lost = duplicated = stuck = failed = 0
    kill_points: list[str] = []
    recovery_s: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for trial in range(TRIALS):
            batch = [
                Turn(session=f"sq-{trial}-{i}", request_id=f"req-{trial}-{i}")
                for i in range(TURNS_PER_TRIAL)
            ]
            turns += batch
            kill_at, delay = rng.choice(KILL_AT), rng.uniform(0.0, 0.4)
            kill_points.append(f"{kill_at}+{delay:.1f}s")
            seen = asyncio.Event()
            streams = [
                asyncio.create_task(
                    follow(http, turn, url, seen=seen if i == 0 else None, kill_at=kill_at)
                )
                for i, turn in enumerate(batch)
            ]
            async with asyncio.timeout(30):
                await seen.wait()
            await asyncio.sleep(delay)
            sqlite_server.kill()
            killed = time.monotonic()
            async with asyncio.timeout(30):
                await asyncio.gather(*streams)
            open_turns = [t for t in batch if not t.done]
            cut += len(open_turns)
            url = sqlite_server.start()  # the same file: the restarted app recovers its turns
            before = [len(t.seqs) for t in open_turns]
            async with asyncio.timeout(60):
                await asyncio.gather(*(follow_to_done(http, t, url) for t in open_turns))
            for turn, count in zip(open_turns, before, strict=True):  # the next event after it
                recovery_s.append(turn.arrived[count] - killed)
        for turn in turns:
            stored = (await http.get(f"{url}{API}/turns/{turn.turn_id}")).json()
            gone, twice = seq_faults(turn.seqs, stored["lastSeq"])
            lost, duplicated = lost + gone, duplicated + twice
            stuck += stored["status"] not in TERMINAL
            failed += stored["status"] in TERMINAL and stored["status"] != "succeeded"
    reruns, applied_twice = tool_effects(sqlite_server.log)
    table = FaultTable(
        trials=TRIALS,
        lost=lost,
        duplicated=duplicated,
        stuck=stuck,
        tool_reruns=reruns,
        applied_twice=applied_twice,
        extra={
            "turns": len(turns),
            "turns cut mid-stream": cut,
            "ended not succeeded": failed,
            "recovery p50 s": round(statistics.median(recovery_s), 2) if recovery_s else "-",
            "recovery p95 s": round(percentile(recovery_s, 0.95), 2) if recovery_s else "-",
            "killed at": ", ".join(kill_points),
        },
    )
    table.show(
        "kill storm (the API process, SQLite, restarted on the same file)",
        capsys,
        save=tmp_path / "kill_storm_sqlite.json",
    )
    assert table.failures == (0, 0, 0, 0), table
    assert failed == 0, table
    assert cut > 0, "no kill landed while a turn streamed"
