"""A turn is asked only by an asking turn that has not ended; a Stop reaches it at once.

An asking turn's driver may stall between deciding to ask and submitting the asked turn
(its lease lost, a Stop written by another process meanwhile). Its submit then finds the
asking turn ended and is refused, with nothing written: no asked turn runs for a
conversation that ended. And a Stop of an asking turn no live driver holds stops a turn
it asked that a driver in the Stop's own process holds at once, not at that driver's next
lease renewal.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import new_input
from tests.support.asked_working import answering, front_desk
from turnkit import SessionRuntime
from turnkit.config import RuntimeConfig
from turnkit.errors import AskingTurnEndedError
from turnkit.events import ToolFailedEvent
from turnkit.ids import SessionId
from turnkit.states import TERMINAL_STATES
from turnkit.store import ClaimRequest, NewInput
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock, ModelStep, ScriptedModel, collect_events

DB = tuple[str, str | None]


@pytest.fixture
def refunded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every refund appends a line to."""
    path = tmp_path / "refunded.txt"
    path.touch()
    monkeypatch.setenv("TK_REFUNDED", str(path))
    return path


@pytest.mark.parametrize("claimed", [False, True])
@pytest.mark.parametrize("ending", ["stopped", "failed", "succeeded"])
async def test_a_turn_asked_after_its_asking_turn_ended_is_refused(
    store: SqlStore, clock: FakeClock, ending: str, claimed: bool
) -> None:
    """Whatever ended the asking turn (a Stop, its driver's failure or success), a submit
    that names it afterwards writes nothing: no session, no message, no turn."""
    asking = await store.submit(
        new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
    )
    assert asking.lease is not None
    if ending == "stopped":
        clock.advance(61)  # its driver's lease lapsed: the Stop ends it in the Store
        assert await store.cancel(asking.turn_id) == "cancelled"
    else:
        await store.commit(
            asking.turn_id,
            epoch=asking.lease.epoch,
            status=ending,  # type: ignore[arg-type]
            error_code="boom" if ending == "failed" else None,
            release=True,
        )
    claim = ClaimRequest(owner="stalled", ttl_s=60, max_attempts=3) if claimed else None
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


async def test_a_turn_asked_by_a_paused_asking_turn_is_submitted(
    store: SqlStore,
) -> None:
    """Unfinished is enough: an asking turn waiting to be claimed (or paused) may ask."""
    asking = await store.submit(new_input("s1"))
    asked = await store.submit(new_input("tk-sub.1", agent="refunds", asked_by=asking.turn_id))
    assert asked.is_new


