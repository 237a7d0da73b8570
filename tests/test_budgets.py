"""Budgets inside a turn: a call that would cross a limit does not start; the turn pauses.

`awaiting_budget` is a pause like an approval (durable event, no task, no lease). The same
turn resumes when an administrator raises the limit — here from another OS process — or
when the period rolls over; cancel works as for any pause. Two processes reserving against
one PostgreSQL limit at once cannot overspend it together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, RuntimeFactory, require_service
from tests.helpers import add
from tests.support import openai_server as fake_openai
from tests.support.openai_server import FakeOpenAIServer, Reply
from tests.support.retention import ShiftedClock
from turnkit import Agent, Approve, ModelFamily, RuntimeConfig, SessionRuntime, tool
from turnkit.budgets import BudgetLimit, BudgetSubject
from turnkit.clock import SystemClock
from turnkit.errors import InvalidInputError, ProviderError
from turnkit.events import (
    BudgetPausedEvent,
    DoneEvent,
    MessageCompleteEvent,
    StreamEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
)
from turnkit.ids import SessionId
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    Usage,
)
from turnkit.models._loader import load_litellm
from turnkit.models.litellm import LiteLLMClient
from turnkit.runtime.worker import Worker
from turnkit.stages._naming import NAMING_PROMPT
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

ROOT = Path(__file__).resolve().parents[1]
ANN = "ann"
openai_server = fake_openai.openai_server  # the fixture, visible to this module's tests


def _config(url: str, **overrides: object) -> RuntimeConfig:
    return RuntimeConfig(
        database_url=url,
        budgets="enforce",
        budget_reserve_tokens=50,
        **overrides,  # type: ignore[arg-type]
    )


def _spending_model() -> ScriptedModel:
    """A tool call that costs 700 tokens, then the answer."""
    first = dataclasses.replace(
        ModelStep.tool_call_reply(call("add", a=2, b=3)),
        usage=Usage(input_tokens=600, output_tokens=100, cost_usd=0.007),
    )
    return ScriptedModel([first, ModelStep.text_reply("It is 5.")])


def _limit(tokens: int, period: str = "month") -> BudgetLimit:
    return BudgetLimit(scope="principal", key=ANN, tokens=tokens, period=period)  # type: ignore[arg-type]


async def _paused_turn(runtime: SessionRuntime) -> list[StreamEvent]:
    """Run a turn whose second call does not fit an 800-token limit."""
    await runtime.set_budget_limit(_limit(800))
    events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
    assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]
    return events


async def _drive_to_done(runtime: SessionRuntime, turn_id: str) -> list[StreamEvent]:
    stop = asyncio.Event()
    working = asyncio.create_task(Worker(runtime, poll_interval_s=0.02).run(stop))
    try:
        async with asyncio.timeout(20):
            while (await runtime.turn(turn_id)).status == "running":
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await working
    return [e async for e in runtime.events(turn_id)]


async def test_a_call_that_would_cross_the_limit_pauses_and_resumes_in_another_process(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    model = _spending_model()
    async with SessionRuntime(
        agent=Agent(model=model, tools=[add]), config=_config(url, run_in_process=False)
    ) as runtime:
        events = await _paused_turn(runtime)
        paused = events[-1]
        assert isinstance(paused, BudgetPausedEvent)
        assert (paused.scope, paused.key, paused.period) == ("principal", ANN, "month")
        assert "700 of 800 tokens" in paused.reason
        # The tool call ran; the call after it never started.
        assert [e.result.output for e in events if isinstance(e, ToolCompletedEvent)] == [5]
        assert len(model.calls) == 1
        record = await runtime.turn(paused.turn_id)
        assert record.status == "awaiting_budget"
        assert record.lease_owner is None  # a pause holds no process
        with pytest.raises(InvalidInputError, match="resumes by itself"):
            await runtime.resume(paused.turn_id, paused.request_id, None)  # type: ignore[arg-type]
        assert await runtime.resume_budget_pauses() == []  # nothing changed: still short

        # An administrator raises the limit from another process.
        script = textwrap.dedent(
            f"""
            import asyncio
            from turnkit import Agent, RuntimeConfig, SessionRuntime
            from turnkit.budgets import BudgetLimit
            from turnkit.testing import ScriptedModel

            async def main():
                config = RuntimeConfig(database_url={url!r}, budgets="enforce",
                                       run_in_process=False)
                agent = Agent(model=ScriptedModel([]))  # this process drives no turn
                async with SessionRuntime(agent=agent, config=config) as admin:
                    await admin.set_budget_limit(
                        BudgetLimit(scope="principal", key={ANN!r}, tokens=100_000))

            asyncio.run(main())
            """
        )
        admin = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=ROOT)
        assert await asyncio.wait_for(admin.wait(), timeout=60) == 0
        assert (await runtime.turn(paused.turn_id)).status == "running"

        rest = await _drive_to_done(runtime, paused.turn_id)
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    answers = [e for e in rest if isinstance(e, MessageCompleteEvent) and e.block.is_answer]
    assert [a.block.text for a in answers] == ["It is 5."]
    assert [e.seq for e in rest] == list(range(1, len(rest) + 1))  # one turn, no gaps
    assert sum(isinstance(e, BudgetPausedEvent) for e in rest) == 1
    assert len(model.calls) == 2  # nothing before the pause ran again


@tool(approval="always")
async def send(to: str) -> str:
    """Send the sum (a person approves)."""
    return f"sent to {to}"


async def _until_not_running(runtime: SessionRuntime, turn_id: str) -> str:
    async with asyncio.timeout(20):
        while (status := (await runtime.turn(turn_id)).status) == "running":
            await asyncio.sleep(0.02)
    return status


@pytest.mark.parametrize("rerun", ["budgets enforced", "budgets turned off"])
async def test_a_turn_back_from_a_budget_pause_can_still_ask_for_an_approval(
    tmp_path: Path, rerun: str
) -> None:
    """The budget pause's answer is its own, not the approval's that follows in the node."""
    first = dataclasses.replace(
        ModelStep.tool_call_reply(call("add", a=2, b=3)),
        usage=Usage(input_tokens=600, output_tokens=100, cost_usd=0.007),
    )
    model = ScriptedModel(
        [first, ModelStep.tool_call_reply(call("send", to="ann")), ModelStep.text_reply("Sent.")]
    )
    agent = Agent(model=model, tools=[add, send])
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    async with SessionRuntime(agent=agent, config=_config(url, run_in_process=False)) as first:
        paused = (await _paused_turn(first))[-1]
        assert await first.set_budget_limit(_limit(100_000)) == [paused.turn_id]  # not driven
    # Another process drives it on: budgets still enforced, or turned off meanwhile.
    config = (
        _config(url, recover_in_process=True)
        if rerun == "budgets enforced"
        else RuntimeConfig(database_url=url, recover_in_process=True)
    )
    async with SessionRuntime(agent=agent, config=config) as runtime:
        status = await _until_not_running(runtime, paused.turn_id)
        assert status == "awaiting_approval"  # it asks: the budget's answer is not its own
        [asked] = await runtime.pending("s1")
        assert asked.tool_name == "send"
        await runtime.resume(paused.turn_id, asked.request_id, Approve())
        await _until_not_running(runtime, paused.turn_id)
        events = [e async for e in runtime.events(paused.turn_id)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded", [e.type for e in events]
    assert [e.result.output for e in events if isinstance(e, ToolCompletedEvent)] == [
        5,
        "sent to ann",
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(model.calls) == 3


async def test_a_budget_pause_ends_with_cancel(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    async with SessionRuntime(
        agent=Agent(model=_spending_model(), tools=[add]), config=_config(url)
    ) as runtime:
        paused = (await _paused_turn(runtime))[-1]
        await runtime.cancel(paused.turn_id)
        assert (await runtime.turn(paused.turn_id)).status == "cancelled"
        assert await runtime.resume_budget_pauses() == []


async def test_raising_the_limit_resumes_the_turn_on_either_store(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    config = _config(url, database_schema=schema) if schema else _config(url)
    async with SessionRuntime(
        agent=Agent(model=_spending_model(), tools=[add]), config=config
    ) as rt:
        paused = (await _paused_turn(rt))[-1]
        [(_, request)] = await rt.store.budget_pauses()
        assert request.request_id == paused.request_id  # type: ignore[union-attr]
        resumed = await rt.set_budget_limit(_limit(100_000))
        assert resumed == [paused.turn_id]
        assert await _until_not_running(rt, paused.turn_id) == "succeeded"


async def test_a_new_period_resumes_the_turn(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    agent = Agent(model=_spending_model(), tools=[add])
    async with SessionRuntime(agent=agent, config=_config(url)) as runtime:
        await runtime.set_budget_limit(_limit(800, period="day"))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        paused = events[-1]
        assert isinstance(paused, BudgetPausedEvent)
    # The next day, a worker's sweep sees the daily limit's new period and drives the turn.
    async with SessionRuntime(
        agent=agent, config=_config(url, run_in_process=False), clock=_Tomorrow()
    ) as later:
        stop = asyncio.Event()
        worker = Worker(later, poll_interval_s=0.02, sweep_interval_s=0.05)
        working = asyncio.create_task(worker.run(stop))
        try:
            async with asyncio.timeout(20):
                while (await later.turn(paused.turn_id)).status == "awaiting_budget":
                    await asyncio.sleep(0.05)
                while (await later.turn(paused.turn_id)).status == "running":
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await working
        rest = [e async for e in later.events(paused.turn_id)]
    assert isinstance(rest[-1], DoneEvent)
    assert rest[-1].status == "succeeded"


async def test_naming_skips_when_the_budget_has_no_room(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    answer = dataclasses.replace(
        ModelStep.text_reply("Hello."), usage=Usage(input_tokens=900, output_tokens=50)
    )
    namer = ScriptedModel([ModelStep.text_reply("A better name")], repeat_last=True)
    agent = Agent(model=ScriptedModel([answer]), utility_model=namer)
    async with SessionRuntime(agent=agent, config=_config(url)) as runtime:
        await runtime.set_budget_limit(_limit(1_000))
        events = await collect_events(
            runtime.execute_message("s1", "Plan my trip to Lisbon", principal=ANN)
        )
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"  # naming never pauses a turn
        await runtime.wait_background()
        assert [c for c in namer.calls if c.messages[0].content == NAMING_PROMPT] == []
        session = await runtime.store.get_session("s1")  # type: ignore[arg-type]
        assert session is not None
        assert session.title == "Plan my trip to Lisbon"  # the first name stands


class _Tomorrow(SystemClock):
    """The system clock, a day ahead."""

    def now(self) -> datetime:
        return super().now() + timedelta(days=1)


_RACER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from turnkit.budgets import BudgetSubject
    from turnkit.store.sql import SqlStore

    async def main(url, schema, start, keys):
        async with SqlStore.from_url(url, schema=schema) as store:
            while time.time() < start:
                await asyncio.sleep(0.005)
            won = []
            for key in keys:
                subject = BudgetSubject(organisation="default", department="general",
                                        principal=key, session_id="s-" + key)
                reservation, _ = await store.reserve_budget(
                    subject, turn_id="t-" + key + "-" + sys.argv[5], usd=0.0, tokens=600,
                    ttl_s=600)
                if reservation is not None:
                    won.append(key)
            print(json.dumps(won))

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].split(",")))
    """
)


