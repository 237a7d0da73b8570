"""`DeltaBuilder`: a turn's `message.delta` events, built without pydantic's per-event work."""

from __future__ import annotations

from datetime import datetime

from turnkit.events import MessageDeltaEvent
from turnkit.ids import SessionId, StageId, TurnId

__all__ = ("DeltaBuilder",)

_set = object.__setattr__


class DeltaBuilder:
    """Builds one turn's text deltas: the first validated, each later one copied from it.

    The copy is what pydantic's `model_construct` does, without its per-field work (a few
    µs per event): every field is set already, and the new values are of the same types.
    """

    __slots__ = ("_session_id", "_template", "_turn_id")

    def __init__(self, session_id: SessionId, turn_id: TurnId) -> None:
        self._session_id = session_id
        self._turn_id = turn_id
        self._template: MessageDeltaEvent | None = None

    def __call__(
        self, stage_id: StageId, ts: datetime, block_id: str, text: str
    ) -> MessageDeltaEvent:
        """A `message.delta` of `text` in block `block_id`."""
        template = self._template
        if template is None:
            self._template = MessageDeltaEvent(
                session_id=self._session_id,
                turn_id=self._turn_id,
                stage_id=stage_id,
                ts=ts,
                block_id=block_id,
                text=text,
            )
            return self._template
        event = MessageDeltaEvent.__new__(MessageDeltaEvent)
        values = template.__dict__.copy()
        values.update(stage_id=stage_id, ts=ts, block_id=block_id, text=text)
        _set(event, "__dict__", values)
        _set(event, "__pydantic_fields_set__", set(template.__pydantic_fields_set__))
        _set(event, "__pydantic_extra__", None)
        _set(event, "__pydantic_private__", None)
        return event
