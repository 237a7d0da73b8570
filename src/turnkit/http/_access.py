"""Who sees what over HTTP: a session and its turns belong to the principal that created it.

A session or turn of another principal answers 404, exactly like one that does not exist.
A principal is its id within its organisation: one id in two organisations is two callers.
"""

from typing import Annotated

from fastapi import Path

from turnkit.errors import SessionNotFoundError, TurnNotFoundError
from turnkit.ids import SESSION_ID_PATTERN, SessionId, TurnId
from turnkit.runtime import SessionRuntime
from turnkit.store import SessionRecord, TurnRecord
from turnkit.tenancy import Principal as TenantPrincipal

__all__ = ("Principal", "SessionPath", "owned", "visible_session", "visible_turn")

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
