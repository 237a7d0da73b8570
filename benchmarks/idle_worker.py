"""A lone message on the production path: how soon an idle worker starts its turn.

One `turnkit serve` (`TURNKIT_RUN_IN_PROCESS=0`: it commits and streams) and `--workers`
`turnkit worker` processes share PostgreSQL and Redis, with the offline demo agent and
an instant model. Messages are posted one at a time, each after a random pause of up to
`--gap` seconds (so it lands anywhere in a worker's poll interval), and each stream is
read to its `done`. Reported: POST → the first event after `turn.started` (the worker
claimed the turn and its first stage began) and POST → `done`, p50 / p90 / max.

Two contenders alternate, each on a fresh schema per round: workers at their defaults
(they `LISTEN` for new turns and also poll every 0.2 s) and workers with `--no-listen`
(they only poll). Ratios are listen / poll in the same round (median, min–max).

Run:  .venv/bin/python benchmarks/idle_worker.py [--turns 40] [--rounds 3] [--workers 2]
      [--gap 0.3] [--json PATH]
Needs PostgreSQL and Redis, where `scale_out.py` finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

import _procs
from scale_out import API, ROOT, start_layout, stop_layout, write_json

CONTENDERS: dict[str, tuple[str, ...]] = {
    "workers listen (default)": (),
    "workers only poll (--no-listen)": ("--no-listen",),
}


async def _turns(url: str, turns: int, gap: float, seed: int) -> dict[str, list[float]]:
    """Post `turns` messages one at a time; ms to the first worker event and to `done`."""
    pause = random.Random(seed)
    first: list[float] = []
    done: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for i in range(-3, turns):  # three to warm every path
            await asyncio.sleep(pause.uniform(0, gap))
            began = time.perf_counter()
            seen_first = None
            path = f"{url}{API}/sessions/idle-{uuid.uuid4().hex[:8]}/execute"
            async with http.stream("POST", path, json={"content": "What is 6 * 7?"}) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    if seen_first is None and '"type":"turn.started"' not in line:
                        seen_first = time.perf_counter()
                    if '"type":"done"' in line:
                        if '"status":"succeeded"' not in line:
                            raise SystemExit(f"turn {i} did not succeed: {line}")
                        break
            ended = time.perf_counter()
            if i >= 0 and seen_first is not None:
                first.append((seen_first - began) * 1000)
                done.append((ended - began) * 1000)
    return {"first_ms": first, "done_ms": done}


def _pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gap", type=float, default=0.3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/idle_worker.json"))
    args = parser.parse_args()
    logs = Path(args.json).parent / "idle_worker_logs"  # beside the results
    logs.mkdir(parents=True, exist_ok=True)
    names = list(CONTENDERS)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            schema = f"tk_idle_{uuid.uuid4().hex[:8]}"
            urls, procs = start_layout(1, args.workers, 0.0, 4, schema, logs, CONTENDERS[name])
            try:
                time.sleep(1.0)  # the workers are up and idle
                got = asyncio.run(_turns(urls[0], args.turns, args.gap, seed=r))
            finally:
                stop_layout(procs, schema)
            row: dict[str, Any] = {"contender": name, "round": r + 1, **got,
                   "first": _pcts(got["first_ms"]), "done": _pcts(got["done_ms"])}  # fmt: skip
            rows.append(row)
            print(f"round {r + 1}: {name}: first event p50 {row['first']['p50']:.1f} ms, "
                  f"done p50 {row['done']['p50']:.1f} ms", flush=True)  # fmt: skip

    summary = []
    for name in names:
        mine = [x for x in rows if x["contender"] == name]
        entry: dict[str, Any] = {"contender": name}
        for key in ("first", "done"):
            values = [v for x in mine for v in x[f"{key}_ms"]]
            entry[key] = _pcts(values)
            ratios = []
            for x in mine:
                other = next(o for o in rows if o["round"] == x["round"] and o is not x)
                listen, poll = (x, other) if name == names[0] else (other, x)
                ratios.append(listen[key]["p50"] / poll[key]["p50"])
            entry[f"{key}_listen_over_poll"] = {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)
            }  # fmt: skip
        summary.append(entry)

    print(f"\nidle worker — Python {platform.python_version()} on {os.cpu_count()} cores, "
          f"1 API + {args.workers} workers, {args.turns} turns × {args.rounds} rounds, "
          f"a pause of up to {args.gap:g} s before each\n")  # fmt: skip
    print("| contender | first event after POST p50 / p90 / max ms "
          "| done after POST p50 / p90 / max ms |")  # fmt: skip
    print("|---|---|---|")
    for s in summary:
        f, d = s["first"], s["done"]
        print(f"| {s['contender']} | {f['p50']:.1f} / {f['p90']:.1f} / {f['max']:.1f} "
              f"| {d['p50']:.1f} / {d['p90']:.1f} / {d['max']:.1f} |")  # fmt: skip
    ratio = summary[0]["first_listen_over_poll"]
    done = summary[0]["done_listen_over_poll"]
    print(f"\nlisten / poll, p50 per round: first event {ratio['median']:.2f} "
          f"({ratio['min']:.2f}–{ratio['max']:.2f}), done {done['median']:.2f} "
          f"({done['min']:.2f}–{done['max']:.2f})")  # fmt: skip
    write_json(args, summary, rows)


if __name__ == "__main__":
    with _procs.stopped_at_end():
        main()
