"""An agent asked as a tool that waits for a person: the asking turn waits with it, the
person answers there, and the answer goes on to the asked agent's turn."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header
from httpx_sse import aconnect_sse

from tests.support.server import serve
from tests.test_agent_tools import SLOW, _crashing, _leave_while_the_specialist_works
from turnkit import (
    Agent,
    Answer,
    Approve,
    Deny,
    Principal,
    RuntimeConfig,
    SessionRuntime,
    tool,
)
from turnkit.cli import main
from turnkit.errors import InvalidInputError
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
    StreamEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
)
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.ids import SessionId
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

REFUNDED: list[tuple[str, int]] = []


@tool(approval="always")
async def refund(order_id: str, amount_eur: int) -> str:
    """Refund an order."""
    REFUNDED.append((order_id, amount_eur))
    return f"refunded {amount_eur} EUR on {order_id}"


@pytest.fixture(autouse=True)
def _no_refunds_yet() -> None:
    REFUNDED.clear()


def _refunds(*steps: ModelStep, **kwargs: object) -> Agent:
    return Agent(
        name="refunds",
        instructions="You refund orders.",
        model=ScriptedModel(list(steps)),
        tools=[refund],
        **kwargs,  # type: ignore[arg-type]
    )


def _front(*asked: Agent, steps: list[ModelStep]) -> Agent:
    return Agent(
        name="front-desk",
        model=ScriptedModel(steps),
        tools=[agent.as_tool() for agent in asked],
    )


def _one_refund(text: str = "Refunded 20 EUR on A1.") -> Agent:
    return _refunds(
        ModelStep.tool_call_reply(call("refund", order_id="A1", amount_eur=20)),
        ModelStep.text_reply(text),
    )


def _asking_once(specialist: Agent, answer: str = "Done.") -> Agent:
    return _front(
        specialist,
        steps=[
            ModelStep.tool_call_reply(call(specialist.name, message="Refund order A1, 20 EUR")),
            ModelStep.text_reply(answer),
        ],
    )


def _runtime(tmp_path: Path, agent: Agent, **config: object) -> SessionRuntime:
    url = f"sqlite:///{tmp_path / 'pauses.db'}"
    return SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url, **config))  # type: ignore[arg-type]


def _ended(events: list[StreamEvent]) -> DoneEvent:
    done = events[-1]
    assert isinstance(done, DoneEvent), done
    return done


async def test_the_asked_agents_approval_is_answered_in_the_asking_turn(tmp_path: Path) -> None:
    front = _asking_once(_one_refund(), "Your refund went through.")
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1", principal="ann"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        assert (asked.tool_name, asked.arguments) == (
            "refund",
            {"order_id": "A1", "amount_eur": 20},
        )
        assert asked.summary == 'refunds: Run refund with amount_eur=20, order_id="A1"'
        assert asked.asked.agent == "refunds"
        assert asked.asked.session_id.startswith("tk-sub.")
        assert REFUNDED == []  # nothing ran before a person said so
        front_turn = await runtime.turn(asked.turn_id)
        asked_turn = await runtime.store.get_turn(asked.asked.turn_id)
        assert front_turn.status == "awaiting_approval"
        assert asked_turn is not None
        assert asked_turn.status == "awaiting_approval"
        [card] = await runtime.pending("s1")
        assert card.asked == asked.asked
        assert card.tool_name == "refund"

        await runtime.resume(asked.turn_id, asked.request_id, Approve(), principal="sam")
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
        [answered] = [e for e in rest if isinstance(e, ApprovalAnsweredEvent)]
        [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
        assert _ended(rest).status == "succeeded"
        asked_events = [e async for e in runtime.events(asked.asked.turn_id)]
        asked_audit = await runtime.audit(asked.asked.turn_id)
        seqs = [e.seq for e in [*events, *rest] if hasattr(e, "seq")]
    assert answered.request_id == asked.request_id
    assert answered.decision == "approve"
    assert completed.result.output == "Refunded 20 EUR on A1."
    assert REFUNDED == [("A1", 20)]  # once
    assert seqs == list(range(1, len(seqs) + 1))  # the asking turn's log has no gap
    assert _ended(asked_events).status == "succeeded"
    [its_answer] = [e for e in asked_events if isinstance(e, ApprovalAnsweredEvent)]
    assert its_answer.decision == "approve"
    answers = [r.payloads.pause_answer for r in asked_audit if r.payloads.pause_answer]
    assert [(a.by, a.decision) for a in answers] == [("sam", "approve")]


async def test_a_denial_goes_on_to_the_asked_agent_which_answers_without_the_call(
    tmp_path: Path,
) -> None:
    specialist = _one_refund("I could not refund A1: a person said no.")
    async with _runtime(tmp_path, _asking_once(specialist, "No refund.")) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, Deny(note="over the limit"))
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
        assert asked.asked is not None
        asked_events = [e async for e in runtime.events(asked.asked.turn_id)]
    [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "I could not refund A1: a person said no."
    [denied] = [e for e in asked_events if isinstance(e, ToolFailedEvent)]
    assert denied.code == "tool-denied"
    assert "over the limit" in (denied.result.error or "")
    assert REFUNDED == []
    [answered] = [e for e in rest if isinstance(e, ApprovalAnsweredEvent)]
    assert (answered.decision, answered.note) == ("deny", "over the limit")


async def test_the_asked_agents_question_is_asked_in_the_asking_turn(tmp_path: Path) -> None:
    asker = Agent(
        name="refunds",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(
                    call("ask_user", question="Which order?", choices=["A1", "B2"])
                ),
                ModelStep.text_reply("Refunding B2."),
            ]
        ),
        clarifications=True,  # once refused as a tool: nobody was there to answer
    )
    async with _runtime(tmp_path, _asking_once(asker)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund my order"))
        asked = events[-1]
        assert isinstance(asked, ClarificationRequestedEvent)
        assert (asked.question, asked.choices) == ("Which order?", ("A1", "B2"))
        assert asked.asked is not None
        asking = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
        assert [asked.tool_call_id] == asking  # the call that asked the agent waits
        assert (await runtime.turn(asked.turn_id)).status == "awaiting_input"
        await runtime.resume(asked.turn_id, asked.request_id, Answer(text="B2"))
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "Refunding B2."
    model = asker.model
    assert isinstance(model, ScriptedModel)
    assert "B2" in str(model.calls[1].messages[-1].content)  # the answer reached its model


async def test_each_of_two_approvals_in_a_row_is_handed_over(tmp_path: Path) -> None:
    twice = _refunds(
        ModelStep.tool_call_reply(call("refund", order_id="A1", amount_eur=20)),
        ModelStep.tool_call_reply(call("refund", order_id="B2", amount_eur=5)),
        ModelStep.text_reply("Refunded both."),
    )
    async with _runtime(tmp_path, _asking_once(twice)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund both"))
        first = events[-1]
        assert isinstance(first, ApprovalRequestedEvent)
        await runtime.resume(first.turn_id, first.request_id, Approve())
        more = await collect_events(runtime.follow(first.turn_id, after_seq=first.seq))
        second = more[-1]
        assert isinstance(second, ApprovalRequestedEvent)
        assert second.arguments == {"order_id": "B2", "amount_eur": 5}
        assert second.request_id != first.request_id
        assert REFUNDED == [("A1", 20)]
        await runtime.resume(second.turn_id, second.request_id, Approve())
        rest = await collect_events(runtime.follow(second.turn_id, after_seq=second.seq))
    assert _ended(rest).status == "succeeded"
    assert REFUNDED == [("A1", 20), ("B2", 5)]
    [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "Refunded both."


async def test_changed_arguments_are_checked_by_the_asked_agents_tool(tmp_path: Path) -> None:
    async with _runtime(tmp_path, _asking_once(_one_refund())) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        wrong = Approve(arguments={"order_id": "A1", "amount_eur": "twenty"})
        with pytest.raises(InvalidInputError, match="do not fit 'refund'"):
            await runtime.resume(asked.turn_id, asked.request_id, wrong)
        assert (await runtime.turn(asked.turn_id)).status == "awaiting_approval"
        still = await runtime.store.get_turn(asked.asked.turn_id)
        assert still is not None
        assert still.status == "awaiting_approval"  # nothing was answered, anywhere
        fixed = Approve(arguments={"order_id": "A1", "amount_eur": 5})
        await runtime.resume(asked.turn_id, asked.request_id, fixed)
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    assert _ended(rest).status == "succeeded"
    assert REFUNDED == [("A1", 5)]


@tool(approval="always", approver_role="supervisor")
async def refund_large(order_id: str, amount_eur: int) -> str:
    """Refund a large amount."""
    REFUNDED.append((order_id, amount_eur))
    return f"refunded {amount_eur} EUR on {order_id}"


async def _principal(
    x_user: str = Header(), x_role: str | None = Header(default=None)
) -> Principal:
    return Principal(id=x_user, roles=frozenset({x_role} if x_role else ()))


async def test_the_asked_turns_own_request_is_neither_answered_nor_listed_apart(
    tmp_path: Path,
) -> None:
    """Over HTTP: the asking turn's card carries the asked call's approver role, so the
    customer who owns the session cannot approve a refund only a supervisor may."""
    api = "/api/harness"
    ann = {"x-user": "ann"}
    supervisor = {"x-user": "sam", "x-role": "supervisor"}
    specialist = Agent(
        name="refunds",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refund_large", order_id="A1", amount_eur=20)),
                ModelStep.text_reply("Refunded 20 EUR on A1."),
            ]
        ),
        tools=[refund_large],
    )
    async with _runtime(tmp_path, _asking_once(specialist)) as runtime:
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_principal))
        install_problem_handlers(app)
        with serve(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                body = {"content": "refund A1"}
                execute = f"{api}/sessions/s1/execute"
                async with aconnect_sse(http, "POST", execute, json=body, headers=ann) as sse:
                    async for event in sse.aiter_sse():  # up to the pause: it stays open
                        if json.loads(event.data).get("type") == "approval.requested":
                            break
                inbox = (await http.get(f"{api}/pauses", headers=supervisor)).json()
                [card] = inbox["pending"]  # the asking turn's card only: it stands for both
                assert card["sessionId"] == "s1"
                assert card["asked"]["agent"] == "refunds"
                assert card["approverRole"] == "supervisor"
                inner = card["asked"]
                direct = await http.post(
                    f"{api}/turns/{inner['turnId']}/approvals/{inner['requestId']}",
                    json={"decision": "approve"},
                    headers=supervisor,
                )
                assert direct.status_code == 422
                assert "answered in the asking turn" in direct.json()["detail"]
                approve = f"{api}/turns/{card['turnId']}/approvals/{card['requestId']}"
                by_owner = await http.post(approve, json={"decision": "approve"}, headers=ann)
                assert by_owner.status_code == 403  # the role the refund tool names answers
                assert REFUNDED == []
                answered = await http.post(
                    approve, json={"decision": "approve"}, headers=supervisor
                )
                assert answered.status_code == 202
                deadline = time.monotonic() + 20
                while (await runtime.turn(card["turnId"])).status != "succeeded":
                    assert time.monotonic() < deadline, "the asking turn never finished"
                    await asyncio.sleep(0.05)
    assert REFUNDED == [("A1", 20)]


async def test_stopping_the_waiting_asking_turn_stops_the_asked_one(tmp_path: Path) -> None:
    async with _runtime(tmp_path, _asking_once(_one_refund())) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        assert await runtime.cancel(asked.turn_id) == "cancelled"
        inner = await runtime.store.get_turn(asked.asked.turn_id)
    assert inner is not None
    assert inner.status == "cancelled"  # nobody is left to answer it
    assert REFUNDED == []


async def test_the_waiting_asked_turn_is_stopped_only_through_the_asking_turn(
    tmp_path: Path,
) -> None:
    """A Stop of the asked turn itself would leave the asking turn's card standing for a
    request nobody can answer any more: it is refused, as answering it apart is."""
    async with _runtime(tmp_path, _asking_once(_one_refund())) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        with pytest.raises(InvalidInputError, match="stop the asking turn"):
            await runtime.cancel(asked.asked.turn_id)
        inner = await runtime.store.get_turn(asked.asked.turn_id)
        assert inner is not None
        assert inner.status == "awaiting_approval"  # nothing changed
        [card] = await runtime.pending("s1")  # the card still stands for it
        assert card.asked == asked.asked
        assert await runtime.cancel(asked.turn_id) == "cancelled"
        inner = await runtime.store.get_turn(asked.asked.turn_id)
    assert inner is not None
    assert inner.status == "cancelled"
    assert REFUNDED == []


WORKING: dict[str, asyncio.Event] = {}


@tool
async def look_up(order_id: str) -> str:
    """Look an order up (until the test stops it; at most 20 s)."""
    WORKING["started"].set()
    await asyncio.sleep(20)
    return f"{order_id}: shipped"


async def test_a_working_asked_turn_stopped_on_its_own_fails_only_its_call(
    tmp_path: Path,
) -> None:
    """Not waiting for anyone, the asked turn may be stopped: the asking turn goes on."""
    WORKING["started"] = asyncio.Event()
    slow = Agent(
        name="orders",
        model=ScriptedModel([ModelStep.tool_call_reply(call("look_up", order_id="A1"))]),
        tools=[look_up],
    )
    front = _front(
        slow,
        steps=[
            ModelStep.tool_call_reply(call("orders", message="Where is A1?")),
            ModelStep.text_reply("I could not find out, sorry."),
        ],
    )
    async with _runtime(tmp_path, front) as runtime:
        running = asyncio.create_task(collect_events(runtime.execute_message("s1", "A1?")))
        await asyncio.wait_for(WORKING["started"].wait(), timeout=20)
        [asked_session] = await runtime.store.delegated_sessions(SessionId("s1"))
        [asked_turn] = await runtime.store.list_turns(asked_session)
        assert await runtime.cancel(asked_turn.turn_id) == "cancelled"
        events = await asyncio.wait_for(running, timeout=20)
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.result.error is not None
    assert "its turn" in failed.result.error
    assert "ended cancelled" in failed.result.error
    assert _ended(events).status == "succeeded"


async def test_a_request_handed_over_twice_over_is_answered_all_the_way_down(
    tmp_path: Path,
) -> None:
    """front-desk asks refunds, which asks fraud, whose tool needs a person."""

    @tool(approval="always")
    async def block_card(card: str) -> str:
        """Block a card."""
        REFUNDED.append((card, 0))
        return f"blocked {card}"

    fraud = Agent(
        name="fraud",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("block_card", card="4242")),
                ModelStep.text_reply("Card 4242 blocked."),
            ]
        ),
        tools=[block_card],
    )
    refunds = Agent(
        name="refunds",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("fraud", message="block card 4242")),
                ModelStep.text_reply("Fraud handled; no refund needed."),
            ]
        ),
        tools=[fraud.as_tool()],
    )
    async with _runtime(tmp_path, _asking_once(refunds, "All handled.")) as runtime:
        events = await collect_events(runtime.execute_message("s1", "my card was stolen"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.summary == 'refunds: fraud: Run block_card with card="4242"'
        assert asked.asked is not None
        assert asked.asked.agent == "refunds"
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    assert _ended(rest).status == "succeeded"
    [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "Fraud handled; no refund needed."
    assert REFUNDED == [("4242", 0)]


async def test_two_asked_agents_of_one_batch_wait_one_after_the_other(tmp_path: Path) -> None:
    @tool(approval="always")
    async def reship(order_id: str) -> str:
        """Ship an order again."""
        REFUNDED.append((order_id, -1))
        return f"reshipped {order_id}"

    shipping = Agent(
        name="shipping",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("reship", order_id="A1")),
                ModelStep.text_reply("Reshipped A1."),
            ]
        ),
        tools=[reship],
    )
    front = _front(
        _one_refund(),
        shipping,
        steps=[
            ModelStep.tool_call_reply(
                call("refunds", message="refund A1"), call("shipping", message="reship A1")
            ),
            ModelStep.text_reply("Both done."),
        ],
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "fix A1"))
        first = events[-1]
        assert isinstance(first, ApprovalRequestedEvent)
        assert first.tool_name == "refund"  # the batch's first call's request first
        await runtime.resume(first.turn_id, first.request_id, Approve())
        more = await collect_events(runtime.follow(first.turn_id, after_seq=first.seq))
        second = more[-1]
        assert isinstance(second, ApprovalRequestedEvent)
        assert second.tool_name == "reship"
        await runtime.resume(second.turn_id, second.request_id, Approve())
        rest = await collect_events(runtime.follow(second.turn_id, after_seq=second.seq))
    assert _ended(rest).status == "succeeded"
    outputs = sorted(
        str(e.result.output) for e in [*more, *rest] if isinstance(e, ToolCompletedEvent)
    )
    assert outputs == ["Refunded 20 EUR on A1.", "Reshipped A1."]
    assert sorted(REFUNDED) == [("A1", -1), ("A1", 20)]


async def test_an_api_process_takes_the_answer_and_a_worker_goes_on_on_either_store(
    db: tuple[str, str | None],
) -> None:
    """Production's path: the API process submits and answers; a worker drives the asking
    turn, hands the request over, and takes the asked turn up again after the answer."""
    url, schema = db
    front = _asking_once(_one_refund(), "Refund done.")
    config = RuntimeConfig(database_url=url, database_schema=schema, run_in_process=False)
    async with SessionRuntime(agent=front, config=config) as runtime:
        submission = await runtime.start("s1", "refund A1", principal="ann")
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            deadline = time.monotonic() + 30
            while (await runtime.turn(submission.turn_id)).status != "awaiting_approval":
                assert time.monotonic() < deadline, "the request was never handed over"
                await asyncio.sleep(0.05)
            [card] = await runtime.pending("s1")
            assert card.asked is not None
            await runtime.resume(submission.turn_id, card.request_id, Approve(), principal="ann")
            while (await runtime.turn(submission.turn_id)).status != "succeeded":
                assert time.monotonic() < deadline, "the worker never finished the turn"
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await running
        events = [e async for e in runtime.events(submission.turn_id)]
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "Refunded 20 EUR on A1."
    assert REFUNDED == [("A1", 20)]
    assert card.asked.agent == "refunds"


async def test_a_recovered_asking_turn_hands_over_what_the_joined_agent_waits_for(
    tmp_path: Path,
) -> None:
    """The process goes away while the specialist works; the turn recovered elsewhere
    joins it, and when it stops for an approval the recovered asking turn waits with it."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    turn_id, child = await _leave_while_the_specialist_works(url, None, tools=(refund,))
    SLOW["block"] = False
    second = _crashing(
        url,
        None,
        [
            ModelStep.tool_call_reply(call("refund", order_id="8", amount_eur=5)),
            ModelStep.text_reply("Order 8 refunded."),
        ],
        [ModelStep.text_reply("Refunded.")],
        tools=(refund,),
    )
    async with second:
        deadline = time.monotonic() + 30
        while (await second.turn(turn_id)).status != "awaiting_approval":
            assert time.monotonic() < deadline, "the recovered turn never waited"
            await asyncio.sleep(0.05)
        [card] = await second.pending("s1")
        assert card.asked is not None
        assert card.tool_name == "refund"
        assert REFUNDED == []
        await second.resume(turn_id, card.request_id, Approve())
        while (await second.turn(turn_id)).status != "succeeded":
            assert time.monotonic() < deadline, "the asking turn never finished"
            await asyncio.sleep(0.05)
        events = [e async for e in second.events(turn_id)]
        [asked_turn] = await second.store.list_turns(child)  # joined, never asked again
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "Order 8 refunded."
    assert REFUNDED == [("8", 5)]
    assert asked_turn.status == "succeeded"
    # The call joined the turn it began: not a call whose effect is unknown, run again.
    assert [e for e in events if isinstance(e, ToolInDoubtEvent)] == []


