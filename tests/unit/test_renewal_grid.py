"""Drivers renew on a grid they share, never further apart than a third of the ttl."""

from __future__ import annotations

import random

from turnkit.runtime.driver import renewal_due


def test_renewals_are_less_than_an_interval_apart_and_not_much_less() -> None:
    rng = random.Random(7)
    interval = 8 / 3
    for _ in range(2000):
        last = rng.uniform(0, 100_000)
        gap = renewal_due(last, interval) - last
        assert interval * 3 / 4 - 1e-9 <= gap < interval


def test_drivers_whose_renewals_fall_in_one_tick_renew_at_the_same_instant() -> None:
    interval = 3.0
    dues = {renewal_due(last, interval) for last in (9.8, 10.0, 10.2, 10.5)}
    assert dues == {12.75}
    assert renewal_due(10.51, interval) == 13.5  # the next tick


class HangThenFail(Exception):
    """A renewal that hangs `seconds`, then raises `error`."""

    def __init__(self, seconds: float, error: Exception) -> None:
        super().__init__(f"hangs {seconds} s")
        self.seconds, self.error = seconds, error


async def test_a_renewal_the_database_misses_is_tried_again_while_the_lease_runs() -> None:
    """A blip during a long tool call costs no attempt; an outage past the lease does."""
    import asyncio
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta
    from typing import Any, cast

    from turnkit.clock import SystemClock
    from turnkit.config import RuntimeConfig
    from turnkit.errors import StoreUnavailableError
    from turnkit.ids import SessionId, TurnId
    from turnkit.runtime._lease_keeper import LeaseKeeper
    from turnkit.store import Lease, Store

    config = RuntimeConfig(lease_ttl_s=0.3, idle_window_s=10, heartbeat_interval_s=1)
    lease = Lease(
        turn_id=TurnId("turn_1"), session_id=SessionId("s1"), owner="me", epoch=1, attempt=1,
        expires_at=datetime.now(UTC) + timedelta(seconds=0.3), took_over=False, last_seq=1,
        started_at=datetime.now(UTC),
    )  # fmt: skip

    async def kept(failures: list[Exception], seconds: float) -> tuple[bool, bool, int, str]:
        renewals = 0

        class Renewing:
            async def renew(self, held: Lease, *, ttl_s: float) -> Lease:
                nonlocal renewals
                renewals += 1
                if failures:
                    failure = failures.pop(0)
                    if isinstance(failure, HangThenFail):
                        await asyncio.sleep(failure.seconds)  # a connection that hangs
                        raise failure.error
                    raise failure
                return replace(held, expires_at=datetime.now(UTC) + timedelta(seconds=ttl_s))

            def stop_signal(self, turn_id: TurnId) -> None:
                return None  # hears no Stop: renewals alone tell

        store = cast(Store, Renewing())
        keeper = LeaseKeeper(store=store, clock=SystemClock(), config=config, lease=lease)
        work: asyncio.Task[Any] = asyncio.create_task(asyncio.sleep(seconds))
        keeping = asyncio.create_task(keeper.keep(cast(Any, work)))
        await asyncio.wait([work], timeout=seconds + 1)
        keeping.cancel()
        return keeper.lost, work.cancelled(), renewals, keeper.why_lost

    blip = StoreUnavailableError("the database cannot be reached")
    lost, cancelled, tries, _ = await kept([blip], 0.6)
    assert (lost, cancelled) == (False, False)  # tried again at the next tick: kept
    assert tries >= 2
    lost, cancelled, _, why = await kept([blip] * 10, 0.6)  # down longer than the lease runs
    assert (lost, cancelled) == (True, True)
    assert why == "the database was out of reach until the lease ran out"  # for the log
    hung = HangThenFail(0.4, blip)  # fails only after the lease (0.3 s) ran out
    lost, cancelled, tries, _ = await kept([hung], 0.8)
    assert (lost, cancelled, tries) == (True, True, 1)  # no retry past the lease's end
    # Fails before the lease's end, but so late that the next try would come after it.
    late = HangThenFail(0.15, blip)
    lost, cancelled, tries, why = await kept([late], 0.8)
    assert (lost, cancelled, tries) == (True, True, 1)
    assert why == "the database was out of reach until the lease ran out"
    # A database that hangs and never answers: the driver stops once the lease runs out,
    # not when the connection gives up (another driver may hold the turn by then).
    forever = HangThenFail(30, blip)
    lost, cancelled, tries, why = await kept([forever], 0.8)
    assert (lost, cancelled, tries) == (True, True, 1)
    assert why == "the database did not answer before the lease ran out"
    lost, cancelled, tries, _ = await kept([RuntimeError("epoch moved on")], 0.6)
    assert (lost, cancelled, tries) == (True, True, 1)  # not an outage: given up at once


