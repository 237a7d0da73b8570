"""Replacing a name inside turnkit for a measurement, loudly when the name is gone.

Benchmarks stub or count private functions and constants (`turnkit.runtime.driver.attempt`,
a store's coalescers, a cache's size). Plain assignment to a name a refactor moved or
renamed creates a new attribute nobody reads: the benchmark then measures something other
than it says, and nothing fails. `replace` and `patched` refuse a name the owner does not
have.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def replace(owner: object, name: str, value: Any) -> Any:
    """Set `owner.name` to `value` and return what it was; AttributeError if it has none."""
    if not hasattr(owner, name):
        raise AttributeError(
            f"{getattr(owner, '__name__', type(owner).__name__)} has no attribute {name!r}: "
            "renamed or moved? patching it would change nothing this benchmark measures"
        )
    old = getattr(owner, name)
    setattr(owner, name, value)
    return old


@contextmanager
def patched(owner: object, name: str, value: Any) -> Iterator[Any]:
    """`owner.name` set to `value` within the block (the original is yielded), then back."""
    old = replace(owner, name, value)
    try:
        yield old
    finally:
        setattr(owner, name, old)