async def test_two_processes_racing_for_one_limit_cannot_overspend() -> None:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    import asyncpg

    from turnkit.store.sql import SqlStore

    schema = f"tk_budget_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    keys = [f"p{i}" for i in range(40)]
    try:
        async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
            for key in keys:  # room for one 600-token call each, not two
                await store.set_budget_limit(_limit(1_000).model_copy(update={"key": key}))
        start = time.time() + 2.0
        racers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _RACER,
                POSTGRES_URL,
                schema,
                str(start),
                ",".join(keys),
                n,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
            )
            for n in ("a", "b")
        ]
        outputs = [await asyncio.wait_for(r.communicate(), timeout=120) for r in racers]
        assert [r.returncode for r in racers] == [0, 0]
        won = [json.loads(out) for out, _ in outputs]
        both = set(won[0]) & set(won[1])
        assert both == set(), f"both processes reserved past the limit for {sorted(both)}"
        assert set(won[0]) | set(won[1]) == set(keys)  # and every key was spent once
        async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
            subject = BudgetSubject(
                organisation="default", department="general", principal="p0", session_id="x"
            )
            [use] = await store.budget_uses(subject)
            assert use.reserved_tokens == 600
    finally:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


async def test_the_cli_sets_lists_and_deletes_limits_and_resumes_paused_turns(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"

    async def turnkit(*argv: str) -> tuple[int, str, str]:
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "turnkit.cli",
            "budgets",
            *argv,
            "--database-url",
            url,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(cli.communicate(), timeout=60)
        assert cli.returncode is not None
        return cli.returncode, out.decode(), err.decode()

    async with SessionRuntime(
        agent=Agent(model=_spending_model(), tools=[add]), config=_config(url, run_in_process=False)
    ) as runtime:
        paused = (await _paused_turn(runtime))[-1]
        code, out, _ = await turnkit("list")
        assert code == 0
        assert "the principal budget of 'ann' (month) has used 700 of 800 tokens" in out
        code, _, err = await turnkit("set", "--scope", "principal", "--key", ANN)
        assert code == 2
        assert err.startswith("turnkit: invalid setting:")  # no amount: one line, no trace
        for amount in (["--usd", "inf"], ["--tokens", "9" * 23]):
            code, _, err = await turnkit("set", "--scope", "principal", "--key", ANN, *amount)
            assert (code, err.count("\n")) == (2, 1), err
            assert err.startswith("turnkit: invalid setting:")
        code, out, _ = await turnkit(
            "set", "--scope", "principal", "--key", ANN, "--tokens", "100000"
        )
        assert code == 0
        assert f"resumed {paused.turn_id}" in out
        assert (await runtime.turn(paused.turn_id)).status == "running"
        rest = await _drive_to_done(runtime, paused.turn_id)
        assert isinstance(rest[-1], DoneEvent)
        code, out, _ = await turnkit("delete", "--scope", "principal", "--key", ANN)
        assert (code, out) == (0, "deleted\n")
        code, out, _ = await turnkit("list")
        assert out == "no budget limits\n"


async def test_deleting_a_session_keeps_its_spend_on_budgets_and_reports(
    db: tuple[str, str | None],
) -> None:
    """Audit and usage outlive chat data: deleting a chat does not reset a budget."""
    url, schema = db
    config = _config(url, database_schema=schema)
    first, answer = _spending_model().steps

    def reply(request: ModelRequest) -> ModelStep:  # every turn spends alike
        return answer if any(m.role == "tool" for m in request.messages) else first

    model = ScriptedModel([ModelStep.respond(reply)], repeat_last=True)
    async with SessionRuntime(agent=Agent(model=model, tools=[add]), config=config) as runtime:
        await runtime.set_budget_limit(_limit(1_000))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
        [before] = await runtime.budget_uses(ANN, "s2")
        report_before = await runtime.store.usage_report(by="principal", principal=ANN)
        assert before.spent_tokens > 700
        assert await runtime.store.delete_session(SessionId("s1"))

        [after] = await runtime.budget_uses(ANN, "s2")
        assert after.spent_tokens == before.spent_tokens
        assert after.spent_usd == pytest.approx(before.spent_usd)
        assert await runtime.store.usage_report(by="principal", principal=ANN) == report_before
        days = await runtime.store.usage_report(by="day", since=datetime.now(UTC) - timedelta(1))
        assert sum(line.input_tokens + line.output_tokens for line in days) == after.spent_tokens

        # A new chat gets no fresh budget: its first call no longer fits.
        events = await collect_events(runtime.execute_message("s2", "add 2 and 3", principal=ANN))
        assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]

        # Someone else reuses the deleted session's id, then deletes that session too.
        await runtime.set_budget_limit(_limit(1_000).model_copy(update={"key": "bob"}))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal="bob"))
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
        [bobs] = await runtime.budget_uses("bob", "s3")
        assert await runtime.store.delete_session(SessionId("s1"))
        [ann_now] = await runtime.budget_uses(ANN, "s3")
        assert ann_now.spent_tokens == before.spent_tokens  # the first chat's spend stays hers
        assert await runtime.store.usage_report(by="principal", principal=ANN) == report_before
        [bob_line] = await runtime.store.usage_report(by="principal", principal="bob")
        assert bob_line.input_tokens + bob_line.output_tokens == bobs.spent_tokens
        assert (await runtime.budget_uses("bob", "s3"))[0].spent_tokens == bobs.spent_tokens


