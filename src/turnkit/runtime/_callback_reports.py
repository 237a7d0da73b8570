"""Callbacks from work in another process: its token, its turn's scope, its progress."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from turnkit.errors import ConfigurationError, InvalidInputError, TurnNotRunningError
from turnkit.events import (
    JobProgressEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
    encode_event,
)
from turnkit.ids import TurnId
from turnkit.replay import EntriesLostError
from turnkit.runtime._reads import RuntimeReads
from turnkit.runtime._runner import Pinned
from turnkit.runtime.callbacks import CallbackScope, callback_token, check_callback_token

__all__ = ("RuntimeCallbacks",)

log = logging.getLogger("turnkit.runtime")


class RuntimeCallbacks(RuntimeReads):
    """`SessionRuntime`'s callback methods (any process with the same secret accepts them)."""

    def callback_token(self, turn_id: str) -> str:
        """The token work in another process reports back to `turn_id` with.

        Tools get it as `ToolContext.callback_token`; any process with the same
        `RuntimeConfig.callback_secret` accepts it.
        """
        if self.config.callback_secret is None:
            raise ConfigurationError("callback tokens need RuntimeConfig(callback_secret=...)")
        return callback_token(self.config.callback_secret, turn_id)

    async def verify_callback(self, turn_id: str, token: str) -> CallbackScope:
        """Check a callback's token and that its turn is running; who it acts for.

        The token is checked before anything is read.

        Raises:
            CallbackTokenError: not this turn's token (or no `callback_secret` here).
            TurnNotFoundError: no such turn.
            TurnNotRunningError: the turn finished, failed, was cancelled or is paused.
        """
        check_callback_token(self.config.callback_secret, turn_id, token)
        record = await self.turn(turn_id)
        if record.status != "running":
            raise TurnNotRunningError(
                f"turn {turn_id!r} is {record.status}: callbacks reach only running turns",
                turn_id=turn_id,
                status=record.status,
            )
        pinned = Pinned.of(record)
        return CallbackScope(
            turn_id=record.turn_id,
            session_id=record.session_id,
            principal=pinned.caller,
            organisation=pinned.organisation,
            department=pinned.department,
        )

    async def report_job_progress(
        self,
        turn_id: str,
        token: str,
        *,
        job_id: str,
        tool_call_id: str,
        progress: float | None = None,
        message: str | None = None,
    ) -> CallbackScope:
        """A callback: publish a `job.progress` event to the turn's live readers.

        The event is ephemeral (the turn's driver alone writes its durable log). The report
        restarts the turn's idle window, wherever its driver runs (it stamps the turn's
        row). Raises as
        `verify_callback` does, and `InvalidInputError` for a progress outside 0–1, or a
        `tool_call_id` that is not a call of the turn still running (nothing is published).
        """
        scope = await self.verify_callback(turn_id, token)
        try:
            event = JobProgressEvent(
                session_id=scope.session_id,
                turn_id=scope.turn_id,
                stage_id="tool-loop",
                ts=self.clock.now(),
                job_id=job_id,
                tool_call_id=tool_call_id,
                progress=progress,
                message=message,
            )
        except ValidationError as exc:
            raise InvalidInputError(f"a bad job progress report: {exc.errors()[0]['msg']}") from exc
        turn = TurnId(scope.turn_id)
        await self._check_running_call(turn, tool_call_id)
        try:  # the driver's idle window reads the stamp; the report goes out regardless
            await self.store.note_activity(turn)
        except Exception as exc:  # noqa: BLE001 - a missed stamp only shortens the window
            log.warning("stamping progress on turn %s failed: %s", turn, exc)
        await self._publish_progress(turn, encode_event(event))
        return scope

    async def _publish_progress(self, turn: TurnId, data: bytes) -> None:
        """Add the report to the turn's stream in the buffer, never making the stream anew.

        A remote buffer whose stream of the turn is gone (Redis restarted empty) gets no
        report: made again by it, the stream would hide the loss from the driver, whose next
        publish would not send the text of its open blocks first. The report is ephemeral;
        the next one reaches readers again once the driver's publish made the stream.
        """
        entries = [(None, data, False)]
        after = getattr(self.replay, "publish_after", None)
        if after is None:
            await self.replay.publish(turn, entries)
            return
        try:
            await after(turn, entries)
        except EntriesLostError:
            log.debug("the buffer lost turn %s's stream: a progress report skipped", turn)

    async def _check_running_call(self, turn: TurnId, tool_call_id: str) -> None:
        """The turn started the call `tool_call_id` and has not finished it, by its log.

        Raises:
            InvalidInputError: no such call in the turn, or it finished already.
        """
        started = ended = False
        async for stored in self.store.read_events(turn):
            if stored.type not in _CALL_EVENTS or tool_call_id.encode() not in stored.data:
                continue  # decoded only when it may name the call
            event = stored.decode()
            if isinstance(event, ToolStartedEvent) and event.block.tool_call_id == tool_call_id:
                started = True
            elif isinstance(event, ToolCompletedEvent | ToolFailedEvent) and (
                event.result.tool_call_id == tool_call_id
            ):
                ended = True
        if not started or ended:
            said = "finished already" if ended else "is not one of its tool calls"
            raise InvalidInputError(
                f"tool call {tool_call_id!r} of turn {turn!r} {said}: a job reports progress "
                "only for a call still running",
                tool_call_id=tool_call_id,
            )


_CALL_EVENTS = frozenset({"tool.started", "tool.completed", "tool.failed"})