async def test_turnkit_pauses_lists_the_asking_turn_only(tmp_path: Path) -> None:
    async with _runtime(tmp_path, _asking_once(_one_refund())) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
    out = io.StringIO()
    url = f"sqlite:///{tmp_path / 'pauses.db'}"
    code = await asyncio.to_thread(main, ["pauses", "--database-url", url], out=out)
    assert code == 0
    head, request = out.getvalue().splitlines()
    assert head.startswith(f"{asked.turn_id}  awaiting_approval  session s1  agent front-desk")
    asks = "approve or deny: the refunds agent asks: refund(order_id='A1', amount_eur=20)"
    assert asks in request


@tool(approval="always")
async def note(text: str) -> str:
    """Write a note."""
    return f"noted {text}"


async def test_a_handed_request_after_an_own_approval_of_the_batch_gets_its_own_answer(
    tmp_path: Path,
) -> None:
    """The batch's own approval was answered and its call's result committed before the
    asked agent's requests came: each handed request still waits for its own answer."""
    twice = _refunds(
        ModelStep.tool_call_reply(call("refund", order_id="A1", amount_eur=20)),
        ModelStep.tool_call_reply(call("refund", order_id="B2", amount_eur=5)),
        ModelStep.text_reply("Refunded both."),
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(
                    call("note", text="hi"), call("refunds", message="refund A1 and B2")
                ),
                ModelStep.text_reply("Done."),
            ]
        ),
        tools=[note, twice.as_tool()],
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "go"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is None  # the batch's own first
        for expected in ({"order_id": "A1", "amount_eur": 20}, {"order_id": "B2", "amount_eur": 5}):
            await runtime.resume(asked.turn_id, asked.request_id, Approve())
            more = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
            asked = more[-1]
            assert isinstance(asked, ApprovalRequestedEvent)
            assert asked.asked is not None
            assert asked.arguments == expected
            assert ([] if expected["order_id"] == "A1" else [("A1", 20)]) == REFUNDED
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    assert _ended(rest).status == "succeeded"
    assert REFUNDED == [("A1", 20), ("B2", 5)]


