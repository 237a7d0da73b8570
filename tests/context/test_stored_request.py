"""The previous request as stored: as small early and late, read back whole, rewrites seen.

A session's previous request is stored beside the transcript (graph checkpoints, the
Store's last request). It counts the messages it shares with that transcript instead of
listing them, and what a request derives from the session's history is kept across its
requests; none of it may change what the prefix check reports.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from turnkit.context._known import KnownHistory, digests_of, joined_sha256
from turnkit.context._sealed import seal
from turnkit.context.pictures import count_pictures
from turnkit.context.prefix import (
    PreviousRequest,
    RequestView,
    check_prefix,
    compact,
    expand,
    message_digest,
    stored,
    view_of,
)
from turnkit.context.transcript import TranscriptMessage
from turnkit.errors import PrefixRewriteError

SYSTEM: TranscriptMessage = {"role": "system", "content": "be brief"}


def _history(turns: int) -> tuple[TranscriptMessage, ...]:
    out: list[TranscriptMessage] = []
    for n in range(turns):
        out += [
            {"role": "user", "content": f"question {n}", "input_seq": n + 1, "opens_turn": True},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{n}", "name": "add", "arguments": "{}"}],
            },
            {
                "role": "tool",
                "content": [{"kind": "text", "text": "2"}, {"kind": "image", "url": "u"}],
                "tool_call_id": f"c{n}",
            },
            {"role": "assistant", "content": f"answer {n}"},
        ]
    return tuple(seal(m) for m in out)


def _turn(history: tuple[TranscriptMessage, ...]) -> list[TranscriptMessage]:
    opening: TranscriptMessage = {"role": "user", "content": "next", "opens_turn": True}
    return [dict(SYSTEM), *history, opening]  # type: ignore[list-item]


def _request(transcript: list[TranscriptMessage]) -> PreviousRequest:
    return stored(RequestView.of(transcript, "tools"))


@pytest.mark.parametrize("turns", [3, 500])
def test_a_stored_request_is_as_small_late_as_early(turns: int) -> None:
    transcript = _turn(_history(turns))
    previous = _request(transcript)
    beside = [*transcript, {"role": "assistant", "content": "done"}]
    kept = compact(previous, digests_of(beside))
    assert len(json.dumps(kept)) < 300
    assert expand(kept, digests_of(beside)) == previous  # read back whole


def test_a_stored_request_keeps_what_the_transcript_beside_it_lacks() -> None:
    transcript = _turn(_history(5))
    closing: TranscriptMessage = {"role": "user", "content": "now answer"}
    previous = _request([*transcript, closing])  # a closing instruction the list never keeps
    kept = compact(previous, digests_of(transcript))
    assert kept["messages"] == [message_digest(closing)]
    assert expand(kept, digests_of(transcript)) == previous


def test_an_agent_changed_since_is_still_reported_as_such() -> None:
    history = _history(20)
    previous = {**_request(_turn(history)), "between_turns": True}
    kept = compact(previous, digests_of(_turn(history)))  # type: ignore[arg-type]
    changed = [{"role": "system", "content": "be verbose"}, *_turn(history)[1:]]
    read = expand(kept, digests_of(changed))  # type: ignore[arg-type]
    assert read == previous
    report = check_prefix(
        view_of(read),
        RequestView.of(changed, "tools"),
        between_turns=True,  # type: ignore[arg-type]
    )
    assert (report.shared, report.broken, report.reason) == (0, "system", "agent-changed")


def test_a_history_rebuilt_otherwise_is_a_rewrite(caplog: pytest.LogCaptureFixture) -> None:
    history = _history(20)
    kept = compact(_request(_turn(history)), digests_of(_turn(history)))
    rebuilt = [*_turn(history)]
    rebuilt[7] = {**rebuilt[7], "content": "answer 1, reworded"}
    with caplog.at_level(logging.WARNING, logger="turnkit.context"):
        read = expand(kept, digests_of(rebuilt))
    assert "not the stored transcript's" in caplog.text
    with pytest.raises(PrefixRewriteError):  # the suite runs with `STRICT` set
        check_prefix(view_of(read), RequestView.of(rebuilt, "tools"))


def test_what_is_kept_for_the_history_is_what_each_message_gives() -> None:
    history = _history(30)
    known = KnownHistory(history[:40]).extended(history[40:])
    transcript = _turn(history)
    digests = tuple(message_digest(m) for m in transcript)
    assert digests_of(transcript, known) == digests
    assert count_pictures(transcript, known) == count_pictures(transcript) == 30
    for end in (0, 1, 2, len(digests) - 1, len(digests)):
        joined = hashlib.sha256("".join(digests[:end]).encode()).hexdigest()
        assert joined_sha256(digests[:end], known) == joined
    # A hook that builds a new message in place of a history message: nothing kept applies.
    rewritten = [*transcript]
    rewritten[5] = {**rewritten[5], "content": "changed"}
    assert not known.leads(rewritten)
    assert digests_of(rewritten, known) == tuple(message_digest(m) for m in rewritten)
    assert count_pictures(rewritten, known) == 30
