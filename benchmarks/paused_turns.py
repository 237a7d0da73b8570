"""What a paused turn costs the process: memory, tasks, leases and replay-buffer entries.

Runs `--turns` turns (one per session, `--concurrency` at a time) that each call a tool
needing approval, so every turn pauses `awaiting_approval`, on SQLite in a temporary
directory with the in-memory replay buffer. Measured after the buffer's grace period:

- resident memory (RSS) per paused turn, after a garbage collection, and the peak;
- the replay-buffer turns, asyncio tasks and leases the paused turns still hold.

It runs twice, each in a fresh interpreter: with the grace period a released turn gets,
and with it as long as the buffer's TTL (what a paused turn held before it was released:
its entries for an hour).

Run:  .venv/bin/python benchmarks/paused_turns.py [--turns 500] [--concurrency 50] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/paused_turns.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _procs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.ids import SessionId
from turnkit.replay import ReplaySettings
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.testing import ModelStep, ScriptedModel, call

GRACE_S = 0.5


@tool(approval="always")
async def send_email(to: str, body: str) -> str:
    """Send an email (a person approves it first)."""
    return f"sent to {to}"


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(turns: int, concurrency: int, grace_s: float) -> dict[str, float]:
    """Pause `turns` turns; what the process holds once the grace period is over."""
    body = "Quarterly numbers attached. " * 40  # ~1 KB of arguments, streamed as events
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("send_email", to="ada@example.com", body=body))],
        repeat_last=True,
    )
    buffer = InMemoryReplayBuffer(ReplaySettings(terminal_grace_s=grace_s))
    with tempfile.TemporaryDirectory() as tmp:
        runtime = SessionRuntime(
            agent=Agent(model=model, tools=[send_email]),
            config=RuntimeConfig(database_url=f"sqlite:///{tmp}/paused.db"),
            replay=buffer,
        )
        async with runtime:
            await _pause(runtime, 0, concurrency, concurrency)  # warm-up: imports, caches
            await asyncio.sleep(GRACE_S * 2)
            gc.collect()
            before = _rss_mib()
            await _pause(runtime, concurrency, turns + concurrency, concurrency)
            await asyncio.sleep(GRACE_S * 2)
            gc.collect()
            after = _rss_mib()
            held = buffer.turns
            tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("turnkit-turn")]
            leased, buffered = 0, 0
            for index in range(concurrency, turns + concurrency):
                [record] = await runtime.store.list_turns(SessionId(f"paused-{index}"))
                assert record.status == "awaiting_approval", record.status
                leased += record.lease_owner is not None
                if held:  # (reading a turn the buffer lacks would add a placeholder)
                    entries = await buffer.read(record.turn_id, after="0", wait_s=0)
                    buffered += sum(len(e.data) for e in entries)
    return {
        "rss_kib_per_paused_turn": (after - before) * 1024 / turns,
        "buffered_kib_per_paused_turn": buffered / 1024 / turns,
        "peak_rss_mib": _peak_mib(),
        "buffer_turns_held": float(held),
        "turn_tasks": float(len(tasks)),
        "leases": float(leased),
    }


async def _pause(runtime: SessionRuntime, start: int, stop: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with gate:
            async for _ in runtime.execute_message(f"paused-{index}", "Email Ada the numbers."):
                pass

    await asyncio.gather(*(one(i) for i in range(start, stop)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    default_json = Path(__file__).parent / "results" / "paused_turns.json"
    parser.add_argument("--json", default=str(default_json))
    parser.add_argument("--grace", type=float, help=argparse.SUPPRESS)  # one run, as JSON
    args = parser.parse_args()
    if args.grace is not None:
        print(json.dumps(await run(args.turns, args.concurrency, args.grace)))
        return
    # Each run in a fresh interpreter: a heap the other run grew would hide what it holds.
    released = _in_child(args, GRACE_S)
    held = _in_child(args, 3600.0)
    print(f"\n{args.turns} paused turns — {platform.python_version()} on {os.cpu_count()} cores\n")
    print(f"{'after the grace period':34} {'released':>10} {'held (TTL)':>11}")
    for key in released:
        print(f"{key:34} {released[key]:10.1f} {held[key]:11.1f}")
    payload: dict[str, Any] = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "turns": args.turns,
        "concurrency": args.concurrency,
        "released": released,
        "held_for_ttl": held,
    }
    _write(Path(args.json), payload)
    print(f"\nwrote {args.json}")


def _write(out: Path, payload: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))


def _in_child(args: argparse.Namespace, grace_s: float) -> dict[str, float]:
    command = [sys.executable, __file__, "--turns", str(args.turns)]
    command += ["--concurrency", str(args.concurrency), "--grace", str(grace_s)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    with _procs.stopped_at_end():  # a child `subprocess.run` waits for is stopped too
        asyncio.run(main())