POLICY = {"asks": False}


def _changing(name: str, arguments: object) -> bool:
    return POLICY["asks"]  # a flag or a limit the app reads when the call is decided


async def test_a_call_that_handed_a_request_over_keeps_its_own_decision(
    tmp_path: Path,
) -> None:
    """The delegation's policy changes its mind while the person decides: the call is not
    asked about again (that would take the person's answer to the specialist's request)."""
    POLICY["asks"] = False
    front = _front(
        steps=[
            ModelStep.tool_call_reply(call("refunds", message="Refund order A1, 20 EUR")),
            ModelStep.text_reply("Done."),
        ]
    )
    front = dataclasses.replace(front, tools=[_one_refund().as_tool(approval=_changing)])
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
        POLICY["asks"] = True
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        rest = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
        log = [e async for e in runtime.events(asked.turn_id)]
    assert _ended(rest).status == "succeeded"
    assert [e.request_id for e in log if isinstance(e, ApprovalRequestedEvent)] == [
        asked.request_id
    ]
    assert REFUNDED == [("A1", 20)]


async def test_turnkit_pauses_says_when_more_asking_turns_wait(tmp_path: Path) -> None:
    """The asked turns it leaves out do not take the asking turns' places in a page."""
    refund_step = ModelStep.tool_call_reply(call("refund", order_id="A1", amount_eur=20))
    ask = ModelStep.tool_call_reply(call("refunds", message="refund A1"))
    front = _front(_refunds(refund_step, refund_step), steps=[ask, ask])
    async with _runtime(tmp_path, front) as runtime:
        waiting = []
        for session in ("s1", "s2"):
            events = await collect_events(runtime.execute_message(session, "refund A1"))
            assert isinstance(events[-1], ApprovalRequestedEvent)
            waiting.append(events[-1].turn_id)
    out = io.StringIO()
    url = f"sqlite:///{tmp_path / 'pauses.db'}"
    code = await asyncio.to_thread(main, ["pauses", "--limit", "1", "--database-url", url], out=out)
    assert code == 0
    listed = out.getvalue()
    assert waiting[0] in listed
    assert waiting[1] not in listed
    assert listed.endswith("(the first 1; --limit shows more)\n")


