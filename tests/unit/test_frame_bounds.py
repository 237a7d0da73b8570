"""The protocol adapters' frame bound: what a too-large event becomes, and what is kept."""

from __future__ import annotations

import json

import pytest
from sse_starlette import ServerSentEvent

from turnkit.protocols._agui_stream import Bound
from turnkit.protocols._ai_sdk_stream import bounded


def _id_and_event(frame: bytes) -> tuple[str | None, dict[str, object]]:
    """A frame's id (None: none) and its event; one `data:` line, then a blank line."""
    *head, data, blank, end = frame.split(b"\n")
    assert (blank, end) == (b"", b""), frame
    assert data.startswith(b"data: "), frame
    sent_id = head[0].removeprefix(b"id: ").decode() if head else None
    return sent_id, json.loads(data.removeprefix(b"data: "))


@pytest.mark.parametrize("seq", [None, 0, 7, 12_345])
@pytest.mark.parametrize(
    "event",
    [
        {"type": "TEXT_MESSAGE_CONTENT", "timestamp": 1, "messageId": "m", "delta": "a\nb\r\nc\rd"},
        {"type": "CUSTOM", "timestamp": 1, "name": "x", "value": "ünïcödé \u2028 \u0085 ✓ 😀"},
        {"type": "RUN_FINISHED", "timestamp": 1, "threadId": "t", "runId": "r", "result": None},
    ],
)
def test_ag_ui_frames_are_the_bytes_sse_starlette_wrote(
    seq: int | None, event: dict[str, object]
) -> None:
    """The frames as `ServerSentEvent(data, id=seq, sep="\\n")` encoded them, byte for byte."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    expected = ServerSentEvent(data=data, id=None if seq is None else str(seq), sep="\n").encode()
    assert Bound(1_000_000, "turn_1").frame(event, seq) == expected


def test_ag_ui_stands_in_for_a_large_event_and_keeps_its_id() -> None:
    bound = Bound(200, "turn_1")
    big = {"type": "CUSTOM", "timestamp": 1, "name": "turnkit.plugin.x", "value": "y" * 500}
    sent_id, event = _id_and_event(bound.frame(big, 7))
    assert sent_id == "7"
    assert event["name"] == "turnkit.frame_dropped"
    assert event["value"] == {"type": "CUSTOM", "bytes": 568, "seq": 7}
    small = {"type": "CUSTOM", "timestamp": 1, "name": "turnkit.plugin.x", "value": "y"}
    assert _id_and_event(bound.frame(small, None)) == (None, small)


def test_ag_ui_sends_a_run_s_structure_whatever_its_size() -> None:
    bound = Bound(200, "turn_1")
    finished = {"type": "RUN_FINISHED", "timestamp": 1, "threadId": "t" * 500, "runId": "r"}
    assert _id_and_event(bound.frame(finished, 9)) == ("9", finished)


def test_ai_sdk_stands_in_for_a_large_chunk_but_not_for_structure() -> None:
    delta = {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "y" * 500}
    stand_in = json.loads(bounded(delta, 200, "turn_1").removeprefix(b"data: "))
    assert stand_in["type"] == "data-turnkit-frame-dropped"
    assert stand_in["transient"] is True
    assert stand_in["data"]["type"] == "tool-input-delta"
    text = {"type": "text-delta", "id": "b1", "delta": "y" * 500}  # text goes in pieces
    pieces = [json.loads(line.removeprefix(b"data: ")) for line in
              bounded(text, 200, "turn_1").split(b"\n\n") if line]  # fmt: skip
    assert len(pieces) > 1
    assert "".join(p["delta"] for p in pieces) == "y" * 500
    start = {"type": "tool-input-available", "toolCallId": "c1", "input": {"text": "y" * 500}}
    assert json.loads(bounded(start, 200, "turn_1").removeprefix(b"data: ")) == start
