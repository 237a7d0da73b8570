"""Does a `turnkit worker` process grow? Two workers driving a server's mix for a while.

Starts `--workers` `turnkit worker` processes (PostgreSQL, a fresh schema; the Redis replay
buffer) hosting the soak agent of `soak_memory.py` (a fake model, no network), and, in
this process, `--producers` producers that queue turns with `run_in_process=False` (as an
API process beside workers does) and follow each through the Redis buffer:

- plain answers; a tool call then the answer; failed turns (the model raises);
- Stop pressed here (another process than the driving worker) mid-answer, half with the
  reader still following, half after it went away;
- pauses (a tool needing approval) answered here later, driven on by a worker.

As `soak_memory.py` does, the workers shrink two bounded caches that take thousands of
turns to fill (the messages kept by value; recent sessions' transcripts), so that a run of
minutes measures what grows without bound; `--full-caches` keeps their real sizes.

Every `--long-every`th turn of a producer goes to that producer's one long session (its
transcript grows all run long); the others have a session each.

Every `--sample-every` seconds it records, per worker: RSS, open file descriptors and
threads (from /proc), the turns it finished (its `finished turn` log lines), and what
only the worker can see, which the soak agent's module reports from inside it every
second: its asyncio tasks and live objects (by type); and for the
whole: PostgreSQL connections by `application_name` (pg_stat_activity), Redis keys and
`used_memory`, and the schema's turns by status and those holding a lease. Growth is the
least-squares slope against turns finished, from the first sample after `--warmup` seconds
to the last. At the end every turn must have ended as its kind ends (succeeded, failed or
cancelled), none twice and none lost; a mismatch is printed and makes the exit code 1.

Run:  .venv/bin/python benchmarks/soak_worker.py [--duration 600] [--warmup 60]
      [--workers 2] [--producers 8] [--concurrency 8] [--sample-every 15] [--long-every 3]
      [--full-caches] [--database-url URL] [--redis-url URL] [--json PATH]
Defaults: `TURNKIT_BENCH_POSTGRES_URL` and `TURNKIT_BENCH_REDIS_URL`, else
`TURNKIT_TEST_POSTGRES_URL` and `TURNKIT_TEST_REDIS_URL`, else 127.0.0.1.
Use a Redis of its own: the key count and memory are the whole database's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import _procs
import _services

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.pauses import Approve
from turnkit.replay import replay_from_url
from turnkit.runtime.reader import Frame, KeepAlive

ROOT = Path(__file__).parent.parent
KINDS = ("plain", "tool", "fail", "stop", "cancel", "approve")
ENDS = {"plain": "succeeded", "tool": "succeeded", "approve": "succeeded", "fail": "failed",
        "stop": "cancelled", "cancel": "cancelled"}  # fmt: skip


SMALL = "TURNKIT_SOAK_SMALL_CACHES"
"""Set in the workers' environment unless `--full-caches`: see `_small_caches`."""
SMALL_HELD_BYTES = 256 * 1024
"""The held transcripts' bound in the workers unless `--full-caches` (64 MiB by default)."""


def _small_caches() -> None:
    """Shrink the two bounded caches that take thousands of turns to fill (the messages
    kept by value, 16,384; recent sessions' transcripts, 64 MiB), so that what a run of
    minutes measures is what grows without bound (private names: this is a benchmark)."""
    from _patch import replace
    from turnkit.context import transcript
    from turnkit.runtime._held import HeldTranscripts

    replace(transcript, "_CACHE_SIZE", 32)
    # The runtime passes its configured bound (`held_transcript_bytes`), so a new default
    # would change nothing: every HeldTranscripts built from now on is capped instead.
    full = HeldTranscripts.__init__

    def capped(self: HeldTranscripts, *, max_bytes: int = SMALL_HELD_BYTES) -> None:
        full(self, max_bytes=min(max_bytes, SMALL_HELD_BYTES))

    replace(HeldTranscripts, "__init__", capped)


STATS = "TURNKIT_SOAK_STATS"
"""Where a worker writes what only it can see: its asyncio tasks and live objects."""
_TASKS: set[asyncio.Task[None]] = set()


