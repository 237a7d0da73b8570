"""Two real API processes sharing PostgreSQL and Redis.

A turn started through one process is resumed through the other; when the process that
drives a turn is killed, a reader on the other one ends with `timed_out` within one idle
window instead of spinning forever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse
from tests.conftest import POSTGRES_URL, REDIS_URL, require_service
from tests.support.services import free_port, kill_all, wait_ready
from tests.support.worker_agent import read_log

ROOT = Path(__file__).parent.parent.parent
API = "/api/harness"
IDLE_WINDOW_S = 2.0
pytestmark = pytest.mark.slow


class Servers:
    def __init__(self, schema: str, prefix: str, log: Path) -> None:
        self.schema = schema
        self.prefix = prefix
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        full_env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TURNKIT_REDIS_URL": REDIS_URL,
            "TURNKIT_AGENT": "tests.support.worker_agent:agent",
            "TURNKIT_IDLE_WINDOW_S": str(IDLE_WINDOW_S),
            "TURNKIT_LEASE_TTL_S": "1",
            "TK_TEST_LOG": str(self.log),
            **env,
        }
        cmd = [
            sys.executable, "-m", "turnkit.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--database-url", POSTGRES_URL,
            "--database-schema", self.schema,
        ]  # fmt: skip
        with open(self.log.with_suffix(f".server{len(self.procs)}.err"), "wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=err, stderr=err)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}{API}/sessions", proc, self.log)
        return url, proc

    def stop(self) -> None:
        kill_all(self.procs)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    require_service("Redis", "127.0.0.1", 6379)
    schema = f"tk_mp_{uuid.uuid4().hex[:10]}"
    pool = Servers(schema, f"tk-mp-{uuid.uuid4().hex[:8]}", tmp_path / "calls.jsonl")
    try:
        yield pool
    finally:
        pool.stop()
        subprocess.run(
            ["psql", POSTGRES_URL, "-q", "-c", f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'],
            check=False,
            capture_output=True,
            timeout=30,
        )


async def _events(
    http: httpx.AsyncClient, method: str, url: str, *, until: str, **kw: object
) -> AsyncIterator[dict[str, object]]:
    async with aconnect_sse(http, method, url, **kw) as source:  # type: ignore[arg-type]
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            event = json.loads(sse.data)
            event["_turn"] = source.response.headers["x-turn-id"]
            yield event
            if event["type"] == until:
                return


async def test_a_turn_started_on_one_process_is_resumed_on_the_other(servers: Servers) -> None:
    url_a, _ = servers.start(TK_TOOL_SLEEP="1.5")
    url_b, _ = servers.start()
    async with httpx.AsyncClient(timeout=30) as http:
        first: list[dict[str, object]] = []
        async for event in _events(
            http, "POST", f"{url_a}{API}/sessions/shared/execute",
            json={"content": "double 21"}, until="tool.started",
        ):  # fmt: skip
            if "seq" in event:
                first.append(event)
        turn_id = first[0]["_turn"]
        rest: list[dict[str, object]] = []
        async for event in _events(
            http, "GET", f"{url_b}{API}/turns/{turn_id}/stream",
            headers={"Last-Event-ID": str(first[-1]["seq"])}, until="done",
        ):  # fmt: skip
            if "seq" in event:
                rest.append(event)
        union = first + rest
        assert [e["seq"] for e in union] == list(range(1, len(union) + 1))
        assert union[-1]["type"] == "done"
        assert union[-1]["status"] == "succeeded"
        history = (await http.get(f"{url_b}{API}/sessions/shared/history")).json()
        assert history[0]["answer"] == "The answer is 42."


async def test_killing_the_driving_process_hands_the_turn_to_another(servers: Servers) -> None:
    """With the apps' own recovery loop (the quickstart default), the other process takes
    the turn over: the reader's stream goes on and the turn succeeds."""
    url_a, proc_a = servers.start(TK_TOOL_SLEEP="60")
    url_b, _ = servers.start()
    async with httpx.AsyncClient(timeout=30) as http:
        seen: list[dict[str, object]] = []
        async for event in _events(
            http, "POST", f"{url_a}{API}/sessions/rescued/execute",
            json={"content": "double 21"}, until="tool.started",
        ):  # fmt: skip
            if "seq" in event:
                seen.append(event)
        turn_id, last = seen[0]["_turn"], seen[-1]["seq"]
        proc_a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rest: list[dict[str, object]] = []
        async for event in _events(
            http, "GET", f"{url_b}{API}/turns/{turn_id}/stream",
            headers={"Last-Event-ID": str(last)}, until="done",
        ):  # fmt: skip
            if "seq" in event:
                rest.append(event)
        waited = time.monotonic() - killed
        union = seen + rest
        assert [e["seq"] for e in union] == list(range(1, len(union) + 1))
        assert rest[-1]["status"] == "succeeded"
        assert waited < 10, f"took {waited:.1f} s to recover"
        history = (await http.get(f"{url_b}{API}/sessions/rescued/history")).json()
        assert history[0]["answer"] == "The answer is 42."