async def test_a_stop_of_an_asking_turn_driven_elsewhere_stops_the_asked_one_at_once(
    tmp_path: Path,
) -> None:
    """Answered, the asking turn was taken by a worker of another process: a Stop only
    flags it there, and the asked turn, answered and free to run, is stopped here."""
    async with _runtime(tmp_path, _asking_once(_one_refund())) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.asked is not None
    async with _runtime(tmp_path, _asking_once(_one_refund()), run_in_process=False) as api:
        await api.resume(asked.turn_id, asked.request_id, Approve())
        config = api.config
        lease = await api.store.claim(
            "a-worker-elsewhere",
            ttl_s=config.lease_ttl_s,
            max_attempts=config.max_attempts,
            turn_id=asked.turn_id,
        )
        assert lease is not None
        assert await api.cancel(asked.turn_id) == "running"  # flagged for its driver
        inner = await api.store.get_turn(asked.asked.turn_id)
    assert inner is not None
    assert inner.status == "cancelled"
    assert REFUNDED == []


async def _until_ended(runtime: SessionRuntime, turn_id: str, wait_s: float = 30) -> str:
    async with asyncio.timeout(wait_s):
        while (status := (await runtime.turn(turn_id)).status) in ("running", "queued"):
            await asyncio.sleep(0.05)
    return status


