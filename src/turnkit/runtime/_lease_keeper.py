"""`LeaseKeeper`: keeps a driven turn's lease and watches its idle window.

The lease is renewed at least every ttl/3, on a grid the process's drivers share (so the
Store extends the leases due together in one transaction), and at once when the Store
hears a Stop of the turn pressed in another process (PostgreSQL); once renewal fails (a database
out of reach is tried again at the next tick while the lease still runs) the turn's work is
cancelled and the keeper says the lease is lost. Meanwhile heartbeats go out
while the turn is quiet, and a turn silent for the idle window has its run's deadline
brought forward.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence

from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.errors import DeadlineExceededError, StoreUnavailableError
from turnkit.events import EphemeralEvent, HeartbeatEvent
from turnkit.runtime._cancel import stop_task
from turnkit.store import Lease, Store
from turnkit.telemetry import Recorder

__all__ = ("RENEWAL_TICKS", "LeaseKeeper", "reasoning", "renewal_due")

RENEWAL_TICKS = 4
"""Ticks of the shared renewal grid per renewal interval (a third of the lease's ttl)."""

log = logging.getLogger("turnkit.runtime")


def renewal_due(last: float, interval: float) -> float:
    """When to renew a lease last renewed at `last` (monotonic seconds).

    A tick of a grid every driver of the process shares, the first at least
    `interval - tick` on: renewals are less than `interval` apart (and not much less), and
    those that come due together are extended in one Store transaction.
    """
    tick = interval / RENEWAL_TICKS
    return math.ceil((last + interval - tick) / tick) * tick


def reasoning(rec: Recorder) -> bool:
    """A model call of the turn is in flight and the turn waits on nothing else.

    Its heartbeats then count as activity. A tool, or a plugin's hook (a model call's
    `before_model_request`, an output check on its answer), is named in `notes.running`
    while it runs: it keeps the idle window by reporting progress.
    """
    return rec.open_call is not None and not rec.notes.running


class LeaseKeeper:
    """Renews one turn's lease and sends its heartbeats, for as long as the turn runs."""

    def __init__(self, *, store: Store, clock: Clock, config: RuntimeConfig, lease: Lease) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.lease = lease
        """The lease as last renewed."""
        self.lost = False
        """The turn may no longer be ours: write nothing more for it."""
        self.why_lost = "another driver owns the turn now"
        """What `lost` came from, for the log."""
        self.deadline: asyncio.Timeout | None = None
        """The running graph's deadline (the ceiling); the heartbeat brings it forward."""
        self.went_quiet = False
        """The turn produced nothing for the idle window: its deadline was brought forward."""
        self._heard: asyncio.Event | None = None
        """The event a Stop of the turn heard from another process sets (`_until`)."""

    def start(
        self,
        graph_task: asyncio.Task[object],
        rec: Recorder,
        send: Callable[[EphemeralEvent], None],
    ) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        """Start renewing the lease and sending heartbeats (to `send`); cancel both to stop."""
        keeper = asyncio.create_task(self.keep(graph_task), name="turnkit-lease")
        beat = asyncio.create_task(self.heartbeat(rec, send), name="turnkit-heartbeat")
        return keeper, beat

    def overdue(self, running: Sequence[str] = ()) -> DeadlineExceededError:
        """Why the run's deadline expired: the idle window, or else the ceiling.

        `running` names what the turn waited on then (a tool, a plugin's hook).
        """
        during = f" while {', '.join(dict.fromkeys(running))} ran" if running else ""
        if self.went_quiet:
            return DeadlineExceededError(
                f"the turn produced nothing for {self.config.idle_window_s:g} s{during} "
                "(`RuntimeConfig.idle_window_s`)",
                idle_window_s=self.config.idle_window_s,
            )
        return DeadlineExceededError(
            f"the turn ran past its ceiling of {self.config.ceiling_s:g} s{during} "
            "(`RuntimeConfig.ceiling_s`)",
            ceiling_s=self.config.ceiling_s,
        )

    async def keep(self, graph_task: asyncio.Task[object]) -> None:
        """Renew the lease on the shared grid; cancel `graph_task` once it is lost or Stopped.

        A renewal the database is briefly out of reach for is tried again at the next tick
        while the lease it last renewed still runs (nobody can take the turn before that):
        a blip during a long tool call does not cost the turn an attempt.

        A renewal waits for the database until that lease runs out, and at least half a
        renewal interval: a process that stalled past its lease (a long GC pause, a
        suspended VM, a `FakeClock` jump) asks before it gives the turn up. The renewal is
        fenced by the lease's epoch, so it succeeds only if nobody took the turn meanwhile;
        then the turn is still this driver's alone, and goes on (or ends at the idle window
        or ceiling that passed while it stalled).
        """
        if self.lease.cancel_requested:  # Stop came while no driver held it: do nothing
            stop_task(graph_task)
            return
        ttl = self.config.lease_ttl_s
        interval = ttl / 3
        last = renewed = self.clock.monotonic()
        while True:
            await self._until(renewal_due(last, interval))
            last = self.clock.monotonic()
            try:
                self.lease = await self._renewed(max(renewed + ttl - last, interval / 2))
            except TimeoutError:
                # A database that hangs rather than refuses: the lease may have run out
                # while the renewal waited, and another driver may hold the turn now.
                self.why_lost = "the database did not answer before the lease ran out"
                self.lost = True
                graph_task.cancel()
                return
            except StoreUnavailableError:
                # Judged when the failure came back (a hung connection may take longer than
                # the lease): the next tick must come well before the lease runs out.
                if renewal_due(self.clock.monotonic(), interval) - renewed < ttl - interval / 2:
                    continue
                self.why_lost = "the database was out of reach until the lease ran out"
                self.lost = True
                graph_task.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - any other failure: we may not own it
                self.why_lost = f"its renewal failed: {exc}"
                self.lost = True
                graph_task.cancel()
                return
            renewed = last
            if self.lease.cancel_requested:
                stop_task(graph_task)  # Stop pressed elsewhere: end as cancelled
                return

    async def _until(self, due: float) -> None:
        """Sleep until `due` (monotonic), or until a Stop of the turn is heard meanwhile.

        Where the Store hears Stops pressed in other processes (`Store.stop_signal`,
        unless `RuntimeConfig.listen_for_stops` is off), such a Stop wakes the keeper at
        once: its renewal then says so, and the turn stops without waiting for the grid.
        """
        # A Store of one's own written before `stop_signal` existed hears no Stops.
        listen = getattr(self.store, "stop_signal", None) if self.config.listen_for_stops else None
        signal = listen(self.lease.turn_id) if listen is not None else None
        # Held for the keeper's life (the Store keeps it only while someone does): a Stop
        # heard during the renewal that follows wakes the next wait at once.
        self._heard = signal
        wait = max(0.0, due - self.clock.monotonic())
        if signal is None:
            await self.clock.sleep(wait)
            return
        if not signal.is_set():
            sleeping = asyncio.ensure_future(self.clock.sleep(wait))
            heard = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait((sleeping, heard), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeping.cancel()
                heard.cancel()
        signal.clear()  # heard (or not): the renewal that follows reads the flag

    async def _renewed(self, left: float) -> Lease:
        """The lease renewed, or TimeoutError once `left` seconds (what it has left) pass."""
        renewal = asyncio.ensure_future(self.store.renew(self.lease, ttl_s=self.config.lease_ttl_s))
        expiry = asyncio.ensure_future(self.clock.sleep(max(0.0, left)))
        try:
            await asyncio.wait((renewal, expiry), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            renewal.cancel()
            raise
        finally:
            expiry.cancel()
        if not renewal.done():
            renewal.cancel()
            raise TimeoutError(f"no renewal within the lease's last {left:.1f} s")
        return renewal.result()

    async def heard_elsewhere(self) -> float | None:
        """Seconds since the turn's row was stamped, when that is within the idle window.

        A callback's progress report, from any process, stamps the row
        (`Store.note_activity`), as the driver's own commits do. Read only when the window
        has lapsed. A read that fails or takes longer than a heartbeat interval counts as
        silence, and so does a stamp from the future (a clock that runs ahead, or a test
        clock behind the store's).
        """
        try:
            async with asyncio.timeout(self.config.heartbeat_interval_s):
                record = await self.store.get_turn(self.lease.turn_id)
        except Exception as exc:  # noqa: BLE001 - the window then ends the run as it would
            log.warning("reading turn %s for its idle window failed: %r", self.lease.turn_id, exc)
            return None
        if record is None:
            return None
        ago = (self.clock.now() - record.updated_at).total_seconds()
        return ago if 0.0 <= ago < self.config.idle_window_s else None

    async def heartbeat(self, rec: Recorder, send: Callable[[EphemeralEvent], None]) -> None:
        """Send heartbeats while the turn is quiet; end its run past the idle window.

        The window counts what the turn produces (`rec.last_activity`) and progress
        reported for it from outside the driver (`heard_elsewhere`). While a model call is
        in flight and nothing else is awaited (`reasoning`), the heartbeats sent for it
        count too: a model that thinks without a word is not idle, and only the ceiling,
        its client's own timeout, a Stop or a lost lease end it.
        """
        interval = self.config.heartbeat_interval_s
        last_beat = -math.inf
        while True:
            await self.clock.sleep(interval)
            now = self.clock.monotonic()
            deadline = self.deadline
            thinking = reasoning(rec)
            quiet_for = now - rec.last_activity
            if deadline is not None and not thinking and quiet_for >= self.config.idle_window_s:
                heard = await self.heard_elsewhere()
                if heard is not None:
                    rec.last_activity = max(rec.last_activity, now - heard)
                    continue
                if not deadline.expired():  # else the ceiling already ended the run
                    deadline.reschedule(asyncio.get_running_loop().time())
                    self.went_quiet = True
                return
            if now - max(rec.last_activity, last_beat) >= interval:
                # Straight to the sink: a heartbeat carries nothing that must be ordered
                # after staged events, and LangGraph's writer only works inside a node.
                last_beat = now
                if thinking:  # a heartbeat for a model call restarts the window
                    rec.last_activity = now
                send(
                    HeartbeatEvent(
                        session_id=rec.session_id,
                        turn_id=rec.turn_id,
                        stage_id="runtime",
                        ts=self.clock.now(),
                    )
                )
