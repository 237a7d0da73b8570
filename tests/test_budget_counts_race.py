"""Budget counts on PostgreSQL (READ COMMITTED): a limit created while a call's commit
is in flight still counts that call."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import asyncpg

from tests.conftest import POSTGRES_URL
from tests.helpers import WrappedModel, add
from turnkit import Agent, BudgetLimit, RuntimeConfig, SessionRuntime
from turnkit.models import Finish, ModelChunk, ModelRequest, Usage
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


class _Gated(WrappedModel):
    """A ScriptedModel whose first call runs `gate()` before it yields its `Finish`."""

    def __init__(self, inner: ScriptedModel, gate: object) -> None:
        self.inner, self.gate, self.calls = inner, gate, 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.calls += 1
        async for chunk in self.inner.stream(request):
            if isinstance(chunk, Finish) and self.calls == 1:
                await self.gate()  # type: ignore[operator]
            yield chunk


async def test_a_limit_set_while_a_calls_commit_is_in_flight_counts_that_call(
    pg_schema: str,
) -> None:
    """The commit statement's snapshot predates the new limit's row: its UPDATE does not
    see the row, and the new limit's first scan does not see the uncommitted usage."""
    schema = pg_schema
    locker = await asyncpg.connect(POSTGRES_URL)
    locker_probe = await asyncpg.connect(POSTGRES_URL)
    setter: asyncio.Task[object] | None = None
    try:
        config = RuntimeConfig(
            database_url=POSTGRES_URL, database_schema=schema, budgets="enforce",
            budget_reserve_tokens=50,
        )  # fmt: skip
        org_limit = BudgetLimit(scope="organisation", tokens=1_000_000)

        async def set_when_the_commit_waits() -> None:
            async with asyncio.timeout(20):
                blocker = await locker.fetchval("SELECT pg_backend_pid()")
                while not await locker_probe.fetchval(  # the commit waits for the turn's row
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    blocker,
                ):
                    await asyncio.sleep(0.02)
            # A new limit, counted from a scan; it may wait for the commit in flight.
            setting = asyncio.create_task(runtime.set_budget_limit(org_limit))
            waiting = await locker_probe.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", blocker
            )
            async with asyncio.timeout(20):
                while not setting.done() and not await locker_probe.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    waiting,
                ):
                    await asyncio.sleep(0.02)
            await locker.execute("COMMIT")  # the commit goes on
            await setting

        async def gate() -> None:
            nonlocal setter
            await locker.execute(f'SET search_path TO "{schema}"')
            await locker.execute("BEGIN")
            await locker.execute("SELECT 1 FROM tk_turns FOR UPDATE")
            setter = asyncio.create_task(set_when_the_commit_waits())

        spend = dataclasses.replace(
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
            usage=Usage(input_tokens=600, output_tokens=100),
        )
        model = _Gated(ScriptedModel([spend, ModelStep.text_reply("It is 5.")]), gate)
        async with SessionRuntime(agent=Agent(model=model, tools=[add]), config=config) as runtime:
            await runtime.set_budget_limit(BudgetLimit(scope="principal", key="ann", tokens=10**6))
            events = await collect_events(
                runtime.execute_message("s1", "add 2 and 3", principal="ann")
            )
            assert events[-1].type == "done", [e.type for e in events]
            assert setter is not None
            await setter
            spent = await runtime.store.read_usage(events[0].turn_id)
            total = spent.input_tokens + spent.output_tokens
            assert total >= 700
            report = {u.limit.scope: u for u in await runtime.store.budget_report()}
            # Both limits cover every call of the turn, both counted from this month.
            assert report["principal"].spent_tokens == total
            assert report["organisation"].spent_tokens == total, (
                f"the new organisation limit counts {report['organisation'].spent_tokens} "
                f"of the {total} tokens spent"
            )
    finally:
        await locker_probe.close()
        await locker.close()
