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
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.http.test_multiprocess import API, _free_port
from tests.support.worker_agent import read_log

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ROOT = Path(__file__).parent.parent.parent
TRIALS = int(os.environ.get("TURNKIT_FAULT_TRIALS", "3"))
TURNS_PER_TRIAL = 2
KILL_AT = ("turn.started", "step.start", "tool.started", "tool.completed", "message.complete")
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")


class SqliteServer:
    """One `turnkit serve` process on a SQLite file, killed and restarted by the test."""

    def __init__(self, db: Path, log: Path) -> None:
        self.db = db
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> str:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKIT_")}
        env.update(
            PYTHONPATH=str(ROOT),
            TURNKIT_AGENT="tests.support.worker_agent:agent",
            TURNKIT_LEASE_TTL_S="2",  # recovery within seconds: the test stays short
            TURNKIT_IDLE_WINDOW_S="60",  # readers wait for the restart, never time out
            TK_TOOL_SLEEP="1",
            TK_TEST_LOG=str(self.log),
        )
        cmd = [
            sys.executable, "-m", "turnkit.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--database-url", f"sqlite:///{self.db}",
        ]  # fmt: skip
        with open(self.log.with_suffix(f".server{self.starts}.err"), "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=err, stderr=err)
        self.starts += 1
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"the server exited; see {self.log.parent}"
            time.sleep(0.1)
        raise AssertionError(f"the server on {port} did not get ready: {self.log.parent}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[SqliteServer]:
    server = SqliteServer(tmp_path / "storm.db", tmp_path / "calls.jsonl")
    try:
        yield server
    finally:
        server.kill()


@dataclass
class _Turn:
    session: str
    request_id: str
    turn_id: str | None = None
    seqs: list[int] = field(default_factory=list[int])
    arrived: list[float] = field(default_factory=list[float])
    """When each of `seqs` arrived (monotonic)."""
    done: bool = False


async def _follow(
    http: httpx.AsyncClient,
    turn: _Turn,
    method: str,
    url: str,
    *,
    seen: asyncio.Event | None = None,
    kill_at: str = "",
    **kw: object,
) -> None:
    """Read the turn's durable events until `done`, or until the connection breaks."""
    try:
        async with aconnect_sse(http, method, url, **kw) as source:  # type: ignore[arg-type]
            source.response.raise_for_status()
            turn.turn_id = source.response.headers["x-turn-id"]
            async for sse in source.aiter_sse():
                event = json.loads(sse.data)
                if "seq" in event:
                    turn.seqs.append(int(event["seq"]))
                    turn.arrived.append(time.monotonic())
                if seen is not None and event["type"] == kill_at:
                    seen.set()
                if event["type"] == "done":
                    turn.done = True
                    return
    except httpx.HTTPError:
        return  # the process died under the stream


async def _resume(http: httpx.AsyncClient, url: str, turn: _Turn) -> None:
    """After the restart: pick the turn up where the client lost it (bounded)."""
    for _ in range(20):
        if turn.done:
            return
        if turn.turn_id is None:  # never got an answer: send the same request again
            await _follow(
                http, turn, "POST", f"{url}{API}/sessions/{turn.session}/execute",
                json={"content": "double 21", "requestId": turn.request_id},
            )  # fmt: skip
        else:
            last = turn.seqs[-1] if turn.seqs else 0
            await _follow(
                http, turn, "GET", f"{url}{API}/turns/{turn.turn_id}/stream",
                headers={"Last-Event-ID": str(last)},
            )  # fmt: skip
    raise AssertionError(f"turn {turn.turn_id} never reached done")


async def test_killing_the_sqlite_api_process_at_random_points_loses_nothing(
    sqlite_server: SqliteServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(int(os.environ.get("TURNKIT_FAULT_SEED", "13")))
    url = sqlite_server.start()
    turns: list[_Turn] = []
    cut = lost = duplicated = stuck = failed = 0
    kill_points: list[str] = []
    recovery_s: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for trial in range(TRIALS):
            batch = [
                _Turn(session=f"sq-{trial}-{i}", request_id=f"req-{trial}-{i}")
                for i in range(TURNS_PER_TRIAL)
            ]
            turns += batch
            kill_at, delay = rng.choice(KILL_AT), rng.uniform(0.0, 0.4)
            kill_points.append(f"{kill_at}+{delay:.1f}s")
            seen = asyncio.Event()
            streams = [
                asyncio.create_task(
                    _follow(
                        http,
                        turn,
                        "POST",
                        f"{url}{API}/sessions/{turn.session}/execute",
                        json={"content": "double 21", "requestId": turn.request_id},
                        seen=seen if i == 0 else None,
                        kill_at=kill_at,
                    )  # fmt: skip
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
                await asyncio.gather(*(_resume(http, url, t) for t in open_turns))
            for turn, count in zip(open_turns, before, strict=True):  # the next event after it
                recovery_s.append(turn.arrived[count] - killed)
        for turn in turns:
            assert turn.turn_id is not None
            seqs = turn.seqs
            lost += len(set(range(1, max(seqs) + 1)) - set(seqs))
            duplicated += len(seqs) - len(set(seqs))
            stored = (await http.get(f"{url}{API}/turns/{turn.turn_id}")).json()
            if stored["status"] not in TERMINAL:
                stuck += 1
            elif stored["status"] != "succeeded":
                failed += 1
            elif stored["lastSeq"] != max(seqs):
                lost += stored["lastSeq"] - max(seqs)
    runs = [line for line in read_log(sqlite_server.log) if line["event"] == "tool"]
    keys_per_call: dict[tuple[str, str], set[str]] = defaultdict(set)
    by_key: dict[str, int] = defaultdict(int)
    for line in runs:  # a re-run under another key would apply its effect twice
        keys_per_call[(str(line["turn"]), str(line["call"]))].add(str(line["key"]))
        by_key[str(line["key"])] += 1
    reruns = sum(n - 1 for n in by_key.values())
    applied_twice = sum(1 for keys in keys_per_call.values() if len(keys) > 1)
    p50 = statistics.median(recovery_s) if recovery_s else 0.0
    p95 = sorted(recovery_s)[max(0, round(0.95 * len(recovery_s)) - 1)] if recovery_s else 0.0
    table = {
        "trials (kills)": TRIALS,
        "turns": len(turns),
        "turns cut mid-stream": cut,
        "lost": lost,
        "duplicated": duplicated,
        "stuck": stuck,
        "ended not succeeded": failed,
        "tool re-runs": reruns,
        "effects applied twice": applied_twice,
        "recovery p50 s": round(p50, 2),
        "recovery p95 s": round(p95, 2),
    }
    with capsys.disabled():
        print("\nkill storm (the API process, SQLite, restarted on the same file):")
        for name, value in table.items():
            print(f"  {name:24} {value}")
        print(f"  {'killed at':24} {', '.join(kill_points)}")
    (tmp_path / "kill_storm_sqlite.json").write_text(json.dumps(table))
    assert (lost, duplicated, stuck, failed, applied_twice) == (0, 0, 0, 0, 0), table
    assert cut > 0, "no kill landed while a turn streamed"