async def test_a_limit_for_a_department_that_does_not_exist_is_refused(
    runtime_factory: RuntimeFactory,
) -> None:
    from turnkit import Department, Organisation
    from turnkit.errors import InvalidInputError

    runtime = runtime_factory(
        Agent(model=ScriptedModel([])),
        tenancy=[Organisation(name="acme", departments=(Department(name="sales"),))],
    )
    typo = BudgetLimit(scope="department", organisation="acme", key="sals", tokens=5)
    with pytest.raises(InvalidInputError, match="no department 'sals' .*sales"):
        await runtime.set_budget_limit(typo)
    assert await runtime.budget_limits("acme") == []  # nothing written
    assert await runtime.set_budget_limit(typo.model_copy(update={"key": "sales"})) == []
    assert [limit.key for limit in await runtime.budget_limits("acme")] == ["sales"]
    # An organisation this process does not serve may still be set up (another may serve it).
    await runtime.set_budget_limit(typo.model_copy(update={"organisation": "globex"}))


def _costly(step: ModelStep, tokens: int) -> ModelStep:
    return dataclasses.replace(step, usage=Usage(input_tokens=tokens, output_tokens=0))


async def test_a_session_limit_covers_the_agents_its_turns_ask(
    db: tuple[str, str | None],
) -> None:
    """A specialist spends against the asking session's limit, and is stopped by it."""
    url, schema = db
    specialist_model = ScriptedModel(
        [
            _costly(ModelStep.tool_call_reply(call("add", a=2, b=3)), 700),
            ModelStep.text_reply("It is 5."),
        ]
    )
    specialist = Agent(name="maths", model=specialist_model, tools=[add])
    front_model = ScriptedModel(
        [
            _costly(ModelStep.tool_call_reply(call("maths", message="add 2 and 3")), 300),
            ModelStep.text_reply("The specialist could not finish."),
        ]
    )
    front = Agent(name="front-desk", model=front_model, tools=[specialist.as_tool()])
    async with SessionRuntime(agent=front, config=_config(url, database_schema=schema)) as runtime:
        await runtime.set_budget_limit(_limit(1_000_000))  # the principal: room to spare
        await runtime.set_budget_limit(BudgetLimit(scope="session", key="s1", tokens=1_000))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))

        # The specialist's first call fit (300 + 700 of 1,000); its second did not, so its
        # turn was stopped and the call failed naming the asking session's limit.
        [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
        assert failed.result.error is not None
        assert "'maths' stopped to wait for a raised budget (the session budget of 's1'" in (
            failed.result.error
        )
        assert len(specialist_model.calls) == 1
        # The front desk's own next call does not fit either: it waits on the same limit.
        paused = events[-1]
        assert isinstance(paused, BudgetPausedEvent), [e.type for e in events]
        assert (paused.scope, paused.key) == ("session", "s1")
        assert "1000 of 1000 tokens" in paused.reason
        [session_use] = [
            u for u in await runtime.budget_uses(ANN, "s1") if u.limit.scope == "session"
        ]
        assert session_use.spent_tokens == 1_000
        # Asked from the session, the specialist's own session is covered by its limit.
        [asked] = await runtime.store.delegated_sessions(SessionId("s1"))
        covering = await runtime.budget_uses(ANN, asked)
        assert [(u.limit.scope, u.limit.key) for u in covering] == [
            ("principal", ANN),
            ("session", "s1"),
        ]


GATES: dict[str, asyncio.Event] = {}


@tool
async def slow_add(a: int, b: int) -> int:
    """Add two integers, once the test lets it."""
    GATES["runs"].set()
    await asyncio.wait_for(GATES["goes_on"].wait(), timeout=20)
    return a + b


async def test_a_calls_reservation_goes_as_its_usage_is_recorded(
    db: tuple[str, str | None],
) -> None:
    """While the call's tools run, what it spent counts once, not also as held."""
    url, schema = db
    GATES.update(runs=asyncio.Event(), goes_on=asyncio.Event())
    first = _costly(ModelStep.tool_call_reply(call("slow_add", a=2, b=3)), 700)
    model = ScriptedModel([first, ModelStep.text_reply("It is 5.")])
    config = dataclasses.replace(_config(url, database_schema=schema), budget_reserve_tokens=4_000)
    async with SessionRuntime(agent=Agent(model=model, tools=[slow_add]), config=config) as runtime:
        await runtime.set_budget_limit(_limit(100_000))
        running = asyncio.create_task(
            collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        )
        try:
            await asyncio.wait_for(GATES["runs"].wait(), timeout=20)
            [use] = await runtime.budget_uses(ANN, "s1")
            assert (use.spent_tokens, use.reserved_tokens) == (700, 0)
        finally:
            GATES["goes_on"].set()
        events = await asyncio.wait_for(running, timeout=20)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


class _SlowAnswer:
    """Streams reasoning and a long answer, then waits (mid-stream) for the test."""

    model = "slow"
    provider = "scripted"

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.go_on = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield ThinkingDelta("two and two make four")
        for _ in range(30):  # past the 160 characters that start the summary
            yield TextDelta("Four is the answer. ")
        await asyncio.sleep(0.3)  # the summary fails meanwhile
        yield TextDelta("And that is all. ")  # a delta: commits what is staged
        await asyncio.sleep(0.1)
        self.streaming.set()
        await asyncio.wait_for(self.go_on.wait(), timeout=20)
        yield Finish("end_turn", Usage(input_tokens=100, output_tokens=100))


async def test_a_failed_thinking_summary_does_not_release_the_answering_calls_reservation(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    answer = _SlowAnswer()
    utility = ScriptedModel(
        [ModelStep.fail(ProviderError("utility down", status_code=500))],
        name="background",
        repeat_last=True,
    )
    agent = Agent(
        model=answer,  # type: ignore[arg-type]
        utility_model=utility,
        skip_stages=frozenset({"anchor-plan"}),
    )
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        budgets="enforce",
        budget_reserve_tokens=4_000,
    )
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(
            BudgetLimit(scope="principal", key=ANN, tokens=100_000, period="month")
        )
        running = asyncio.create_task(
            collect_events(runtime.execute_message("s1", "2+2?", principal=ANN))
        )
        try:
            await asyncio.wait_for(answer.streaming.wait(), timeout=20)
            assert utility.calls, "the summary was asked (and failed)"
            [use] = await runtime.budget_uses(ANN, "s1")
            # The answering call is still streaming: what it reserved must still be held
            # (else other turns may spend the same tokens).
            assert use.reserved_tokens >= 4_000, (use.spent_tokens, use.reserved_tokens)
        finally:
            answer.go_on.set()
        events = await asyncio.wait_for(running, timeout=20)
    assert isinstance(events[-1], DoneEvent)


class _SlowRung:
    """A fallback rung: streams part of an answer, then waits mid-stream for the test."""

    model = "m-fallback"
    provider = "scripted"

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.go_on = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("Hello, ")
        yield TextDelta("there.")
        await asyncio.sleep(0.1)
        self.streaming.set()
        await asyncio.wait_for(self.go_on.wait(), timeout=20)
        yield Finish("end_turn", Usage(input_tokens=100, output_tokens=100))


async def test_a_failed_rung_does_not_release_the_reservation_the_next_rung_streams_on(
    db: tuple[str, str | None],
) -> None:
    """A cascade is one call: its first rung's failure row must not free what it reserved."""
    url, schema = db
    first = ScriptedModel(
        [ModelStep.fail(ProviderError("slow down", status_code=429))], name="m-first"
    )
    second = _SlowRung()
    family = ModelFamily("m", [first, second])  # type: ignore[list-item]
    config = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        budgets="enforce",
        budget_reserve_tokens=4_000,
    )
    async with SessionRuntime(agent=Agent(model=family), config=config) as runtime:
        await runtime.set_budget_limit(
            BudgetLimit(scope="principal", key=ANN, tokens=100_000, period="month")
        )
        running = asyncio.create_task(
            collect_events(runtime.execute_message("s1", "hello", principal=ANN))
        )
        try:
            await asyncio.wait_for(second.streaming.wait(), timeout=20)
            [use] = await runtime.budget_uses(ANN, "s1")
            # The call (its second rung) is still streaming: its reservation must be held.
            assert use.reserved_tokens >= 4_000, (use.spent_tokens, use.reserved_tokens)
        finally:
            second.go_on.set()
        events = await asyncio.wait_for(running, timeout=20)
    assert isinstance(events[-1], DoneEvent)


