"""The protocol adapters' frame bound: what a too-large event becomes, and what is kept."""

from __future__ import annotations

import json

from turnkit.protocols._agui_stream import Bound
from turnkit.protocols._ai_sdk_stream import bounded


def test_ag_ui_stands_in_for_a_large_event_and_keeps_its_id() -> None:
    bound = Bound(200, "turn_1")
    big = {"type": "CUSTOM", "timestamp": 1, "name": "turnkit.plugin.x", "value": "y" * 500}
    sent = bound.frame(big, 7)
    event = json.loads(str(sent.data))
    assert sent.id == "7"
    assert event["name"] == "turnkit.frame_dropped"
    assert event["value"]["type"] == "CUSTOM"
    assert event["value"]["seq"] == 7
    assert event["value"]["bytes"] > 500
    small = {"type": "CUSTOM", "timestamp": 1, "name": "turnkit.plugin.x", "value": "y"}
    assert json.loads(str(bound.frame(small, None).data)) == small


def test_ag_ui_sends_a_run_s_structure_whatever_its_size() -> None:
    bound = Bound(200, "turn_1")
    finished = {"type": "RUN_FINISHED", "timestamp": 1, "threadId": "t" * 500, "runId": "r"}
    assert json.loads(str(bound.frame(finished, 9).data)) == finished


def test_ai_sdk_stands_in_for_a_large_chunk_but_not_for_structure() -> None:
    delta = {"type": "text-delta", "id": "b1", "delta": "y" * 500}
    stand_in = json.loads(bounded(delta, 200, "turn_1").removeprefix(b"data: "))
    assert stand_in["type"] == "data-turnkit-frame-dropped"
    assert stand_in["transient"] is True
    assert stand_in["data"]["type"] == "text-delta"
    start = {"type": "tool-input-available", "toolCallId": "c1", "input": {"text": "y" * 500}}
    assert json.loads(bounded(start, 200, "turn_1").removeprefix(b"data: ")) == start
