"""Where compaction cuts a transcript: what stays, what is summarized, what is dropped."""

from __future__ import annotations

from turnkit.context.compaction import keep_newest, split_for_summary, split_within_turn
from turnkit.context.transcript import TranscriptMessage

SYSTEM: TranscriptMessage = {"role": "system", "content": "Be helpful."}


def _ask(text: str, seq: int) -> TranscriptMessage:
    return {"role": "user", "content": text, "input_seq": seq, "opens_turn": True}


def _round(call_id: str) -> list[TranscriptMessage]:
    call = {"id": call_id, "name": "fetch", "arguments": "{}"}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},  # type: ignore[list-item]
        {"role": "tool", "content": f"result of {call_id}", "tool_call_id": call_id},
    ]


def _contents(messages: list[TranscriptMessage]) -> list[str]:
    return [str(m["content"]) or f"call {m.get('tool_calls', [{}])[0].get('id')}" for m in messages]


PLAN: TranscriptMessage = {"role": "system", "content": "Plan: 1. fetch", "standing": True}
PLUGIN_NOTE: TranscriptMessage = {"role": "system", "content": "Today is Monday."}
GUIDE: TranscriptMessage = {"role": "user", "content": "use metric units", "input_seq": 3}
SUMMARY: TranscriptMessage = {"role": "user", "content": "[Summary of 4 earlier message(s)]"}


def test_a_long_turn_keeps_its_opening_plan_guides_and_newest_round() -> None:
    transcript = [
        SYSTEM,
        _ask("first question", 1),
        {"role": "assistant", "content": "first answer"},
        _ask("second question", 2),
        PLAN,
        *_round("c1"),
        PLUGIN_NOTE,
        GUIDE,
        *_round("c2"),
        SUMMARY,  # an earlier compaction of this turn: summarized again, not kept
        *_round("c3"),
    ]
    split = split_within_turn(transcript)
    assert _contents(split.head) == [
        "Be helpful.",
        "second question",
        "Plan: 1. fetch",
        "use metric units",
    ]
    assert _contents(split.tail) == ["call c3", "result of c3"]  # unread: kept whole
    assert _contents(split.middle) == [
        "first question",
        "first answer",
        "call c1",
        "result of c1",
        "Today is Monday.",  # a plugin's note is part of its round, summarized with it
        "call c2",
        "result of c2",
        "[Summary of 4 earlier message(s)]",
    ]


def test_a_turn_whose_newest_round_is_all_there_is_lets_it_go() -> None:
    transcript = [SYSTEM, _ask("question", 1), *_round("c1")]
    split = split_within_turn(transcript)
    assert _contents(split.middle) == ["call c1", "result of c1"]
    assert split.tail == []
    assert (
        split_within_turn([*transcript, *_round("c2")], keep_newest_round=False).tail == []
    )  # it alone would not fit


def test_keep_newest_drops_an_earlier_turn_whole_and_the_turns_rounds_one_by_one() -> None:
    transcript = [
        SYSTEM,
        _ask("q1", 1),
        {"role": "assistant", "content": "a1"},
        _ask("q2", 2),
        *_round("c1"),
        *_round("c2"),
        *_round("c3"),
    ]
    split = split_within_turn(transcript)
    dropped_one = keep_newest(split, lambda m: len(m) <= 8)
    assert "q1" not in _contents(dropped_one)
    assert "a1" not in _contents(dropped_one)  # never an answer without its question
    dropped_more = keep_newest(split, lambda m: len(m) <= 7)
    assert _contents(dropped_more)[-4:] == ["call c2", "result of c2", "call c3", "result of c3"]
    assert "call c1" not in _contents(dropped_more)


def test_no_opening_message_is_cut_within_the_turn() -> None:
    transcript = [SYSTEM, {"role": "user", "content": "hi"}, *_round("c1"), *_round("c2")]
    split = split_for_summary(transcript)
    assert _contents(split.tail) == ["call c2", "result of c2"]


def test_a_second_cut_counts_what_the_first_note_left_out_too() -> None:
    earlier_note: TranscriptMessage = {
        "role": "user",
        "content": "[8 earlier message(s) were left out to stay within the context window]",
    }
    transcript = [
        SYSTEM,
        earlier_note,
        _ask("q1", 1),
        {"role": "assistant", "content": "a1"},
        _ask("q2", 2),
        *_round("c1"),
    ]
    kept = keep_newest(split_for_summary(transcript), lambda m: len(m) <= 5)
    # The 8 the old note stood for, and q1 with its answer (the old note is no message).
    assert _contents(kept)[1] == (
        "[10 earlier message(s) were left out to stay within the context window]"
    )
