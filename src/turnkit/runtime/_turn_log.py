"""What a process that drives turns logs of each: a model that failed over, then its ending.

A worker logs on `turnkit.worker`, a runtime driving its own turns on `turnkit.runtime`:
an operator of either sees a provider outage and every turn's ending in the log, not only
in the turns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from turnkit.clock import Clock
from turnkit.events import DoneEvent, DurableEvent, EphemeralEvent, ProviderCascadeEvent
from turnkit.runtime.driver import TurnDriver
from turnkit.states import awaiting
from turnkit.store import Lease

__all__ = ("LEFT", "TurnLog")

Sink = Callable[[DurableEvent | EphemeralEvent | None], None]

LEFT = "left to another process (shutting down)"


class TurnLog:
    """One turn's lines: `see` each event it streams, then `finished` once it is over."""

    __slots__ = ("_clock", "_fallback_level", "_lease", "_log", "_started", "ended")

    def __init__(
        self, log: logging.Logger, lease: Lease, clock: Clock, *, fallback_level: int
    ) -> None:
        """`fallback_level`: what a fallback is logged at.

        A worker's are warnings; an app's own runtime says them at INFO, since its caller
        streams the same `provider.cascade`, and an app that set no logging up would get
        them on stderr.
        """
        self._log, self._lease, self._clock = log, lease, clock
        self._fallback_level = fallback_level
        self._started = clock.monotonic()
        self.ended: str | None = None
        """The status (with its error code) its `done` said; None before it."""

    def see(self, event: DurableEvent | EphemeralEvent | None) -> None:
        if isinstance(event, DoneEvent):
            code = event.error_code if event.status != "succeeded" else None
            self.ended = f"{event.status} ({code})" if code else event.status
        elif isinstance(event, ProviderCascadeEvent):  # a provider outage, visible
            self._log.log(
                self._fallback_level,
                "turn %s: model %s failed (%s); %s",
                self._lease.turn_id,
                event.from_model,
                event.reason,
                f"trying {event.to_model}" if event.to_model else "no model left to try",
                extra=self._about,
            )

    def watching(self, then: Sink) -> Sink:
        """A sink that notes each event, then hands it to `then`."""

        def sink(event: DurableEvent | EphemeralEvent | None) -> None:
            self.see(event)
            then(event)

        return sink

    def outcome(self, driver: TurnDriver | None, *, leaving: bool = False) -> str:
        """How the turn stands now its driver returned: its ending, or why it has none."""
        if self.ended is not None:
            return self.ended
        if leaving or (driver is not None and driver.abandoned):
            return LEFT
        if driver is not None and driver.lease_lost:
            return f"lease lost ({driver.why_lease_lost})"
        recorder = driver.recorder if driver is not None else None
        pause = recorder.notes.pending_pause if recorder is not None else None
        return awaiting(pause.kind) if pause is not None else "ended"

    def finished(self, outcome: str, driver: TurnDriver | None = None) -> None:
        """The turn's ending line; with the trace ids of `driver`'s attempt span, if any.

        It is written once that span has ended, maybe inside another span (the request
        that answered a pause): the line still joins the attempt it tells the end of.
        """
        seconds = self._clock.monotonic() - self._started
        took = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
        self._log.info(
            "finished turn %s (session %s): %s in %s",
            self._lease.turn_id,
            self._lease.session_id,
            outcome,
            took,
            extra=self._about | _trace_ids(driver),
        )

    @property
    def _about(self) -> dict[str, str]:
        """What a JSON line says the record is about (`turnkit.runtime.logs`)."""
        return {"turn_id": self._lease.turn_id, "session_id": self._lease.session_id}


def _trace_ids(driver: TurnDriver | None) -> dict[str, str]:
    ids = driver.trace_ids if driver is not None else None
    return {"trace_id": ids[0], "span_id": ids[1]} if ids is not None else {}
