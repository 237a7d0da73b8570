"""`Worker`: claims queued runs from the Store and drives each under a lease.

`turnkit worker` runs one. Claims use `FOR UPDATE SKIP LOCKED` on PostgreSQL, so any
number of workers can share one database; each run gets its own task, under a
concurrency bound. The worker also sweeps orphaned runs on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from turnkit.errors import ConfigurationError, StoreUnavailableError
from turnkit.ids import TurnId
from turnkit.runtime import SessionRuntime
from turnkit.runtime._cancel import stop_task
from turnkit.runtime._claims import ClaimsInFlight
from turnkit.runtime._publish import BufferPublisher
from turnkit.runtime._slots import Slot
from turnkit.runtime._turn_log import TurnLog
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.driver import TurnDriver, hand_over_all
from turnkit.store import Lease
from turnkit.store.sql import tls_file_missing, tls_file_refused, tls_refused, unresolved_host

__all__ = ("Worker", "until_reached")

log = logging.getLogger("turnkit.worker")


STILL_AWAY_EVERY_S = 30.0
"""While the database stays away, a warning says so again this often (and for how long)."""

UNRESOLVED_GRACE_S = 30.0
"""How long a starting process waits for a database host name that does not resolve, or a
TLS file the database URL names that is missing or unreadable.

