"""Turns per second through one `turnkit serve` process with many SSE clients at once.

One `turnkit serve` on the embedded defaults (SQLite in a temporary directory, the
in-memory replay buffer, the offline demo agent: a plan call, a tool call and the answer,
zero model latency) takes `--clients` concurrent clients, each posting `--turns-per-client` messages
to `POST /api/harness/sessions/{id}/execute` one after the other and reading each SSE
stream to its end. The floor is a plain FastAPI + sse-starlette endpoint in its own process
on the same uvicorn, parsing the same request body and streaming the very frames a turnkit
turn sent (captured from a warm-up turn), so both send the same bytes. turnkit serves
three times: as `turnkit serve` runs (start-up objects frozen, fewer collections), with
at most 64 turns running at once (`TURNKIT_MAX_RUNNING_TURNS=64`), and with Python's own
collector (`TURNKIT_GC=python`). For reference, the same turn's CPU through
`execute_message` in a process of its own, one turn at a time, is printed too.

The load generator is a lean raw-socket HTTP/1.1 client in this process (one connection
per turn, `Connection: close`), the same for both servers; it shares the machine's cores
with the server, so the faster the server the more CPU the client takes from it (which
holds the floor back more than turnkit). Both servers log each request as `turnkit serve`
does (uvicorn's access log at `info`). Per contender and round:
turns/s, turn latency p50/p99, the server process's CPU per turn (from /proc) and its peak
RSS. The contenders alternate within each round, first one then the other, in an order
that rotates; ratios are taken round by round (median, min–max).

Run:  .venv/bin/python benchmarks/serve_clients.py [--clients 200,1000] [--turns-per-client 2]
                                                  [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import _procs

ROOT = Path(__file__).parent.parent
HOST = "127.0.0.1"
API = "/api/harness"
BODY = json.dumps({"content": "What is 6 * 7?"}).encode()
DONE = b'"type":"done"'
CONTENDERS = (
    "sse-starlette floor",
    "turnkit serve",
    "turnkit serve, at most 64 running",
    "turnkit serve, Python's GC",
)
TURNKIT_SERVERS = (  # name, TURNKIT_GC, TURNKIT_MAX_RUNNING_TURNS
    ("turnkit serve", "tuned", None),
    ("turnkit serve, at most 64 running", "tuned", "64"),
    ("turnkit serve, Python's GC", "python", None),
)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Body(BaseModel):
    """The floor's request body, parsed and validated as turnkit's is."""

    content: str


# ── the floor server (run as a child: this script with --floor-server) ────────────────


def floor_server(port: int, frames_path: str) -> None:
    """Serve the captured frames on `POST /floor/sessions/{id}/execute` with sse-starlette."""
    import uvicorn
    from fastapi import FastAPI
    from sse_starlette import EventSourceResponse, ServerSentEvent

    captured = json.loads(Path(frames_path).read_text())
    app = FastAPI()

    @app.post("/floor/sessions/{session_id}/execute")
    async def execute(session_id: str, body: Body) -> EventSourceResponse:
        async def frames() -> AsyncIterator[ServerSentEvent]:
            for frame in captured:
                yield ServerSentEvent(data=frame["data"], id=frame["id"], event=frame["event"])

        return EventSourceResponse(
            frames(), headers={"X-Turn-Id": session_id, "Cache-Control": "no-store"}, ping=None
        )

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host=HOST, port=port, log_level="info")  # as `turnkit serve` runs


def parse_frames(body: bytes) -> list[dict[str, str | None]]:
    """An SSE body's frames as {id, event, data} (comments skipped)."""
    frames = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        frame: dict[str, str | None] = {"id": None, "event": None, "data": None}
        data: list[str] = []
        for line in block.decode().split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field in ("id", "event"):
                frame[field] = value
        if data:
            frame["data"] = "\n".join(data)
            frames.append(frame)
    return frames


# ── the same turn in process (run as a child: this script with --in-process) ──────────


def in_process(database: str, turns: int) -> None:
    """CPU per turn of the demo turn through `execute_message`, one at a time, no HTTP."""
    from turnkit.cli import GC_THRESHOLDS
    from turnkit.quickstart import runtime_from_env

    async def main() -> float:
        runtime = runtime_from_env({"TURNKIT_DATABASE_URL": f"sqlite:///{database}"})
        async with runtime:
            for i in range(turns + 20):
                if i == 20:  # after warming up, with the collector `turnkit serve` uses
                    gc.collect()
                    gc.freeze()
                    gc.set_threshold(*GC_THRESHOLDS)
                    cpu = time.process_time()
                async for event in runtime.execute_message(f"in-process-{i}", "What is 6 * 7?"):
                    if event.type == "done" and event.status != "succeeded":
                        raise SystemExit(f"in-process turn {i} ended {event.status}")
            return (time.process_time() - cpu) * 1000 / turns

    print(json.dumps({"cpu_ms_per_turn": asyncio.run(main())}))


