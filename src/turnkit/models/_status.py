"""The HTTP statuses that make a provider failure worth trying again.

Below both `family` (the default retriable predicate) and `litellm` (which marks
`ProviderError.is_retriable`), so neither imports the other for it.
"""

from __future__ import annotations

from typing import Final

__all__ = ("RETRIABLE_STATUS",)

RETRIABLE_STATUS: Final = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
"""Timeout, conflict, too early, rate limited, and the 5xx statuses of a busy provider."""
