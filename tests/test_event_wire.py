"""The published event schema describes what goes on the wire, event by event."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from jsonschema import Draft202012Validator

from tests.conftest import RuntimeFactory
from turnkit import Agent, ToolContext, tool
from turnkit.blocks import ImagePart, TextPart, ToolResultBlock
from turnkit.events import TurnStartedEvent, encode_event
from turnkit.ids import ToolCallId
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

SCHEMA = Path(__file__).parent.parent / "docs" / "reference" / "events.schema.json"
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@tool
async def measure(n: int, ctx: ToolContext) -> dict[str, float]:
    """Measure something slowly."""
    await ctx.report_progress(0.5, "half way")
    return {"n": n, "ratio": 1.5}


async def test_every_event_of_a_turn_fits_the_published_schema(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("measure", n=2), call("nope"), text="Measuring."),
            ModelStep.text_reply("It is **2**.", thinking="the tool said 2"),
        ]
    )
    agent = Agent(model=model, tools=[measure], skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)
    message = [TextPart(text="What is in the picture?"), ImagePart(data=PIXEL)]
    events = await collect_events(runtime.execute_message("s1", message))

    schema = json.loads(SCHEMA.read_text())
    validator = Draft202012Validator(schema)
    wire = [json.loads(encode_event(e)) for e in events]
    for item in wire:
        problems = [p.message for p in validator.iter_errors(item)]
        assert problems == [], (item["type"], problems)
    kinds = {item["type"] for item in wire}
    assert {"turn.started", "tool.started", "tool.failed", "job.progress", "done"} <= kinds
    assert {"message.delta", "message.complete"} <= kinds
    # The picture travels as base64, as the schema says (`contentEncoding`), not as bytes.
    [started] = [item for item in wire if item["type"] == "turn.started"]
    [picture] = started["attachments"]
    assert base64.b64decode(picture["data"]) == PIXEL
    data = schema["$defs"]["ImagePart"]["properties"]["data"]["anyOf"][0]
    assert data == {"type": "string", "contentEncoding": "base64"}


def test_the_durable_union_holds_every_durable_event_and_nothing_else() -> None:
    import typing

    from turnkit.events import DurableEvent, DurableStreamEvent, StreamEvent

    every = typing.get_args(typing.get_args(StreamEvent)[0])
    assert set(typing.get_args(DurableStreamEvent)) == {
        cls for cls in every if issubclass(cls, DurableEvent)
    }


def test_a_result_whose_arguments_nobody_changed_is_written_as_before() -> None:
    """A reader of an earlier version (events forbid unknown fields) still reads it."""
    plain = ToolResultBlock(tool_call_id=ToolCallId("c1"), tool_name="t", output="x")
    edited = plain.model_copy(update={"arguments": {"to": "ada"}})
    assert "arguments" not in json.loads(plain.model_dump_json())
    assert json.loads(edited.model_dump_json())["arguments"] == {"to": "ada"}


def test_a_text_block_says_filtered_only_when_the_filter_cut_it() -> None:
    """A block the filter did not cut carries no `filtered` key, so a turnkit from before
    the field (which refuses unknown keys) still reads every other answer; a cut one
    carries it and reads back the same."""
    from turnkit.blocks import TextBlock
    from turnkit.events import MessageCompleteEvent, decode_event

    def complete(block: TextBlock) -> MessageCompleteEvent:
        return MessageCompleteEvent.model_validate(
            {
                "turn_id": "turn_1",
                "session_id": "s",
                "seq": 3,
                "ts": "2026-12-07T00:00:00Z",
                "stage_id": "synthesize",
                "generation_id": "g1",
                "block": block,
            }
        )

    whole = encode_event(complete(TextBlock(block_id="b1", text="All of it.", is_answer=True)))
    assert "filtered" not in json.loads(whole)["block"]
    cut = complete(TextBlock(block_id="b1", text="Here is", is_answer=True, filtered=True))
    wire = json.loads(encode_event(cut))
    assert wire["block"]["filtered"] is True
    assert decode_event(encode_event(cut)) == cut


def test_stored_rows_leave_out_what_they_do_not_fill() -> None:
    """An audit row names only the payload slots it fills, and a turn's summary has no
    `asked` when it asked nobody: a turnkit from before a slot or field was added (its
    models refuse unknown keys) reads every row and summary that does not use it."""
    from turnkit.audit import AskedTurnPayload, AuditPayloads
    from turnkit.events import AskedUsage
    from turnkit.store import RunSummary

    assert json.loads(AuditPayloads().model_dump_json(by_alias=True)) == {}
    spent = AskedTurnPayload(
        tool_call_id=ToolCallId("call_1"),
        agent="shipping",
        session_id="tk-sub.1",
        turn_id="turn_2",
        status="succeeded",
        model_calls=2,
        cost_usd=0.75,
    )
    filled = json.loads(AuditPayloads(askedTurn=spent).model_dump_json(by_alias=True))
    assert list(filled) == ["askedTurn"]
    assert AuditPayloads.model_validate(filled).asked_turn == spent
    plain = RunSummary(status="succeeded", model_calls=1)
    assert "asked" not in json.loads(plain.model_dump_json())
    asked = RunSummary(status="succeeded", asked=AskedUsage(turns=1, model_calls=2))
    assert RunSummary.model_validate_json(asked.model_dump_json()) == asked


def test_the_message_of_turn_started_is_described_in_the_schema() -> None:
    fields = TurnStartedEvent.model_json_schema()["properties"]
    assert fields["content"]["description"] == "The user's message."
    assert fields["attachments"]["description"] == "Pictures the person attached to the message."
