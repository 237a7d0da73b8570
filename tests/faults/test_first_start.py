"""Processes starting together on a fresh PostgreSQL schema all come up (no setup race)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, require_service
from tests.faults._table import FaultTable

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.postgres]
ROOT = Path(__file__).parent.parent.parent
ROUNDS = int(os.environ.get("TURNKIT_FAULT_ROUNDS", "3"))
PROCESSES = 4

_OPEN = """
import asyncio, sys
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.testing import ModelStep, ScriptedModel

async def main() -> None:
    config = RuntimeConfig(database_url=sys.argv[1], database_schema=sys.argv[2])
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    await runtime.open()
    await runtime.close()

asyncio.run(main())
"""


async def _drop(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def test_processes_starting_together_on_a_fresh_schema_all_come_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    failures: list[str] = []
    for _ in range(ROUNDS):
        schema = f"tk_first_{uuid.uuid4().hex[:10]}"
        try:
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", _OPEN, POSTGRES_URL, schema],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )  # fmt: skip
                for _ in range(PROCESSES)
            ]
            for proc in procs:
                _, err = proc.communicate(timeout=60)
                if proc.returncode != 0:
                    failures.append(err.decode()[-600:])
        finally:
            asyncio.run(_drop(schema))
    table = FaultTable(
        trials=ROUNDS * PROCESSES, extra={"rounds": ROUNDS, "failed starts": len(failures)}
    )
    table.show(f"first start ({PROCESSES} processes at once on a fresh schema)", capsys)
    assert not failures, f"{len(failures)} of {ROUNDS * PROCESSES} starts failed:\n{failures[0]}"
