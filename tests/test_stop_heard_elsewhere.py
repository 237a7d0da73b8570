"""A Stop pressed in one process stops a turn another process drives at once (PostgreSQL).

The Stop flags the turn for its live driver and, on PostgreSQL, announces it as it commits
(`NOTIFY turnkit_stop`); the process driving the turn hears it and renews the turn's lease
at once, which tells it of the Stop. With a 60 s lease (renewed every 20 s) a driver that
learned of it only at its renewal could not stop within the tests' 10 s bounds: the model
would stream on and the tool it calls would run. SQLite has no notifications: there the
driver learns of it at its next renewal. Two runtimes on one database stand for two
processes: each has its Store, its connections and its listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.conftest import POSTGRES_URL
from tests.helpers import GatedModel, new_input, until
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.ids import SessionId, TurnId
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.runtime._lease_keeper import LeaseKeeper
from turnkit.runtime.worker import Worker
from turnkit.store import ClaimRequest, _listen_pg
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel, call

_SLOW_CHUNKS = 60
"""The first call streams this many pieces of text, 50 ms apart (3 s), then calls a tool."""


class SlowModel:
    """Streams its first answer slowly before it calls `refund`; says whether it was cut."""

    def __init__(self) -> None:
        self.inner = ScriptedModel(
            [ModelStep.tool_call_reply(call("refund", order_id="A1")), ModelStep.text_reply("ok")]
        )
        self.streamed = 0
        self.cut = False
        """A call's stream was closed before it finished."""

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def provider(self) -> str:
        return self.inner.provider

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        finished = False
        try:
            if not self.inner.calls:
                for _ in range(_SLOW_CHUNKS):
                    await asyncio.sleep(0.05)
                    self.streamed += 1
                    yield TextDelta("x")
            async for chunk in self.inner.stream(request):
                yield chunk
            finished = True
        finally:
            self.cut |= not finished


def _agent(model: SlowModel, refunds: list[str], name: str = "assistant") -> Agent:
    @tool
    async def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"refunded {order_id}"

    return Agent(name=name, model=model, tools=[refund])


def _config(schema: str, **kwargs: Any) -> RuntimeConfig:
    return RuntimeConfig(
        database_url=POSTGRES_URL, database_schema=schema, **{"lease_ttl_s": 60.0, **kwargs}
    )


@contextlib.asynccontextmanager
async def _worker(runtime: SessionRuntime) -> AsyncIterator[Worker]:
    stop = asyncio.Event()
    worker = Worker(runtime, concurrency=1, poll_interval_s=0.05, sweep_interval_s=3600)
    running = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await running


@pytest.mark.parametrize("driver", ["runtime", "worker"])
async def test_a_stop_from_another_process_stops_a_streaming_turn_at_once(
    pg_schema: str, driver: str
) -> None:
    """The turn is driven by a runtime (started there) or by a worker; another runtime
    presses Stop while the model streams. The turn ends `cancelled` long before a renewal
    would have told its driver, the model's stream is closed, and the tool it was about
    to call never starts."""
    model, refunds = SlowModel(), []
    agent = _agent(model, refunds)
    async with contextlib.AsyncExitStack() as stack:
        if driver == "runtime":
            here = await stack.enter_async_context(
                SessionRuntime(agent=agent, config=_config(pg_schema))
            )
        else:
            here = await stack.enter_async_context(
                SessionRuntime(agent=agent, config=_config(pg_schema, run_in_process=False))
            )
            await stack.enter_async_context(_worker(here))
        elsewhere = await stack.enter_async_context(
            SessionRuntime(agent=agent, config=_config(pg_schema, run_in_process=False))
        )
        submission = await (here if driver == "runtime" else elsewhere).start("s1", "refund A1")
        await until(lambda: model.streamed >= 1, "the model streams")

        assert await elsewhere.cancel(submission.turn_id) == "running"  # flagged for its driver

        async def cancelled() -> bool:
            return (await elsewhere.turn(submission.turn_id)).status == "cancelled"

        await until(cancelled, "the driver hears the Stop and ends the turn")
        assert model.cut  # the model's stream was closed mid-answer
        assert model.streamed < _SLOW_CHUNKS
        assert refunds == []  # the tool never started


