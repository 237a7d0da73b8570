"""SIGKILL the API process driving a turn at random points; the other process takes it over.

Two `turnkit serve` processes share PostgreSQL and Redis with their default recovery
settings (the apps' own recovery loop on, the default lease TTL). Each trial starts a
tool-using turn on process A, kills A at a random point (right after the turn starts, or
while its tool runs), follows the turn on process B from the last event A sent, and
restarts A. It prints a table — trials, lost, duplicated, stuck, tool re-runs, effects
applied twice, recovery time p50/p95 — and fails on any loss, duplicate or stuck turn.

The rolling-restart test runs the documented layout (2 API processes with
`TURNKIT_RUN_IN_PROCESS=0`, 2 workers) and restarts every process once while turns stream.

Bounded: `TURNKIT_FAULT_TRIALS` (default 3) trials, each bounded in time.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from tests.conftest import POSTGRES_URL, REDIS_URL
from tests.faults._cluster import Turn, Workers, follow, follow_to_done, pid_of
from tests.faults._table import FaultTable, percentile, seq_faults, tool_effects
from tests.http.test_multiprocess import API, Servers, _events, servers
from turnkit.ids import TurnId
from turnkit.store.sql import SqlStore

pytestmark = [pytest.mark.slow, pytest.mark.faults]
TRIALS = int(os.environ.get("TURNKIT_FAULT_TRIALS", "3"))
__all__ = ("servers",)  # the fixture, re-exported for pytest


async def test_killing_api_processes_at_random_points_loses_nothing(
    servers: Servers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(int(os.environ.get("TURNKIT_FAULT_SEED", "7")))
    defaults = {"TURNKIT_LEASE_TTL_S": "8", "TURNKIT_IDLE_WINDOW_S": "60"}
    url_a, proc_a = servers.start(TK_TOOL_SLEEP="60", **defaults)
    url_b, _ = servers.start(**defaults)
    lost = duplicated = stuck = 0
    recovery_s: list[float] = []
    turn_ids: list[str] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for trial in range(TRIALS):
            kill_at = rng.choice(["turn.started", "tool.started"])
            seen: list[dict[str, object]] = []
            async for event in _events(
                http, "POST", f"{url_a}{API}/sessions/storm-{trial}/execute",
                json={"content": "double 21"}, until=kill_at,
            ):  # fmt: skip
                if "seq" in event:
                    seen.append(event)
            turn_id, last = str(seen[0]["_turn"]), int(str(seen[-1]["seq"]))
            turn_ids.append(turn_id)
            proc_a.send_signal(signal.SIGKILL)
            proc_a.wait(timeout=10)
            killed = time.monotonic()
            rest: list[dict[str, object]] = []
            async for event in _events(
                http, "GET", f"{url_b}{API}/turns/{turn_id}/stream",
                headers={"Last-Event-ID": str(last)}, until="done",
            ):  # fmt: skip
                if event.get("type") == "turn.recovering":  # streaming again, taken over
                    recovery_s.append(time.monotonic() - killed)
                if "seq" in event:
                    rest.append(event)
            seqs = [int(str(e["seq"])) for e in seen + rest]
            expected = list(range(1, max(seqs) + 1))
            lost += len(set(expected) - set(seqs))
            duplicated += len(seqs) - len(set(seqs))
            stored = (await http.get(f"{url_b}{API}/turns/{turn_id}")).json()
            if stored["status"] != "succeeded":
                stuck += 1
            elif stored["lastSeq"] != max(seqs):
                lost += stored["lastSeq"] - max(seqs)
            url_a, proc_a = servers.start(TK_TOOL_SLEEP="60", **defaults)  # restart A
    reruns, applied_twice = tool_effects(servers.log)
    table = FaultTable(
        trials=TRIALS,
        lost=lost,
        duplicated=duplicated,
        stuck=stuck,
        tool_reruns=reruns,
        applied_twice=applied_twice,
        extra={
            "recovery p50 s": round(statistics.median(recovery_s), 2),
            "recovery p95 s": round(percentile(recovery_s, 0.95), 2),
        },
    )
    table.show(
        "kill storm (API processes, PostgreSQL + Redis)", capsys, save=tmp_path / "kill_storm.json"
    )
    p95 = percentile(recovery_s, 0.95)
    assert table.failures == (0, 0, 0, 0), table
    assert p95 <= 10.0, f"a killed turn took {p95:.1f} s to stream again (p95)"


class _Deploy:
    """2 API processes (`TURNKIT_RUN_IN_PROCESS=0`) + 2 workers, and the turns streaming."""

    API_ENV: ClassVar[dict[str, str]] = {
        "TURNKIT_RUN_IN_PROCESS": "0",
        "TURNKIT_IDLE_WINDOW_S": "60",
    }
    WORKER_ENV: ClassVar[dict[str, str]] = {"TK_TOOL_SLEEP": "3"}

    def __init__(self, servers: Servers, http: httpx.AsyncClient) -> None:
        self.servers = servers
        self.http = http
        self.apis = [servers.start(**self.API_ENV), servers.start(**self.API_ENV)]
        self.workers = Workers(
            database_url=POSTGRES_URL, schema=servers.schema, redis_url=REDIS_URL, log=servers.log
        )
        self.live = [self.workers.start(**self.WORKER_ENV) for _ in range(2)]
        self.store = SqlStore.from_url(POSTGRES_URL, schema=servers.schema)
        self.stopping: set[str] = set()
        self.turns: list[Turn] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.restarted = 0

    def pick(self, cut: str | None) -> str:
        """A live API process, another than the one that cut the stream."""
        urls = [url for url, _ in self.apis if url not in self.stopping]
        return next((url for url in urls if url != cut), urls[0])

    async def stream(self, url: str) -> None:
        """Start a turn on `url` and follow it to `done`; returns once its tool runs."""
        turn = Turn(session=f"roll-{len(self.turns)}", request_id=f"roll-{len(self.turns)}")
        self.turns.append(turn)
        running = asyncio.Event()

        async def run() -> None:
            await follow(self.http, turn, url, seen=running, kill_at="tool.started")
            await follow_to_done(self.http, turn, self.pick)

        self.tasks.append(asyncio.create_task(run()))
        async with asyncio.timeout(30):
            await running.wait()

    async def restart_api(self, index: int) -> None:
        """SIGTERM with a stream open on this very process; a replacement takes its place."""
        url, proc = self.apis[index]
        await self.stream(url)
        self.stopping.add(url)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        self.apis[index] = self.servers.start(**self.API_ENV)
        self.restarted += 1

    async def restart_worker(self, index: int) -> None:
        """SIGTERM while this very worker drives a turn (bounded tries to get it one)."""
        proc = self.live[index]
        for _ in range(16):  # either worker may claim a new turn: try until this one has one
            await self.stream(self.pick(None))
            if await self._drives(proc.pid, self.turns[-1]):
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        self.live[index] = self.workers.start(**self.WORKER_ENV)
        self.restarted += 1

    async def _drives(self, pid: int, turn: Turn) -> bool:
        """Whether `pid` drives `turn`, the newest: its tool has just started and sleeps for
        longer than the drain timeout, so a SIGTERM now leaves it to another worker (an older
        turn's tool may end during the drain, and nothing would be taken over)."""
        record = await self.store.get_turn(TurnId(str(turn.turn_id)))
        return bool(record and record.status == "running" and pid_of(record.lease_owner) == pid)

    async def account(self) -> FaultTable:
        """Wait for every turn's `done` (bounded), then count against the stored logs."""
        async with asyncio.timeout(90):
            await asyncio.gather(*self.tasks)
        lost = duplicated = stuck = taken_over = 0
        for turn in self.turns:
            stored = (await self.http.get(f"{self.pick(None)}{API}/turns/{turn.turn_id}")).json()
            gone, twice = seq_faults(turn.seqs, stored["lastSeq"])
            lost, duplicated = lost + gone, duplicated + twice
            stuck += stored["status"] != "succeeded"
            taken_over += stored["attempts"] > 1 or "turn.recovering" in turn.types
        reruns, applied_twice = tool_effects(self.servers.log)
        return FaultTable(
            trials=self.restarted,
            lost=lost,
            duplicated=duplicated,
            stuck=stuck,
            tool_reruns=reruns,
            applied_twice=applied_twice,
            extra={
                "turns": len(self.turns),
                "streams cut by a restart": sum(
                    bool(set(t.cut_on) & self.stopping) for t in self.turns
                ),
                "turns taken over": taken_over,
            },
        )

    async def close(self) -> None:
        self.workers.stop()
        await self.store.close()


async def test_a_rolling_restart_of_every_process_loses_no_turn(
    servers: Servers, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deploy as documented: 2 API processes (`TURNKIT_RUN_IN_PROCESS=0`) and 2 workers.

    Each process in turn gets SIGTERM and a replacement while turns stream: a stream open on
    the stopping API process reconnects with `Last-Event-ID` to the other one; a stopping
    worker leaves its turns after its drain timeout and another worker takes them over.
    """
    async with httpx.AsyncClient(timeout=60) as http:
        deploy = _Deploy(servers, http)
        try:
            await deploy.restart_api(0)
            await deploy.restart_worker(0)
            await deploy.restart_api(1)
            await deploy.restart_worker(1)
            table = await deploy.account()
        finally:
            await deploy.close()
    table.show("rolling restart (2 API + 2 workers, PostgreSQL + Redis)", capsys)
    assert table.failures == (0, 0, 0, 0), table
    assert deploy.restarted == 4, "every process is restarted once"
    for url in deploy.stopping:  # each API restart cut a stream that went on elsewhere
        assert any(url in t.cut_on for t in deploy.turns), f"no stream was open on {url}"
    assert table.extra["turns taken over"], "no turn was taken over by another worker"