async def test_killing_the_driving_process_ends_the_readers_stream(servers: Servers) -> None:
    """Without any recovery (no worker, the apps' own loop off), a reader ends the turn
    `timed_out` after the idle window: a clear end, not a spinner."""
    url_a, proc_a = servers.start(TK_TOOL_SLEEP="60", TURNKIT_RECOVER_IN_PROCESS="0")
    url_b, _ = servers.start(TURNKIT_RECOVER_IN_PROCESS="0")
    async with httpx.AsyncClient(timeout=30) as http:
        seen: list[dict[str, object]] = []
        async for event in _events(
            http, "POST", f"{url_a}{API}/sessions/doomed/execute",
            json={"content": "double 21"}, until="tool.started",
        ):  # fmt: skip
            if "seq" in event:
                seen.append(event)
        turn_id, last = seen[0]["_turn"], seen[-1]["seq"]
        proc_a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        ending: list[dict[str, object]] = []
        async for event in _events(
            http, "GET", f"{url_b}{API}/turns/{turn_id}/stream",
            headers={"Last-Event-ID": str(last)}, until="done",
        ):  # fmt: skip
            if "seq" in event:
                ending.append(event)
        waited = time.monotonic() - killed
        assert ending[-1]["type"] == "done"
        assert ending[-1]["status"] == "timed_out"
        assert [e["type"] for e in ending[-2:]] == ["error", "done"]
        assert waited < IDLE_WINDOW_S + 3, f"took {waited:.1f} s for a {IDLE_WINDOW_S} s window"
        turn = (await http.get(f"{url_b}{API}/turns/{turn_id}")).json()
        assert turn["status"] == "timed_out"


async def test_a_worker_driven_turn_streams_live_through_redis(servers: Servers) -> None:
    url, _ = servers.start(TURNKIT_RUN_IN_PROCESS="0")
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, never awaited
        [
            sys.executable,
            "-m",
            "turnkit.cli",
            "worker",
            "--agent",
            "tests.support.worker_agent:agent",
            "--database-url",
            POSTGRES_URL,
            "--database-schema",
            servers.schema,
            "--redis-url",
            REDIS_URL,
            "--poll-interval",
            "0.05",
        ],  # fmt: skip
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TK_TEST_LOG": str(servers.log)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    servers.procs.append(worker)
    async with httpx.AsyncClient(timeout=60) as http:
        events = [
            event
            async for event in _events(
                http, "POST", f"{url}{API}/sessions/by-worker/execute",
                json={"content": "double 21"}, until="done",
            )
        ]  # fmt: skip
    assert events[-1]["status"] == "succeeded"
    # Deltas are ephemeral: never stored, so they can only have come live through Redis.
    assert any(e["type"] == "message.delta" for e in events)
    calls = read_log(servers.log)
    assert {c["pid"] for c in calls} == {worker.pid}  # the worker drove it, not the API
