"""The projection folds a turn's committed events into what a person sees."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from turnkit.blocks import TextBlock, ToolResultBlock, ToolUseBlock, UserBlock
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    InputGuidedEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    RunFinishedEvent,
    Task,
    TasksUpdatedEvent,
    ToolCompletedEvent,
    ToolStartedEvent,
    TurnStartedEvent,
)
from turnkit.ids import ToolCallId, TurnId
from turnkit.projection import QueuedInput, project, project_session

TURN = TurnId("turn_1")


def _stamp(seq: int | None = None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "session_id": "s1",
        "turn_id": TURN,
        "stage_id": "tool-loop",
        "ts": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return {**base, "seq": seq} if seq is not None else base


CALL = ToolCallId("call_1")
LOG = [
    TurnStartedEvent(**_stamp(1), content="delete x", agent="a", model="m", effort="off"),
    MessageCompleteEvent(**_stamp(2), block=TextBlock(block_id="b1", text="Deleting.")),
    ToolStartedEvent(
        **_stamp(3),
        block=ToolUseBlock(tool_call_id=CALL, tool_name="rm", arguments={"p": "x"}),
        idempotency_key="k",
    ),
    ApprovalRequestedEvent(
        **_stamp(4),
        request_id="req_1",
        tool_call_id=CALL,
        tool_name="rm",
        arguments={"p": "x"},
        summary="rm x",
    ),  # fmt: skip
]


def test_a_paused_turn_waits_for_its_card() -> None:
    view = project(TURN, LOG)
    assert view.status == "awaiting_approval"
    assert view.pending is not None
    assert (view.pending.request_id, view.pending.seq) == ("req_1", 4)
    assert [type(b) for b in view.blocks] == [UserBlock, TextBlock, ToolUseBlock]
    assert view.answer is None
    assert not view.settled


def test_the_turn_going_on_clears_the_card_and_run_finished_settles_it() -> None:
    rest = [
        ToolCompletedEvent(
            **_stamp(5), tool_call_id=CALL, duration_ms=1.0, tool_name="rm",
            result=ToolResultBlock(tool_call_id=CALL, tool_name="rm", output="ok"),
        ),
        InputGuidedEvent(**_stamp(6), content="also y", input_seq=2),
        TasksUpdatedEvent(**_stamp(7), tasks=(Task(id="t1", title="rm", status="done"),)),
        MessageDeltaEvent(**_stamp(), block_id="b2", text="ignored: ephemeral"),
        MessageCompleteEvent(
            **_stamp(8), block=TextBlock(block_id="b2", text="Done.", is_answer=True)
        ),
        RunFinishedEvent(
            **_stamp(9), status="succeeded", attempt=1, model="m", model_calls=2,
            input_tokens=10, output_tokens=4, cost_usd=0.002, duration_ms=5.0,
        ),
        DoneEvent(**_stamp(10), status="succeeded"),
    ]  # fmt: skip
    view = project(TURN, [*LOG, *rest])
    assert view.pending is None
    assert view.status == "succeeded"
    assert view.settled
    assert view.cost_usd == 0.002
    assert view.answer == "Done."
    assert [t.status for t in view.tasks] == ["done"]
    assert [s.content for s in view.segments] == ["delete x", "also y"]
    assert view.segments[1].blocks[-1] == TextBlock(block_id="b2", text="Done.", is_answer=True)
    assert view.last_seq == 10


def _turn(turn_id: str, *events: Any) -> tuple[TurnId, list[Any]]:
    return TurnId(turn_id), [e.model_copy(update={"turn_id": turn_id}) for e in events]


def _started(seq_in_session: int, content: str, request_id: str | None = None) -> Any:
    return TurnStartedEvent(
        **_stamp(1), content=content, agent="a", model="m", effort="off",
        input_seq=seq_in_session, request_id=request_id,
    )  # fmt: skip


ANSWERED = MessageCompleteEvent(
    **_stamp(2), block=TextBlock(block_id="b9", text="Here.", is_answer=True)
)
FINISHED = RunFinishedEvent(
    **_stamp(3), status="succeeded", attempt=1, model="m", model_calls=1,
    input_tokens=1, output_tokens=1, duration_ms=1.0,
)  # fmt: skip


def test_the_queue_drains_at_run_finished_not_when_the_answer_arrives() -> None:
    waiting = _turn("t2", _started(2, "and then this", request_id="r2"))
    answered = project_session([_turn("t1", _started(1, "first"), ANSWERED), waiting])
    assert [t.turn_id for t in answered.turns] == ["t1"]
    [queued] = answered.queue
    assert (queued.turn_id, queued.content, queued.delivery) == ("t2", "and then this", "queue")
    assert (queued.input_seq, queued.request_id) == (2, "r2")
    assert answered.live is not None
    assert answered.live.turn_id == "t1"

    settled = project_session([_turn("t1", _started(1, "first"), ANSWERED, FINISHED), waiting])
    assert settled.queue == ()
    assert [t.turn_id for t in settled.turns] == ["t1", "t2"]
    assert settled.live is not None
    assert settled.live.turn_id == "t2"


def test_guides_queue_until_the_live_turn_takes_them() -> None:
    guides = [
        QueuedInput(turn_id=TurnId("t1"), input_seq=2, content="also B", delivery="guide"),
        QueuedInput(turn_id=TurnId("t1"), input_seq=3, content="and C", delivery="guide"),
    ]
    took_b = InputGuidedEvent(**_stamp(2), content="also B", input_seq=2)
    view = project_session([_turn("t1", _started(1, "check A"), took_b)], guides)
    assert [(q.content, q.delivery) for q in view.queue] == [("and C", "guide")]
    assert [s.input_seq for s in view.turns[0].segments] == [1, 2]

    # The turn ended without taking C: C is no longer the turn's (it gets a turn of its own).
    ended = _turn("t1", _started(1, "check A"), took_b, FINISHED.model_copy(update={"seq": 3}))
    assert project_session([ended], guides).queue == ()


def test_the_session_view_lists_what_its_turns_wait_for() -> None:
    paused = _turn("t1", *LOG)
    behind = _turn("t2", _started(2, "later"))
    view = project_session([paused, behind])
    assert [p.request_id for p in view.pending] == ["req_1"]
    assert [q.turn_id for q in view.queue] == ["t2"]  # a paused turn holds the queue too