async def test_an_asking_turn_a_deploy_changed_stops_the_asked_one_it_waited_on(
    db: tuple[str, str | None],
) -> None:
    """The asking agent changed while its request waited: the answer ends the asking turn
    `agent-not-found`, and the asked turn stops too, rather than waiting for a driver
    forever, or being recovered and running the refund for nobody."""
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, recover_in_process=True, lease_ttl_s=2
    )
    async with SessionRuntime(agent=_asking_once(_one_refund()), config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    assert asked.asked is not None

    edited = dataclasses.replace(_asking_once(_one_refund()), instructions="Edited.")
    async with SessionRuntime(agent=edited, config=config) as runtime:
        await runtime.resume(asked.turn_id, asked.request_id, Approve(), principal="sam")
        assert await _until_ended(runtime, asked.turn_id) == "failed"
        record = await runtime.turn(asked.turn_id)
        await asyncio.sleep(config.lease_ttl_s * 2)  # room for a recovery loop to take it
        inner = await _until_ended(runtime, asked.asked.turn_id, wait_s=10)
    assert record.error_code == "agent-not-found"
    assert inner == "cancelled"
    assert REFUNDED == []  # nobody reads its answer: it never ran


async def test_an_asking_turn_a_worker_cannot_drive_stops_the_asked_one(tmp_path: Path) -> None:
    """An API process takes the answer (and hands it to the asked turn); the worker that
    drives the asking turn has only the new version of its agent: both turns end."""
    url = f"sqlite:///{tmp_path / 'pauses.db'}"
    first = RuntimeConfig(database_url=url)
    async with SessionRuntime(agent=_asking_once(_one_refund()), config=first) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund A1"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    assert asked.asked is not None

    api = RuntimeConfig(database_url=url, run_in_process=False)
    edited = dataclasses.replace(_asking_once(_one_refund()), instructions="Edited.")
    async with SessionRuntime(agent=edited, config=api) as runtime:
        await runtime.resume(asked.turn_id, asked.request_id, Approve(), principal="sam")
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            assert await _until_ended(runtime, asked.turn_id) == "failed"
            inner = await _until_ended(runtime, asked.asked.turn_id, wait_s=10)
        finally:
            stop.set()
            await running
    assert inner == "cancelled"
    assert REFUNDED == []
