"""What a callback from another process does: check its turn, then report to its readers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from pydantic import ValidationError

from turnkit.errors import InvalidInputError, TurnNotRunningError
from turnkit.events import JobProgressEvent, encode_event
from turnkit.ids import TurnId
from turnkit.replay import ReplayBuffer
from turnkit.runtime._runner import Pinned
from turnkit.runtime.callbacks import CallbackScope, check_callback_token
from turnkit.store import Store, TurnRecord

__all__ = ("callback_scope", "publish_job_progress")

log = logging.getLogger("turnkit.runtime")


async def callback_scope(
    turn: Callable[[str], Awaitable[TurnRecord]], secret: str | None, turn_id: str, token: str
) -> CallbackScope:
    """Check a callback's token and that its turn is running; who it acts for.

    The token is checked before anything is read (`turn` looks the turn up only then).

    Raises:
        CallbackTokenError: not this turn's token (or no secret).
        TurnNotFoundError: no such turn.
        TurnNotRunningError: the turn finished, failed, was cancelled or is paused.
    """
    check_callback_token(secret, turn_id, token)
    record = await turn(turn_id)
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


async def publish_job_progress(
    store: Store,
    replay: ReplayBuffer,
    scope: CallbackScope,
    *,
    ts: datetime,
    job_id: str,
    tool_call_id: str,
    progress: float | None,
    message: str | None,
) -> None:
    """Publish a `job.progress` event to the turn's live readers; restart its idle window.

    Raises `InvalidInputError` for a progress outside 0–1 (nothing is published).
    """
    try:
        event = JobProgressEvent(
            session_id=scope.session_id,
            turn_id=scope.turn_id,
            stage_id="tool-loop",
            ts=ts,
            job_id=job_id,
            tool_call_id=tool_call_id,
            progress=progress,
            message=message,
        )
    except ValidationError as exc:
        raise InvalidInputError(f"a bad job progress report: {exc.errors()[0]['msg']}") from exc
    try:  # the driver's idle window reads the stamp; the report goes out regardless
        await store.note_activity(TurnId(scope.turn_id))
    except Exception as exc:  # noqa: BLE001 - a missed stamp only shortens the window
        log.warning("stamping progress on turn %s failed: %s", scope.turn_id, exc)
    await replay.publish(TurnId(scope.turn_id), [(None, encode_event(event), False)])
