"""Text too long for one frame, cut into pieces that fit (both protocols' bounds)."""

from __future__ import annotations

from typing import Final

__all__ = ("pieces",)

_MAX_CHAR_BYTES: Final = 6
"""The most one character takes in a JSON string (`\\u001f`; UTF-8 needs 4 at most)."""


def pieces(text: str, room_bytes: int) -> list[str]:
    """`text` in pieces of at most `room_bytes` each as a JSON string (a character at least)."""
    size = max(1, room_bytes // _MAX_CHAR_BYTES)
    return [text[at : at + size] for at in range(0, len(text), size)]
