"""Compaction: before a call would fill 85% of the context window, history becomes a summary.

Pure functions; the tool-loop stage makes the summary call. With a utility model the
summarized messages are replaced by one summary message. Without one, the oldest turns
are dropped until the request fits (a note says so). When the current turn is itself the
bulk (a long run of tool rounds), the earlier turns and its own older rounds go; its
opening message, its notes (a plan, a skill) and its newest round, whose results the
model has not read yet, stay. Either way the list then grows by appending again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from turnkit.context.transcript import TranscriptMessage, current_opening, from_transcript
from turnkit.models import ModelMessage, text_of

__all__ = (
    "COMPACTION_THRESHOLD",
    "FALLBACK_TARGET",
    "SUMMARY_PROMPT",
    "Split",
    "keep_newest",
    "needs_compaction",
    "split_for_summary",
    "split_within_turn",
    "summary_request",
    "with_summary",
)

COMPACTION_THRESHOLD: Final = 0.85
"""Compact before a call that would fill this share of the model's context window."""

FALLBACK_TARGET: Final = 0.6
"""Without a utility model, drop old turns until the request fits this share."""

SUMMARY_PROMPT: Final = (
    "You compress a conversation between a person and an assistant so that the assistant "
    "can carry on without the full text. Write a faithful summary: the person's goals and "
    "constraints, facts and numbers established (including tool results that matter), "
    "decisions made and questions still open. Plain prose, no preamble."
)


def needs_compaction(tokens: int, window: int | None) -> bool:
    """Whether a request of `tokens` would fill 85% or more of `window`."""
    return window is not None and window > 0 and tokens >= COMPACTION_THRESHOLD * window


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Where a transcript is cut: `head` stays, `middle` is summarized, `tail` stays."""

    head: list[TranscriptMessage]
    middle: list[TranscriptMessage]
    tail: list[TranscriptMessage]
    rounds_from: int | None = None
    """Where in `middle` the current turn's own rounds begin (None: all earlier turns):
    earlier turns are dropped whole, the turn's rounds one at a time."""


def _leading(transcript: list[TranscriptMessage]) -> int:
    """How many system messages open the list (the agent's instructions)."""
    return next((i for i, m in enumerate(transcript) if m["role"] != "system"), len(transcript))


def split_for_summary(transcript: list[TranscriptMessage]) -> Split:
    """Where to cut: summarize earlier turns and keep the current one whole.

    In a session's first turn (nothing before it to summarize), cut within it.
    """
    lead, opening = _leading(transcript), current_opening(transcript)
    if lead < opening < len(transcript):
        head, middle = transcript[:lead], transcript[lead:opening]
        return Split(head=head, middle=middle, tail=transcript[opening:])
    return split_within_turn(transcript)


def split_within_turn(
    transcript: list[TranscriptMessage], *, keep_newest_round: bool = True
) -> Split:
    """Where to cut when the current turn itself is the bulk.

    The earlier turns (or their summary) and the turn's older rounds go. What stays: the
    agent's instructions, the turn's opening message, the notes it works by (its plan, a
    skill) and what the person added while it ran, and its newest round, from the last
    assistant message on, whose tool results (pictures too) the model has not read yet.
    Every tool call kept has its result: a round goes or stays whole. With no older
    round to let go (the newest is all there is), or `keep_newest_round=False` (it alone
    would not fit), the newest round goes too.
    """
    lead, opening = _leading(transcript), current_opening(transcript)
    opened = transcript[opening : opening + 1]
    own = transcript[opening + 1 :] if opened else transcript[lead:]
    earlier = transcript[lead:opening] if opened else []
    newest = max((i for i, m in enumerate(own) if m["role"] == "assistant"), default=len(own))
    kept = [m for m in own[:newest] if _stays(m)]
    older = [m for m in own[:newest] if not _stays(m)]
    if not keep_newest_round or (not earlier and not older):
        newest = len(own)
        kept = [m for m in own if _stays(m)]
        older = [m for m in own if not _stays(m)]
    return Split(
        head=[*transcript[:lead], *opened, *kept],
        middle=[*earlier, *older],
        tail=own[newest:],
        rounds_from=len(earlier),
    )


def _stays(message: TranscriptMessage) -> bool:
    """A note the turn works by, or a message the person sent into the turn (a guide)."""
    guide = message["role"] == "user" and message.get("input_seq") is not None
    return guide or bool(message.get("standing"))


def summary_request(
    middle: list[TranscriptMessage], *, asked: str = ""
) -> tuple[ModelMessage, ...]:
    """The utility call's messages: the instruction, then the conversation as text.

    `asked`: the person's current request, which stays as it is: the summary is written
    with it in view (the messages to summarize may be the work done on it).
    """
    lines: list[str] = [f"(The person's current request, kept as it is: {asked})"] if asked else []
    for message in from_transcript(middle):
        text = text_of(message.content)
        calls = "; ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        if calls:
            text = f"{text}\n[called {calls}]".strip()
        lines.append(f"{message.role}: {text}")
    return (
        ModelMessage(role="system", content=SUMMARY_PROMPT),
        ModelMessage(role="user", content="\n\n".join(lines)),
    )


def _note(text: str) -> TranscriptMessage:
    return {"role": "user", "content": text}


def with_summary(split: Split, summary: str) -> list[TranscriptMessage]:
    """The transcript with `split.middle` replaced by one summary message."""
    note = _note(
        f"[Summary of {len(split.middle)} earlier message(s), replaced to stay within the "
        f"context window]\n{summary}"
    )
    return [*split.head, note, *split.tail]


def _units(
    messages: list[TranscriptMessage], starts: Callable[[TranscriptMessage], bool]
) -> list[list[TranscriptMessage]]:
    units: list[list[TranscriptMessage]] = []
    for message in messages:
        if not units or starts(message):
            units.append([])
        units[-1].append(message)
    return units


_LEFT_OUT = re.compile(r"\[(\d+) earlier message\(s\) were left out")


def _left_out(message: TranscriptMessage) -> int:
    """How many messages dropping `message` leaves out: an earlier note counts its own."""
    found = _LEFT_OUT.match(message["content"]) if isinstance(message["content"], str) else None
    return int(found.group(1)) if found and message["role"] == "user" else 1


def keep_newest(
    split: Split, fits: Callable[[list[TranscriptMessage]], bool]
) -> list[TranscriptMessage]:
    """The deterministic fallback: drop the oldest turns (or tool rounds) until it fits.

    Earlier turns go first, whole; then the current turn's oldest rounds (each assistant
    message with its tool results). A note says how many messages were left out in all,
    those an earlier note counted included.
    """
    # An earlier turn goes whole, from its opening message; a round of the current turn
    # from its assistant message, with its tool results: no call is cut from its result.
    cut = len(split.middle) if split.rounds_from is None else split.rounds_from
    units = [
        *_units(split.middle[:cut], lambda m: bool(m.get("opens_turn"))),
        *_units(split.middle[cut:], lambda m: m["role"] == "assistant"),
    ]
    dropped = 0
    while True:
        dropped += sum(_left_out(m) for m in units.pop(0)) if units else 0
        kept = [m for unit in units for m in unit]
        note = _note(
            f"[{dropped} earlier message(s) were left out to stay within the context window]"
        )
        candidate = [*split.head, note, *kept, *split.tail]
        if not units or fits(candidate):
            return candidate