async def test_a_process_that_does_not_listen_for_stops_opens_no_listening_connection(
    pg_schema: str, sent: list[str]
) -> None:
    """`listen_for_stops=False` (behind a pooler that relays no notifications): a turn
    runs to its end with no `LISTEN` sent; by default the process listens, and a turn
    that nobody stops sends no notification of a Stop."""
    for listen in (False, True):
        model, refunds = SlowModel(), []
        config = _config(pg_schema, listen_for_stops=listen, lease_ttl_s=1.5)
        sent.clear()
        async with SessionRuntime(agent=_agent(model, refunds), config=config) as runtime:
            submission = await runtime.start("s1" if listen else "s0", "refund A1")

            async def succeeded(turn_id: str = submission.turn_id) -> bool:
                return (await runtime.turn(turn_id)).status == "succeeded"

            await until(succeeded, "the turn runs to its end")
        listens = [q for q in sent if q.startswith("LISTEN")]
        assert listens == (['LISTEN "turnkit_work"', 'LISTEN "turnkit_stop"'] if listen else [])
        assert not [q for q in sent if "pg_notify('turnkit_stop'" in q]
        assert refunds == ["A1"]


async def test_a_stop_from_another_process_stops_the_agent_a_turn_asked_at_once(
    pg_schema: str,
) -> None:
    """The front desk asks the refunds agent (as a tool), whose model streams slowly; a
    Stop of the front desk's turn pressed in another process stops both turns at once,
    and the refund the asked agent was about to make never starts."""
    model, refunds = SlowModel(), []
    asked_agent = _agent(model, refunds, "refunds")
    desk = Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refunds", message="Refund order A1")),
            ModelStep.text_reply("Done."),
        ]),
        tools=[asked_agent.as_tool()],
    )  # fmt: skip
    async with (
        SessionRuntime(agents=[desk, asked_agent], config=_config(pg_schema)) as here,
        SessionRuntime(
            agents=[desk, asked_agent], config=_config(pg_schema, run_in_process=False)
        ) as elsewhere,
    ):
        submission = await here.start("s1", "refund A1")
        await until(lambda: model.streamed >= 1, "the asked agent's model streams")
        [delegated] = await elsewhere.store.delegated_sessions(SessionId("s1"))
        [asked] = await elsewhere.store.list_turns(delegated)

        assert await elsewhere.cancel(submission.turn_id) == "running"

        async def both_cancelled() -> bool:
            statuses = {
                (await elsewhere.turn(t)).status for t in (submission.turn_id, asked.turn_id)
            }
            return statuses == {"cancelled"}

        await until(both_cancelled, "both drivers hear the Stop and end their turns")
        assert model.cut
        assert refunds == []


@pytest.mark.parametrize("how", ["flagged", "asker-ended"])
async def test_a_stop_announces_each_turn_it_flags_to_the_process_that_drives_it(
    pg_schema: str, how: str
) -> None:
    """The Store's side: a Stop that flags a turn for its live driver sets that turn's
    `stop_signal` in another process, and so does a Stop that flags the turn it asked
    with it (`flagged`) or ends the asking turn at once and so stops the asked turn, which
    a live driver elsewhere holds (`asker-ended`: its own driver had stopped). A turn the
    Stop leaves alone is not signalled."""
    claim = ClaimRequest(owner="w1", ttl_s=60, max_attempts=3)
    async with (
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as stopping,
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as driving,
    ):
        asking = await stopping.submit(new_input("s1", claim_for=claim))
        asked = await stopping.submit(
            new_input(
                "tk-sub.1",
                agent="refunds",
                request_id="delegated",
                asked_by=asking.turn_id,
                claim_for=dataclasses.replace(claim, owner="w2"),
            )
        )
        other = await stopping.submit(new_input("s2", claim_for=claim))
        signals = {
            t: driving.stop_signal(t) for t in (asking.turn_id, asked.turn_id, other.turn_id)
        }
        assert await driving.work_signal() is not None  # listening (one connection for both)
        # Ended here (no live driver: its own had stopped): nothing to announce. Heard in
        # commit order, so once the Stop below is heard, this would have been too.
        assert await stopping.cancel(other.turn_id, stopped_owner="w1") == "cancelled"

        if how == "flagged":
            assert await stopping.cancel(asking.turn_id) == "running"
            heard = {asking.turn_id, asked.turn_id}
        else:
            assert await stopping.cancel(asking.turn_id, stopped_owner="w1") == "cancelled"
            heard = {asked.turn_id}
        await until(lambda: all(signals[t].is_set() for t in heard), "the driver hears")
        # The turns ended here were not announced (`other`'s ending was committed first)
        assert [t for t, signal in signals.items() if signal.is_set()] == [
            t for t in signals if t in heard
        ]


