"""Hear PostgreSQL's notifications on one connection of a process's own.

`LISTEN turnkit_work`: migration `0011` makes PostgreSQL send it (its payload the tables'
schema) when a turn is queued unclaimed, put back unclaimed, or unblocked by the end of an
earlier turn of its session; `Listener.event` sets an `asyncio.Event` on each one for its
own schema (a worker's claim loop waits on it).

`LISTEN turnkit_stop`: a Stop that flags a turn for its live driver (`_cancel_sql`) sends
it, its payload the turn's id, when its transaction commits; `Listener.stop_signal` gives
each turn driven here an event the notification for that turn sets (its lease keeper then
renews at once, and learns of the Stop).

A turn's driver asks for its event only once it holds the turn: a Stop that commits
between its claim and that moment is not lost. The listener keeps the ids of the last
`HEARD_KEPT` turns it heard stopped that nobody here asked about, and gives a turn among
them an event already set; and as it starts listening it reads the ids of the running
turns already flagged for their drivers (one statement per connection: a Stop flagged
before it listened was not announced to it) and counts them as heard: a read the server
refuses (a schema not migrated yet, a role that may not read `tk_turns`) is logged once,
and the listener listens on.

The connection is opened on first use: by `event()` itself, or in the background by
`stop_signal`. A connection the server closed sets the work event (the caller looks once
more, as it would after a poll), and the next use connects again; then every turn's stop
event is set too (a Stop sent meanwhile went unheard: each keeper renews once). A
connection that cannot be opened is logged and retried after `RETRY_S`; until then the
claim loop polls and Stops are heard at the next renewal, as without a listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ("CHANNEL", "HEARD_KEPT", "RETRY_S", "STOP_CHANNEL", "Listener")

log = logging.getLogger("turnkit.store")

CHANNEL = "turnkit_work"
STOP_CHANNEL = "turnkit_stop"
RETRY_S = 5.0
"""After a failed connect, how long the listener waits before it tries again."""
HEARD_KEPT = 1024
"""How many Stops of turns nobody here asked about the listener remembers (the newest)."""
_CONNECT_TIMEOUT_S = 5.0
_FLAGGED = "SELECT turn_id FROM tk_turns WHERE status = 'running' AND cancel_requested LIMIT $1"


class Listener:
    """One listening connection, the work event and the stop events its notifications set."""

    def __init__(
        self, dsn: str, settings: dict[str, str] | None, monotonic: Callable[[], float]
    ) -> None:
        self._dsn = dsn
        self._settings = {**(settings or {}), "application_name": "turnkit-listen"}
        self._monotonic = monotonic
        self._signal = asyncio.Event()
        self._stops: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        """Each turn driven here: the event a Stop of it sets (kept while its keeper holds it)."""
        self._heard: OrderedDict[str, None] = OrderedDict()
        """Turns heard stopped before anyone here asked for their event (the newest last)."""
        self._conn: Any = None
        self._schema: str | None = None
        self._retry_at = 0.0
        """After a failed connect: when to try again (0: the last connect worked)."""
        self._connected_before = False
        self._flagged_refused = False
        """Reading the turns flagged for Stop was refused once (logged then only)."""
        self._connecting: asyncio.Task[asyncio.Event | None] | None = None
        self._lock = asyncio.Lock()

    def _listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def event(self) -> asyncio.Event | None:
        """The work event, listening again if the connection was lost; None while it cannot."""
        if self._listening():
            return self._signal
        if self._monotonic() < self._retry_at:
            return None
        async with self._lock:
            if not self._listening():
                await self._connect()
        return self._signal if self._conn is not None else None

    def stop_signal(self, turn_id: str) -> asyncio.Event:
        """The event a Stop of `turn_id` sets; connects in the background if need be.

        The same event for as long as someone holds it. Call it again now and then (each
        renewal does): a connection lost meanwhile is opened again.
        """
        signal = self._stops.get(turn_id)
        if signal is None:
            signal = self._stops[turn_id] = asyncio.Event()
            if turn_id in self._heard:  # stopped before its driver asked
                del self._heard[turn_id]
                signal.set()
        idle = self._connecting is None or self._connecting.done()
        if idle and not self._listening() and self._monotonic() >= self._retry_at:
            self._connecting = asyncio.create_task(self.event(), name="turnkit-listen")
            self._connecting.add_done_callback(_logged)
        return signal

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
            await conn.add_listener(STOP_CHANNEL, self._stopped)
            # Listening now: a Stop flagged before went unheard, so it is read instead.
            flagged = await self._flagged(conn)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # refused, timed out, too many clients, closed at once: poll meanwhile
            if conn is not None:
                conn.terminate()
            if not self._retry_at:
                log.warning(
                    "cannot listen for new turns and Stops (%s: %s); polling until it can",
                    type(exc).__name__,
                    exc,
                )
            self._retry_at = self._monotonic() + RETRY_S
            return
        except BaseException:  # cancelled (the store closing): leave no connection open
            if conn is not None:
                conn.terminate()
            raise
        conn.add_termination_listener(self._lost)
        self._conn = conn
        if self._retry_at:
            log.info("listening for new turns and Stops again")
        self._retry_at = 0.0
        self._signal.set()  # what was queued while nobody listened: look once
        if self._connected_before:  # a Stop sent while nobody listened: renew once
            for signal in list(self._stops.values()):
                signal.set()
        self._connected_before = True
        for turn_id in flagged:
            self._heard_stop(turn_id)

    async def _flagged(self, conn: Any) -> list[str]:
        """The running turns flagged for Stop; none where the server refuses the query.

        Refused (a schema not migrated yet, a role that may not read `tk_turns`), it is
        logged once and the listener listens on: a Stop is still heard as it is sent, and
        one flagged before reaches its driver at the next renewal. A connection that
        fails meanwhile fails the connect, as any other step of it would.
        """
        import asyncpg  # the `postgres` extra

        try:
            rows = await conn.fetch(_FLAGGED, HEARD_KEPT)
        except asyncpg.PostgresError as exc:
            if not _refused(exc):  # a shutdown, a lost connection: the connect fails
                raise
            if not self._flagged_refused:
                self._flagged_refused = True
                log.warning(
                    "cannot read the turns already flagged for Stop (%s: %s); listening on, "
                    "a Stop flagged before is heard at its turn's next renewal",
                    type(exc).__name__,
                    exc,
                )
            return []
        return [row["turn_id"] for row in rows]

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._schema:
            self._signal.set()

    def _stopped(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._heard_stop(payload)

    def _heard_stop(self, turn_id: str) -> None:
        """Set the turn's event; or, nobody here asked for it yet, remember the Stop."""
        signal = self._stops.get(turn_id)  # a turn driven here (ids are unique across schemas)
        if signal is not None:
            signal.set()
            return
        self._heard[turn_id] = None  # (perhaps claimed here and not asked for yet)
        self._heard.move_to_end(turn_id)
        while len(self._heard) > HEARD_KEPT:
            self._heard.popitem(last=False)

    def _lost(self, conn: Any) -> None:
        if conn is self._conn:  # not a connection already replaced
            self._conn = None
        self._signal.set()

    async def close(self) -> None:
        """Stop listening (idempotent)."""
        connecting, self._connecting = self._connecting, None
        if connecting is not None and not connecting.done():
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.remove_termination_listener(self._lost)
            with contextlib.suppress(Exception):  # a connection already broken: gone anyway
                await conn.close(timeout=_CONNECT_TIMEOUT_S)


def _logged(task: asyncio.Task[asyncio.Event | None]) -> None:
    """A background connect that failed other than as `_connect` expects: logged."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("listening for Stops failed: %r", task.exception())


def _refused(exc: BaseException) -> bool:
    """Whether the server refused a statement as written: SQLSTATE class 42 or 3F000.

    A table or schema it does not have, a privilege the role lacks; not a connection lost
    or a server shutting down (57P01), which fail the connect as any outage does.
    """
    state = str(getattr(exc, "sqlstate", "") or "")
    return state.startswith("42") or state == "3F000"
