"""What PostgreSQL's one-statement submit of an asked agent's turn costs the server.

An agent asked as a tool (`Agent.as_tool`) gets its turn through `SUBMIT_ASKED`, which
also holds the asking turn's row and checks it is unfinished **and has no Stop pending**
(`NOT cancel_requested`). This times that statement against the same statement without
the Stop check (`before`), and the plain `SUBMIT` of an ordinary message for reference,
in the same run, interleaved, each execution rolled back (so every one sees the same
tables):

- **server ms**: `EXPLAIN (ANALYZE, FORMAT JSON)` of the statement, its execution time
  as the server reports it (planning left out: the store's statement is prepared once);
- **round trip ms**: the prepared statement as the store sends it (asyncpg), from send to
  answer, in a transaction rolled back after.

The asking turn is one of `--turns` turns in the table (unfinished, claimed), and the
asked agent's session exists (the runtime opens it before the submit).

Run:  .venv/bin/python benchmarks/asked_submit.py [--runs 400] [--turns 20000]
      [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/asked_submit.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _services
from turnkit.ids import SessionId, TurnId, new_turn_id
from turnkit.store import ClaimRequest, NewInput, _submit_pg as submit_pg
from turnkit.store.sql import SqlStore

_STOP_CHECK = " AND NOT cancel_requested"
CONTENDERS: dict[str, str] = {
    "asked (after)": submit_pg.SUBMIT_ASKED,
    "asked (before)": submit_pg.SUBMIT_ASKED.replace(_STOP_CHECK, ""),
    "plain SUBMIT": submit_pg.SUBMIT,
}


class _Captured:
    """Stands in for the asyncpg connection: keeps what `submit_pg.submit` would send."""

    args: tuple[Any, ...] = ()

    async def fetchrow(self, _sql: str, *args: Any) -> None:
        self.args = args


def _new(session: str, asked_by: TurnId | None) -> NewInput:
    return NewInput(
        session_id=SessionId(session),
        turn_id=new_turn_id(),
        content="Refund order A1",
        request_id="delegated" if asked_by else None,
        delivery="queue",
        agent="refunds",
        model="m",
        effort="off",
        pinned={"model": "m"},
        claim_for=ClaimRequest(owner="bench", ttl_s=30, max_attempts=3),
        asked_by=asked_by,
    )


async def _args(new: NewInput) -> tuple[Any, ...]:
    captured = _Captured()
    await submit_pg.submit(captured, new, datetime.now(UTC))
    assert captured.args
    return captured.args


async def _fill(url: str, schema: str, turns: int) -> TurnId:
    async with SqlStore.from_url(url, schema=schema) as store:
        for i in range(turns // 1000):  # many past turns, 1,000 a transaction
            await store._tx(_insert_past, i)
        asking = await store.submit(_new("s1", None))
        await store.create_session(SessionId("tk-sub.bench"), parent=SessionId("s1"))
        return asking.turn_id


def _insert_past(conn: Any, block: int) -> None:
    from sqlalchemy import insert

    from turnkit.store._schema import turns

    now = datetime.now(UTC)
    conn.execute(
        insert(turns),
        [
            {
                "turn_id": f"past{block:04d}{i:04d}",
                "session_id": f"p{block}",
                "input_seq": i + 1,
                "status": "succeeded",
                "content": "x",
                "agent": "a",
                "model": "m",
                "created_at": now,
                "updated_at": now,
            }
            for i in range(1000)
        ],
    )


async def _time(conn: Any, sql: str, args: tuple[Any, ...]) -> tuple[float, float]:
    """(server ms, round trip ms) of one execution, rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        [plan] = json.loads(await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args))
    finally:
        await tx.rollback()
    tx = conn.transaction()
    await tx.start()
    try:
        started = time.perf_counter()
        row = await conn.fetchrow(sql, *args)
        took = (time.perf_counter() - started) * 1000
    finally:
        await tx.rollback()
    assert row is not None, "the statement wrote nothing"
    return plan["Execution Time"], took


async def run(url: str, runs: int, turns: int) -> dict[str, Any]:
    import asyncpg

    schema = f"tk_bench_{uuid.uuid4().hex[:10]}"
    asking = await _fill(url, schema, turns)
    asked_args = await _args(_new("tk-sub.bench", asking))
    plain_args = await _args(_new("s2", None))
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    results: dict[str, dict[str, list[float]]] = {
        name: {"server": [], "trip": []} for name in CONTENDERS
    }
    try:
        names = list(CONTENDERS)
        for i in range(runs + 20):  # the first 20 warm up (plans, caches)
            for name in names[i % 3 :] + names[: i % 3]:  # each goes first in turn
                sql = CONTENDERS[name]
                server, trip = await _time(
                    conn, sql, plain_args if name == "plain SUBMIT" else asked_args
                )
                if i >= 20:
                    results[name]["server"].append(server)
                    results[name]["trip"].append(trip)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
    return {
        name: {
            f"{kind} {stat}": round(value, 4)
            for kind, values in timings.items()
            for stat, value in (
                ("p50", statistics.median(values)),
                ("p90", statistics.quantiles(values, n=10)[-1]),
            )
        }
        for name, timings in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--postgres", default=_services.POSTGRES_URL)
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).parent / "results" / "asked_submit.json",
    )
    args = parser.parse_args()
    table = asyncio.run(run(args.postgres, args.runs, args.turns))
    print(
        f"{'statement':<16} {'server p50':>11} {'server p90':>11} {'trip p50':>9} {'trip p90':>9}"
    )
    for name, row in table.items():
        print(
            f"{name:<16} {row['server p50']:>11.3f} {row['server p90']:>11.3f} "
            f"{row['trip p50']:>9.3f} {row['trip p90']:>9.3f}"
        )
    result = {
        "runs": args.runs,
        "turns": args.turns,
        "python": platform.python_version(),
        "ms": table,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
