"""Message digests are kept by value: the same bytes as computing them, rewrites still seen."""

from __future__ import annotations

import hashlib

import pytest

from turnkit.context.prefix import RequestView, check_prefix, message_digest
from turnkit.context.transcript import TranscriptMessage, sent_bytes
from turnkit.errors import PrefixRewriteError


def _plain(message: TranscriptMessage) -> str:
    return hashlib.sha256(sent_bytes(message)).hexdigest()[:32]


MESSAGES: list[TranscriptMessage] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi", "input_seq": 3, "opens_turn": True},
    {"role": "assistant", "content": "", "tool_calls": []},
    {
        "role": "assistant",
        "content": "let me see",
        "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 1}'}],
    },
    {"role": "tool", "content": "2", "tool_call_id": "c1"},
    {"role": "user", "content": [{"kind": "text", "text": "look"}, {"kind": "image", "url": "u"}]},
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: str(m["role"]))
def test_a_kept_digest_is_the_computed_one(message: TranscriptMessage) -> None:
    assert message_digest(message) == _plain(message)
    assert message_digest(dict(message)) == _plain(message)  # type: ignore[arg-type]


def test_absent_and_empty_fields_stay_apart() -> None:
    bare: TranscriptMessage = {"role": "assistant", "content": "x"}
    empty_calls: TranscriptMessage = {"role": "assistant", "content": "x", "tool_calls": []}
    assert message_digest(bare) != message_digest(empty_calls)
    assert message_digest(empty_calls) == _plain(empty_calls)


def test_a_message_rewritten_in_place_is_still_caught() -> None:
    message: TranscriptMessage = {
        "role": "assistant",
        "content": "a",
        "tool_calls": [{"id": "c9", "name": "add", "arguments": "{}"}],
    }
    before = RequestView.of([message], "tools")
    message["tool_calls"][0]["arguments"] = '{"a": 2}'
    after = RequestView.of([message], "tools")
    assert after.messages[0] == _plain(message) != before.messages[0]
    with pytest.raises(PrefixRewriteError):  # the suite runs with `STRICT` set
        check_prefix(before, after)
