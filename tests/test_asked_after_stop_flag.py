"""An agent is not asked by a turn whose Stop is pending in another process.

A Stop pressed in one process, of a turn another process drives, only flags that turn: its
driver learns of it at its next lease renewal, unless its process hears the Stop (on
PostgreSQL, where it listens, at once). Until then the driver goes on, and a tool call may
start; but an agent it asks then would run (and act: a refund) for a conversation
the user stopped. The asked turn's submit refuses it, with nothing written, not even the
session the ask would have opened.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import new_input
from tests.support.asked_working import instant_refund
from turnkit import Agent, SessionRuntime, tool
from turnkit.config import RuntimeConfig
from turnkit.errors import AskingTurnEndedError
from turnkit.events import ToolCompletedEvent, ToolFailedEvent
from turnkit.ids import SessionId
from turnkit.store import ClaimRequest
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock, ModelStep, ScriptedModel, call, collect_events

DB = tuple[str, str | None]


@pytest.fixture
def refunded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every refund appends a line to."""
    path = tmp_path / "refunded.txt"
    path.touch()
    monkeypatch.setenv("TK_REFUNDED", str(path))
    return path


async def test_an_agent_asked_after_a_stop_elsewhere_flagged_the_asking_turn_is_refused(
    db: DB, refunded: Path
) -> None:
    """Runtime `here` drives the front desk; the moment its first tool runs, runtime
    `elsewhere` (another process, in effect) presses Stop, which only flags the turn (its
    lease is live, renewed every 10 s). The front desk then asks the refunds agent: the
    ask is refused, so no refund runs, and neither a turn nor a session is left of it.
    (`here` does not listen for Stops, as behind a pooler that relays no notifications:
    a process that listens would stop the turn before it asks.)"""
    url, schema = db
    reached, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def look_up(order_id: str) -> str:
        """Look an order up."""
        reached.set()
        await stopped.wait()
        return f"order {order_id}: paid"

    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("instant_refund", order_id="A1")),
            ModelStep.text_reply("Refunded A1."),
        ]),
        tools=[instant_refund],
    )  # fmt: skip
    desk = Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("look_up", order_id="A1")),
            ModelStep.tool_call_reply(call("refunds", message="Refund order A1")),
            ModelStep.text_reply("Done."),
        ]),
        tools=[look_up, refunds.as_tool()],
    )  # fmt: skip
    config = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=30.0)
    deaf = dataclasses.replace(config, listen_for_stops=False)
    async with (
        SessionRuntime(agent=desk, config=deaf) as here,
        SessionRuntime(agent=desk, config=config) as elsewhere,
    ):
        asking = asyncio.create_task(collect_events(here.execute_message("s1", "refund A1")))
        async with asyncio.timeout(10):
            await reached.wait()

        [record] = await elsewhere.store.list_turns(SessionId("s1"))
        assert await elsewhere.cancel(record.turn_id) == "running"  # flagged only
        stopped.set()
        async with asyncio.timeout(20):
            events = await asking
        delegated = await here.store.delegated_sessions(SessionId("s1"))
        asked = [t for sub in delegated for t in await here.store.list_turns(sub)]

    assert await asyncio.to_thread(refunded.read_text) == ""  # the refund never ran
    assert asked == []  # never submitted
    assert delegated == []  # ... and no empty session left of the ask
    done = [e for e in events if isinstance(e, ToolCompletedEvent | ToolFailedEvent)]
    [failed] = [e for e in done if isinstance(e, ToolFailedEvent)]
    assert "was stopped" in failed.result.model_dump_json(), failed


@pytest.mark.parametrize("claimed", [False, True])
async def test_a_turn_asked_by_a_turn_flagged_for_stop_is_refused(
    store: SqlStore, claimed: bool
) -> None:
    """The Store's rule: a Stop pending for the asking turn (flagged for its live driver)
    refuses the asked turn's submit as an ended asking turn does; nothing is written."""
    asking = await store.submit(
        new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
    )
    assert await store.cancel(asking.turn_id) == "running"
    claim = ClaimRequest(owner="w", ttl_s=60, max_attempts=3) if claimed else None
    with pytest.raises(AskingTurnEndedError) as refused:
        await store.submit(
            new_input(
                "tk-sub.1",
                agent="refunds",
                request_id="delegated",
                asked_by=asking.turn_id,
                claim_for=claim,
            )
        )
    assert refused.value.details["turn_id"] == asking.turn_id
    assert await store.list_turns(SessionId("tk-sub.1")) == []
    assert await store.get_session(SessionId("tk-sub.1")) is None