async def _report(path: Path) -> None:
    """In a worker: every second, its asyncio tasks and the live objects the collector
    tracks (the most common types too), as one JSON line overwritten in place."""
    import gc
    from collections import Counter

    while True:
        types = Counter(type(o).__qualname__ for o in gc.get_objects())
        line = {"tasks": len(asyncio.all_tasks()) - 1, "objects": sum(types.values()),
                "types": dict(types.most_common(25))}  # fmt: skip
        path.with_suffix(".tmp").write_text(json.dumps(line))
        path.with_suffix(".tmp").replace(path)
        await asyncio.sleep(1)


def __getattr__(name: str) -> Any:  # `soak_worker:AGENT`, built in the workers that load it
    if name == "AGENT":
        from soak_memory import soak_agent

        if os.environ.get(SMALL) == "1":  # loaded before the worker builds its runtime
            _small_caches()
        if os.environ.get(STATS):  # loaded inside `turnkit worker`'s running event loop
            _TASKS.add(asyncio.get_running_loop().create_task(_report(Path(os.environ[STATS]))))

        agent: Agent = soak_agent()
        return agent
    raise AttributeError(name)


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


# ── the producers ────────────────────────────────────────────────────────────────────


def _frames(
    runtime: SessionRuntime, turn_id: str, after: int
) -> AsyncGenerator[Frame | KeepAlive, None]:
    """A reader's frames after `after`: a generator, closed when the caller stops early."""
    frames = runtime.reader().follow(turn_id, after_seq=after)
    return cast(AsyncGenerator[Frame | KeepAlive, None], frames)


async def _follow(
    runtime: SessionRuntime, turn_id: str, after: int, until: str = ""
) -> tuple[int, dict[str, Any]]:
    """Read a turn's frames after `after` (until an event of type `until`); the last seq
    and the last event."""
    seq, event = after, {}
    stream = _frames(runtime, turn_id, after)
    async with contextlib.aclosing(stream):
        async for frame in stream:
            if not isinstance(frame, Frame):
                continue
            if frame.seq is not None:
                seq = frame.seq
            event = json.loads(frame.data)
            if until and event.get("type") == until:
                break
    return seq, event


async def _one(runtime: SessionRuntime, session: str, kind: str, index: int) -> str:
    submission = await runtime.start(session, f"{kind} turn {index}")
    turn_id = submission.turn_id
    if kind in ("plain", "tool", "fail"):
        await _follow(runtime, turn_id, 0)
    elif kind == "cancel":  # Stop pressed while the reader follows on
        stream = _frames(runtime, turn_id, 0)
        async with contextlib.aclosing(stream):
            async for frame in stream:
                if isinstance(frame, Frame) and json.loads(frame.data)["type"] == "message.delta":
                    await runtime.cancel(turn_id)
                    break
        await _follow(runtime, turn_id, 0)
    elif kind == "stop":  # the reader goes away mid-answer, then Stop is pressed
        await _follow(runtime, turn_id, 0, until="message.delta")
        await runtime.cancel(turn_id)
    elif kind == "approve":  # pauses; answered here, a worker drives the turn on
        seq, asked = await _follow(runtime, turn_id, 0, until="approval.requested")
        await runtime.resume(turn_id, asked["request_id"], Approve())
        await _follow(runtime, turn_id, seq)
    return turn_id


async def _producers(
    runtime: SessionRuntime, args: argparse.Namespace, deadline: float, done: list[Any]
) -> None:
    async def lane(lane: int) -> None:
        index = 0
        while time.monotonic() < deadline:
            kind = KINDS[(lane + index) % len(KINDS)]
            # every `--long-every`th turn in the lane's long session, the rest one each
            long = args.long_every and index % args.long_every == 0
            session = f"long-{lane}" if long else f"s-{lane}-{index}"
            started = time.monotonic()
            try:
                async with asyncio.timeout(60):
                    turn_id = await _one(runtime, session, kind, index)
                done.append((turn_id, kind, time.monotonic() - started))
            except Exception as exc:  # counted as lost unless it shows up ended later
                done.append((None, kind, repr(exc)))
            index += 1

    await asyncio.gather(*(lane(i) for i in range(args.producers)))


# ── sampling ─────────────────────────────────────────────────────────────────────────


