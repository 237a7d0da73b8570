"""Who sees what over HTTP: a session and its turns belong to the principal that created it.

A session or turn of another principal answers 404, exactly like one that does not exist.
A principal is its id within its organisation: one id in two organisations is two callers.
Who may answer a paused turn's request: `turnkit.runtime.answerers`.
"""

from datetime import datetime
from typing import Annotated

from fastapi import Path

from turnkit.errors import SessionNotFoundError, TurnNotFoundError
from turnkit.http.models import PendingOut
from turnkit.ids import SESSION_ID_PATTERN, SessionId, TurnId
from turnkit.pauses import PauseRequest
from turnkit.projection import PendingDecision
from turnkit.runtime import SessionRuntime
from turnkit.runtime.answerers import approver_required, may_answer
from turnkit.store import SessionRecord, TurnRecord
from turnkit.tenancy import Principal as TenantPrincipal

__all__ = (
    "Principal",
    "SessionPath",
    "answerable_pauses",
    "answerable_turn",
    "owned",
    "visible_session",
    "visible_turn",
)

Principal = TenantPrincipal | None
"""A caller as the routes compare it (None: anonymous)."""

SessionPath = Annotated[
    str,
    Path(
        pattern=SESSION_ID_PATTERN.pattern,
        max_length=128,
        description="1-128 letters, digits or `_ . : -`, starting with a letter or digit.",
    ),
]


def owned(record: SessionRecord | None, session_id: str, principal: Principal) -> SessionRecord:
    """`record`, when `principal` may see it (else `SessionNotFoundError`)."""
    pid, organisation = (principal.id, principal.organisation) if principal else (None, None)
    if record is None or not record.visible_to(pid, organisation):
        raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
    return record


async def visible_session(
    runtime: SessionRuntime, session_id: str, principal: Principal
) -> SessionRecord:
    """The session `session_id`, when `principal` may see it (else `SessionNotFoundError`)."""
    return owned(await runtime.store.get_session(SessionId(session_id)), session_id, principal)


async def visible_turn(runtime: SessionRuntime, turn_id: str, principal: Principal) -> TurnRecord:
    """The turn `turn_id`, when `principal` may see its session (else `TurnNotFoundError`)."""
    record = await runtime.store.get_turn(TurnId(turn_id))
    if record is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    try:
        await visible_session(runtime, record.session_id, principal)
    except SessionNotFoundError as exc:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id) from exc
    return record


async def answerable_turn(
    runtime: SessionRuntime, turn_id: str, request_id: str, principal: Principal
) -> TurnRecord:
    """The turn whose request `request_id` `principal` answers (see `may_answer`).

    Raises:
        TurnNotFoundError: there is no such turn, or the caller may not see it.
        ApproverRequiredError: the owner answering an approval that needs a role.
    """
    record = await runtime.store.get_turn(TurnId(turn_id))
    if record is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    session = await runtime.store.get_session(record.session_id)
    asked = (await runtime.turn_view(record)).decisions
    decision = next((d for d in asked if d.request_id == request_id), None)
    if decision is None:  # not one of this turn's requests: its owner hears why from the Store
        try:
            owned(session, record.session_id, principal)
        except SessionNotFoundError as exc:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id) from exc
        return record
    allowed = may_answer(decision, record, session, principal)
    if allowed is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    if not allowed:
        raise approver_required(decision)
    return record


_PAGE = 200
"""Paused turns `answerable_pauses` reads at a time."""
_PAGES = 50
"""Pages it reads at most: the 10,000 oldest paused turns of the caller's organisation."""


async def answerable_pauses(
    runtime: SessionRuntime, principal: Principal, limit: int
) -> list[PendingOut]:
    """The open approvals and questions `principal` may answer, oldest first, at most `limit`.

    Its own sessions' and, with a role, the approvals its role (or `admin`) answers in its
    organisation; not those of agents asked as tools, answered in their asking turns.
    Paused turns are read a page at a time (among the oldest `_PAGE * _PAGES`) and judged
    by their saved request first, so only those the caller may answer have their log read.
    """
    organisation = principal.organisation if principal is not None else None
    found: list[PendingOut] = []
    sessions: dict[SessionId, SessionRecord | None] = {}
    after: tuple[datetime, str] | None = None
    for _ in range(_PAGES):
        paused = await runtime.store.open_pauses(
            organisation=organisation, limit=_PAGE, after=after, asked=False
        )
        for record, request in paused:
            if len(found) == limit:
                break
            if request.kind == "budget":
                continue
            if record.session_id not in sessions:
                sessions[record.session_id] = await runtime.store.get_session(record.session_id)
            session = sessions[record.session_id]
            if not may_answer(_asked(record, request), record, session, principal):
                continue
            decision = (await runtime.turn_view(record)).pending
            if decision is not None:
                found.append(PendingOut.of(decision, record.session_id))
        if len(paused) < _PAGE or len(found) == limit:
            break
        after = (paused[-1][0].created_at, paused[-1][0].turn_id)
    return found


def _asked(record: TurnRecord, request: PauseRequest) -> PendingDecision:
    """What a saved request asks, enough to judge who may answer it (no log read)."""
    role = request.payload.get("approver_role")
    return PendingDecision(
        turn_id=record.turn_id,
        request_id=request.request_id,
        kind="approval" if request.kind == "approval" else "clarification",
        seq=record.last_seq,
        approver_role=role if isinstance(role, str) else None,
    )
