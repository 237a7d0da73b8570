"""Turn start: the admission chain, in order, on the SDK path, with nothing written on refusal.

Department → agent visibility → model → budget policy → attachments, then the app's own
checks at their declared positions. The HTTP routes share the chain (tests/http).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkit import (
    Agent,
    AgentNotFoundError,
    RuntimeConfig,
    SessionRuntime,
)
from turnkit.budgets import BudgetLimit
from turnkit.errors import (
    AdmissionRefusedError,
    AgentNotAllowedError,
    AttachmentNotIndexedError,
    BudgetExceededError,
    BudgetPolicyMissingError,
    ConfigurationError,
    DepartmentUnknownError,
    InvalidInputError,
    ModelNotAllowedError,
)
from turnkit.runtime.admission import AdmissionCheck, AdmissionRequest, DocumentState
from turnkit.tenancy import Department, Organisation, Principal
from turnkit.testing import ModelStep, ScriptedModel, collect_events

ACME = Organisation(
    name="acme",
    departments=(
        Department(name="sales", blocked_models=frozenset({"big"})),
        Department(name="research"),
    ),
)
PINNED = Organisation(name="pinned", default_agent="helper")

ALICE = Principal(id="alice", organisation="acme", department="sales")
ROB = Principal(id="rob", organisation="acme", department="research")
NOBODY_KNOWS = Principal(id="eve", organisation="acme", department="legal")


def _model(name: str) -> ScriptedModel:
    return ScriptedModel([ModelStep.text_reply("ok.")] * 8, name=name)


def _agents() -> list[Agent]:
    return [
        Agent(name="helper", model="small"),
        Agent(name="deep", model="big"),
        Agent(name="lab", model="small", visibility="department", department="research"),
        Agent(name="diary", model="small", visibility="private", owner="alice"),
    ]


def _runtime(tmp_path: Path, **kwargs: object) -> SessionRuntime:
    config = kwargs.pop("config", None) or RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'admission.db'}"
    )
    return SessionRuntime(
        agents=_agents(),
        models={"small": _model("small"), "big": _model("big")},
        config=config,  # type: ignore[arg-type]
        tenancy=[ACME, PINNED],
        **kwargs,  # type: ignore[arg-type]
    )


async def _nothing_written(runtime: SessionRuntime) -> None:
    assert await runtime.store.list_sessions(limit=10) == []


async def test_an_admitted_message_records_who_spends(tmp_path: Path) -> None:
    async with _runtime(tmp_path) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hi", principal=ALICE))
        assert events[-1].type == "done"
        record = await runtime.turn(events[0].turn_id)
        assert (record.pinned["organisation"], record.pinned["department"]) == ("acme", "sales")
        # The agent's own model: no override recorded.
        assert "model" not in record.pinned["overrides"]  # type: ignore[operator]


async def test_a_principal_with_no_department_sits_in_the_default_one(tmp_path: Path) -> None:
    async with _runtime(tmp_path) as runtime:
        sub = await runtime.submit("s1", "hi", principal=Principal(id="kim", organisation="acme"))
        record = await runtime.turn(sub.turn_id)
        assert record.pinned["department"] == "general"
        # A bare id (single-user apps) is the default organisation's default department.
        sub = await runtime.submit("s2", "hi", principal="solo")
        assert (await runtime.turn(sub.turn_id)).pinned["organisation"] == "default"


@pytest.mark.parametrize(
    ("principal", "error"),
    [
        (NOBODY_KNOWS, DepartmentUnknownError),
        (Principal(id="x", organisation="elsewhere"), DepartmentUnknownError),
    ],
)
async def test_the_department_check_refuses_unknown_ones(
    tmp_path: Path, principal: Principal, error: type[Exception]
) -> None:
    async with _runtime(tmp_path) as runtime:
        with pytest.raises(error):
            await runtime.submit("s1", "hi", principal=principal)
        await _nothing_written(runtime)


async def test_not_visible_answers_like_not_found(tmp_path: Path) -> None:
    async with _runtime(tmp_path) as runtime:
        with pytest.raises(AgentNotFoundError) as missing:
            await runtime.submit("s1", "hi", agent="nope", principal=ALICE)
        with pytest.raises(AgentNotFoundError) as hidden:
            await runtime.submit("s1", "hi", agent="lab", principal=ALICE)  # research only
        with pytest.raises(AgentNotFoundError):
            await runtime.submit("s1", "hi", agent="diary", principal=ROB)  # alice's own
        assert type(missing.value) is type(hidden.value)
        await _nothing_written(runtime)
        # The owner and the department see theirs.
        await runtime.submit("s2", "hi", agent="lab", principal=ROB)
        await runtime.submit("s3", "hi", agent="diary", principal=ALICE)


async def test_the_default_agent_switch_refuses_rather_than_swaps(tmp_path: Path) -> None:
    worker = Principal(id="w", organisation="pinned")
    admin = Principal(id="a", organisation="pinned", roles=frozenset({"admin"}))
    async with _runtime(tmp_path) as runtime:
        with pytest.raises(AgentNotAllowedError):
            await runtime.submit("s1", "hi", agent="deep", principal=worker)
        await _nothing_written(runtime)
        asked_none = await runtime.submit("s1", "hi", principal=worker)
        assert (await runtime.turn(asked_none.turn_id)).agent == "helper"
        by_admin = await runtime.submit("s2", "hi", agent="deep", principal=admin)
        assert (await runtime.turn(by_admin.turn_id)).agent == "deep"


async def test_the_model_check(tmp_path: Path) -> None:
    async with _runtime(tmp_path) as runtime:
        with pytest.raises(ModelNotAllowedError, match="not served"):
            await runtime.submit("s1", "hi", model="gpt-unheard-of", principal=ROB)
        with pytest.raises(ModelNotAllowedError, match="sales"):
            await runtime.submit("s1", "hi", model="big", principal=ALICE)  # blocked there
        with pytest.raises(ModelNotAllowedError, match="sales"):
            await runtime.submit("s1", "hi", agent="deep", principal=ALICE)  # its own model
        await _nothing_written(runtime)
        sub = await runtime.submit("s1", "hi", model="big", principal=ROB)
        record = await runtime.turn(sub.turn_id)
        assert record.pinned["overrides"] == {"model": "big"}  # it differs: recorded
        same = await runtime.submit("s2", "hi", agent="deep", model="big", principal=ROB)
        assert "model" not in (await runtime.turn(same.turn_id)).pinned["overrides"]  # type: ignore[operator]


async def test_budgets_fail_closed_and_refuse_when_spent(tmp_path: Path) -> None:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'admission.db'}", budgets="enforce")
    async with _runtime(tmp_path, config=config) as runtime:
        with pytest.raises(BudgetPolicyMissingError):
            await runtime.submit("s1", "hi", principal=ALICE)
        await _nothing_written(runtime)
        await runtime.set_budget_limit(
            BudgetLimit(scope="department", organisation="acme", key="sales", tokens=0)
        )
        with pytest.raises(BudgetExceededError, match="department budget of 'sales'"):
            await runtime.submit("s1", "hi", principal=ALICE)
        await _nothing_written(runtime)
        # Research has no limit of its own, and nothing covers its organisation: refused.
        with pytest.raises(BudgetPolicyMissingError):
            await runtime.submit("s1", "hi", principal=ROB)
        await runtime.set_budget_limit(
            BudgetLimit(scope="organisation", organisation="acme", usd=10.0)
        )
        await runtime.submit("s1", "hi", principal=ROB)
        with pytest.raises(BudgetExceededError):  # the department's limit still binds
            await runtime.submit("s2", "hi", principal=ALICE)


async def test_attachments_need_an_indexed_copy(tmp_path: Path) -> None:
    states: dict[str, DocumentState] = {"d1": "indexed", "d2": "reading", "d3": "missing"}

    async def resolve(document: str, principal: Principal | None) -> DocumentState:
        return states.get(document, "missing")

    async with _runtime(tmp_path, documents=resolve) as runtime:
        with pytest.raises(AttachmentNotIndexedError) as refused:
            await runtime.submit("s1", "hi", principal=ALICE, documents=["d1", "d3"])
        assert refused.value.document == "d3"
        await _nothing_written(runtime)
        sub = await runtime.submit("s1", "hi", principal=ALICE, documents=["d1", "d2"])
        assert (await runtime.turn(sub.turn_id)).pinned["documents"] == ["d1", "d2"]
    async with _runtime(tmp_path) as runtime:
        with pytest.raises(InvalidInputError, match="resolver"):
            await runtime.submit("s9", "hi", principal=ALICE, documents=["d1"])


async def test_checks_run_in_order_and_the_first_failure_wins(tmp_path: Path) -> None:
    seen: list[str] = []

    def recording(name: str, *, refuse: bool = False) -> object:
        async def check(request: AdmissionRequest) -> None:
            seen.append(f"{name}:{request.agent.name if request.agent else None}")
            if refuse:
                raise AdmissionRefusedError(f"{name} says no")

        return check

    checks = [
        AdmissionCheck(name="first", check=recording("first"), before="department"),  # type: ignore[arg-type]
        AdmissionCheck(name="after-vis", check=recording("after-vis"), after="visibility"),  # type: ignore[arg-type]
        AdmissionCheck(name="late", check=recording("late", refuse=True), after="attachments"),  # type: ignore[arg-type]
    ]
    async with _runtime(tmp_path, admission=checks) as runtime:
        with pytest.raises(AdmissionRefusedError, match="late says no"):
            await runtime.submit("s1", "hi", principal=ALICE)
        assert seen == ["first:None", "after-vis:helper", "late:helper"]
        await _nothing_written(runtime)
        # A department that fails stops the chain before any later check runs, even one
        # that would also fail (the blocked model).
        seen.clear()
        with pytest.raises(DepartmentUnknownError):
            await runtime.submit("s1", "hi", model="big", principal=NOBODY_KNOWS)
        assert seen == ["first:None"]


def test_an_app_check_names_one_position() -> None:
    async def noop(request: AdmissionRequest) -> None:
        return None

    with pytest.raises(ConfigurationError, match="exactly one"):
        AdmissionCheck(name="x", check=noop)
    with pytest.raises(ConfigurationError, match="not one of"):
        AdmissionCheck(name="x", check=noop, after="payment")  # type: ignore[arg-type]