def _proc(pid: int) -> dict[str, int]:
    out = {"rss_kib": 0, "fds": 0, "threads": 0}
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    out["rss_kib"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def _stats(log: Path) -> dict[str, Any]:
    """What the worker wrote last (`_report`): its tasks and live objects."""
    with contextlib.suppress(OSError, ValueError):
        stats: dict[str, Any] = json.loads(log.with_suffix(".stats.json").read_text())
        return stats
    return {"tasks": -1, "objects": -1, "types": {}}


def _finished(log: Path) -> int:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace").count("finished turn ")
    return 0


async def _sample(
    args: argparse.Namespace, schema: str, procs: list[subprocess.Popen[bytes]],
    logs: list[Path], done: list[Any], began: float,
) -> dict[str, Any]:  # fmt: skip
    import asyncpg
    import redis.asyncio as aioredis

    row: dict[str, Any] = {"t_s": round(time.monotonic() - began, 1), "produced": len(done)}
    row["workers"] = [{**_proc(p.pid), **_stats(log), "turns": _finished(log)}
                      for p, log in zip(procs, logs, strict=True)]  # fmt: skip
    conn = await asyncpg.connect(_plain(args.database_url))
    try:
        apps = await conn.fetch(
            "SELECT application_name, count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "GROUP BY application_name"
        )
        row["pg_connections"] = {r["application_name"] or "?": r["n"] for r in apps}
        statuses = await conn.fetch(f'SELECT status, count(*) AS n FROM "{schema}".tk_turns '
                                    "GROUP BY status")  # fmt: skip
        row["turns_by_status"] = {r["status"]: r["n"] for r in statuses}
        row["leased"] = await conn.fetchval(
            f'SELECT count(*) FROM "{schema}".tk_turns WHERE lease_owner IS NOT NULL'
        )
    finally:
        await conn.close()
    client = aioredis.Redis.from_url(args.redis_url)
    try:
        row["redis_keys"] = await client.dbsize()
        row["redis_used_kib"] = int((await client.info("memory"))["used_memory"]) // 1024
    finally:
        await client.aclose()
    return row


def _type_growth(pts: list[tuple[int, dict[str, Any]]]) -> dict[str, float]:
    """The live object types that grew most, per 1,000 turns, first sample to last."""
    (t0, first), (t1, last) = pts[0], pts[-1]
    if t1 <= t0:
        return {}
    grew = {k: (v - first["types"].get(k, 0)) * 1000 / (t1 - t0) for k, v in last["types"].items()}
    return dict(sorted(grew.items(), key=lambda kv: -kv[1])[:6])


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    num = sum((x - mx) * (y - my) for x, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return num / den


# ── the run ──────────────────────────────────────────────────────────────────────────


def _start_workers(
    args: argparse.Namespace, schema: str, logdir: Path
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                    os.environ.get("PYTHONPATH")])),
        SMALL: "0" if args.full_caches else "1",
    }  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for i in range(args.workers):
            cmd = [sys.executable, "-m", "turnkit.cli", "worker", "--agent", "soak_worker:AGENT",
                   "--concurrency", str(args.concurrency), "--database-url", args.database_url,
                   "--database-schema", schema, "--redis-url", args.redis_url]  # fmt: skip
            log = logdir / f"worker{i}.log"
            mine = {**env, STATS: str(log.with_suffix(".stats.json"))}
            procs.append(_procs.start(cmd, log=log, env=mine, cwd=ROOT))
            logs.append(log)
    except BaseException:  # what did start must not outlive the run
        _procs.stop(procs)
        raise
    return procs, logs


