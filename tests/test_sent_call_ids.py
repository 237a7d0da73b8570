"""Tool-call ids an older turnkit stored go out as every provider takes them back.

An older turnkit named calls uniquely within a turn only, and kept a model's id as it
came: a session it wrote may repeat `call_0` across turns, or keep an id with a dot or
over 40 characters. Anthropic refuses a repeated id and OpenAI one over 40 characters, so
every later turn of that session would fail on such a rung: the request renames them.
"""

from __future__ import annotations

import re

from turnkit.models import ModelMessage, ToolCallPart
from turnkit.models._chat_format import message_dicts

SAFE = re.compile(r"[A-Za-z0-9_-]{1,40}")


def _round(call_id: str, answer: str) -> list[ModelMessage]:
    call = ToolCallPart(tool_call_id=call_id, name="lookup", arguments="{}")
    return [
        ModelMessage(role="user", content=f"ask {answer}"),
        ModelMessage(role="assistant", content="", tool_calls=(call,)),
        ModelMessage(role="tool", content=answer, tool_call_id=call_id),
    ]


def _pairs(sent: list[dict[str, object]]) -> list[tuple[str, str]]:
    calls = [c["id"] for m in sent for c in m.get("tool_calls", ())]  # type: ignore[attr-defined]
    answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    return list(zip(calls, answers, strict=True))  # type: ignore[arg-type]


def test_an_id_repeated_across_turns_goes_out_once_each_call_answered_by_its_own() -> None:
    messages = [*_round("call_0", "one"), *_round("call_0", "two"), *_round("call_0", "three")]
    pairs = _pairs(message_dicts(messages))
    assert pairs[0] == ("call_0", "call_0")  # a first use keeps its id (bytes as before)
    assert len({call for call, _ in pairs}) == 3
    assert all(call == answer and SAFE.fullmatch(call) for call, answer in pairs)


def test_an_id_a_provider_would_refuse_goes_out_safe_and_the_same_every_time() -> None:
    long_id = "toolu_" + "x" * 60
    messages = [*_round("fn.lookup:1", "one"), *_round(long_id, "two")]
    first, again = message_dicts(messages), message_dicts(messages)
    assert first == again  # the prompt prefix stays byte-identical from call to call
    pairs = _pairs(first)
    assert all(call == answer and SAFE.fullmatch(call) for call, answer in pairs)


def test_safe_unique_ids_go_out_as_they_are() -> None:
    messages = [*_round("call_0", "one"), *_round("call_0_r1_1", "two")]
    assert _pairs(message_dicts(messages)) == [("call_0", "call_0"), ("call_0_r1_1", "call_0_r1_1")]