async def test_a_turn_asked_by_a_live_unflagged_turn_is_submitted(
    store: SqlStore, clock: FakeClock
) -> None:
    """Only a pending Stop refuses: a live asking turn nobody stopped asks as before."""
    asking = await store.submit(
        new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
    )
    asked = await store.submit(
        new_input("tk-sub.1", agent="refunds", request_id="delegated", asked_by=asking.turn_id)
    )
    assert asked.is_new


@pytest.mark.parametrize("how", ["stopped", "flagged"])
async def test_a_refused_ask_deletes_the_empty_session_it_opened(
    store: SqlStore, clock: FakeClock, how: str
) -> None:
    """The asked agent's session is opened before its message is submitted (admission and
    tool access read it); a refused submit deletes it again, and only it: a session of the
    same asking session that took a message stays."""
    asking = await store.submit(
        new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
    )
    for sub in ("tk-sub.0", "tk-sub.1"):
        await store.create_session(SessionId(sub), parent=SessionId("s1"))
    answered = await store.submit(
        new_input("tk-sub.0", agent="refunds", request_id="delegated", asked_by=asking.turn_id)
    )
    if how == "stopped":
        clock.advance(61)  # its driver's lease lapsed: the Stop ends it in the Store
        assert await store.cancel(asking.turn_id) == "cancelled"
    else:
        assert await store.cancel(asking.turn_id) == "running"
    with pytest.raises(AskingTurnEndedError) as refused:
        await store.submit(
            new_input("tk-sub.1", agent="refunds", request_id="delegated", asked_by=asking.turn_id)
        )
    assert refused.value.details["stop_pending"] is (how == "flagged")
    assert await store.get_session(SessionId("tk-sub.1")) is None
    assert await store.delegated_sessions(SessionId("s1")) == [answered.session_id]


async def test_a_refused_ask_leaves_a_session_it_did_not_open_for_that_turn(
    store: SqlStore,
) -> None:
    """A session of another parent (or none) under the refused ask's id is left alone."""
    asking = await store.submit(new_input("s1"))
    await store.create_session(SessionId("tk-sub.1"), parent=SessionId("s2"))
    await store.create_session(SessionId("tk-sub.2"))
    assert await store.cancel(asking.turn_id) == "cancelled"
    for sub in ("tk-sub.1", "tk-sub.2"):
        with pytest.raises(AskingTurnEndedError):
            await store.submit(
                new_input(sub, agent="refunds", request_id="delegated", asked_by=asking.turn_id)
            )
        assert await store.get_session(SessionId(sub)) is not None


async def _blocked_by(watcher: Any, pid: int) -> int:
    """The server process that waits for a lock `pid` holds (polled until there is one)."""
    async with asyncio.timeout(10):
        while True:
            waiting = await watcher.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid
            )
            if waiting is not None:
                return int(waiting)
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("one_statement_submit", [True, False])
async def test_a_stop_flagging_while_the_asked_submit_holds_the_row_flags_the_asked_turn(
    pg_schema: str, clock: FakeClock, one_statement_submit: bool
) -> None:
    """PostgreSQL: the asked turn's submit holds the asking turn's row when a Stop from
    another process flags that turn; the Stop waits for the row, and once the submit
    commits it flags the new asked turn with the asking one (none left to run on)."""
    import asyncpg

    from tests.conftest import POSTGRES_URL

    async with (
        SqlStore.from_url(POSTGRES_URL, clock=clock, schema=pg_schema) as store,
        SqlStore.from_url(POSTGRES_URL, clock=clock, schema=pg_schema) as elsewhere,
    ):
        asking = await store.submit(
            new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
        )
        sub = SessionId("tk-sub.1")
        await store.create_session(sub, parent=SessionId("s1"))
        blocker = await asyncpg.connect(POSTGRES_URL)
        watcher = await asyncpg.connect(POSTGRES_URL)
        try:
            held = blocker.transaction()
            await held.start()
            await blocker.execute(
                f'SELECT FROM "{pg_schema}".tk_sessions WHERE session_id = $1 FOR UPDATE', sub
            )
            submitting = asyncio.create_task(
                store.submit(
                    new_input(
                        sub,
                        agent="refunds",
                        request_id="delegated",
                        asked_by=asking.turn_id,
                        create_session=one_statement_submit,
                        claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3),
                    )
                )
            )
            submitter = await _blocked_by(watcher, blocker.get_server_pid())
            stopping = asyncio.create_task(elsewhere.cancel(asking.turn_id))
            await _blocked_by(watcher, submitter)  # the Stop waits for the asking row
            await held.rollback()
            asked = await submitting
            assert await stopping == "running"
            flagged = await watcher.fetchval(
                f'SELECT cancel_requested FROM "{pg_schema}".tk_turns WHERE turn_id = $1',
                asked.turn_id,
            )
        finally:
            await blocker.close()
            await watcher.close()
    assert flagged is True
