"""Who sees what over HTTP: a session and its turns belong to the principal that created it.

A session or turn of another principal answers 404, exactly like one that does not exist.
A principal is its id within its organisation: one id in two organisations is two callers.
Who may answer a paused turn's request: `turnkit.runtime.answerers`.
"""

from typing import Annotated

from fastapi import Path

from turnkit.errors import SessionNotFoundError, TurnNotFoundError
from turnkit.http.models import PendingOut
from turnkit.ids import SESSION_ID_PATTERN, SessionId, TurnId
from turnkit.runtime import SessionRuntime
from turnkit.runtime.answerers import check_answerer, may_answer
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
    if may_answer(decision, session, principal) is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    check_answerer(decision, session, principal)
    return record


_INBOX_SCAN = 1000
"""Paused turns `answerable_pauses` reads at most, before keeping those the caller may answer."""


async def answerable_pauses(
    runtime: SessionRuntime, principal: Principal, limit: int
) -> list[PendingOut]:
    """The open approvals and questions `principal` may answer, oldest first.

    Its own sessions' and, with a role, the approvals its role (or `admin`) answers in
    its organisation.
    """
    organisation = principal.organisation if principal is not None else None
    found: list[PendingOut] = []
    sessions: dict[SessionId, SessionRecord | None] = {}
    paused = await runtime.store.open_pauses(organisation=organisation, limit=_INBOX_SCAN)
    for record, request in paused:
        if request.kind == "budget" or len(found) == limit:
            continue
        if record.session_id not in sessions:
            sessions[record.session_id] = await runtime.store.get_session(record.session_id)
        decision = (await runtime.turn_view(record)).pending
        session = sessions[record.session_id]
        if decision is not None and may_answer(decision, session, principal):
            out = PendingOut.model_validate(decision)
            found.append(out.model_copy(update={"session_id": record.session_id}))
    return found
