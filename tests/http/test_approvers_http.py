"""Who answers an approval over HTTP: a role the tool names (not the customer whose session
it is), an admin, or the owner; and the inbox of what a caller may answer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, Header
from httpx_sse import aconnect_sse
from tests.support.server import serve

from turnkit import (
    Agent,
    Organisation,
    Principal,
    RuntimeConfig,
    SessionRuntime,
    ToolContext,
    tool,
)
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.quickstart import create_app
from turnkit.runtime.answerers import answer_deps
from turnkit.runtime.deps import NO_DEPS
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"
REFUNDS: list[int] = []


def over_fifty(name: str, args: Mapping[str, Any]) -> bool:
    return bool(args["amount"] > 50)


@tool(approval=over_fifty, approver_role="supervisor")
async def refund(order_id: str, amount: int) -> str:
    """Refund part of an order (a supervisor approves more than 50)."""
    REFUNDS.append(amount)
    return f"refunded {amount} on {order_id}"


@tool(approval="always")
async def cancel_order(order_id: str) -> str:
    """Cancel an order (the customer confirms)."""
    return f"cancelled {order_id}"


async def _caller(
    x_user: Annotated[str, Header()],
    x_org: Annotated[str, Header()] = "acme",
    x_role: Annotated[str | None, Header()] = None,
) -> Principal:
    roles = frozenset({x_role}) if x_role else frozenset()
    return Principal(id=x_user, organisation=x_org, roles=roles)


CUSTOMER = {"x-user": "cust"}
SUPERVISOR = {"x-user": "sup", "x-role": "supervisor"}
ELSEWHERE = {"x-user": "sup2", "x-org": "other", "x-role": "supervisor"}
ADMIN = {"x-user": "boss", "x-role": "admin"}
COLLEAGUE = {"x-user": "bob"}


@contextlib.asynccontextmanager
async def _served(
    tmp_path: Path, steps: list[ModelStep], auth: Any = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A quickstart app for an agent with both tools, in organisations acme and other."""
    REFUNDS.clear()
    model = ScriptedModel(steps)
    agent = Agent(model=model, tools=[refund, cancel_order], skip_stages=frozenset({"anchor-plan"}))
    runtime = SessionRuntime(
        agent=agent,
        tenancy=[Organisation(name="acme"), Organisation(name="other")],
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'approvers.db'}"),
    )
    with serve(create_app(runtime, auth=auth or _caller)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    steps = [
        ModelStep.tool_call_reply(call("refund", order_id="A1", amount="80")),
        ModelStep.text_reply("Refunded."),
        ModelStep.tool_call_reply(call("cancel_order", order_id="A2")),
        ModelStep.text_reply("Cancelled."),
    ]
    async with _served(tmp_path, steps) as client:
        yield client


async def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in response.text.splitlines()
        if line.startswith("data: {") and '"seq"' in line
    ]


async def _paused(
    http: httpx.AsyncClient, session: str, text: str, headers: Mapping[str, str] = CUSTOMER
) -> dict[str, Any]:
    """Execute a message and read its stream up to the pause (which waits: it stays open)."""
    url = f"{API}/sessions/{session}/execute"
    body = {"content": text}
    async with aconnect_sse(http, "POST", url, json=body, headers=dict(headers)) as sse:
        sse.response.raise_for_status()
        async for event in sse.aiter_sse():
            data = json.loads(event.data)
            if data.get("type") == "approval.requested":
                return dict(data)
    raise AssertionError("the stream ended before the pause")


def _answer(asked: Mapping[str, Any], decision: str = "approve") -> tuple[str, dict[str, str]]:
    url = f"{API}/turns/{asked['turn_id']}/approvals/{asked['request_id']}"
    return url, {"decision": decision}


