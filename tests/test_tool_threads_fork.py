"""Sync tools still run in a forked child (the tool thread pool is made afresh there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_sync_tool_runs_in_a_child_forked_after_a_tool_ran() -> None:
    code = """
import asyncio, os
from turnkit.tools._function import _in_tool_thread

def work(x): return x * 2

async def once():
    return await asyncio.wait_for(_in_tool_thread(work, {"x": 21}), 3)

assert asyncio.run(once()) == 42
pid = os.fork()
if pid == 0:
    try:
        os._exit(0 if asyncio.run(once()) == 42 else 1)
    except BaseException:
        os._exit(1)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", code], timeout=30, env=os.environ.copy())
    assert done.returncode == 0  # the child's sync tool ran (it waited forever before)
