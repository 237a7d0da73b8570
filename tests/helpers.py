"""Small helpers shared by tests."""

from __future__ import annotations

from turnkit import tool
from turnkit.events import DurableEvent, EphemeralEvent


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


def durable(events: list[DurableEvent | EphemeralEvent]) -> list[DurableEvent]:
    return [e for e in events if isinstance(e, DurableEvent)]


def types(events: list[DurableEvent | EphemeralEvent]) -> list[str]:
    return [e.type for e in events]  # type: ignore[attr-defined]
