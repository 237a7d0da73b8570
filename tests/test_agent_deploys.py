"""A deploy that changes an agent: what happens to the turns pinned to its old version.

Two runtimes on one database stand for the old and the new deploy. A turn that had not
started (queued behind another turn of its session, or never claimed) is re-pinned to the
agent's current version when the new process takes it, after the checks that depend on the
agent ran again; a turn that started keeps its version and ends `agent-not-found` unless
the old version is still hosted.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Collection

import pytest

from tests.support.agents_host import RuleModel, build_deps, default, secret_report, special, whoami
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.cli._inspect import session_turns
from turnkit.errors import StaleEpochError
from turnkit.events import (
    ApprovalRequestedEvent,
    ErrorEvent,
    MessageCompleteEvent,
    StepStartEvent,
)
from turnkit.ids import SessionId
from turnkit.runtime.agents import ToolAccessRequest
from turnkit.runtime.worker import Worker
from turnkit.store import SqlStore, TurnRecord
from turnkit.tenancy import Department, Organisation

DB = tuple[str, str | None]
EDITED = "You are the special agent, now with a better prompt."


@tool
async def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: found"


def _host(db: DB, agent: Agent | None = None, **kw: object) -> SessionRuntime:
    url, schema = db
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        run_in_process=bool(kw.pop("run_in_process", False)),
        lease_ttl_s=2,
    )
    return SessionRuntime(
        agent=default(),
        agents=[agent or special()],
        deps=build_deps,
        config=config,
        **kw,  # type: ignore[arg-type]
    )


async def _work_until(runtime: SessionRuntime, turn_id: str, *settled: str) -> TurnRecord:
    """Drive turns with a worker of `runtime` until `turn_id` is in one of `settled`."""
    stop = asyncio.Event()
    worker = Worker(runtime, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
    running = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 20
        while (record := await runtime.turn(turn_id)).status not in settled:
            assert time.monotonic() < deadline, f"turn stayed {record.status}"
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await running
    return record


async def _answer(runtime: SessionRuntime, turn_id: str) -> str:
    answers = [
        e.block.text
        async for e in runtime.events(turn_id)
        if isinstance(e, MessageCompleteEvent) and e.block.is_answer
    ]
    return str(answers[-1])


async def _repins(runtime: SessionRuntime, turn_id: str) -> list[tuple[str, str, str]]:
    rows = await runtime.audit(turn_id)
    return [
        (p.agent, p.from_version, p.to_version)
        for p in (row.payloads.agent_repinned for row in rows)
        if p is not None
    ]


async def test_a_turn_never_claimed_before_a_deploy_runs_on_the_new_version(db: DB) -> None:
    old = special()
    async with _host(db, old) as api:  # the old deploy: it only submits (a worker drives)
        submission = await api.start("s1", "who am I?", agent="special", principal="grace")
    new = special(instructions=EDITED)
    assert new.version != old.version
    async with _host(db, new) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
        assert (record.status, record.error_code) == ("succeeded", None)
        assert record.pinned["agent_version"] == new.version
        assert record.pinned["repinned_from"] == old.version
        assert (
            await _answer(deployed, submission.turn_id) == "special-model: grace at tenant-of-grace"
        )
        assert await _repins(deployed, submission.turn_id) == [
            ("special", old.version, new.version)
        ]
        model = new.model
        assert isinstance(model, RuleModel)
        assert all(EDITED in str(r.messages[0].content) for r in model.requests)
        listing = io.StringIO()  # what `turnkit turns --session s1` prints
        assert isinstance(deployed.store, SqlStore)
        await session_turns(deployed.store, listing, SessionId("s1"))
        assert f"re-pinned from version {old.version} to {new.version}" in listing.getvalue()


async def test_a_turn_queued_behind_a_paused_one_is_repinned_and_the_paused_one_is_not(
    db: DB,
) -> None:
    old = special(approval="always")
    async with _host(db, old, run_in_process=True) as api:
        events = [e async for e in api.execute_message("s1", "who am I?", agent="special")]
        paused = events[-1]
        assert isinstance(paused, ApprovalRequestedEvent)
        queued = await api.submit("s1", "and now?", agent="special")  # waits behind it
    new = special(approval="always", instructions=EDITED)
    async with _host(db, new, run_in_process=True) as deployed:
        await deployed.resume(paused.turn_id, paused.request_id, Approve())
        first = await _work_until(deployed, paused.turn_id, "succeeded", "failed")
        # The paused turn had run: it keeps its version, gone from this host.
        assert (first.status, first.error_code) == ("failed", "agent-not-found")
        assert first.pinned["agent_version"] == old.version
        assert await _repins(deployed, paused.turn_id) == []
        # The queued one had done nothing: it runs on the new version (and asks first).
        second = await _work_until(deployed, queued.turn_id, "awaiting_approval", "failed")
        assert second.status == "awaiting_approval", second.error_code
        assert second.pinned["agent_version"] == new.version
        assert await _repins(deployed, queued.turn_id) == [("special", old.version, new.version)]
        [card] = await deployed.pending("s1")
        await deployed.resume(queued.turn_id, card.request_id, Approve())
        done = await _work_until(deployed, queued.turn_id, "succeeded", "failed")
        assert done.status == "succeeded"


async def test_a_refusing_check_ends_the_repinned_turn_with_its_own_code(db: DB) -> None:
    """The new version's model is blocked for the caller's department: `model-not-allowed`."""
    async with _host(db) as api:
        submission = await api.start("s1", "who am I?", agent="special")
    blocked = Organisation(
        name="default", departments=(Department(name="general", blocked_models=frozenset({"m2"})),)
    )
    new = special(model=RuleModel("m2"))
    async with _host(db, new, tenancy=[blocked]) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
        [error] = [e async for e in deployed.events(record.turn_id) if isinstance(e, ErrorEvent)]
    assert (record.status, record.error_code) == ("failed", "model-not-allowed")
    assert "'m2'" in error.message
    assert f"version {new.version} was checked instead" in error.message
    assert record.pinned["agent_version"] == special().version  # not re-pinned


async def test_a_repinned_turn_is_visible_only_as_its_caller_may_see_the_new_version(
    db: DB,
) -> None:
    async with _host(db) as api:
        submission = await api.start("s1", "who am I?", agent="special", principal="ada")
    new = special(visibility="private", owner="grace")  # no longer Ada's to use
    async with _host(db, new) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
        assert (record.status, record.error_code) == ("failed", "agent-not-found")
        assert record.pinned["agent_version"] != new.version


async def test_a_repinned_turn_gets_the_tools_its_caller_may_use_of_the_new_version(
    db: DB,
) -> None:
    def access(request: ToolAccessRequest) -> Collection[str]:
        return {"whoami", "lookup"}  # never secret_report

    async with _host(db, tool_access=access) as api:
        submission = await api.start("s1", "who am I?", agent="special", principal="ada")
        assert (await api.turn(submission.turn_id)).pinned["tools"] == ["whoami"]
    new = special(tools=[whoami, secret_report, lookup])
    async with _host(db, new, tool_access=access) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
    assert record.status == "succeeded"
    assert record.pinned["tools"] == ["whoami", "lookup"]


async def test_a_claim_that_died_before_doing_anything_is_repinned_too(db: DB) -> None:
    """A process that claimed the turn and crashed before its first commit did nothing."""
    async with _host(db) as api:
        submission = await api.start("s1", "who am I?", agent="special")
        lease = await api.store.claim(
            "gone", ttl_s=0.05, max_attempts=3, turn_id=submission.turn_id
        )
        assert lease is not None
    await asyncio.sleep(0.1)  # its lease lapses
    new = special(instructions=EDITED)
    async with _host(db, new) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
    assert (record.status, record.attempts) == ("succeeded", 2)
    assert record.pinned["agent_version"] == new.version


@pytest.mark.parametrize("keep_old", [False, True])
async def test_a_turn_that_started_keeps_its_version_after_a_crash(db: DB, keep_old: bool) -> None:
    """Taken over after its driver died mid-turn: `agent-not-found`, unless the new process
    still hosts the old version (added before the new one, which stays the current)."""
    old = special()
    async with _host(db, old) as api:
        submission = await api.start("s1", "who am I?", agent="special")
        lease = await api.store.claim(
            "gone", ttl_s=0.05, max_attempts=3, turn_id=submission.turn_id
        )
        assert lease is not None
        step = StepStartEvent(
            session_id=submission.session_id,
            turn_id=submission.turn_id,
            stage_id="tool-loop",
            ts=api.clock.now(),
            seq=2,
            step="tool-loop",
        )
        await api.store.commit(submission.turn_id, epoch=lease.epoch, events=[step])
    await asyncio.sleep(0.1)
    new = special(instructions=EDITED)
    deployed = _host(db, new)
    if keep_old:
        deployed.agents.add(old)
        deployed.agents.add(new)  # the last added is the current version
    async with deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
        assert await _repins(deployed, submission.turn_id) == []
    assert record.pinned["agent_version"] == old.version
    if keep_old:
        assert (record.status, record.error_code) == ("succeeded", None)
    else:
        assert (record.status, record.error_code) == ("failed", "agent-not-found")


async def test_a_turn_handed_over_by_a_draining_process_keeps_its_version(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TK_TOOL_SLEEP", "30")  # the turn is inside its tool call
    async with _host(db, run_in_process=True) as api:
        submission = await api.start("s1", "who am I?", agent="special")
        deadline = time.monotonic() + 10
        while (await api.turn(submission.turn_id)).last_seq < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    # closing handed the lease over
    monkeypatch.setenv("TK_TOOL_SLEEP", "0")
    async with _host(db, special(instructions=EDITED)) as deployed:
        record = await _work_until(deployed, submission.turn_id, "succeeded", "failed")
    assert (record.status, record.error_code) == ("failed", "agent-not-found")


async def test_only_the_lease_holder_repins_and_only_before_the_turn_wrote_anything(
    db: DB,
) -> None:
    """Two claimers: the one whose lease lapsed cannot re-pin; nor can anyone once the
    turn's log holds more than its `turn.started`."""
    async with _host(db) as api:
        submission = await api.start("s1", "who am I?", agent="special")
        turn_id = submission.turn_id
        first = await api.store.claim("one", ttl_s=0.05, max_attempts=3, turn_id=turn_id)
        assert first is not None
        await asyncio.sleep(0.1)
        second = await api.store.claim("two", ttl_s=30, max_attempts=3, turn_id=turn_id)
        assert second is not None
        pinned = dict((await api.turn(turn_id)).pinned)
        with pytest.raises(StaleEpochError):
            await api.store.repin(first, pinned=pinned | {"agent_version": "stale"}, model="m")
        await api.store.repin(second, pinned=pinned | {"agent_version": "new"}, model="m2")
        record = await api.turn(turn_id)
        assert (record.pinned["agent_version"], record.model) == ("new", "m2")
        step = StepStartEvent(
            session_id=submission.session_id,
            turn_id=turn_id,
            stage_id="tool-loop",
            ts=api.clock.now(),
            seq=2,
            step="tool-loop",
        )
        await api.store.commit(turn_id, epoch=second.epoch, events=[step])
        with pytest.raises(StaleEpochError):
            await api.store.repin(second, pinned=pinned | {"agent_version": "late"}, model="m")
        assert (await api.turn(turn_id)).pinned["agent_version"] == "new"