async def test_a_driver_that_stalled_past_its_lease_asks_the_database_before_giving_up() -> None:
    """A process stalled past its lease (GC pause, suspended VM, a FakeClock jump): the
    fenced renewal decides. Nobody took the turn: kept. Another epoch: lost. No answer
    within half a renewal interval: lost."""
    import asyncio
    from dataclasses import replace
    from datetime import timedelta
    from typing import Any, cast

    from turnkit.config import RuntimeConfig
    from turnkit.errors import StaleEpochError
    from turnkit.ids import SessionId, TurnId
    from turnkit.runtime._lease_keeper import LeaseKeeper
    from turnkit.store import Lease, Store
    from turnkit.testing import FakeClock

    config = RuntimeConfig(lease_ttl_s=8, idle_window_s=120, heartbeat_interval_s=1)

    async def stalled(answer: str) -> tuple[bool, bool, str]:
        clock = FakeClock()
        lease = Lease(
            turn_id=TurnId("turn_1"), session_id=SessionId("s1"), owner="me", epoch=1,
            attempt=1, expires_at=clock.now() + timedelta(seconds=8), took_over=False,
            last_seq=1, started_at=clock.now(),
        )  # fmt: skip
        asked = asyncio.Event()

        class Renewing:
            async def renew(self, held: Lease, *, ttl_s: float) -> Lease:
                asked.set()
                await asyncio.sleep(0.01)  # a round trip: longer than one loop iteration
                if answer == "stale":
                    raise StaleEpochError("epoch moved on", turn_id=held.turn_id, epoch=2)
                if answer == "hang":
                    await asyncio.sleep(30)
                return replace(held, expires_at=clock.now() + timedelta(seconds=ttl_s))

            def stop_signal(self, turn_id: TurnId) -> None:
                return None

        keeper = LeaseKeeper(store=cast(Store, Renewing()), clock=clock, config=config, lease=lease)
        work: asyncio.Task[Any] = asyncio.create_task(asyncio.sleep(30))
        keeping = asyncio.create_task(keeper.keep(cast(Any, work)))
        await asyncio.sleep(0)
        clock.advance(60)  # the whole process stalled far past the lease's 8 s
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(asked.wait())), 5)
        await asyncio.sleep(0.05)  # the database answered (or did not)
        if answer == "hang":
            clock.advance(config.lease_ttl_s / 3)  # a renewal interval passes unanswered
            await asyncio.sleep(0.01)
        cancelled = work.cancelled() or work.cancelling() > 0
        keeping.cancel()
        work.cancel()
        await asyncio.gather(keeping, work, return_exceptions=True)
        return keeper.lost, cancelled, keeper.why_lost

    lost, cancelled, _ = await stalled("ours")
    assert (lost, cancelled) == (False, False)  # nobody took it: the turn goes on
    lost, cancelled, why = await stalled("stale")
    assert (lost, cancelled) == (True, True)
    assert why.startswith("its renewal failed")
    lost, cancelled, why = await stalled("hang")
    assert (lost, cancelled) == (True, True)
    assert why == "the database did not answer before the lease ran out"


async def test_a_stop_heard_while_the_lease_is_being_renewed_stops_the_turn_at_once() -> None:
    """The notification of a Stop can land during a renewal that read the turn just before
    the Stop committed: the keeper still holds the turn's event then, so its next wait
    ends at once and the renewal after it reads the Stop (not a third of the ttl later)."""
    import asyncio
    import weakref
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta
    from typing import Any, cast

    from turnkit.clock import SystemClock
    from turnkit.config import RuntimeConfig
    from turnkit.ids import SessionId, TurnId
    from turnkit.runtime._lease_keeper import LeaseKeeper
    from turnkit.store import Lease, Store

    config = RuntimeConfig(lease_ttl_s=60, idle_window_s=120, heartbeat_interval_s=1)
    lease = Lease(
        turn_id=TurnId("turn_1"), session_id=SessionId("s1"), owner="me", epoch=1, attempt=1,
        expires_at=datetime.now(UTC) + timedelta(seconds=60), took_over=False, last_seq=1,
        started_at=datetime.now(UTC),
    )  # fmt: skip

    class Listening:
        """As the PostgreSQL Store: events kept only while someone holds them."""

        def __init__(self) -> None:
            self.stops: weakref.WeakValueDictionary[str, asyncio.Event] = (
                weakref.WeakValueDictionary()
            )
            self.renewals = 0

        def stop_signal(self, turn_id: TurnId) -> asyncio.Event:
            signal = self.stops.get(turn_id)
            if signal is None:
                signal = self.stops[turn_id] = asyncio.Event()
            return signal

        async def renew(self, held: Lease, *, ttl_s: float) -> Lease:
            self.renewals += 1
            stopped = self.renewals > 1
            if self.renewals == 1:
                import gc

                gc.collect()
                if (signal := self.stops.get(held.turn_id)) is not None:
                    signal.set()  # the Stop's NOTIFY, arriving while this renewal runs
            return replace(
                held,
                expires_at=datetime.now(UTC) + timedelta(seconds=ttl_s),
                cancel_requested=stopped,
            )

    store = Listening()
    keeper = LeaseKeeper(store=cast(Store, store), clock=SystemClock(), config=config, lease=lease)
    work: asyncio.Task[Any] = asyncio.create_task(asyncio.sleep(3600))
    keeping = asyncio.create_task(keeper.keep(cast(Any, work)))
    try:
        for _ in range(100):  # the keeper waits for its first renewal, its event held
            if lease.turn_id in store.stops:
                break
            await asyncio.sleep(0.01)
        store.stops[lease.turn_id].set()  # some signal: the keeper renews at once
        await asyncio.wait([work], timeout=10)  # a renewal interval is 20 s here
        assert work.cancelled(), f"still running after {store.renewals} renewal(s)"
        assert store.renewals == 2
    finally:
        keeping.cancel()
        work.cancel()
