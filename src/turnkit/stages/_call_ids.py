"""Tool-call ids every provider of a cascade accepts, each naming one call.

A model's id is kept when it can be: made of letters, digits, `_` and `-` (Anthropic
refuses any other character), at most 40 characters (OpenAI's limit), and used by no
other call the request carries (Anthropic refuses a repeated id, and some servers number
calls per response: `call_0` in every round and every turn). Otherwise the call gets one
that is, everywhere it appears: its events, the log, the transcript, its idempotency key.
"""

from __future__ import annotations

from collections.abc import Callable

from turnkit.models import ToolCallPart
from turnkit.models.call_ids import fresh_call_id
from turnkit.stages._types import TranscriptMessage

__all__ = ("call_namer", "unique_ids")


def unique_ids(
    calls: tuple[ToolCallPart, ...], transcript: list[TranscriptMessage], iteration: int
) -> tuple[ToolCallPart, ...]:
    """The calls, each with an id no call in `transcript` (or before it in `calls`) has."""
    if not calls:  # an answer: the transcript's ids need not be gathered
        return calls
    used = _transcript_call_ids(transcript)
    out: list[ToolCallPart] = []
    for call in calls:
        new_id = fresh_call_id(call.tool_call_id, used, f"r{iteration}_")
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
        named[given] = new_id = fresh_call_id(given, used, f"r{iteration}_")
        used.add(new_id)
        return new_id

    return name


def _transcript_call_ids(transcript: list[TranscriptMessage]) -> set[str]:
    """The ids of every call the transcript carries, earlier turns' too.

    Compaction bounds it, and what compaction summarized away is no longer sent.
    """
    return {str(c.get("id")) for m in transcript for c in m.get("tool_calls", ())}
