"""Picture release: the one other deliberate exception to the prefix rule.

A picture stays in the list for the rest of a turn, and providers refuse large pictures
once a call carries more than twenty. So when a call would carry more than twenty, the
pictures in every tool result except the newest are replaced by a note; a picture the
person attached is never released. That call pays for the cache again; the list then
grows by appending until it crosses twenty again.
"""

from __future__ import annotations

from typing import Final

from turnkit.context.transcript import PartJson, TranscriptMessage, picture_parts

__all__ = ("PICTURE_LIMIT", "count_pictures", "release_pictures")

PICTURE_LIMIT: Final = 20
"""More pictures than this in one call triggers a release."""


def count_pictures(transcript: list[TranscriptMessage]) -> int:
    """Pictures a request made of `transcript` would carry."""
    return sum(picture_parts(m) for m in transcript if not isinstance(m["content"], str))


def release_pictures(transcript: list[TranscriptMessage]) -> tuple[list[TranscriptMessage], int]:
    """Replace pictures in every tool result but the newest; returns (list, released)."""
    holders = [i for i, m in enumerate(transcript) if m["role"] == "tool" and picture_parts(m)]
    released = 0
    out = list(transcript)
    for index in holders[:-1]:
        message = out[index]
        content = message["content"]
        assert not isinstance(content, str)  # it has pictures, so it has parts
        count = picture_parts(message)
        note: PartJson = {
            "kind": "text",
            "text": f"[{count} picture(s) reviewed earlier were released to save context; "
            "call the tool again to inspect them]",
        }
        parts = [p for p in content if p.get("kind") != "image"]
        out[index] = {**message, "content": [*parts, note]}
        released += count
    return out, released
