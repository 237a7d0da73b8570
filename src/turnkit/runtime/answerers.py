"""Who may answer a paused turn's request, over HTTP or any route an app writes.

A question, and an approval whose tool names no `approver_role`, is its session owner's to
answer. An approval whose tool (or agent) names an `approver_role` is answered by a
principal holding that role, or `admin`, in the turn's organisation, and not by the owner
unless they hold it. `runtime.resume` itself checks nothing: the app (or the route
helpers) decide who calls it.
"""

from __future__ import annotations

from typing import Any

from turnkit.errors import ApproverRequiredError
from turnkit.projection import PendingDecision
from turnkit.runtime.deps import NO_DEPS
from turnkit.store import SessionRecord, TurnRecord
from turnkit.tenancy import ADMIN_ROLE, DEFAULT_ORGANISATION, Principal

__all__ = (
    "approver_required",
    "answer_deps",
    "check_answerer",
    "may_answer",
    "sent_by",
    "turn_organisation",
)


def turn_organisation(record: TurnRecord) -> str:
    """The organisation the turn's message was admitted in (its sender's)."""
    return str(record.pinned.get("organisation") or DEFAULT_ORGANISATION)


def sent_by(record: TurnRecord, principal: Principal | str | None) -> bool:
    """Whether `principal` sent the turn's message (the same id in the same organisation)."""
    principal = Principal.of(principal)
    sender = record.pinned.get("principal")
    if principal is None:
        return sender is None
    return sender == principal.id and turn_organisation(record) == principal.organisation


def answer_deps(record: TurnRecord, principal: Principal | str | None, request_deps: Any) -> Any:
    """The deps a turn resumed by `principal`'s answer runs with.

    The request's deps are its caller's: a supervisor's must not become the tools' of a
    customer's turn. Only the message's sender brings theirs; anyone else's answer gives
    none (`NO_DEPS`), so the turn runs with the deps this process kept for it, else those
    the runtime's factory builds for the sender, as a worker would.
    """
    return request_deps if sent_by(record, principal) else NO_DEPS


def may_answer(
    decision: PendingDecision,
    record: TurnRecord,
    session: SessionRecord | None,
    principal: Principal | None,
) -> bool | None:
    """Whether `principal` may answer `decision` of `record`'s turn.

    None: it may not even see the turn (a 404 hides it). False: the session's owner, for
    an approval that needs a role they do not hold.
    """
    pid, organisation = (principal.id, principal.organisation) if principal else (None, None)
    owns = session is not None and session.visible_to(pid, organisation)
    role = decision.approver_role if decision.kind == "approval" else None
    if role is None:
        return True if owns else None
    in_org = principal is not None and principal.organisation == turn_organisation(record)
    if in_org and principal is not None and {role, ADMIN_ROLE} & principal.roles:
        return True
    return False if owns else None


def check_answerer(
    decision: PendingDecision,
    record: TurnRecord,
    session: SessionRecord | None,
    principal: Principal | None,
) -> None:
    """Refuse an answer `principal` may not give (`ApproverRequiredError`).

    For a caller who may not even see the turn, check `may_answer` first (a 404 hides it).
    """
    if may_answer(decision, record, session, principal) is False:
        raise approver_required(decision)


def approver_required(decision: PendingDecision) -> ApproverRequiredError:
    """The refusal of an answer to `decision` by a caller without its role."""
    return ApproverRequiredError(
        f"this approval is answered by a principal with the role "
        f"{decision.approver_role!r} (or admin) in the turn's organisation",
        role=decision.approver_role,
    )
