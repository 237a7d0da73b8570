"""Tool-call ids every provider of a cascade accepts, each naming one call.

A model's id is kept when it can be: made of letters, digits, `_` and `-` (Anthropic
refuses any other character), at most 40 characters (OpenAI's limit), and used by no
other call the request carries (Anthropic refuses a repeated id, and some servers number
calls per response: `call_0` in every round and every turn). Otherwise the call gets one
that is, everywhere it appears: its events, the log, the transcript, its idempotency key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from turnkit.models import ToolCallPart
from turnkit.stages._types import TranscriptMessage

__all__ = ("MAX_CALL_ID_CHARS", "call_namer", "unique_ids")

MAX_CALL_ID_CHARS = 40
"""The longest id any provider takes back (OpenAI's limit; Anthropic's is longer)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def unique_ids(
    calls: tuple[ToolCallPart, ...], transcript: list[TranscriptMessage], iteration: int
) -> tuple[ToolCallPart, ...]:
    """The calls, each with an id no call in `transcript` (or before it in `calls`) has."""
    if not calls:  # an answer: the transcript's ids need not be gathered
        return calls
    used = _transcript_call_ids(transcript)
    out: list[ToolCallPart] = []
    for call in calls:
        new_id = _fresh_id(call.tool_call_id, used, iteration)
        used.add(new_id)
        if new_id != call.tool_call_id:
            call = ToolCallPart(tool_call_id=new_id, name=call.name, arguments=call.arguments)
        out.append(call)
    return tuple(out)


def call_namer(transcript: list[TranscriptMessage], iteration: int) -> Callable[[str], str]:
    """The id a call streaming now will get (its `tool.delta` and `tool.started` agree).

    The transcript's ids are gathered on the first call that needs them: a response
    that names no tool pays nothing.
    """
    used: set[str] | None = None
    named: dict[str, str] = {}  # each call's, as `unique_ids` names them, in their order

    def name(given: str) -> str:
        nonlocal used
        if given in named:
            return named[given]
        if used is None:
            used = _transcript_call_ids(transcript)
        named[given] = new_id = _fresh_id(given, used, iteration)
        used.add(new_id)
        return new_id

    return name


def _transcript_call_ids(transcript: list[TranscriptMessage]) -> set[str]:
    """The ids of every call the transcript carries, earlier turns' too.

    Compaction bounds it, and what compaction summarized away is no longer sent.
    """
    return {str(c.get("id")) for m in transcript for c in m.get("tool_calls", ())}


def _fresh_id(given: str, used: set[str], iteration: int) -> str:
    """`given` made safe, or, when a call has it already, `<safe>_r{iteration}_{n}`."""
    safe = _fit(_UNSAFE.sub("_", given) or "call")
    new_id, n = safe, 1
    while new_id in used:
        new_id, n = _fit(f"{safe}_r{iteration}_{n}"), n + 1
    return new_id


def _fit(call_id: str) -> str:
    """`call_id`, or a 40-character one made from its start and a digest of the whole."""
    if len(call_id) <= MAX_CALL_ID_CHARS:
        return call_id
    digest = hashlib.blake2b(call_id.encode(), digest_size=6).hexdigest()  # 12 characters
    return f"{call_id[: MAX_CALL_ID_CHARS - len(digest) - 1]}_{digest}"