async def test_a_refund_a_supervisor_answers_is_not_the_customers_to_approve(
    http: httpx.AsyncClient,
) -> None:
    asked = await _paused(http, "s1", "refund A1")
    assert asked["approver_role"] == "supervisor"
    url, body = _answer(asked)

    refused = await http.post(url, json=body, headers=CUSTOMER)
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "approver-required"
    assert "'supervisor'" in refused.json()["detail"]
    for stranger in (COLLEAGUE, ELSEWHERE):  # cannot even see the turn
        hidden = await http.post(url, json=body, headers=stranger)
        assert (hidden.status_code, hidden.json()["code"]) == (404, "turn-not-found")
    turn = await http.get(f"{API}/turns/{asked['turn_id']}", headers=CUSTOMER)
    assert turn.json()["status"] == "awaiting_approval"  # nothing was answered
    assert REFUNDS == []

    inbox = (await http.get(f"{API}/pauses", headers=SUPERVISOR)).json()["pending"]
    assert [(p["requestId"], p["sessionId"], p["approverRole"]) for p in inbox] == [
        (asked["request_id"], "s1", "supervisor")
    ]
    for nobody in (CUSTOMER, COLLEAGUE, ELSEWHERE):
        assert (await http.get(f"{API}/pauses", headers=nobody)).json()["pending"] == []

    typo = {"decision": "approve", "arguments": {"order_id": "A1", "amount": "lots"}}
    refused = await http.post(url, json=typo, headers=SUPERVISOR)  # the pause stays open
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid-input")
    assert "do not fit 'refund'" in refused.json()["detail"]
    ok = await http.post(url, json=body, headers=SUPERVISOR)
    assert ok.status_code == 202, ok.text
    rest = await http.get(f"{API}/turns/{asked['turn_id']}/stream", headers=CUSTOMER)
    assert [e["type"] for e in await _events(rest)][-1] == "done"
    assert REFUNDS == [80]
    audit = (await http.get(f"{API}/turns/{asked['turn_id']}/audit", headers=CUSTOMER)).json()
    answers = [r["payloads"]["pauseAnswer"] for r in audit["rows"]
               if r["payloads"].get("pauseAnswer")]  # fmt: skip
    assert [(a["by"], a["decision"]) for a in answers] == [("sup", "approve")]
    again = await http.post(url, json=body, headers=SUPERVISOR)
    assert (again.status_code, again.json()["code"]) == (409, "pause-already-answered")


async def test_an_approval_with_no_role_is_the_owners_alone(
    http: httpx.AsyncClient,
) -> None:
    first = await _paused(http, "s2", "refund A1")
    url, body = _answer(first)
    assert (await http.post(url, json=body, headers=SUPERVISOR)).status_code == 202
    await http.get(f"{API}/turns/{first['turn_id']}/stream", headers=CUSTOMER)
    asked = await _paused(http, "s2", "cancel A2")
    assert "approver_role" not in asked  # left out unset, as earlier readers expect
    url, body = _answer(asked)
    mine = (await http.get(f"{API}/pauses", headers=CUSTOMER)).json()["pending"]
    assert [p["requestId"] for p in mine] == [asked["request_id"]]
    for stranger in (SUPERVISOR, ADMIN):  # not a role's call: nobody else's to answer
        hidden = await http.post(url, json=body, headers=stranger)
        assert hidden.status_code == 404
        assert (await http.get(f"{API}/pauses", headers=stranger)).json()["pending"] == []
    by_owner = await http.post(url, json=body, headers=CUSTOMER)
    assert by_owner.status_code == 202, by_owner.text


async def test_a_stop_over_http_records_who_ended_the_wait(http: httpx.AsyncClient) -> None:
    asked = await _paused(http, "s4", "refund A1")
    stop = await http.post(f"{API}/turns/{asked['turn_id']}/cancel", headers=CUSTOMER)
    assert stop.json()["status"] == "cancelled"
    audit = (await http.get(f"{API}/turns/{asked['turn_id']}/audit", headers=CUSTOMER)).json()
    answers = [r["payloads"]["pauseAnswer"] for r in audit["rows"]
               if r["payloads"].get("pauseAnswer")]  # fmt: skip
    assert [(a["by"], a["decision"]) for a in answers] == [("cust", "stopped")]


async def test_an_ag_ui_resume_by_the_customer_is_refused_for_a_supervisors_approval(
    http: httpx.AsyncClient,
) -> None:
    message = {"id": "m1", "role": "user", "content": "refund A1"}
    run = {"threadId": "t1", "runId": "r1", "messages": [message]}
    first = await http.post("/api/agui/run", json=run, headers=CUSTOMER)
    frames = [json.loads(x[6:]) for x in first.text.splitlines() if x.startswith("data: ")]
    (interrupt,) = frames[-1]["outcome"]["interrupts"]
    assert interrupt["metadata"]["turnkit"]["approverRole"] == "supervisor"
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    again = {"threadId": "t1", "runId": "r2", "messages": [], "resume": resume}
    refused = await http.post("/api/agui/run", json=again, headers=CUSTOMER)
    assert (refused.status_code, refused.json()["code"]) == (403, "approver-required")
    assert REFUNDS == []


ANONYMOUS: dict[str, str] = {}


async def _anonymous_or(
    x_user: Annotated[str | None, Header()] = None,
    x_org: Annotated[str, Header()] = "acme",
    x_role: Annotated[str | None, Header()] = None,
) -> Principal | None:
    return None if x_user is None else await _caller(x_user, x_org, x_role)