async def test_sqlite_hears_no_stop_its_renewals_tell(tmp_path: Path) -> None:
    """SQLite has no notifications: a driver learns of a Stop pressed elsewhere at its
    next renewal."""
    async with SqlStore.from_url(f"sqlite:///{tmp_path / 't.db'}") as store:
        submission = await store.submit(
            new_input("s1", claim_for=ClaimRequest(owner="w1", ttl_s=60, max_attempts=3))
        )
        assert store.stop_signal(submission.turn_id) is None
        assert submission.lease is not None
        assert await store.cancel(submission.turn_id) == "running"
        renewed = await store.renew(submission.lease, ttl_s=60)
        assert renewed.cancel_requested


@pytest.mark.parametrize(
    ("value", "listens"), [(None, True), ("", True), ("1", True), ("0", False), ("off", False)]
)
def test_the_quickstart_app_listens_for_stops_unless_told_not_to(
    value: str | None, listens: bool
) -> None:
    """`TURNKIT_LISTEN_FOR_STOPS=0` behind a pooler; unset or empty (compose passes an
    unset variable as empty) keeps the default."""
    from turnkit.quickstart import runtime_from_env

    env = {"TURNKIT_DATABASE_URL": "sqlite:///:memory:"}
    if value is not None:
        env["TURNKIT_LISTEN_FOR_STOPS"] = value
    assert runtime_from_env(env).config.listen_for_stops is listens


async def test_a_lost_listening_connection_is_opened_again_at_the_next_renewal(
    pg_schema: str,
) -> None:
    """The server closes the listening connection: the next renewal (which asks for the
    turn's `stop_signal` again) listens again and, since a Stop sent meanwhile went
    unheard, sets the signal once; a Stop after that is heard again."""
    claim = ClaimRequest(owner="w1", ttl_s=60, max_attempts=3)
    async with (
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as stopping,
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as driving,
    ):
        sub = await stopping.submit(new_input("s1", claim_for=claim))
        signal = driving.stop_signal(sub.turn_id)
        assert signal is not None
        assert await driving.work_signal() is not None  # listening
        listener = driving._listener  # its own connection: not other tests' listeners
        assert listener is not None
        pid = listener._conn.get_server_pid()
        admin = await asyncpg.connect(POSTGRES_URL)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()

        async def renewed_and_listening() -> bool:
            assert driving.stop_signal(sub.turn_id) is signal  # as each renewal asks
            return signal.is_set()

        await until(renewed_and_listening, "listening again, the driver renews once")
        signal.clear()
        assert await stopping.cancel(sub.turn_id) == "running"
        await until(signal.is_set, "the Stop is heard on the new connection")


@pytest.mark.parametrize(
    ("driver", "listening"), [("runtime", False), ("runtime", True), ("worker", True)]
)
async def test_a_stop_between_the_claim_and_the_keepers_first_wait_is_heard_at_once(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, driver: str, listening: bool
) -> None:
    """A Stop from another process commits after the turn's claim but before its lease
    keeper asks to hear Stops of it: its notification finds nobody waiting for that turn
    (`listening`: the process already listened, as a worker does, and drops it), or the
    process did not listen yet (its first turn: nobody heard it). The keeper still learns
    of it before its first renewal (20 s on with a 60 s lease): the turn ends `cancelled`
    within the test's 10 s bound, and the model, which answers only once its call is
    cut, never answers."""
    model = GatedModel()  # never opened: the turn runs until something stops it
    agent = Agent(name="assistant", model=model)
    entered, gate = asyncio.Event(), asyncio.Event()
    keep = LeaseKeeper.keep

    async def gated(self: LeaseKeeper, graph_task: asyncio.Task[object]) -> None:
        entered.set()
        await gate.wait()  # the window: claimed, not yet asking for the turn's Stop signal
        await keep(self, graph_task)

    monkeypatch.setattr(LeaseKeeper, "keep", gated)
    async with contextlib.AsyncExitStack() as stack:
        here = await stack.enter_async_context(
            SessionRuntime(
                agent=agent, config=_config(pg_schema, run_in_process=driver == "runtime")
            )
        )
        if driver == "worker":
            await stack.enter_async_context(_worker(here))
        elsewhere = await stack.enter_async_context(
            SessionRuntime(agent=agent, config=_config(pg_schema, run_in_process=False))
        )
        marker = asyncio.Event()
        if listening:
            marker = here.store.stop_signal(TurnId("marker")) or marker  # nobody drives it
            assert await here.store.work_signal() is not None
        else:  # nothing asked to listen yet
            assert here.store._listener is None  # type: ignore[attr-defined]
        submission = await (here if driver == "runtime" else elsewhere).start("s1", "hi")
        await until(entered.is_set, "the turn is claimed and its keeper starts")

        assert await elsewhere.cancel(submission.turn_id) == "running"  # flagged
        if listening:  # heard in commit order: once the marker is, the Stop was
            admin = await asyncpg.connect(POSTGRES_URL)
            try:
                await admin.execute("SELECT pg_notify('turnkit_stop', 'marker')")
            finally:
                await admin.close()
            await until(marker.is_set, "the Stop's notification reached this process")
        gate.set()

        async def cancelled() -> bool:
            return (await elsewhere.turn(submission.turn_id)).status == "cancelled"

        await until(cancelled, "the keeper learns of the Stop before its first renewal")
        assert model.calls == 1
        assert model.active == 0


