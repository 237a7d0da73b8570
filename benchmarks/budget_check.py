"""What checking budget limits before a model call costs as an organisation's history grows.

Fills a store with `--sizes` past turns of one organisation (spread over 90 days, 7
departments, 300 principals, 5,000 sessions, each with a usage rollup), sets four limits
covering one caller (organisation per month, department per day, principal per month,
session in total) and times `Store.reserve_budget`, what runs before every model call
with budgets on, two ways in the same run, alternating:

- **counted**: each limit's count is on its row (what turnkit does);
- **scanned**: the counts are cleared first, so the check sums the usage rollup, as
  turnkit did before limits kept counts (and as it still does, once, to start a count).

On SQLite in a temporary directory and, when `--postgres URL` is given (default
`$TURNKIT_BENCH_POSTGRES_URL`, else `$TURNKIT_TEST_POSTGRES_URL`), on PostgreSQL in a
schema of its own.

Run:  .venv/bin/python benchmarks/budget_check.py [--sizes 1000,20000,100000] [--checks 30]
      [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/budget_check.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert, text, update

import _services
from turnkit.budgets import BudgetLimit, BudgetSubject
from turnkit.ids import TurnId
from turnkit.store._schema import budget_limits, turns, usage
from turnkit.store.sql import SqlStore

_SUBJECT = BudgetSubject(organisation="acme", department="d3", principal="p7", session_id="s42")
_LIMITS = (
    ("organisation", "acme", "month"),
    ("department", "d3", "day"),
    ("principal", "p7", "month"),
    ("session", "s42", "total"),
)


def _fill(conn: Connection, size: int, now: datetime) -> None:
    for first in range(0, size, 10_000):
        rows = range(first, min(size, first + 10_000))
        conn.execute(
            insert(turns),
            [
                {
                    "turn_id": f"t{i:08d}",
                    "session_id": f"s{i % 5000}",
                    "status": "succeeded",
                    "content": "x",
                    "agent": "a",
                    "model": "m",
                    "organisation": "acme",
                    "department": f"d{i % 7}",
                    "principal": f"p{i % 300}",
                    "created_at": now - timedelta(days=i % 90),
                    "updated_at": now,
                }
                for i in rows
            ],
        )
        conn.execute(
            insert(usage),
            [
                {
                    "turn_id": f"t{i:08d}",
                    "session_id": f"s{i % 5000}",
                    "model_calls": 2,
                    "input_tokens": 100,
                    "output_tokens": 20,
                    "cost_usd": 0.001,
                }
                for i in rows
            ],
        )


async def _check(store: SqlStore, *, scanned: bool, turn: int) -> float:
    if scanned:  # as before limits kept counts: every check sums the rollup
        await store._migrate(lambda c: c.execute(update(budget_limits).values(spent_period=None)))
    started = time.perf_counter()
    found, _ = await store.reserve_budget(
        _SUBJECT, turn_id=TurnId(f"bench{turn}"), usd=0.0, tokens=10, ttl_s=60
    )
    elapsed = time.perf_counter() - started
    assert found is not None
    await store.release_budget(TurnId(f"bench{turn}"))
    return elapsed


async def _measure(url: str, schema: str | None, size: int, checks: int) -> dict[str, Any]:
    async with SqlStore.from_url(url, schema=schema) as store:
        now = datetime.now(UTC)
        await store._migrate(lambda c: _fill(c, size, now))
        for scope, key, period in _LIMITS:
            await store.set_budget_limit(
                BudgetLimit(scope=scope, organisation="acme", key=key, period=period, usd=1e9)
            )
        times: dict[str, list[float]] = {"counted": [], "scanned": []}
        for n in range(checks):  # interleaved, the order flipping each round
            order = ("counted", "scanned") if n % 2 == 0 else ("scanned", "counted")
            for way in order:
                times[way].append(await _check(store, scanned=way == "scanned", turn=n))
    counted, scanned = (statistics.median(times[w]) * 1e3 for w in ("counted", "scanned"))
    ratios = sorted(s / c for s, c in zip(times["scanned"], times["counted"], strict=True))
    return {
        "turns": size,
        "counted_ms": round(counted, 3),
        "scanned_ms": round(scanned, 3),
        "ratio_median": round(statistics.median(ratios), 1),
        "ratio_p10": round(ratios[len(ratios) // 10], 1),
        "ratio_p90": round(ratios[len(ratios) * 9 // 10], 1),
    }


async def _postgres(url: str, size: int, checks: int) -> dict[str, Any]:
    schema = f"tk_budget_bench_{os.getpid()}"
    try:
        return await _measure(url, schema, size, checks)
    finally:
        async with SqlStore.from_url(url) as store:
            await store._migrate(lambda c: c.execute(text(f'DROP SCHEMA "{schema}" CASCADE')))


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,20000,100000")
    parser.add_argument("--checks", type=int, default=30)
    parser.add_argument("--postgres", default=_services.GIVEN_POSTGRES_URL)
    parser.add_argument(
        "--json", default=str(Path(__file__).parent / "results" / "budget_check.json")
    )
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            found = await _measure(f"sqlite:///{tmp}/bench.db", None, size, args.checks)
        rows.append({"store": "sqlite", **found})
        if args.postgres:
            rows.append(
                {"store": "postgresql", **await _postgres(args.postgres, size, args.checks)}
            )
    print(
        "| store | past turns | counted ms (median) | scanned ms (median) "
        "| scanned ÷ counted (p10–p90) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['store']} | {r['turns']:,} | {r['counted_ms']:.2f} | {r['scanned_ms']:.2f} "
            f"| {r['ratio_median']}× ({r['ratio_p10']}–{r['ratio_p90']}) |"
        )
    _write(Path(args.json), {"machine": platform.platform(), "checks": args.checks, "rows": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