# ── processes ─────────────────────────────────────────────────────────────────────────


class Server:
    """A server process on a free port; reads its CPU time and peak RSS from /proc."""

    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], log: Path, *, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.log = log
        self.proc = _procs.start(cmd, log=log, env=env, cwd=cwd)

    def wait_ready(self, url: str) -> None:
        """Return once it accepts connections; else stop it and exit, naming its log."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log}")
            try:
                with socket.create_connection((HOST, int(url.rsplit(":", 1)[1])), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise SystemExit(f"{self.name} did not start; see {self.log}")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        _procs.stop([self.proc])


# ── the load ──────────────────────────────────────────────────────────────────────────


async def post_turn(port: int, path: str, body: bytes = BODY) -> tuple[float, bytes]:
    """POST one message and read the SSE response to EOF; (seconds, raw body)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    raw = await reader.read(-1)
    writer.close()
    return time.perf_counter() - started, raw


def dechunk(raw: bytes) -> bytes:
    """The body of an HTTP/1.1 response with chunked transfer encoding."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"unexpected response: {head[:200]!r}")
    out, pos = bytearray(), 0
    while True:
        end = rest.index(b"\r\n", pos)
        size = int(rest[pos:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += rest[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


async def load(port: int, prefix: str, clients: int, per_client: int, tag: str) -> dict[str, Any]:
    latencies: list[float] = []

    async def client(i: int) -> None:
        for j in range(per_client):
            seconds, raw = await post_turn(port, f"{prefix}/sessions/{tag}-{i}-{j}/execute")
            if DONE not in raw or b'"succeeded"' not in raw:
                raise SystemExit(f"{tag}: turn {i}/{j} did not succeed:\n{raw[-400:]!r}")
            latencies.append(seconds * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "turns": len(latencies),
        "turns_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


# ── the run ───────────────────────────────────────────────────────────────────────────


def start_turnkit(tmp: Path, name: str, gc_mode: str, bound: str | None) -> tuple[Server, int]:
    env = {**os.environ, "TURNKIT_RUN_IN_PROCESS": "1", "TURNKIT_GC": gc_mode}
    for var in ("TURNKIT_MODEL", "TURNKIT_REDIS_URL", "TURNKIT_DATABASE_URL",
                "TURNKIT_MAX_RUNNING_TURNS"):  # fmt: skip
        env.pop(var, None)
    if bound is not None:
        env["TURNKIT_MAX_RUNNING_TURNS"] = bound
    tag = f"{gc_mode}-{bound or 'unbounded'}"
    port = _port()
    server = Server(name, [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
                    "--database-url", f"sqlite:///{tmp / (tag + '.db')}"],
                    env, tmp / f"turnkit-{tag}.log")  # fmt: skip
    server.wait_ready(f"http://{HOST}:{port}")
    return server, port


def start_servers(tmp: Path) -> tuple[dict[str, tuple[Server, int, str]], int]:
    """The floor and each of `TURNKIT_SERVERS`; also the frames per turn."""
    servers: dict[str, tuple[Server, int, str]] = {}
    try:
        for name, mode, bound in TURNKIT_SERVERS:
            server, port = start_turnkit(tmp, name, mode, bound)
            servers[name] = (server, port, API)
        path = f"{API}/sessions/warmup/execute"
        _, raw = asyncio.run(post_turn(servers["turnkit serve"][1], path))
        frames = parse_frames(dechunk(raw))
        if not frames or DONE not in (frames[-1]["data"] or "").encode():
            raise SystemExit(f"the warm-up turn did not end with done:\n{raw[-400:]!r}")
        (tmp / "frames.json").write_text(json.dumps(frames))
        floor_port = _port()
        floor = Server("floor", [sys.executable, __file__, "--floor-server", str(floor_port),
                       "--frames", str(tmp / "frames.json")], {**os.environ},
                       tmp / "floor.log")  # fmt: skip
        servers = {"sse-starlette floor": (floor, floor_port, "/floor"), **servers}
        floor.wait_ready(f"http://{HOST}:{floor_port}")
    except BaseException:  # what did start must not outlive the run
        _procs.stop(server.proc for server, _, _ in servers.values())
        raise
    return servers, len(frames)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tk-serve-clients-"))
    servers, frames = start_servers(tmp)
    names = list(servers)
    rows: list[dict[str, Any]] = []
    try:
        for clients in args.clients:
            for rnd in range(args.rounds):
                order = names[rnd % len(names) :] + names[: rnd % len(names)]
                for name in order:
                    server, port, prefix = servers[name]
                    asyncio.run(load(port, prefix, 20, 1, f"warm{clients}r{rnd}"))
                    cpu = server.cpu_s()
                    result = asyncio.run(
                        load(port, prefix, clients, args.turns_per_client, f"c{clients}r{rnd}")
                    )
                    result["server_cpu_ms_per_turn"] = (
                        (server.cpu_s() - cpu) * 1000 / result["turns"]
                    )
                    result |= {"contender": name, "clients": clients, "round": rnd}
                    result["server_peak_rss_mib"] = server.peak_rss_mib()
                    rows.append(result)
                    print(f"  {clients:>5} clients  round {rnd}  {name:28} "
                          f"{result['turns_per_s']:8.1f} turns/s", flush=True)  # fmt: skip
    finally:
        for server, _, _ in servers.values():
            server.stop()
    child = subprocess.run([sys.executable, __file__, "--in-process", str(tmp / "in.db")],
                           check=True, capture_output=True, text=True, timeout=600)  # fmt: skip
    alone = json.loads(child.stdout.strip().splitlines()[-1])["cpu_ms_per_turn"]
    return {"rows": rows, "frames_per_turn": frames, "in_process_cpu_ms_per_turn": alone}


def summarize(rows: list[dict[str, Any]], clients: int, name: str) -> dict[str, Any]:
    mine = [r for r in rows if r["clients"] == clients and r["contender"] == name]
    floor = {r["round"]: r for r in rows if r["clients"] == clients
             and r["contender"] == "sse-starlette floor"}  # fmt: skip
    ratios = [r["turns_per_s"] / floor[r["round"]]["turns_per_s"] for r in mine]
    med = statistics.median
    return {
        "contender": name,
        "clients": clients,
        "turns_per_s": round(med(r["turns_per_s"] for r in mine), 1),
        "x_floor": round(med(ratios), 2),
        "x_floor_min": round(min(ratios), 2),
        "x_floor_max": round(max(ratios), 2),
        "p50_ms": round(med(r["p50_ms"] for r in mine), 1),
        "p99_ms": round(med(r["p99_ms"] for r in mine), 1),
        "server_cpu_ms_per_turn": round(med(r["server_cpu_ms_per_turn"] for r in mine), 2),
        "server_peak_rss_mib": round(max(r["server_peak_rss_mib"] for r in mine), 1),
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    table = [summarize(result["rows"], c, name) for c in args.clients
             for name in CONTENDERS]  # fmt: skip
    print(f"\nserve_clients — Python {platform.python_version()} on {os.cpu_count()} cores, "
          f"{args.turns_per_client} turns per client, {args.rounds} rounds, "
          f"{result['frames_per_turn']} SSE frames per turn\n")  # fmt: skip
    head = (f"{'contender':28}{'clients':>8}{'turns/s':>9}{'× floor (min–max)':>20}"
            f"{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/turn':>13}{'peak RSS MiB':>14}")  # fmt: skip
    print(head)
    for row in table:
        spread = f"{row['x_floor']:.2f} ({row['x_floor_min']:.2f}–{row['x_floor_max']:.2f})"
        print(f"{row['contender']:28}{row['clients']:>8}{row['turns_per_s']:>9}{spread:>20}"
              f"{row['p50_ms']:>9}{row['p99_ms']:>9}{row['server_cpu_ms_per_turn']:>13}"
              f"{row['server_peak_rss_mib']:>14}")  # fmt: skip
    print(f"\nthe same turn in process (execute_message, one at a time, no HTTP): "
          f"{result['in_process_cpu_ms_per_turn']:.2f} ms CPU per turn")  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="200,1000")
    parser.add_argument("--turns-per-client", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/serve_clients.json"))
    parser.add_argument("--floor-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--frames", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        floor_server(args.floor_server, args.frames)
        return
    if args.in_process:
        in_process(args.in_process, 200)
        return
    args.clients = [int(c) for c in args.clients.split(",")]
    result = run(args)
    table = report(result, args)
    meta = {"python": platform.python_version(), "cores": os.cpu_count(),
            "turns_per_client": args.turns_per_client, "rounds": args.rounds}  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "table": table, **result}, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    with _procs.stopped_at_end():
        main()
