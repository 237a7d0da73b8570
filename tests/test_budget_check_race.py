"""Budget checks on PostgreSQL (READ COMMITTED): a call another process commits while a
check reads counts as spent or as held, never as neither."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.conftest import POSTGRES_URL
from tests.helpers import new_input
from turnkit import BudgetLimit
from turnkit.audit import AuditRow, CallIdentity, CallShape
from turnkit.budgets import BudgetSubject
from turnkit.ids import TurnId
from turnkit.store import _budgets_sql
from turnkit.store.sql import SqlStore


async def test_a_call_committed_while_a_check_reads_counts_as_spent_or_as_held(
    monkeypatch: pytest.MonkeyPatch, pg_schema: str
) -> None:
    """A check reads a limit's count and what reservations hold. A call of another turn
    committed as the check runs (its spend added to the count, its reservation released,
    in one transaction) must be in one of the two, or the check lets two calls overspend:
    both are read in one statement (one snapshot), here just after that commit."""
    schema = pg_schema

    def subject(who: str) -> BudgetSubject:
        return BudgetSubject(organisation="default", department="general", principal=who,
                             session_id=f"s-{who}")  # fmt: skip

    async with SqlStore.from_url(POSTGRES_URL, schema=schema) as store:
        await store.set_budget_limit(BudgetLimit(scope="organisation", tokens=1_000))
        sub = await store.submit(
            new_input(
                session="s-bob", principal="bob", organisation="default", department="general"
            )  # fmt: skip
        )
        lease = await store.claim("w1", ttl_s=30, max_attempts=3)
        assert lease is not None
        held, _ = await store.reserve_budget(
            subject("bob"), turn_id=sub.turn_id, usd=0.0, tokens=600, ttl_s=600
        )
        assert held is not None  # bob's call may spend 600 of the 1,000 tokens
        row = AuditRow(
            identity=CallIdentity(session_id=sub.session_id, turn_id=sub.turn_id,
                                  stage_id="tool-loop", seq_within_turn=1),
            call=CallShape(provider="p", model="m", family="f", rung=0, latency_ms=1.0,
                           input_tokens=500, output_tokens=100, outcome="ok"),
        )  # fmt: skip

        async def bobs_commit() -> None:  # another process records bob's call
            async with SqlStore.from_url(POSTGRES_URL, schema=schema) as other:
                await other.commit(sub.turn_id, epoch=lease.epoch, audit=[row])

        original, between = (
            _budgets_sql.covering,
            threading.Thread(target=lambda: asyncio.run(bobs_commit())),
        )

        def covering(conn: object, who: BudgetSubject, now: object) -> list[object]:
            if not between.is_alive() and between.ident is None:
                between.start()  # inside the check's transaction, before it reads
                between.join(timeout=5)  # (a commit waiting for the check goes on later)
            return original(conn, who, now)  # type: ignore[arg-type]

        monkeypatch.setattr(_budgets_sql, "covering", covering)
        try:
            ann, [use] = await store.reserve_budget(
                subject("ann"), turn_id=TurnId("t-ann"), usd=0.0, tokens=600, ttl_s=600
            )
        finally:
            monkeypatch.undo()
            await asyncio.to_thread(between.join, 20)
        assert ann is None, (
            f"ann reserved 600 tokens with bob's 600 seen as neither spent nor held "
            f"(the check saw {use.spent_tokens} spent, {use.reserved_tokens} held)"
        )
        [after] = await store.budget_report()
        assert after.spent_tokens == 600