async def run(args: argparse.Namespace) -> dict[str, Any]:
    schema = f"tk_soakw_{uuid.uuid4().hex[:8]}"
    logdir = Path(args.logs)  # made by main
    config = RuntimeConfig(database_url=args.database_url, database_schema=schema,
                           run_in_process=False)  # fmt: skip
    from soak_memory import soak_agent

    runtime = SessionRuntime(agent=soak_agent(), config=config,
                             replay=replay_from_url(args.redis_url))  # fmt: skip
    await runtime.open()  # creates the schema before the workers start
    procs: list[subprocess.Popen[bytes]] = []
    done: list[Any] = []
    samples: list[dict[str, Any]] = []
    try:
        procs, logs = _start_workers(args, schema, logdir)
        began = time.monotonic()
        deadline = began + args.duration
        producing = asyncio.create_task(_producers(runtime, args, deadline, done))
        while not producing.done():
            samples.append(await _sample(args, schema, procs, logs, done, began))
            last = samples[-1]
            print(f"{last['t_s']:>6.0f} s  turns {last['produced']:>6}  "
                  + "  ".join(f"w{i} rss {w['rss_kib'] / 1024:.1f} MiB fds {w['fds']}"
                              for i, w in enumerate(last["workers"]))
                  + f"  pg {sum(last['pg_connections'].values())}  redis keys "
                  f"{last['redis_keys']}  leased {last['leased']}", flush=True)  # fmt: skip
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(args.sample_every):
                    await asyncio.shield(producing)
        await producing
        await asyncio.sleep(3)  # the buffer's grace for the last turns
        samples.append(await _sample(args, schema, procs, logs, done, began))
        ended: dict[str, tuple[str, str]] = {}
        for turn_id, kind, _ in done:
            if turn_id is not None:
                ended[turn_id] = (kind, (await runtime.turn(turn_id)).status)
    finally:
        await asyncio.to_thread(_procs.stop, procs, 60)
        await runtime.close()
        await runtime.replay.close()
        import asyncpg

        conn = await asyncpg.connect(_plain(args.database_url))
        with contextlib.suppress(Exception):
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
    return _summarise(args, samples, done, ended, logs)


