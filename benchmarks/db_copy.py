"""`turnkit db copy` from SQLite to PostgreSQL: time and rows per second.

Seeds a SQLite database with `--sessions` sessions of one finished turn each (a scripted
text reply) and `--paused` more whose turn waits for an approval (their checkpoints are
copied too), then runs `turnkit db copy` into a fresh PostgreSQL schema, which it drops
afterwards.

Run:  .venv/bin/python benchmarks/db_copy.py [--sessions 1000] [--paused 50]
          [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

import _services
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.cli import main
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool(approval="always")
async def send_email(to: str) -> str:
    """Send an email (needs a person's approval)."""
    return f"sent to {to}"


async def _seed(url: str, sessions: int, paused: int) -> None:
    steps = [ModelStep.text_reply("Noted, thanks.")] * sessions + [
        ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))
    ] * paused
    agent = Agent(model=ScriptedModel(steps), tools=[send_email])
    async with SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url)) as runtime:
        for i in range(sessions):
            await collect_events(runtime.execute_message(f"s{i}", "hello"))
        for i in range(paused):
            await collect_events(runtime.execute_message(f"p{i}", "email Ada"))


async def _drop(postgres: str, schema: str) -> None:
    conn = await asyncpg.connect(postgres)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def run() -> None:
    """Seed, copy, print the copy's lines and its rate."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--paused", type=int, default=50)
    parser.add_argument("--postgres", default=_services.POSTGRES_URL)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    schema = f"tk_bench_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'turnkit.db'}"
        asyncio.run(_seed(url, args.sessions, args.paused))
        out = io.StringIO()
        started = time.perf_counter()
        argv = ["db", "copy", "--from", url, "--to", args.postgres, "--to-schema", schema]
        try:
            code = main(argv, out=out)
        finally:
            took = time.perf_counter() - started
            asyncio.run(_drop(args.postgres, schema))
    print(out.getvalue(), end="")
    if code != 0:
        raise SystemExit(f"turnkit db copy exited {code}")
    rows = int(out.getvalue().rsplit("copied ", 1)[1].split(" row", 1)[0].replace(",", ""))
    print(f"exit {code}: {rows:,} rows in {took:.2f} s ({rows / took:,.0f} rows/s, whole command)")
    if args.json:
        figures = {"sessions": args.sessions, "paused": args.paused, "rows": rows, "seconds": took}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures | {"rows_per_s": rows / took}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run()
