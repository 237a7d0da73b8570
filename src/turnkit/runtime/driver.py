"""`TurnDriver`: runs one turn's graph and owns its ending (write before send throughout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

from turnkit.audit import CallShape
from turnkit.clock import Clock
from turnkit.errors import InternalError, StaleEpochError, TurnError
from turnkit.events import (
    CheckpointCreatedEvent,
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    ErrorEvent,
    TurnStartedEvent,
)
from turnkit.graph import TurnGraph, TurnState, latest_checkpoint_id, stream_turn
from turnkit.stages import StageContext
from turnkit.stages._types import Route, TranscriptMessage
from turnkit.store import Store, TurnRecord
from turnkit.telemetry import Recorder

__all__ = ("TurnDriver",)

Sink = Callable[[DurableEvent | EphemeralEvent | None], None]
"""Where the driver sends events; `None` marks the end of the turn."""


class TurnDriver:
    """Drives one turn: starts it, runs the graph, and writes exactly one ending."""

    def __init__(
        self,
        *,
        graph: TurnGraph,
        store: Store,
        clock: Clock,
        record: TurnRecord,
        ctx_factory: Callable[[Recorder], StageContext],
        transcript: list[TranscriptMessage],
        entry: Route,
        effort: Literal["off", "low", "medium", "high"],
        durability: Literal["sync", "async", "exit"],
        sink: Sink,
    ) -> None:
        self.graph = graph
        self.record = record
        self.sink = sink
        self.transcript = transcript
        self.entry = entry
        self.effort = effort
        self.durability = durability
        self.recorder = Recorder(
            store=store,
            session_id=record.session_id,
            turn_id=record.turn_id,
            epoch=record.lease_epoch,
            clock=clock,
            publish=self._publish,
            last_seq=record.last_seq,
        )
        self.ctx = ctx_factory(self.recorder)

    def _publish(self, event: DurableEvent | EphemeralEvent) -> None:
        self.sink(event)

    async def run(self) -> None:
        """Run the turn to a terminal state. Cancelling this task aborts the turn."""
        rec = self.recorder
        record = self.record
        rec.durable(
            TurnStartedEvent,
            "runtime",
            content=record.content,
            request_id=record.request_id,
            agent=record.agent,
            model=record.model,
            effort=self.effort,
        )
        state: TurnState = {
            "transcript": self.transcript,
            "content": record.content,
            "route": self.entry,
            "iteration": 0,
            "last_request_len": 0,
        }
        try:
            try:
                async for chunk in stream_turn(
                    self.graph,
                    state,
                    self.ctx,
                    thread_id=record.turn_id,
                    durability=self.durability,
                ):
                    if isinstance(chunk, DurableEvent | EphemeralEvent):
                        self.sink(chunk)
            finally:
                rec.publish = self._publish  # the last node's stream writer is gone
            checkpoint_id = await latest_checkpoint_id(self.graph, record.turn_id)
            if checkpoint_id is not None:
                rec.durable(CheckpointCreatedEvent, "post-turn", checkpoint_id=checkpoint_id)
            rec.durable(DoneEvent, "post-turn", status="succeeded")
            await rec.flush(status="succeeded")
        except asyncio.CancelledError:
            await self._end_aborted()
            raise
        except StaleEpochError:
            raise  # another driver owns the turn: write nothing more
        except TurnError as exc:
            await self._end_failed(exc)
        except Exception as exc:  # noqa: BLE001 - any bug still ends the turn with a clear state
            await self._end_failed(
                InternalError(f"unexpected {type(exc).__name__} inside the turn: {exc}")
            )
        finally:
            self.sink(None)

    async def _end_failed(self, exc: TurnError) -> None:
        rec = self.recorder
        rec.durable(ErrorEvent, "runtime", code=exc.code, message=exc.message)
        rec.durable(DoneEvent, "runtime", status="failed", error_code=exc.code)
        await rec.flush(status="failed", error_code=exc.code)

    async def _end_aborted(self) -> None:
        rec = self.recorder
        call = rec.open_call
        if call is not None:
            rec.audit(
                call.stage_id,
                call=CallShape(
                    provider=call.provider,
                    model=call.model,
                    family=call.family,
                    rung=call.rung,
                    latency_ms=(time.perf_counter() - call.started) * 1000,
                    outcome="user-aborted",
                    error_code="user-aborted",
                ),
            )
            rec.open_call = None
        rec.durable(DoneEvent, "runtime", status="cancelled")
        await rec.flush(status="cancelled")