def _summarise(
    args: argparse.Namespace, samples: list[dict[str, Any]], done: list[Any],
    ended: dict[str, tuple[str, str]], logs: list[Path],
) -> dict[str, Any]:  # fmt: skip
    wrong = [(t, kind, status) for t, (kind, status) in ended.items() if ENDS[kind] != status]
    failed = [(kind, why) for t, kind, why in done if t is None]
    texts = [log.read_text(errors="replace") for log in logs]
    warm = [s for s in samples if s["t_s"] >= args.warmup] or samples[-2:]
    per_worker = []
    for i in range(args.workers):
        pts = [(s["workers"][i]["turns"], s["workers"][i]) for s in warm]
        first, last = pts[0][1], pts[-1][1]
        per_worker.append({
            "turns": last["turns"],
            "rss_mib_first": first["rss_kib"] / 1024, "rss_mib_last": last["rss_kib"] / 1024,
            "rss_mib_max": max(s["workers"][i]["rss_kib"] for s in samples) / 1024,
            "rss_bytes_per_turn": _slope([(t, w["rss_kib"] * 1024) for t, w in pts]),
            # the same over the later half of those turns: below the whole's if it levels off
            "rss_bytes_per_turn_late": _slope([(t, w["rss_kib"] * 1024) for t, w in pts
                                               if t >= (pts[0][0] + pts[-1][0]) / 2]),
            "fds_first": first["fds"], "fds_last": last["fds"],
            "fds_max": max(s["workers"][i]["fds"] for s in samples),
            "fds_per_1000_turns": _slope([(t, w["fds"]) for t, w in pts]) * 1000,
            "threads_last": last["threads"],
            "tasks_first": first["tasks"], "tasks_last": last["tasks"],
            "tasks_max": max(s["workers"][i]["tasks"] for s in samples),
            "objects_per_turn": _slope([(t, w["objects"]) for t, w in pts]),
            "types_per_1000_turns": _type_growth(pts),
            "claimed": texts[i].count("claimed turn "),
            "recovered": texts[i].count("recovering turn "),
            "errors": texts[i].count(" ERROR "), "warnings": texts[i].count(" WARNING "),
        })  # fmt: skip
    total = [(s["produced"], s) for s in warm]
    latencies = sorted(x for _, _, x in done if isinstance(x, float))
    return {
        "python": platform.python_version(), "cores": os.cpu_count(), "args": vars(args),
        "turns": len(done), "turns_per_s": len(done) / max(1.0, samples[-1]["t_s"]),
        "p50_s": latencies[len(latencies) // 2] if latencies else None,
        "p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        "wrong_endings": wrong[:20], "wrong_count": len(wrong),
        "producer_failures": failed[:20], "producer_failure_count": len(failed),
        "workers": per_worker,
        "pg_connections_max": max(sum(s["pg_connections"].values()) for s in samples),
        "pg_connections_last": samples[-1]["pg_connections"],
        "redis_keys_per_1000_turns": _slope([(t, s["redis_keys"]) for t, s in total]) * 1000,
        "redis_keys_last": samples[-1]["redis_keys"],
        "redis_keys_max": max(s["redis_keys"] for s in samples),
        "redis_kib_per_1000_turns": _slope([(t, s["redis_used_kib"]) for t, s in total]) * 1000,
        "leased_last": samples[-1]["leased"],
        "statuses_last": samples[-1]["turns_by_status"],
        "samples": samples,
    }  # fmt: skip


def _print(r: dict[str, Any]) -> None:
    print(f"\nturnkit worker soak — Python {r['python']} on {r['cores']} cores, "
          f"{r['turns']} turns in {r['args']['duration']} s ({r['turns_per_s']:.1f}/s, "
          f"p50 {r['p50_s'] or 0:.2f} s, p99 {r['p99_s'] or 0:.2f} s), "
          f"growth after {r['args']['warmup']} s\n")  # fmt: skip
    print(
        "| worker | turns | RSS MiB first → last (max) | RSS bytes/turn (later half) "
        "| live objects/turn "
        "| asyncio tasks first → last (max) | fds first → last (max) | fds/1000 turns "
        "| threads | recovered | errors / warnings |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, w in enumerate(r["workers"]):
        print(f"| {i} | {w['turns']} | {w['rss_mib_first']:.1f} → {w['rss_mib_last']:.1f} "
              f"({w['rss_mib_max']:.1f}) | {w['rss_bytes_per_turn']:,.0f} "
              f"({w['rss_bytes_per_turn_late']:,.0f}) | "
              f"{w['objects_per_turn']:.2f} | {w['tasks_first']} → {w['tasks_last']} "
              f"({w['tasks_max']}) | {w['fds_first']} → "
              f"{w['fds_last']} ({w['fds_max']}) | {w['fds_per_1000_turns']:.2f} | "
              f"{w['threads_last']} | {w['recovered']} | {w['errors']} / {w['warnings']} |"
              )  # fmt: skip
    for i, w in enumerate(r["workers"]):
        print(f"worker {i}: live objects that grew most, per 1,000 turns: "
              f"{w['types_per_1000_turns']}")  # fmt: skip
    print(f"\nPostgreSQL connections: at most {r['pg_connections_max']}, at the end "
          f"{r['pg_connections_last']}")  # fmt: skip
    print(f"Redis: {r['redis_keys_last']} keys at the end (at most {r['redis_keys_max']}), "
          f"{r['redis_keys_per_1000_turns']:.2f} keys and "
          f"{r['redis_kib_per_1000_turns']:.1f} KiB per 1,000 turns")  # fmt: skip
    print(f"turns by status at the end: {r['statuses_last']}, holding a lease: {r['leased_last']}")
    print(
        f"endings other than their kind's: {r['wrong_count']} {r['wrong_endings'][:5]}; "
        f"producer failures: {r['producer_failure_count']} {r['producer_failures'][:5]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600, help="seconds of producing")
    parser.add_argument("--warmup", type=float, default=60, help="seconds before growth counts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--producers", type=int, default=8, help="turns in flight")
    parser.add_argument("--concurrency", type=int, default=8, help="each worker's")
    parser.add_argument("--sample-every", type=float, default=15)
    parser.add_argument(
        "--long-every",
        type=int,
        default=3,
        help="every Nth turn of a producer goes to its long session (0: none)",
    )
    parser.add_argument("--database-url", default=_services.POSTGRES_URL)
    parser.add_argument("--redis-url", default=_services.REDIS_URL)
    parser.add_argument(
        "--full-caches",
        action="store_true",
        help="keep the two bounded caches at their real sizes in the workers",
    )
    parser.add_argument("--logs", default=str(ROOT / "benchmarks/results/soak_worker_logs"))
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/soak_worker.json"))
    args = parser.parse_args()
    if not 0 < args.duration <= 24 * 3600 or args.workers < 1 or args.producers < 1:
        parser.error("--duration must be in (0, 86400], --workers and --producers at least 1")
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(args))
    _print(result)
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {args.json}")
    raise SystemExit(1 if result["wrong_count"] or result["producer_failure_count"] else 0)


if __name__ == "__main__":
    with _procs.stopped_at_end():
        main()