def _asking_maths() -> Agent:
    specialist = Agent(
        name="maths",
        model=ScriptedModel(
            [
                _costly(ModelStep.tool_call_reply(call("add", a=2, b=3)), 700),
                _costly(ModelStep.text_reply("It is 5."), 100),
            ]
        ),
        tools=[add],
    )
    return Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                _costly(ModelStep.tool_call_reply(call("maths", message="add 2 and 3")), 300),
                _costly(ModelStep.text_reply("5."), 100),
                _costly(ModelStep.text_reply("Hello again."), 50),
            ]
        ),
        tools=[specialist.as_tool()],
    )


async def _session_spend(runtime: SessionRuntime) -> int:
    [use] = [u for u in await runtime.budget_uses(ANN, "s1") if u.limit.scope == "session"]
    return use.spent_tokens


async def test_retention_of_an_asked_agents_session_keeps_the_asking_session_limits_spend(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    clock = ShiftedClock(timedelta(days=-100))
    config = RuntimeConfig(
        database_url=url, database_schema=schema, budgets="enforce", budget_reserve_tokens=50
    )
    async with SessionRuntime(agent=_asking_maths(), config=config, clock=clock) as runtime:
        await runtime.set_budget_limit(
            BudgetLimit(scope="principal", key=ANN, tokens=1_000_000, period="total")
        )
        await runtime.set_budget_limit(
            BudgetLimit(scope="session", key="s1", tokens=5_000, period="total")
        )
        await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        assert await _session_spend(runtime) == 1_200  # 300 + 100 here, 700 + 100 asked
        clock.shift = timedelta(0)
        await collect_events(runtime.execute_message("s1", "hello", principal=ANN))
        assert await _session_spend(runtime) == 1_250

        report = await runtime.delete_idle_sessions(timedelta(days=90))

        # s1 is in use; the asked agent's session, idle, goes only with it.
        assert report.session_ids == ()
        [asked] = await runtime.store.delegated_sessions(SessionId("s1"))
        assert await runtime.store.get_session(asked) is not None
        # The session limit of s1 (period "total") still counts what was spent for it.
        assert await _session_spend(runtime) == 1_250


async def test_deleting_an_asked_agents_session_keeps_the_asking_session_limits_spend(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, budgets="enforce", budget_reserve_tokens=50
    )
    async with SessionRuntime(agent=_asking_maths(), config=config) as runtime:
        await runtime.set_budget_limit(
            BudgetLimit(scope="principal", key=ANN, tokens=1_000_000, period="total")
        )
        await runtime.set_budget_limit(
            BudgetLimit(scope="session", key="s1", tokens=5_000, period="total")
        )
        await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        [asked] = await runtime.store.delegated_sessions(SessionId("s1"))
        assert await _session_spend(runtime) == 1_200

        with pytest.raises(InvalidInputError, match="deleted with the session that asked it"):
            await runtime.delete_session(asked)
        assert await runtime.store.get_session(asked) is not None
        assert await _session_spend(runtime) == 1_200
        assert await runtime.delete_session("s1")  # with it, the asked agent's session goes
        assert await runtime.store.get_session(asked) is None


def _a_700_token_call() -> ModelStep:
    return dataclasses.replace(
        ModelStep.tool_call_reply(call("add", a=2, b=3)),
        usage=Usage(input_tokens=600, output_tokens=100),
    )


async def test_a_limit_with_room_for_one_call_resumes_one_turn(tmp_path: Path) -> None:
    """The turns resumed before it in one pass count: the rest would only pause again."""
    model = ScriptedModel(
        [
            _a_700_token_call(),
            _a_700_token_call(),
            ModelStep.text_reply("5"),
            ModelStep.text_reply("5"),
        ]
    )
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'tk.db'}", budgets="enforce", budget_reserve_tokens=50
    )
    async with SessionRuntime(agent=Agent(model=model, tools=[add]), config=config) as rt:
        await rt.set_budget_limit(BudgetLimit(scope="department", key="general", tokens=1_450))
        for session, who in (("s1", "ann"), ("s2", "bob")):
            events = await collect_events(rt.execute_message(session, "add 2 and 3", principal=who))
            assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]
        paused = await rt.store.budget_pauses()
        assert len(paused) == 2
        need = max(int(p.payload["tokens"]) for _, p in paused)  # type: ignore[arg-type]
        [use] = await rt.store.budget_report("default")
        # room for one more call, not for two
        resumed = await rt.set_budget_limit(
            BudgetLimit(
                scope="department", key="general", tokens=use.spent_tokens + need + need // 2
            )
        )
        assert len(resumed) == 1, resumed
        for record, _ in await rt.store.budget_pauses():
            await rt.cancel(record.turn_id)
        async with asyncio.timeout(20):
            for turn_id in resumed:
                async for _ in rt.reader().follow(turn_id):
                    pass