A name a platform gives a service (a compose service, a StatefulSet's pod) may not exist
until that service is up, nor a certificate a sidecar writes until it has run; one still
not there after this is taken as a mistyped URL."""


class _Backoff:
    """0.2 s doubling to 5 s while the database is away.

    Logs a warning when an outage starts, another every `STILL_AWAY_EVERY_S` while it
    lasts (so a worker stuck waiting says so), and an INFO line when it ends.
    """

    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger
        self.delay = 0.0
        self.away = False
        self._since = self._told = 0.0

    def next(self, exc: Exception) -> float:
        now = time.monotonic()
        if not self.away:
            self.log.warning("the database is unavailable (%s); retrying with backoff", exc)
            self.away, self._since, self._told = True, now, now
        elif now - self._told >= STILL_AWAY_EVERY_S:
            self.log.warning(
                "the database is still unavailable after %.0f s (%s); retrying with backoff",
                now - self._since,
                exc,
            )
            self._told = now
        return self.later()

    def later(self) -> float:
        """The next wait, for a failure that is not an outage (logged by the caller)."""
        self.delay = min(max(self.delay * 2, 0.2), 5.0)
        return self.delay

    def reset(self) -> None:
        if self.away:
            log.info("the database is back; claiming again")
        self.delay, self.away = 0.0, False


async def _wait(seconds: float, *events: asyncio.Event) -> None:
    """Until one of `events` is set, at most `seconds`."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


async def until_reached(
    attempt: Callable[[], Awaitable[object]],
    database_url: str,
    stop: asyncio.Event,
    *,
    logger: logging.Logger = log,
) -> bool:
    """Run `attempt` until it reaches the database; False if `stop` is set first.

    A database that is down or refuses connections is waited out with backoff (0.2 s
    doubling to 5 s), logged when it starts and again every 30 s while it lasts. So is,
    for `UNRESOLVED_GRACE_S`, what may not exist yet while the process starts: a host name
    that does not resolve (a platform's name for a service that is not up yet), and a TLS
    file the URL names that is missing or unreadable (a certificate a sidecar writes).

    Raises:
        ConfigurationError: the database's host name still does not resolve, or a TLS
            file the URL names (`sslrootcert`, `sslcert`, `sslkey`, `sslcrl`) is still
            missing or unreadable, after `UNRESOLVED_GRACE_S` (a mistyped URL, most
            likely); or at once, its TLS settings cannot reach it (a certificate that
            fails verification) or a TLS file holds no certificate or key it can use: no
            wait mends those.
    """
    backoff = _Backoff(logger=logger)
    missing_since: float | None = None
    while not stop.is_set():
        try:
            await attempt()
            return True
        except (StoreUnavailableError, OSError) as exc:
            missing = _not_there_yet(exc, database_url)
            now = time.monotonic()
            if missing is None:
                missing_since = None
            elif missing_since is None:
                missing_since = now
                logger.warning("%s; waiting up to %g s for it", missing, UNRESOLVED_GRACE_S)
            elif now - missing_since >= UNRESOLVED_GRACE_S:
                raise ConfigurationError(missing) from exc
            await _wait(backoff.next(exc), stop)
    return False


def _not_there_yet(exc: BaseException, database_url: str) -> str | None:
    """What `exc` says is not there (yet), as `until_reached` says it after the grace.

    None for an outage.

    Raises:
        ConfigurationError: what no wait mends (`tls_refused`, a TLS file unparsed).
    """
    missing = tls_file_missing(exc, database_url)
    refused = tls_refused(exc) or (None if missing else tls_file_refused(exc, database_url))
    if refused is not None:
        raise ConfigurationError(refused) from exc
    if missing is not None:
        return missing
    host = unresolved_host(exc, database_url)
    if host is None:
        return None
    return f"the database host {host!r} does not resolve: check the host name in the database URL"


class Worker:
    """Claim-and-drive loop over one `SessionRuntime`'s Store.

    Args:
        runtime: Supplies the Store, the compiled graph, the agent and the config.
        concurrency: At most this many turns run at once.
        poll_interval_s: How long to wait when nothing is claimable. A worker driving
            `concurrency` turns does not poll: it claims again as soon as one ends.
        listen: Also wake when the Store announces a claimable turn (PostgreSQL:
            `LISTEN`), so a new message is claimed at once rather than at the next
            poll; and hear a Stop pressed elsewhere for a turn it drives at once
            (`RuntimeConfig.listen_for_stops`, which off also turns this off). Turn it
            off behind a pooler that cannot relay notifications (PgBouncer in
            transaction mode); the worker then only polls, and its turns learn of such a
            Stop at their next lease renewal.
        sweep_interval_s: How often to run the orphan sweep.
        drain_timeout_s: On stop, how long running turns may take before they are
            abandoned: their tasks stop without ending the turns, which are handed
            over for another worker to take at once (or, when the database cannot be
            told, once their leases lapse).
        owner: The lease owner name it claims under (default: the runtime's). A loop
            beside an app that drives turns itself takes a name of its own, so a Stop
            of the app's turn never mistakes this loop's lease for the app's.
    """

    def __init__(
        self,
        runtime: SessionRuntime,
        *,
        concurrency: int = 4,
        poll_interval_s: float = 0.2,
        sweep_interval_s: float = 30.0,
        drain_timeout_s: float = 30.0,
        listen: bool = True,
        owner: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.runtime = runtime
        self.owner = owner or runtime.owner
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.sweep_interval_s = sweep_interval_s
        self.drain_timeout_s = drain_timeout_s
        self.listen = listen
        self._tasks: set[asyncio.Task[None]] = set()
        self._drivers: dict[asyncio.Task[None], TurnDriver] = {}
        self._claimed: dict[asyncio.Task[None], Lease] = {}
        """Each driving task's lease, from its claim (its driver may not be built yet)."""
        self._claims = ClaimsInFlight()
        """Its claim under way, if any: a Stop waits for it to land (`stop`)."""
        self._stopped: set[asyncio.Task[None]] = set()
        """Tasks cancelled by `stop` (Stop pressed), not by shutting down."""
        self._room = asyncio.Event()
        """Set when a turn this worker drives ends (room for another claim)."""

    @property
    def running(self) -> int:
        """Turns being driven now."""
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and drive runs until `stop` is set, then drain.

        A database that cannot be reached (at start or later) is waited out with backoff
        (0.2 s doubling to 5 s): the worker logs it, again every 30 s while it lasts, and
        keeps trying until `stop`. At start, a host name that still does not resolve or a
        TLS file the URL names that is still not there after `UNRESOLVED_GRACE_S` (30 s),
        or at once TLS settings that cannot reach the database (a certificate that fails
        verification, a TLS file with no certificate or key in it), raise
        `ConfigurationError` instead.
        """
        runtime = self.runtime
        if not await self._until_open(stop):
            log.info("worker %s stopped before the database could be reached", self.owner)
            return
        clock = runtime.clock
        next_sweep = clock.monotonic()
        log.info("worker %s started (concurrency %d)", self.owner, self.concurrency)
        backoff = _Backoff()
        listening = False
        try:
            while not stop.is_set():
                try:
                    if clock.monotonic() >= next_sweep:
                        await self._sweep_logged()
                        next_sweep = clock.monotonic() + self.sweep_interval_s
                    work = await runtime.store.work_signal() if self.listen else None
                    if work is not None:
                        if not listening:
                            log.info("listening for new turns (LISTEN turnkit_work)")
                            listening = True
                        work.clear()  # before the claim: what is announced after it wakes us
                    claimed = await self._claim_one()
                except StoreUnavailableError as exc:
                    await _wait(backoff.next(exc), stop)
                    continue
                except Exception as exc:  # not an outage the driver recognised: log it, go on
                    if backoff.delay == 0.0:  # the first of a run: with its traceback
                        log.exception("claiming failed; retrying with backoff")
                    else:
                        log.warning("claiming still fails: %r", exc)
                    await _wait(backoff.later(), stop)
                    continue
                backoff.reset()
                if claimed:
                    continue
                if len(self._tasks) >= self.concurrency:  # full: wait for a turn to end
                    self._room.clear()
                    until_sweep = max(0.0, next_sweep - clock.monotonic())
                    await _wait(until_sweep, stop, self._room)
                else:  # until a turn is announced, or the next poll (a lease lapses unheard)
                    await _wait(self.poll_interval_s, stop, *([work] if work is not None else []))
        finally:
            await self._drain()
            log.info("worker %s stopped", self.owner)

    async def _sweep_logged(self) -> None:
        """The periodic sweep; a failure other than an outage is logged, not fatal to claiming.

        The next sweep interval tries again.
        """
        try:
            await self.sweep()
        except StoreUnavailableError:
            raise
        except Exception:
            log.exception("the sweep failed; trying again after the sweep interval")

    async def _until_open(self, stop: asyncio.Event) -> bool:
        return await until_reached(self.runtime.open, self.runtime.config.database_url, stop)

    async def _claim_one(self) -> bool:
        """Claim and start one runnable turn, if there is room and one; whether it did.

        Room means one of this worker's `concurrency` and a free slot of its process
        (`RuntimeConfig.max_running_turns`, which the app's own turns share when the
        loop runs beside them: it takes no slot a turn waits for).
        """
        if len(self._tasks) >= self.concurrency:
            return False
        slot = self.runtime.host.slots.try_take()
        if slot is None:
            return False
        runtime, config = self.runtime, self.runtime.config
        try:
            lease = await self._claims.claim(
                runtime.store.claim(
                    self.owner, ttl_s=config.lease_ttl_s, max_attempts=config.max_attempts
                )
            )
        except BaseException:
            slot.release()
            raise
        if lease is None:
            slot.release()
            return False
        self._start(lease, slot)
        return True

    def _start(self, lease: Lease, slot: Slot) -> None:
        about = {"turn_id": lease.turn_id, "session_id": lease.session_id}  # for JSON lines
        if lease.took_over:
            log.info(
                "recovering turn %s (session %s): attempt %d, %s",
                lease.turn_id,
                lease.session_id,
                lease.attempt,
                "handed over by a process that shut down"
                if lease.handed_over
                else "its previous driver's lease expired",
                extra=about,
            )
        else:
            log.info(
                "claimed turn %s (session %s, attempt %d)",
                lease.turn_id,
                lease.session_id,
                lease.attempt,
                extra=about,
            )
        task = asyncio.create_task(self._drive(lease), name=f"turnkit-turn-{lease.turn_id}")
        self._claimed[task] = lease  # a Stop finds it before its first step (`stop`)
        self._tasks.add(task)
        task.add_done_callback(lambda done: slot.release())
        task.add_done_callback(self._ended)

    async def stop(self, turn_id: TurnId, *, by: str | None = None) -> bool:
        """Stop a turn this worker drives: it ends `cancelled`. False if it drives none.

        A turn it claimed whose driver is not built yet, or was stopped before it wrote
        anything, is ended in the Store, where this worker's lease on it no longer counts.
        `by`: who pressed Stop.
        """
        await self._claims.landed()  # a claim in flight may be this turn's: let it land
        for task, lease in list(self._claimed.items()):
            if lease.turn_id == turn_id:  # its driver built or not (it then never runs)
                self._stopped.add(task)
                stop_task(task)
                await asyncio.gather(task, return_exceptions=True)
                # A driver that wrote its ending keeps it; one stopped before it could
                # write anything leaves the turn to end here, where our lease no longer counts.
                await self.runtime.store.cancel(turn_id, stopped_owner=self.owner, by=by)
                return True
        return False

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._room.set()

    async def _drive(self, lease: Lease) -> None:
        task = asyncio.current_task()
        assert task is not None
        said = TurnLog(log, lease, self.runtime.clock, fallback_level=logging.WARNING)
        outcome = "ended"
        driver: TurnDriver | None = None
        async with BufferPublisher(self.runtime.replay, lease.turn_id) as publisher:
            try:
                self._claimed[task] = lease  # a drain hands it over, also before it is built
                host = self.runtime.host
                deps = host.keep_deps(lease.turn_id, NO_DEPS)  # a caller's here, if any
                runner = self.runtime.runner()
                if not self.listen:  # nor for Stops: nothing here relays notifications
                    runner.config = dataclasses.replace(runner.config, listen_for_stops=False)
                driver = await runner.driver(lease, sink=said.watching(publisher), deps=deps)
                self._drivers[task] = driver
                await driver.run()
                if driver.ended:
                    host.turn_ended(lease.turn_id)
                outcome = said.outcome(driver)  # abandoned by the drain: left, not ended
            except asyncio.CancelledError:
                # Stopped here, or ended by the driver itself (Stop pressed in another
                # process cancels the driving task once the turn's ending is written).
                outcome = "cancelled" if task in self._stopped else said.outcome(None, leaving=True)
                raise
            except Exception:
                outcome = "crashed"
                log.exception("driving %s failed", lease.turn_id)
            finally:
                self._drivers.pop(task, None)
                self._claimed.pop(task, None)
                self._stopped.discard(task)
                said.finished(outcome, driver)

    async def sweep(self) -> list[str]:
        """End orphaned runs now; returns their turn ids.

        With budgets enforced it also resumes turns paused `awaiting_budget` that a new
        budget period (or a limit raised elsewhere) leaves room for; this worker then
        claims them like any queued turn.
        """
        config = self.runtime.config
        ended = await self.runtime.store.sweep(
            ceiling_s=config.ceiling_s, max_attempts=config.max_attempts
        )
        for turn_id in ended:
            log.warning("swept %s: timed out with no live driver", turn_id)
            self.runtime.forget_ended(turn_id)
        if ended:  # their drivers are gone: their live entries need not outlive the grace
            releases = (self.runtime.replay.release(TurnId(t)) for t in ended)
            with contextlib.suppress(Exception):  # a hung buffer holds the sweep 2 s at most
                async with asyncio.timeout(2.0):
                    await asyncio.gather(*releases, return_exceptions=True)
        if config.budgets == "enforce":
            for resumed in await self.runtime.resume_budget_pauses():
                log.info("resumed %s: its budget has room again", resumed)
        return list(ended)

    async def _drain(self) -> None:
        if not self._tasks:
            return
        log.info(
            "stopping: waiting up to %g s for %d running turn(s) to finish",
            self.drain_timeout_s,
            len(self._tasks),
        )
        _, pending = await asyncio.wait(set(self._tasks), timeout=self.drain_timeout_s)
        left = []
        for task in pending:
            # Shutting down is not Stop: leave the turn to the next worker, write nothing.
            driver = self._drivers.get(task)
            if driver is not None:
                driver.abandon()
                left.append(driver.lease)
            elif (claimed := self._claimed.get(task)) is not None:  # its driver not built yet
                left.append(claimed)
            task.cancel()
        # Each task's last commit and publish are bounded (`HAND_OVER_WITHIN_S`,
        # `CUT_SHORT_FLUSH_S`): a hung Redis must not eat the hand-over's own time.
        await asyncio.gather(*pending, return_exceptions=True)
        await hand_over_all(self.runtime.store, left, log)  # taken over now, within 2 s