async def test_an_attempt_that_died_after_the_repin_leaves_its_audit_row_to_the_next(
    db: DB,
) -> None:
    """The new pin and its `agentRepinned` row are two commits: an attempt that died
    between them left a turn pinned anew whose audit says nothing of it. The attempt that
    takes it over, before anything else of the turn is written, writes the row (once)."""
    from turnkit.runtime._runner import Pinned

    old = special()
    async with _host(db, old) as api:
        submission = await api.start("s1", "who am I?", agent="special")
    new = special(instructions=EDITED)
    async with _host(db, new) as deployed:
        turn_id = submission.turn_id
        lease = await deployed.store.claim("gone", ttl_s=0.05, max_attempts=3, turn_id=turn_id)
        assert lease is not None
        record = await deployed.turn(turn_id)
        repinned = await deployed.runner()._repin(record, Pinned.of(record), lease)
        assert repinned is not None  # pinned anew; the attempt dies before its audit row
        assert (await deployed.turn(turn_id)).pinned["repinned_from"] == old.version
        await asyncio.sleep(0.1)  # its lease lapses
        record = await _work_until(deployed, turn_id, "succeeded", "failed")
        assert (record.status, record.attempts) == ("succeeded", 2)
        assert await _repins(deployed, turn_id) == [("special", old.version, new.version)]