async def test_a_stop_flagged_before_the_process_listened_is_heard_by_a_later_ask(
    pg_schema: str,
) -> None:
    """A turn is claimed and flagged by a Stop before the driving process listens (say
    while its listening connection opens); the driver asks for its `stop_signal` only once
    the process listens: the signal is set already. A turn nobody stopped is not; a turn
    heard stopped while nobody here asked for it is set when someone does."""
    claim = ClaimRequest(owner="w1", ttl_s=60, max_attempts=3)
    async with (
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as stopping,
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as driving,
    ):
        flagged = await stopping.submit(new_input("s1", claim_for=claim))
        quiet = await stopping.submit(new_input("s2", claim_for=claim))
        later = await stopping.submit(new_input("s3", claim_for=claim))
        assert await stopping.cancel(flagged.turn_id) == "running"
        assert await driving.work_signal() is not None  # listening from here on
        signal = driving.stop_signal(flagged.turn_id)
        assert signal is not None
        assert signal.is_set()
        marker = driving.stop_signal(TurnId("marker"))
        assert marker is not None
        assert await stopping.cancel(later.turn_id) == "running"
        admin = await asyncpg.connect(POSTGRES_URL)
        try:  # heard in commit order: once the marker is, the Stop was
            await admin.execute("SELECT pg_notify('turnkit_stop', 'marker')")
        finally:
            await admin.close()
        await until(marker.is_set, "the Stop's notification reached the driving store")
        later_signal = driving.stop_signal(later.turn_id)
        assert later_signal is not None
        assert later_signal.is_set()
        quiet_signal = driving.stop_signal(quiet.turn_id)
        assert quiet_signal is not None
        assert not quiet_signal.is_set()


async def test_a_refused_read_of_flagged_turns_leaves_the_listener_listening(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses the read of the turns already flagged for Stop as the listener
    opens (here a table it cannot find, as in a schema not migrated yet or for a role
    that may not read it): that is logged once, and the process listens all the same, so
    new turns and Stops are still heard as they are sent, not at the next poll or renewal."""
    monkeypatch.setattr(_listen_pg, "_FLAGGED", "SELECT turn_id FROM tk_no_such_table LIMIT $1")
    claim = ClaimRequest(owner="w1", ttl_s=60, max_attempts=3)
    async with (
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as stopping,
        SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as driving,
    ):
        assert await driving.work_signal() is not None  # listening
        driven = await stopping.submit(new_input("s1", claim_for=claim))
        signal = driving.stop_signal(driven.turn_id)
        assert signal is not None
        assert not signal.is_set()
        assert await stopping.cancel(driven.turn_id) == "running"  # flagged, announced
        await until(signal.is_set, "the Stop is heard as it is sent")
        listener = driving._listener  # type: ignore[attr-defined]
        await listener._conn.close()  # opened again at the next use: refused again
        await until(lambda: listener._conn is None, "the closed connection is let go")
        assert await driving.work_signal() is not None
    refused = [r for r in caplog.records if "flagged for Stop" in r.getMessage()]
    assert len(refused) == 1
    assert refused[0].levelname == "WARNING"


async def test_a_connection_lost_while_reading_flagged_turns_fails_the_connect(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends the listener's connection during that read (a restart: 57P01): not
    a refusal to log and listen past on a dead connection, but a connect that failed, so
    the process polls and connects again later."""
    ends_itself = "SELECT pg_terminate_backend(pg_backend_pid()) WHERE $1::int > 0"
    monkeypatch.setattr(_listen_pg, "_FLAGGED", ends_itself)
    async with SqlStore.from_url(POSTGRES_URL, schema=pg_schema) as driving:
        assert await driving.work_signal() is None  # polling: the connect failed
        assert driving._listener._conn is None  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if "flagged for Stop" in r.getMessage()]