@pytest.mark.parametrize(
    "who",
    [
        {"x-user": "sup2", "x-org": "other", "x-role": "supervisor"},
        {"x-user": "boss2", "x-org": "other", "x-role": "admin"},
    ],
)
async def test_a_role_of_another_organisation_answers_no_unowned_sessions_approval(
    tmp_path: Path, who: dict[str, str]
) -> None:
    """An anonymous customer's session belongs to no organisation: the turn's (the one its
    message was admitted in) decides who holds the role, not the session's."""
    steps = [ModelStep.tool_call_reply(call("refund", order_id="A1", amount=80))]
    async with _served(tmp_path, steps, _anonymous_or) as http:
        asked = await _paused(http, "u1", "refund A1", ANONYMOUS)
        answer_url, body = _answer(asked)
        refused = await http.post(answer_url, json=body, headers=who)  # it sees the
        assert refused.status_code == 403, refused.text  # session: nobody owns it
        inbox = await http.get(f"{API}/pauses", headers=who)
        assert inbox.json()["pending"] == []
    assert REFUNDS == []


async def test_the_inbox_finds_what_the_caller_answers_behind_what_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import turnkit.http._access as access

    monkeypatch.setattr(access, "_PAGE", 1)  # one paused turn a page: as with many
    steps = [
        ModelStep.tool_call_reply(call("cancel_order", order_id="A1")),
        ModelStep.tool_call_reply(call("cancel_order", order_id="A2")),
        ModelStep.tool_call_reply(call("refund", order_id="A3", amount=80)),
    ]
    async with _served(tmp_path, steps) as http:
        await _paused(http, "s1", "cancel A1")  # the customers' own approvals
        await _paused(http, "s2", "cancel A2")
        asked = await _paused(http, "s3", "refund A3")
        inbox = (await http.get(f"{API}/pauses", headers=SUPERVISOR)).json()["pending"]
        mine = (await http.get(f"{API}/pauses?limit=1", headers=CUSTOMER)).json()["pending"]
    assert [p["requestId"] for p in inbox] == [asked["request_id"]]
    assert [p["sessionId"] for p in mine] == ["s1"]


@dataclass(frozen=True)
class Wallet:
    """An app's deps: whose account a refund is paid from, and who built them."""

    account: str
    built_by: str


PAID_FROM: list[Wallet] = []


@tool(approval=over_fifty, approver_role="supervisor")
async def refund_from_wallet(order_id: str, amount: int, ctx: ToolContext[Wallet]) -> str:
    """Refund part of an order from the caller's wallet (a supervisor approves more than 50)."""
    PAID_FROM.append(ctx.deps)
    return f"refunded {amount} on {order_id} from {ctx.deps.account}"


async def _request_wallet(x_user: Annotated[str, Header()]) -> Wallet:
    return Wallet(account=f"wallet-of-{x_user}", built_by="request")


async def test_a_supervisors_answer_runs_the_tool_with_the_customers_deps(
    tmp_path: Path,
) -> None:
    """The approving request's deps are the supervisor's: the refund must not be paid from
    their wallet."""
    PAID_FROM.clear()
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("refund_from_wallet", order_id="A1", amount=80)),
        ModelStep.text_reply("Refunded."),
        ModelStep.tool_call_reply(call("refund_from_wallet", order_id="A2", amount=10)),
        ModelStep.text_reply("Refunded too."),
    ])  # fmt: skip
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[refund_from_wallet]),
        tenancy=[Organisation(name="acme")],
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'wallets.db'}"),
        deps=lambda scope: Wallet(account=f"wallet-of-{scope.principal}", built_by="factory"),
    )
    app = FastAPI(lifespan=lambda _: _opened(runtime))
    app.include_router(create_turnkit_router(runtime, auth=_caller, deps=_request_wallet))
    install_problem_handlers(app)
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            asked = await _paused(http, "s1", "refund A1")
            url_, body = _answer(asked)
            assert (await http.post(url_, json=body, headers=SUPERVISOR)).status_code == 202
            rest = await http.get(f"{API}/turns/{asked['turn_id']}/stream", headers=CUSTOMER)
            assert [e["type"] for e in await _events(rest)][-1] == "done"
            small = await http.post(  # no approval: the customer's own request runs it
                f"{API}/sessions/s1/execute", json={"content": "refund A2"}, headers=CUSTOMER
            )
            assert small.status_code == 200
            turn = await runtime.turn(asked["turn_id"])
    # The customer's own request's deps, kept in the process for the turn they started
    # (another process builds theirs with the factory, as a worker does); never the
    # supervisor's.
    assert [Wallet(account="wallet-of-cust", built_by="request")] * 2 == PAID_FROM
    model.assert_complete()
    assert answer_deps(turn, "cust", "theirs") == NO_DEPS  # a bare id: not the sender ...
    customer = Principal(id="cust", organisation="acme")
    assert answer_deps(turn, customer, "theirs") == "theirs"  # ... the whole principal is


@contextlib.asynccontextmanager
async def _opened(runtime: SessionRuntime) -> AsyncIterator[None]:
    async with runtime:
        yield
