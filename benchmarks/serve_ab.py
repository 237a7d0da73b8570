"""Server CPU per turn of two turnkit source trees, side by side, through one streaming route.

One `turnkit serve` per tree (`--tree NAME=PATH`, PATH a checkout's `src`; twice), each on
the embedded defaults (SQLite in a temporary directory, the in-memory replay buffer, the
offline demo agent: a plan call, a tool call and the answer, zero model latency), takes
`--clients` concurrent clients, each posting `--turns-per-client` messages one after the
other through `--path` and reading each stream to its end: the harness's execute route,
the AI SDK's `POST /api/chat` or AG-UI's `POST /api/agui/run`. The two servers take turns
within each round, in an order that alternates; each measurement follows 20 warm-up turns.
The load generator is a lean raw-socket HTTP/1.1 client in this process (one connection
per turn), the same for both. Server CPU is the server process's own, from /proc.

Printed: per tree, the median server CPU per turn and its min–max over the rounds, the
median turns/s; then the per-round difference (second tree minus first), median and
min–max, and in how many rounds the second tree took less.

Run:  .venv/bin/python benchmarks/serve_ab.py --tree old=../old/src --tree new=src
                                              [--path harness|ai-sdk|agui] [--clients 200]
                                              [--turns-per-client 2] [--rounds 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _procs
import serve_clients

HOST = serve_clients.HOST
QUESTION = "What is 6 * 7?"


def _harness(session: str) -> tuple[str, dict[str, Any]]:
    return f"/api/harness/sessions/{session}/execute", {"content": QUESTION}


def _ai_sdk(session: str) -> tuple[str, dict[str, Any]]:
    message = {"id": f"{session}-m", "role": "user", "parts": [{"type": "text", "text": QUESTION}]}
    return "/api/chat", {"id": session, "messages": [message], "trigger": "submit-message"}


def _agui(session: str) -> tuple[str, dict[str, Any]]:
    message = {"id": f"{session}-u", "role": "user", "content": QUESTION}
    return "/api/agui/run", {"threadId": session, "runId": f"{session}-r", "messages": [message]}


ROUTES: dict[str, tuple[Callable[[str], tuple[str, dict[str, Any]]], tuple[bytes, ...]]] = {
    # route: (path and body for a session, what a succeeded turn's stream holds)
    "harness": (_harness, (b'"type":"done"', b'"succeeded"')),
    "ai-sdk": (_ai_sdk, (b"data: [DONE]", b'"status":"succeeded"')),
    "agui": (_agui, (b'"type":"RUN_FINISHED"', b'"outcome":{"type":"success"}')),
}


class Server(serve_clients.Server):
    """`turnkit serve` from one source tree, on a free port, ready once it returns."""

    def __init__(self, name: str, src: Path, tmp: Path) -> None:
        self.port = serve_clients._port()
        env = {**os.environ, "PYTHONPATH": str(src), "TURNKIT_RUN_IN_PROCESS": "1"}
        for var in ("TURNKIT_MODEL", "TURNKIT_REDIS_URL", "TURNKIT_DATABASE_URL",
                    "TURNKIT_MAX_RUNNING_TURNS", "TURNKIT_GC"):  # fmt: skip
            env.pop(var, None)
        cmd = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(self.port),
               "--database-url", f"sqlite:///{tmp / (name + '.db')}"]  # fmt: skip
        super().__init__(name, cmd, env, tmp / f"{name}.log", cwd=tmp)
        self.wait_ready(f"http://{HOST}:{self.port}")


async def load(server: Server, route: str, clients: int, per_client: int, tag: str) -> int:
    """`clients` clients, each sending `per_client` turns in a row; the turns that ran."""
    shape, succeeded = ROUTES[route]

    async def client(i: int) -> None:
        for j in range(per_client):
            path, body = shape(f"{tag}-{i}-{j}")
            _, raw = await serve_clients.post_turn(server.port, path, json.dumps(body).encode())
            if not raw.startswith(b"HTTP/1.1 200") or not all(s in raw for s in succeeded):
                raise SystemExit(f"{server.name}: turn {tag}-{i}-{j} failed:\n{raw[-600:]!r}")

    await asyncio.gather(*(client(i) for i in range(clients)))
    return clients * per_client


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tk-serve-ab-"))
    servers: list[Server] = []
    rows: list[dict[str, Any]] = []
    try:
        for name, src in args.tree:  # one that does not start stops those that did
            servers.append(Server(name, src, tmp))
        for rnd in range(args.rounds):
            for server in servers if rnd % 2 == 0 else servers[::-1]:
                asyncio.run(load(server, args.path, 20, 1, f"warm{rnd}"))
                cpu, began = server.cpu_s(), time.perf_counter()
                turns = asyncio.run(
                    load(server, args.path, args.clients, args.turns_per_client, f"r{rnd}")
                )
                elapsed = time.perf_counter() - began
                row = {
                    "tree": server.name,
                    "round": rnd,
                    "turns": turns,
                    "turns_per_s": turns / elapsed,
                    "server_cpu_ms_per_turn": (server.cpu_s() - cpu) * 1000 / turns,
                }
                rows.append(row)
                print(f"  round {rnd}  {server.name:10} {row['server_cpu_ms_per_turn']:7.2f} ms "
                      f"CPU/turn  {row['turns_per_s']:7.1f} turns/s", flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    return {"route": args.path, "clients": args.clients, "rows": rows}


def summarize(result: dict[str, Any], names: list[str]) -> None:
    rows, med = result["rows"], statistics.median
    cpu = {n: [r["server_cpu_ms_per_turn"] for r in rows if r["tree"] == n] for n in names}
    for name in names:
        tps = [r["turns_per_s"] for r in rows if r["tree"] == name]
        print(f"{name:10} server CPU per turn {med(cpu[name]):6.2f} ms "
              f"({min(cpu[name]):.2f}–{max(cpu[name]):.2f})  {med(tps):7.1f} turns/s")  # fmt: skip
    first, second = names
    diffs = [b - a for a, b in zip(cpu[first], cpu[second], strict=True)]
    fewer = sum(d < 0 for d in diffs)
    spread = f"{min(diffs):+.2f} to {max(diffs):+.2f}"
    print(f"{second} − {first}, round by round: {med(diffs):+.2f} ms ({spread}); "
          f"lower in {fewer} of {len(diffs)} rounds")  # fmt: skip


def _tree(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError("give a tree as NAME=PATH (PATH: a checkout's src)")
    return name, Path(path).resolve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=_tree, action="append", required=True)
    parser.add_argument("--path", choices=sorted(ROUTES), default="ai-sdk")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--turns-per-client", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if len(args.tree) != 2 or args.tree[0][0] == args.tree[1][0]:
        parser.error("give exactly two --tree, with different names")
    result = run(args)
    summarize(result, [name for name, _ in args.tree])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    with _procs.stopped_at_end():
        main()
