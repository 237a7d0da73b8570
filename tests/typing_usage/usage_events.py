"""The event stream and the audit as a user reads them (type-checked, never run)."""

from __future__ import annotations

from typing import assert_type

from pydantic import JsonValue

from turnkit import SessionRuntime, StreamEvent
from turnkit.audit import AuditRow, FallbackStepPayload
from turnkit.errors import ErrorCode
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    DurableStreamEvent,
    ErrorEvent,
    MessageDeltaEvent,
    ToolCompletedEvent,
    decode_event,
    encode_event,
)
from turnkit.states import TerminalStatus


async def answer(runtime: SessionRuntime) -> str:
    text = ""
    async for event in runtime.execute_message("s1", "hi"):
        match event:
            case MessageDeltaEvent(text=delta):
                assert_type(delta, str)
                text += delta
            case ToolCompletedEvent() as completed:
                assert_type(completed.result.output, JsonValue)
            case ApprovalRequestedEvent(request_id=request_id, arguments=arguments):
                assert_type(request_id, str)
                assert_type(arguments, dict[str, JsonValue])
            case ErrorEvent(code=code):
                assert_type(code, ErrorCode)
            case DoneEvent(status=status):
                assert_type(status, TerminalStatus)
            case _:
                pass
        if event.type == "done":
            assert_type(event, DoneEvent)
            assert_type(event.error_code, ErrorCode | None)
        print(event.status)  # type: ignore[union-attr]  # not narrowed: most events have none
    return text


async def replay(runtime: SessionRuntime, turn_id: str) -> None:
    async for stored in runtime.events(turn_id):
        assert_type(stored, DurableStreamEvent)
        assert_type(stored.seq, int)
    async for event in runtime.follow(turn_id, after_seq=3):
        assert_type(decode_event(encode_event(event)), StreamEvent)


async def audit(runtime: SessionRuntime, turn_id: str) -> None:
    rows = await runtime.audit(turn_id)
    assert_type(rows, list[AuditRow])
    for row in rows:
        if row.call is not None:
            assert_type(row.call.model, str)
            assert_type(row.call.cost_usd, float)
        step = row.payloads.fallback_step
        if step is not None:
            assert_type(step, FallbackStepPayload)
            assert_type(step.to_model, str | None)
