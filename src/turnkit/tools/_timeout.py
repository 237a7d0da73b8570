"""A tool's `timeout_s`: checked where the tool is made, applied around each call."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import TypeVar

from turnkit.errors import ConfigurationError

__all__ = ("check_timeout_s", "within")

T = TypeVar("T")


def check_timeout_s(timeout_s: object, tool: str) -> None:
    """Refuse a `timeout_s` that is not a number of seconds above 0 (None: no limit).

    Raises:
        ConfigurationError: it is not.
    """
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ConfigurationError(
            f"timeout_s of the tool {tool!r} is a number of seconds above 0 (or None: no "
            f"limit), not {timeout_s!r}"
        )


async def within(
    timeout_s: float | None, call: Awaitable[T], expired: Callable[[], Exception]
) -> T:
    """Await `call`, cancelled after `timeout_s` (None: no limit); then raise `expired()`.

    A `TimeoutError` the call raises itself goes through as it is. The timer is set from
    a context of its own: the event loop keeps a timer, cancelled or not, until it would
    have fired, and with it the context it was set in, which holds the whole turn.
    """
    if timeout_s is None:
        return await call
    limit = asyncio.timeout(None)
    try:
        async with limit:
            by = asyncio.get_running_loop().time() + timeout_s
            contextvars.Context().run(limit.reschedule, by)
            return await call
    except TimeoutError:
        if not limit.expired():
            raise  # the call's own
        raise expired() from None
