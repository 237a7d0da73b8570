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
from turnkit.projection import project

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
