"""Message digests are kept by value: the same bytes as computing them, rewrites still seen."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.context._sealed import seal
from turnkit.context.prefix import RequestView, check_prefix, message_digest
from turnkit.context.transcript import TranscriptMessage, from_transcript, sent_bytes
from turnkit.errors import PrefixRewriteError
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


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


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: str(m["role"]))
def test_a_sealed_message_keeps_the_same_digest_and_model_message(
    message: TranscriptMessage,
) -> None:
    sealed = seal(message)
    assert sealed == message
    assert message_digest(sealed) == message_digest(sealed) == _plain(message)
    assert from_transcript([sealed]) == from_transcript([sealed]) == from_transcript([message])
    assert sent_bytes(sealed) == sent_bytes(message)


def test_a_sealed_message_refuses_every_change_in_place() -> None:
    """Earlier turns' history is sealed: a hook that tried to rewrite it fails at once."""
    sealed = seal(MESSAGES[3])
    calls = sealed["tool_calls"]
    changes = [
        lambda: sealed.__setitem__("content", "edited"),
        lambda: sealed.update(content="edited"),
        lambda: sealed.pop("content"),
        lambda: calls.append({"id": "c2", "name": "add", "arguments": "{}"}),
        lambda: calls.__setitem__(0, {"id": "c2", "name": "add", "arguments": "{}"}),
        lambda: calls[0].__setitem__("arguments", '{"a": 2}'),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="never changes in place"):
            change()
    assert sealed == MESSAGES[3]
    rewritten = {**sealed, "content": "edited"}  # a new message: checked by value
    assert message_digest(rewritten) == _plain(rewritten) != message_digest(sealed)  # type: ignore[arg-type]


async def test_what_ended_turns_leave_in_the_caches_is_bounded_by_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn's own messages are kept by value, and outlive it: a bound by count alone
    kept 16,384 of them, long tool results and pasted documents included (a process of
    one-turn sessions grew by about 15 MB a thousand turns with 16,000-character results)."""
    from turnkit.context import prefix, transcript

    monkeypatch.setattr(transcript, "_CACHE_CHARS", 100_000, raising=False)
    turns = 12
    steps = [ModelStep.tool_call_reply(call("fetch_page")), ModelStep.text_reply("Read it.")]
    model = ScriptedModel(steps * turns)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'pages.db'}")
    async with SessionRuntime(agent=Agent(model=model, tools=[fetch_page]), config=config) as rt:
        for n in range(turns):
            await collect_events(rt.execute_message(f"s{n}", "read the page"))
    for cache in (prefix.message_digest, transcript._model_message):
        held = sum(len(key[1]) for key in cache.by_value)
        assert held <= 100_000  # was: every turn's 16,000-character preview, and more


@tool
async def fetch_page() -> str:
    """Fetch a long page."""
    return uuid.uuid4().hex * 1_000