PRICED = "tk-usd-first-call-test"


async def test_turns_starting_at_once_cannot_overspend_a_usd_limit(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A turn's first call reserves USD too, at its model's list price."""
    litellm = load_litellm()  # offline: never the network's price map
    litellm.register_model({
        f"openai/{PRICED}": {
            "input_cost_per_token": 1e-5,
            "output_cost_per_token": 1e-5,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    })  # fmt: skip
    # The first turn's call stalls (holding its reservation); the second would answer.
    openai_server.script(PRICED, [Reply.text("thinking", stall=True), Reply.text("done")])
    client = LiteLLMClient(f"openai/{PRICED}", api_base=openai_server.base_url, api_key="sk")
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'usd.db'}",
        budgets="enforce",
        budget_reserve_tokens=1_000,  # a call may cost about (prompt + 1,000) x $1e-5 = $0.01
    )
    async with SessionRuntime(agent=Agent(model=client), config=config) as runtime:
        await runtime.set_budget_limit(BudgetLimit(scope="organisation", usd=0.015))  # one call
        first = await runtime.start("s1", "hello", principal="ann")
        async with asyncio.timeout(10):
            while not (use := (await runtime.store.budget_report("default"))[0]).reserved_tokens:
                await asyncio.sleep(0.02)
        assert use.reserved_usd > 0.0, "the first call of a turn reserved no USD"
        second = await runtime.start("s2", "hello", principal="bob")
        async with asyncio.timeout(10):
            events = [e async for e in runtime.follow(second.turn_id)]
        assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]
        # The reason says what to raise a USD limit by, not only the tokens.
        assert "the next model call needs about" in events[-1].reason
        # ... and the dollars are those tokens at the model's list price ($1e-5 a token).
        needs = re.search(r" about (\d+) tokens \(\$(\d+\.\d{4})\)$", events[-1].reason)
        assert needs is not None, events[-1].reason
        assert float(needs[2]) == pytest.approx(int(needs[1]) * 1e-5, abs=1e-4)
        await runtime.cancel(second.turn_id)
        await runtime.cancel(first.turn_id)


async def test_a_turn_resumed_by_a_new_period_spends_within_that_period(
    db: tuple[str, str | None],
) -> None:
    """What a turn spends after a new period resumed it counts in that period, for the
    sweep too: a pass that resumed it every time would have it pause again, once per
    sweep, until its call fails after 64 pauses."""
    url, schema = db

    def reply(request: ModelRequest) -> ModelStep:  # every call spends 700 tokens
        return _a_700_token_call()

    model = ScriptedModel([ModelStep.respond(reply)], repeat_last=True)
    agent = Agent(model=model, tools=[add], max_tool_rounds=12)
    config = _config(url, database_schema=schema)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(_limit(800, period="day"))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        paused = events[-1]
        assert isinstance(paused, BudgetPausedEvent), [e.type for e in events]
        assert len(model.calls) == 1
    async with SessionRuntime(agent=agent, config=config, clock=_Tomorrow()) as later:
        assert await later.resume_budget_pauses() == [paused.turn_id]  # a new day
        async with asyncio.timeout(20):
            rest = [e async for e in later.follow(paused.turn_id, after_seq=paused.seq)]
        # Today's 800 tokens take one more 700-token call; the next waits for tomorrow.
        again = rest[-1]
        assert isinstance(again, BudgetPausedEvent), [e.type for e in rest]
        assert "700 of 800 tokens" in again.reason
        # Today's room is gone: the next sweep leaves the turn waiting for tomorrow.
        assert await later.resume_budget_pauses() == []
        assert len(model.calls) == 2


async def test_a_first_call_cut_short_is_priced_at_its_models_list_price(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """The provider billed what it read and wrote: a USD limit sees it, first call or not."""
    litellm = load_litellm()  # offline: never the network's price map
    model = "tk-cut-first-call-test"
    litellm.register_model({
        f"openai/{model}": {
            "input_cost_per_token": 1e-5,
            "output_cost_per_token": 2e-5,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    })  # fmt: skip
    openai_server.script(model, [Reply.text("Thinking about it", stall=True)])
    client = LiteLLMClient(f"openai/{model}", api_base=openai_server.base_url, api_key="sk")
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'cut.db'}",
        ceiling_s=0.5,  # a model call is never idle: its ceiling cuts it
        idle_window_s=0.5,
        heartbeat_interval_s=0.05,
    )
    async with SessionRuntime(agent=Agent(model=client), config=config) as runtime:
        async with asyncio.timeout(20):
            events = await collect_events(runtime.execute_message("s1", "tell me a story"))
        done = events[-1]
        assert isinstance(done, DoneEvent)
        assert done.status == "timed_out"
        [cut] = [r.call for r in await runtime.audit(done.turn_id) if r.call is not None]
    assert cut is not None
    assert cut.output_tokens > 0
    assert cut.cost_usd == pytest.approx(cut.input_tokens * 1e-5 + cut.output_tokens * 2e-5)


async def test_turns_answered_in_a_new_period_cannot_overspend_it_together(
    db: tuple[str, str | None],
) -> None:
    """Two turns that waited for a person across midnight: what the first spends after
    its answer counts against today's limit for the second too."""
    url, schema = db
    spent = Usage(input_tokens=600, output_tokens=100)
    model = ScriptedModel(
        [
            dataclasses.replace(ModelStep.tool_call_reply(call("send", to="Ann")), usage=spent),
            dataclasses.replace(ModelStep.tool_call_reply(call("send", to="Bob")), usage=spent),
            dataclasses.replace(ModelStep.text_reply("Sent."), usage=spent),
            dataclasses.replace(ModelStep.text_reply("Sent."), usage=spent),
        ]
    )
    agent = Agent(model=model, tools=[send])
    config = _config(url, database_schema=schema)
    waiting = []
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(_limit(10_000, period="day"))
        for session in ("s1", "s2"):
            events = await collect_events(runtime.execute_message(session, "send", principal=ANN))
            assert events[-1].type == "approval.requested", [e.type for e in events]
            waiting.append(events[-1])
    async with SessionRuntime(agent=agent, config=config, clock=_Tomorrow()) as later:
        await later.set_budget_limit(_limit(800, period="day"))  # today: room for one call
        first, second = waiting
        await later.resume(first.turn_id, first.request_id, Approve())
        async with asyncio.timeout(20):
            rest = [e async for e in later.follow(first.turn_id, after_seq=first.seq)]
        assert isinstance(rest[-1], DoneEvent), [e.type for e in rest]
        await later.resume(second.turn_id, second.request_id, Approve())
        async with asyncio.timeout(20):
            rest = [e async for e in later.follow(second.turn_id, after_seq=second.seq)]
        # The first turn spent 700 of today's 800 tokens: the second's call waits.
        assert isinstance(rest[-1], BudgetPausedEvent), [e.type for e in rest]
        assert "700 of 800 tokens" in rest[-1].reason
        assert len(model.calls) == 3
        await later.cancel(second.turn_id)


_NIGHT = ShiftedClock()


@tool
async def add_past_midnight(a: int, b: int) -> int:
    """Add two integers (the first time, a day goes by meanwhile)."""
    if _NIGHT.shift == timedelta(0):
        _NIGHT.shift = timedelta(days=1)
    return a + b


async def test_a_turn_working_past_midnight_spends_in_the_new_day_from_its_first_call_there(
    db: tuple[str, str | None],
) -> None:
    """Spend is dated by the call: yesterday's call of a turn that works on past midnight
    is not in today's count, today's are, also after the turn pauses and resumes today."""
    url, schema = db
    _NIGHT.shift = timedelta(0)
    step = dataclasses.replace(
        ModelStep.tool_call_reply(call("add_past_midnight", a=2, b=3)),
        usage=Usage(input_tokens=600, output_tokens=100),
    )
    model = ScriptedModel([step], repeat_last=True)
    agent = Agent(model=model, tools=[add_past_midnight], max_tool_rounds=12)
    config = _config(url, database_schema=schema)
    async with SessionRuntime(agent=agent, config=config, clock=_NIGHT) as runtime:
        await runtime.set_budget_limit(_limit(2_000, period="day"))
        events = await collect_events(runtime.execute_message("s1", "add 2 and 3", principal=ANN))
        paused = events[-1]
        assert isinstance(paused, BudgetPausedEvent), [e.type for e in events]
        # One call yesterday; today three (the third fit the 600 tokens left), then none.
        assert len(model.calls) == 4
        assert "has used 2100 of 2000 tokens" in paused.reason
        # An administrator raises today's limit: one more call fits, not three.
        assert await runtime.set_budget_limit(_limit(2_400, period="day")) == [paused.turn_id]
        async with asyncio.timeout(20):
            rest = [e async for e in runtime.follow(paused.turn_id, after_seq=paused.seq)]
        again = rest[-1]
        assert isinstance(again, BudgetPausedEvent), [e.type for e in rest]
        assert "has used 2800 of 2400 tokens" in again.reason
        assert len(model.calls) == 5
        [use] = await runtime.store.budget_report()
        assert use.spent_tokens == 2_800  # what GET /budgets shows: today's calls only
        await runtime.cancel(paused.turn_id)


async def test_a_process_whose_clock_is_behind_adds_to_the_new_days_count(
    db: tuple[str, str | None],
) -> None:
    """Just after midnight, a process whose clock still says yesterday does not start
    yesterday's count again: what it spends goes into today's, which the others read."""
    url, schema = db
    config = _config(url, database_schema=schema)
    ahead = SessionRuntime(agent=Agent(model=_spending_model(), tools=[add]), config=config,
                           clock=_Tomorrow())  # fmt: skip
    behind = SessionRuntime(agent=Agent(model=_spending_model(), tools=[add]), config=config)
    async with ahead, behind:
        await ahead.set_budget_limit(_limit(100_000, period="day"))
        first = await collect_events(ahead.execute_message("s1", "add 2 and 3", principal=ANN))
        second = await collect_events(behind.execute_message("s2", "add 2 and 3", principal=ANN))
        await ahead.wait_background()
        await behind.wait_background()
        spent = [await ahead.store.read_usage(e[0].turn_id) for e in (first, second)]
        total = sum(u.input_tokens + u.output_tokens for u in spent if u is not None)
        assert total >= 1_400
        [use] = await ahead.store.budget_report()
        assert use.spent_tokens == total  # the first turn's spend was not forgotten
        [late] = await behind.store.budget_report()
        assert late.spent_tokens == total  # the clock behind reads the newer count too


async def test_a_limit_that_counts_nothing_yet_starts_from_its_history_before_a_call(
    db: tuple[str, str | None],
) -> None:
    """A limit from before limits kept counts (or whose count was lost): the first check
    sums the period's history, off the event loop, and the limit counts from then on."""
    from sqlalchemy import update

    from turnkit.store._schema import budget_limits

    url, schema = db
    config = _config(url, database_schema=schema) if schema else _config(url)
    first = _spending_model().steps
    agent = Agent(model=ScriptedModel([*first, *first]), tools=[add])
    async with SessionRuntime(agent=agent, config=config) as rt:
        await rt.set_budget_limit(_limit(100_000))
        done = await collect_events(rt.execute_message("s1", "add 2 and 3", principal=ANN))
        assert isinstance(done[-1], DoneEvent)
        subject = BudgetSubject(
            organisation="default", department="default", principal=ANN, session_id="s2"
        )
        [use] = await rt.store.budget_uses(subject)
        spent = use.spent_tokens  # the first turn's two calls
        assert spent > 700
        await rt.store._migrate(  # as an upgraded database holds it, and the limit lowered
            lambda conn: conn.execute(
                update(budget_limits).values(
                    spent_period=None, spent_usd=0.0, spent_tokens=0, tokens=spent + 500
                )
            )
        )
        [use] = await rt.store.budget_uses(subject)
        assert use.spent_tokens == spent  # summed from the history: nothing counted yet
        events = await collect_events(rt.execute_message("s2", "add 2 and 3", principal=ANN))
        assert isinstance(events[-1], BudgetPausedEvent)  # its first call fit, its second not
        [use] = await rt.store.budget_uses(subject)
        assert use.spent_tokens == spent + 700
        counted = await rt.store._migrate(lambda conn: conn.execute(budget_limits.select()).one())
        assert counted.spent_period is not None
        assert counted.spent_tokens == spent + 700


async def test_a_turn_ended_without_its_driver_frees_what_its_call_reserved(
    db: tuple[str, str | None],
) -> None:
    """A Stop, a time-out or a deleted session of a turn whose driver died frees its hold.

    A driver SIGKILLed mid-call never releases what the call reserved. Unless the
    transaction that ends the turn from outside drops it, it stays until it expires (the
    ceiling, an hour by default), counted against every limit covering the turn: the
    caller's next turns pause `awaiting_budget` on a turn that has ended, and no sweep
    resumes them.
    """
    url, schema = db
    config = _config(url, database_schema=schema, run_in_process=False)
    async with SessionRuntime(
        agent=Agent(model=_spending_model(), tools=[add]), config=config
    ) as runtime:
        await runtime.set_budget_limit(_limit(20_000))
        stopped, timed_out, deleted = [
            await runtime.submit(session, "add 2 and 3", principal=ANN)
            for session in ("s1", "s2", "s3")
        ]
        for turn in (stopped, timed_out, deleted):  # a driver reserved for the call, then died
            subject = BudgetSubject(
                organisation="default", department="general", principal=ANN,
                session_id=turn.session_id,
            )  # fmt: skip
            reservation, _ = await runtime.store.reserve_budget(
                subject, turn_id=turn.turn_id, usd=0.0, tokens=4_000, ttl_s=3_600
            )
            assert reservation is not None
        [use] = await runtime.budget_uses(ANN, "s9")
        assert use.reserved_tokens == 12_000

        assert await runtime.store.cancel(stopped.turn_id) == "cancelled"
        assert await runtime.store.time_out(timed_out.turn_id, reason="its driver is gone")
        await runtime.delete_session("s3")

        [use] = await runtime.budget_uses(ANN, "s9")
        assert use.reserved_tokens == 0, "ended turns still hold what their dead calls reserved"


async def test_the_cli_refuses_a_limit_its_columns_cannot_hold_in_one_line(
    db: tuple[str, str | None],
) -> None:
    """A key or organisation longer than its column is refused before anything is written.

    On PostgreSQL it reached the INSERT and printed the driver's traceback (exit 1).
    """
    url, schema = db
    for too_long in (
        ["--key", "k" * 257],
        ["--key", "k", "--organisation", "o" * 129],
        ["--key", "k", "--organisation", "Bad Org"],  # no caller's organisation is named so
    ):
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "turnkit.cli", "budgets", "set", "--scope", "principal",
            *too_long, "--tokens", "1000", "--database-url", url,
            *(["--database-schema", schema] if schema else []),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(cli.communicate(), timeout=60)
        assert (cli.returncode, err.decode().count("\n")) == (2, 1), err.decode()[-600:]
        assert err.decode().startswith("turnkit: invalid setting:"), err.decode()