async def test_a_stalled_driver_whose_turn_was_stopped_asks_nobody(db: DB, refunded: Path) -> None:
    """The asking turn's driver stalls just before it submits the asked turn, and its turn
    is stopped meanwhile (its lease counted lost, as after a pause past its ttl): the
    submit is refused, the asked agent never runs, so the refund it would make never
    happens, and the session the ask opened is deleted."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    async with SessionRuntime(agent=front_desk(answering()), config=config) as runtime:
        submit = runtime.store.submit

        async def stalled(new: NewInput) -> Any:
            if new.asked_by is not None:  # meanwhile, another process stops the turn
                stopped = await runtime.store.cancel(new.asked_by, stopped_owner=runtime.host.owner)
                assert stopped == "cancelled"
            return await submit(new)

        runtime.store.submit = stalled  # type: ignore[method-assign]
        async with asyncio.timeout(20):
            events = await collect_events(runtime.execute_message("s1", "refund A1"))
        delegated = await runtime.store.delegated_sessions(SessionId("s1"))
        asked = [t for sub in delegated for t in await runtime.store.list_turns(sub)]
    assert await asyncio.to_thread(refunded.read_text) == ""  # the refund never ran
    assert asked == []  # never submitted
    assert delegated == []  # ... and the session the ask opened went with its refusal
    failed = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert all("ended" in e.result.model_dump_json() for e in failed), failed


async def test_a_stop_of_an_asking_turn_nobody_drives_stops_its_asked_turn_here_at_once(
    db: DB,
) -> None:
    """The asking turn's driver died (its lease lapsed); the turn it asked is driven in
    this process, its lease renewed only every 10 s. A Stop of the asking turn here ends
    the asked turn at once, its model call aborted, not at that driver's next renewal."""
    url, schema = db
    hanging = ScriptedModel([ModelStep.hang("Looking the order up")])
    desk = front_desk(hanging)
    [refunds_tool] = desk.tools
    config = RuntimeConfig(
        database_url=url, database_schema=schema, run_in_process=False, lease_ttl_s=30.0
    )
    async with SessionRuntime(agent=desk, config=config) as runtime:
        asking = await runtime.submit("s1", "refund A1")
        lease = await runtime.store.claim("died", ttl_s=0.2, max_attempts=3, turn_id=asking.turn_id)
        assert lease is not None
        refunds = refunds_tool.agent  # type: ignore[attr-defined]
        asked = await runtime._submit(
            "tk-sub.0123456789abcdef0123456789abcdef",
            "Refund order A1",
            agent=refunds,
            request_id="delegated",
            principal=None,
            claim=False,
            asked_by=asking.turn_id,
        )
        runtime.host.detach(asked.turn_id, agent=refunds)
        async with asyncio.timeout(10):
            while not hanging.calls:  # the asked agent's model call is under way here
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the dead driver's lease on the asking turn lapsed
        started = time.monotonic()
        assert await runtime.cancel(asking.turn_id) == "cancelled"
        status = (await runtime.turn(asked.turn_id)).status
        while status not in TERMINAL_STATES and time.monotonic() - started < 5:
            await asyncio.sleep(0.05)
            status = (await runtime.turn(asked.turn_id)).status
        took = time.monotonic() - started
    assert status == "cancelled"
    assert took < 2.0, f"the asked turn stopped only after {took:.1f} s"
    assert hanging.aborted == 1


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
async def test_an_asked_turn_committed_while_the_one_statement_ending_waited_is_stopped(
    pg_schema: str, clock: FakeClock, one_statement_submit: bool
) -> None:
    """PostgreSQL: the asked turn's submit (its one statement, or the full transaction)
    holds the asking turn's row when the driver's one-statement ending (a failure) starts;
    that ending's snapshot has no asked turn, and it waits for the row. Once the submit
    commits, the ending must not go through on that snapshot: it is left to the full
    transaction, which stops the asked turn, so none is left running for a conversation
    that ended."""
    import asyncpg

    from tests.conftest import POSTGRES_URL

    async with (
        SqlStore.from_url(POSTGRES_URL, clock=clock, schema=pg_schema) as store,
        SqlStore.from_url(POSTGRES_URL, clock=clock, schema=pg_schema) as elsewhere,
    ):
        asking = await store.submit(
            new_input("s1", claim_for=ClaimRequest(owner="w", ttl_s=60, max_attempts=3))
        )
        assert asking.lease is not None
        sub = SessionId("tk-sub.1")
        await store.create_session(sub, parent=SessionId("s1"))
        blocker = await asyncpg.connect(POSTGRES_URL)
        watcher = await asyncpg.connect(POSTGRES_URL)  # outside a transaction: fresh views
        try:
            # The submit (a stalled driver's) will wait on its session's row, after it
            # took the asking turn's; the driver that took the turn over ends it meanwhile.
            held = blocker.transaction()
            await held.start()
            await blocker.execute(
                f'SELECT FROM "{pg_schema}".tk_sessions WHERE session_id = $1 FOR UPDATE', sub
            )
            asked_new = new_input(
                sub,
                agent="refunds",
                request_id="delegated",
                asked_by=asking.turn_id,
                create_session=one_statement_submit,  # False: the full transaction
            )
            submitting = asyncio.create_task(store.submit(asked_new))
            submitter = await _blocked_by(watcher, blocker.get_server_pid())
            ending = asyncio.create_task(
                elsewhere.commit(
                    asking.turn_id,
                    epoch=asking.lease.epoch,
                    status="failed",
                    error_code="boom",
                    release=True,
                )
            )
            await _blocked_by(watcher, submitter)  # the ending waits for the asking row
            await held.rollback()
            asked = await submitting
            result = await ending
        finally:
            await blocker.close()
            await watcher.close()
        record = await store.get_turn(asked.turn_id)
    assert record is not None
    assert result.stopped_asked == (asked.turn_id,)
    assert record.status == "cancelled"
