"""A runtime's read side: a session's history and projections, a turn's events and audit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from turnkit.audit import AuditRow
from turnkit.errors import InvalidInputError, SessionNotFoundError, TurnNotFoundError
from turnkit.events import DurableStreamEvent, StreamEvent
from turnkit.ids import SessionId, TurnId
from turnkit.projection import PendingDecision, QueuedInput, SessionView, TurnView
from turnkit.runtime._core import RuntimeCore
from turnkit.runtime._follow import until_waiting
from turnkit.runtime._history import TurnHistory, session_view, turn_history, turn_view
from turnkit.runtime._validate import check_session_id, check_title
from turnkit.states import PAUSED_STATES, TERMINAL_STATES
from turnkit.store import SessionRecord, TurnRecord
from turnkit.store.records import skip_unreadable
from turnkit.tenancy import Principal

__all__ = ("RuntimeReads", "caller_scope")


def caller_scope(
    principal: Principal | str | None, anonymous: bool
) -> tuple[str | None, str | None] | None:
    """Whose sessions a write may touch: a caller's (principal, organisation), or None.

    `anonymous`, with no principal: a caller nobody signed in, `(None, None)` (sessions
    nobody owns). Neither: the app's own call, which may touch any session.
    """
    caller = Principal.of(principal)
    if caller is not None:
        return caller.id, caller.organisation
    return (None, None) if anonymous else None


class RuntimeReads(RuntimeCore):
    """What `SessionRuntime` reads back from its Store (any process's turns)."""

    async def history(self, session_id: str) -> list[TurnHistory]:
        """A session's turns, oldest first, each with its committed blocks.

        Raises:
            SessionNotFoundError: the session has no turns.
        """
        turns = await self.store.list_turns(SessionId(session_id))
        if not turns:
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return [await turn_history(self.store, t) for t in turns]

    async def view(self, session_id: str, *, ended: bool = False) -> SessionView:
        """The session's projection: its turns in order, its queue, what it waits for.

        `ended=False` (the default) leaves out turns that have ended: they change neither
        the queue nor the pending decisions, and a long session has many of them.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        records = await self.store.list_turns(SessionId(session_id))
        if not records:
            await self.session(session_id)  # a session with no turn yet, or none at all
        if not ended:
            records = [r for r in records if r.status not in TERMINAL_STATES]
        return await session_view(self.store, records)

    async def turn_view(self, turn: str | TurnRecord) -> TurnView:
        """A turn's projection: its committed events folded into what a person sees.

        `turn` is a turn id, or a record the caller has just read (`runtime.turn(...)`),
        which is then not read again.

        Raises:
            TurnNotFoundError: there is no such turn.
        """
        record = turn if isinstance(turn, TurnRecord) else await self.turn(turn)
        return await turn_view(self.store, record)

    async def pending(self, session_id: str) -> list[PendingDecision]:
        """The approvals and questions a session's paused turns wait for, oldest first.

        What a page shows after a reload, without replaying any stream.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        return list((await self.view(session_id)).pending)

    async def queue(self, session_id: str) -> list[QueuedInput]:
        """Messages the session holds that no turn has answered yet, in the order sent.

        Turns waiting behind an open one (`delivery="queue"`) and the guide messages the
        running turn has not taken yet (`delivery="guide"`). The queue drains only when a
        turn ends (its `run.finished`), never when an answer arrives.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        return list((await self.view(session_id)).queue)

    async def events(
        self, turn_id: str, *, after_seq: int = 0
    ) -> AsyncIterator[DurableStreamEvent]:
        """A turn's committed events after `after_seq`, in order (each has a `seq`).

        Raises:
            TurnNotFoundError: there is no such turn.
            InvalidInputError: `after_seq` is negative.
        """
        if after_seq < 0:
            raise InvalidInputError(f"after_seq is 0 or more, not {after_seq}")
        await self.turn(turn_id)  # TurnNotFoundError if there is none
        stored = self.store.read_events(TurnId(turn_id), after_seq=after_seq)
        async for event in skip_unreadable(stored):  # an unreadable one is logged, left out
            yield cast(DurableStreamEvent, event)  # only durable events are stored

    async def follow(self, turn_id: str, *, after_seq: int = 0) -> AsyncIterator[StreamEvent]:
        """A turn's events after `after_seq`, live, ending where `execute_message` ends.

        It ends after `done`, or where the turn waits for a person (or a budget): follow
        a turn you answered with `resume` from the pause's `seq`,
        `runtime.follow(turn_id, after_seq=asked.seq)`, to see it go on. Live deltas come
        too; what was committed before you followed is read from the Store.

        Raises:
            TurnNotFoundError: there is no such turn.
            InvalidInputError: `after_seq` is negative.
        """
        if after_seq < 0:
            raise InvalidInputError(f"after_seq is 0 or more, not {after_seq}")
        record = await self.turn(turn_id)  # TurnNotFoundError if there is none
        if record.status in PAUSED_STATES and after_seq >= record.last_seq:
            return  # it waits already, and the caller has seen up to its pause
        events = self.reader().events(record.turn_id, after_seq=after_seq)
        async for event in until_waiting(events, record.turn_id, self.turn):
            yield event

    async def audit(self, turn_id: str) -> list[AuditRow]:
        """A turn's audit rows, in order."""
        await self.turn(turn_id)  # TurnNotFoundError if there is none
        return await self.store.read_audit(TurnId(turn_id))

    async def session(self, session_id: str) -> SessionRecord:
        """A session's record (title, owner, …).

        Raises:
            SessionNotFoundError: there is no such session.
        """
        record = await self.store.get_session(SessionId(session_id))
        if record is None:
            raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
        return record

    async def rename_session(
        self,
        session_id: str,
        title: str,
        *,
        principal: Principal | str | None = None,
        anonymous: bool = False,
    ) -> SessionRecord:
        """Give a session a title of your own (a person's rename: never named over later).

        `principal` renames only a session it may see (`anonymous=True`: a caller nobody
        signed in, only one nobody owns), checked in the statement that writes the title;
        with neither, any session (the app's own rename). The HTTP route passes its caller.

        Raises:
            InvalidInputError: `title` is empty, only white space, longer than 500
                characters, or holds a NUL.
            SessionNotFoundError: there is no such session (that the caller may see).
        """
        check_title(title)
        sid = check_session_id(session_id)
        await self.ensure_open()
        caller = caller_scope(principal, anonymous)
        if caller is None:  # the app's own call: a Store written before `visible_to` works
            return await self.store.rename_session(sid, title)
        return await self.store.rename_session(sid, title, visible_to=caller)

    async def turn(self, turn_id: str) -> TurnRecord:
        """A turn's record (status, last seq, …)."""
        record = await self.store.get_turn(TurnId(turn_id))
        if record is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return record
