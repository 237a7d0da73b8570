"""Hear when a turn becomes claimable: `LISTEN turnkit_work` on a connection of its own.

Migration `0011` makes PostgreSQL send `turnkit_work` (its payload the tables' schema)
when a turn is queued unclaimed, put back unclaimed, or unblocked by the end of an
earlier turn of its session. `WorkListener` sets an `asyncio.Event` on each one for its
own schema. It connects on first use; a connection the server closed sets the event (the
caller looks once more, as it would after a poll) and the next `event()` connects again.
A connection that cannot be opened is logged and retried after `RETRY_S`; until then the
caller polls, as without a listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ("CHANNEL", "RETRY_S", "WorkListener")

log = logging.getLogger("turnkit.store")

CHANNEL = "turnkit_work"
RETRY_S = 5.0
"""After a failed connect, how long `event()` answers None before it tries again."""
_CONNECT_TIMEOUT_S = 5.0


class WorkListener:
    """One listening connection and the event its notifications set."""

    def __init__(
        self, dsn: str, settings: dict[str, str] | None, monotonic: Callable[[], float]
    ) -> None:
        self._dsn = dsn
        self._settings = {**(settings or {}), "application_name": "turnkit-listen"}
        self._monotonic = monotonic
        self._signal = asyncio.Event()
        self._conn: Any = None
        self._schema: str | None = None
        self._retry_at = 0.0
        """After a failed connect: when to try again (0: the last connect worked)."""
        self._lock = asyncio.Lock()

    async def event(self) -> asyncio.Event | None:
        """The event, listening again if the connection was lost; None while it cannot."""
        if self._conn is not None and not self._conn.is_closed():
            return self._signal
        if self._monotonic() < self._retry_at:
            return None
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                await self._connect()
        return self._signal if self._conn is not None else None

    async def _connect(self) -> None:
        import asyncpg  # the `postgres` extra

        self._conn = None
        conn: Any = None
        try:
            conn = await asyncpg.connect(
                self._dsn, server_settings=self._settings, timeout=_CONNECT_TIMEOUT_S
            )
            self._schema = await conn.fetchval("SELECT current_schema()")
            await conn.add_listener(CHANNEL, self._notified)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # refused, timed out, too many clients, closed at once: poll meanwhile
            if conn is not None:
                conn.terminate()
            if not self._retry_at:
                log.warning(
                    "cannot listen for new turns (%s: %s); polling until it can",
                    type(exc).__name__,
                    exc,
                )
            self._retry_at = self._monotonic() + RETRY_S
            return
        conn.add_termination_listener(self._lost)
        self._conn = conn
        if self._retry_at:
            log.info("listening for new turns again")
        self._retry_at = 0.0
        self._signal.set()  # what was queued while nobody listened: look once

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._schema:
            self._signal.set()

    def _lost(self, conn: Any) -> None:
        if conn is self._conn:  # not a connection already replaced
            self._conn = None
        self._signal.set()

    async def close(self) -> None:
        """Stop listening (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.remove_termination_listener(self._lost)
            with contextlib.suppress(Exception):  # a connection already broken: gone anyway
                await conn.close(timeout=_CONNECT_TIMEOUT_S)
