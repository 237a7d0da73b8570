"""SIGKILL the API process driving a turn at random points; the other process takes it over.

Two `turnkit serve` processes share PostgreSQL and Redis with their default recovery
settings (the apps' own recovery loop on, the default lease TTL). Each trial starts a
tool-using turn on process A, kills A at a random point (right after the turn starts, or
while its tool runs), follows the turn on process B from the last event A sent, and
restarts A. It prints a table — trials, lost, duplicated, stuck, tool re-runs, effects
applied twice, recovery time p50/p95 — and fails on any loss, duplicate or stuck turn.

Bounded: `TURNKIT_FAULT_TRIALS` (default 3) trials, each bounded in time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from tests.http.test_multiprocess import API, Servers, _events, servers
from tests.support.worker_agent import read_log

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
    runs = [line for line in read_log(servers.log) if line["event"] == "tool"]
    keys_per_call: dict[tuple[str, str], set[str]] = defaultdict(set)
    for line in runs:  # a re-run under another key would apply its effect twice
        keys_per_call[(str(line["turn"]), str(line["call"]))].add(str(line["key"]))
    by_key: dict[str, int] = defaultdict(int)
    for line in runs:
        by_key[str(line["key"])] += 1
    reruns = sum(n - 1 for n in by_key.values())
    applied_twice = sum(1 for keys in keys_per_call.values() if len(keys) > 1)
    p50 = statistics.median(recovery_s)
    p95 = sorted(recovery_s)[max(0, round(0.95 * len(recovery_s)) - 1)]
    table = {
        "trials": TRIALS,
        "lost": lost,
        "duplicated": duplicated,
        "stuck": stuck,
        "tool re-runs": reruns,
        "effects applied twice": applied_twice,
        "recovery p50 s": round(p50, 2),
        "recovery p95 s": round(p95, 2),
    }
    with capsys.disabled():
        print("\nkill storm (API processes, PostgreSQL + Redis):")
        for name, value in table.items():
            print(f"  {name:24} {value}")
    (tmp_path / "kill_storm.json").write_text(json.dumps(table))
    assert (lost, duplicated, stuck, applied_twice) == (0, 0, 0, 0), table
    assert p95 <= 10.0, f"a killed turn took {p95:.1f} s to stream again (p95)"


async def test_a_rolling_restart_of_every_process_loses_no_turn(servers: Servers) -> None:
    """Restart each API process in turn (SIGTERM: a deploy) while turns stream."""
    env = {"TURNKIT_LEASE_TTL_S": "8", "TURNKIT_IDLE_WINDOW_S": "60", "TK_TOOL_SLEEP": "2"}
    urls = [servers.start(**env), servers.start(**env)]
    async with httpx.AsyncClient(timeout=60) as http:
        started: list[tuple[str, int]] = []
        for i, (url, _) in enumerate(urls):
            seen = [
                e
                async for e in _events(
                    http,
                    "POST",
                    f"{url}{API}/sessions/roll-{i}/execute",
                    json={"content": "double 21"},
                    until="tool.started",
                )  # fmt: skip
                if "seq" in e
            ]
            started.append((str(seen[0]["_turn"]), int(str(seen[-1]["seq"]))))
        for index in range(len(urls)):  # one process at a time, as a deploy does
            _, proc = urls[index]
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            urls[index] = servers.start(**env)
        reader_url = urls[0][0]
        for turn_id, last in started:
            rest = [
                e
                async for e in _events(
                    http,
                    "GET",
                    f"{reader_url}{API}/turns/{turn_id}/stream",
                    headers={"Last-Event-ID": str(last)},
                    until="done",
                )  # fmt: skip
                if "seq" in e
            ]
            assert [int(str(e["seq"])) for e in rest] == list(range(last + 1, last + 1 + len(rest)))
            assert rest[-1]["status"] == "succeeded", rest[-1]
