"""Processes and clients for the fault tests: `turnkit worker`s, `turnkit serve`s, and a
client that follows a turn's SSE stream across cuts (reconnecting with `Last-Event-ID`).

Every wait is bounded; every process a helper starts is SIGKILLed by its `stop()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from httpx_sse import SSEError, aconnect_sse

from tests.support.services import free_port, kill_all, wait_ready

__all__ = ("API", "TERMINAL", "Apis", "Turn", "Workers", "follow", "follow_to_done", "pid_of")

ROOT = Path(__file__).parent.parent.parent
API = "/api/harness"
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")


def _env(log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKIT_")}
    return {**env, "PYTHONPATH": str(ROOT), "TK_TEST_LOG": str(log), **extra}


class Workers:
    """`turnkit worker` processes on one database, started and killed by the test."""

    def __init__(
        self,
        *,
        database_url: str,
        log: Path,
        schema: str | None = None,
        redis_url: str | None = None,
        lease_ttl_s: float = 2.0,
        drain_timeout_s: float = 0.5,
    ) -> None:
        self.cmd = [
            sys.executable, "-m", "turnkit.cli", "worker",
            "--agent", "tests.support.worker_agent:agent", "--database-url", database_url,
            "--lease-ttl", str(lease_ttl_s), "--poll-interval", "0.05",
            "--sweep-interval", "3600", "--drain-timeout", str(drain_timeout_s),
        ]  # fmt: skip
        if schema:
            self.cmd += ["--database-schema", schema]
        if redis_url:
            self.cmd += ["--redis-url", redis_url]
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        with open(self.log.with_suffix(f".worker{len(self.procs)}.err"), "wb") as err:
            proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=_env(self.log, **env), stdout=err, stderr=err
            )
        self.procs.append(proc)
        return proc

    @property
    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        kill_all(self.procs)


class Apis:
    """`turnkit serve` processes on one database; each is ready (`/readyz` 200) when started."""

    def __init__(self, *, database_url: str, log: Path, schema: str | None = None) -> None:
        self.database_url = database_url
        self.schema = schema
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        cmd = [
            sys.executable, "-m", "turnkit.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--database-url", self.database_url,
        ]  # fmt: skip
        if self.schema:
            cmd += ["--database-schema", self.schema]
        full_env = _env(self.log, TURNKIT_AGENT="tests.support.worker_agent:agent", **env)
        with open(self.log.with_suffix(f".api{len(self.procs)}.err"), "wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=err, stderr=err)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/readyz", proc, self.log.parent)
        return url, proc

    def stop(self) -> None:
        kill_all(self.procs)


def pid_of(owner: str | None) -> int | None:
    """The process id in a lease owner name (`host:pid:suffix`)."""
    if not owner:
        return None
    return int(owner.rsplit(":", 2)[1])


@dataclass
class Turn:
    """What one client received of one turn, over every connection it made."""

    session: str
    request_id: str
    turn_id: str | None = None
    seqs: list[int] = field(default_factory=list[int])
    types: list[str] = field(default_factory=list[str])
    arrived: list[float] = field(default_factory=list[float])
    """When each of `seqs` arrived (monotonic)."""
    cut_on: list[str] = field(default_factory=list[str])
    """The API URLs whose connection broke before `done`."""
    done: bool = False

    def first(self, event_type: str) -> float | None:
        """When the first durable event of this type arrived."""
        pairs = zip(self.types, self.arrived, strict=True)
        return next((at for kind, at in pairs if kind == event_type), None)


async def follow(
    http: httpx.AsyncClient,
    turn: Turn,
    url: str,
    *,
    seen: asyncio.Event | None = None,
    kill_at: str = "",
) -> None:
    """One connection: start the turn (POST) or resume it after the last event it received.

    Reads durable events until `done`, or until the connection breaks. `seen` is set when
    an event of type `kill_at` arrives.
    """
    if turn.turn_id is None:  # never got an answer: (re)send the same request
        method, target = "POST", f"{url}{API}/sessions/{turn.session}/execute"
        kw: dict[str, object] = {"json": {"content": "double 21", "requestId": turn.request_id}}
    else:
        method, target = "GET", f"{url}{API}/turns/{turn.turn_id}/stream"
        kw = {"headers": {"Last-Event-ID": str(turn.seqs[-1] if turn.seqs else 0)}}
    try:
        async with aconnect_sse(http, method, target, **kw) as source:  # type: ignore[arg-type]
            source.response.raise_for_status()
            turn.turn_id = source.response.headers["x-turn-id"]
            async for sse in source.aiter_sse():
                event = json.loads(sse.data)
                if "seq" in event:
                    turn.seqs.append(int(event["seq"]))
                    turn.types.append(str(event["type"]))
                    turn.arrived.append(time.monotonic())
                if seen is not None and event["type"] == kill_at:
                    seen.set()
                if event["type"] == "done":
                    turn.done = True
                    return
    except (httpx.HTTPError, SSEError):
        pass  # the process went away under the stream, or refused while stopping
    turn.cut_on.append(url)


async def follow_to_done(
    http: httpx.AsyncClient,
    turn: Turn,
    pick: str | Callable[[str | None], str],
    *,
    tries: int = 30,
) -> None:
    """Reconnect until `done` (bounded): to `pick`, or to the API `pick(last_cut_url)` names."""
    for _ in range(tries):
        if turn.done:
            return
        cut = turn.cut_on[-1] if turn.cut_on else None
        await follow(http, turn, pick if isinstance(pick, str) else pick(cut))
        if not turn.done:
            await asyncio.sleep(0.2)
    raise AssertionError(f"turn {turn.turn_id} never reached done ({len(turn.cut_on)} cuts)")
