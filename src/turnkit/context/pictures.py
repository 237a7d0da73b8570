"""Picture release: the one other deliberate exception to the prefix rule.

A picture stays in the list for the rest of a turn, and providers refuse large pictures
once a call carries more than twenty. So when a call would carry more than twenty, every
picture the model has seen already (in tool results it has read, attached to earlier
turns' messages) is replaced by a note; the newest round's results and the current
message's own pictures stay. That call pays for the cache again; the list then grows by
appending until it crosses twenty again.
"""

from __future__ import annotations

from itertools import islice
from typing import Final

from turnkit.context._known import KnownHistory
from turnkit.context.transcript import (
    PartJson,
    TranscriptMessage,
    current_opening,
    picture_parts,
)

__all__ = ("PICTURE_LIMIT", "count_pictures", "release_pictures")

PICTURE_LIMIT: Final = 20
"""More pictures than this in one call triggers a release."""


def count_pictures(transcript: list[TranscriptMessage], known: KnownHistory | None = None) -> int:
    """Pictures a request made of `transcript` would carry.

    `known`: the session's history, which `transcript` may start with (its count is kept).
    """
    start, counted = 0, 0
    if known is not None and known.leads(transcript):
        start, counted = len(known.messages) + 1, known.pictures
        counted += picture_parts(transcript[0])
    rest = islice(transcript, start, None)
    return counted + sum(picture_parts(m) for m in rest if not isinstance(m["content"], str))


def release_pictures(transcript: list[TranscriptMessage]) -> tuple[list[TranscriptMessage], int]:
    """Replace the pictures the model has already seen; returns (list, released).

    Seen: a tool result before the newest assistant message (the newest round's results
    are still unread, however many), and a picture attached to an earlier turn's message.
    The current message's own pictures are never released.
    """
    last_call = max((i for i, m in enumerate(transcript) if m["role"] == "assistant"), default=-1)
    opening = current_opening(transcript)
    released = 0
    out = list(transcript)
    for index, message in enumerate(transcript[:last_call]):
        count = picture_parts(message)
        if not count:
            continue
        if message["role"] == "tool":
            said = (
                f"[{count} picture(s) reviewed earlier were released to save context; "
                "call the tool again to inspect them]"
            )
        elif message["role"] == "user" and index < opening:
            said = f"[{count} picture(s) the person attached earlier were released to save context]"
        else:
            continue
        content = message["content"]
        assert not isinstance(content, str)  # it has pictures, so it has parts
        note: PartJson = {"kind": "text", "text": said}
        parts = [p for p in content if p.get("kind") != "image"]
        out[index] = {**message, "content": [*parts, note]}
        released += count
    return out, released
