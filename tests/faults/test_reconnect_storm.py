"""Cut live streams at random points and reconnect to the other API process, many times.

Every reconnect sends `Last-Event-ID`; the union of what the client received must be the
turn's committed log exactly: no duplicated event, no missing one. Prints the fault table.
Bounded: `TURNKIT_FAULT_TURNS` turns (default 4), at most 40 cuts each.
"""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.faults._table import FaultTable, seq_faults, tool_effects
from tests.http.test_multiprocess import API, Servers, servers

pytestmark = [pytest.mark.slow, pytest.mark.faults]
TURNS = int(os.environ.get("TURNKIT_FAULT_TURNS", "4"))
__all__ = ("servers",)  # the fixture, re-exported for pytest


async def test_random_cuts_and_reconnects_over_two_processes(
    servers: Servers, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(int(os.environ.get("TURNKIT_FAULT_SEED", "11")))
    urls = [servers.start(TK_TOOL_SLEEP="0.6")[0], servers.start(TK_TOOL_SLEEP="0.6")[0]]
    cuts = duplicated = missing = stuck = 0
    async with httpx.AsyncClient(timeout=30) as http:
        for turn in range(TURNS):
            received: list[int] = []
            turn_id = ""
            done = False
            for attempt in range(40):
                url = urls[attempt % 2]
                if attempt == 0:
                    method, target = "POST", f"{url}{API}/sessions/cut-{turn}/execute"
                    kwargs: dict[str, object] = {"json": {"content": "double 21"}}
                else:
                    method, target = "GET", f"{url}{API}/turns/{turn_id}/stream"
                    kwargs = {"headers": {"Last-Event-ID": str(received[-1])}}
                budget = rng.randint(1, 3)  # cut after this many durable events
                async with aconnect_sse(http, method, target, **kwargs) as source:  # type: ignore[arg-type]
                    turn_id = source.response.headers["x-turn-id"]
                    async for sse in source.aiter_sse():
                        event = json.loads(sse.data)
                        if "seq" not in event:
                            continue
                        received.append(int(event["seq"]))
                        if event["type"] == "done":
                            done = True
                            break
                        budget -= 1
                        if budget == 0:
                            break  # the connection is cut mid-stream
                if done:
                    break
                cuts += 1
            stored = (await http.get(f"{urls[0]}{API}/turns/{turn_id}")).json()
            gone, twice = seq_faults(received, stored["lastSeq"])
            missing, duplicated = missing + gone, duplicated + twice
            stuck += not done or stored["status"] != "succeeded"
    reruns, applied_twice = tool_effects(servers.log)
    table = FaultTable(
        trials=TURNS,
        lost=missing,
        duplicated=duplicated,
        stuck=stuck,
        tool_reruns=reruns,
        applied_twice=applied_twice,
        extra={"cuts and reconnects": cuts},
    )
    table.show("reconnect storm (two API processes, PostgreSQL + Redis)", capsys)
    assert table.failures == (0, 0, 0, 0), table
    assert cuts >= TURNS  # the test did cut streams
