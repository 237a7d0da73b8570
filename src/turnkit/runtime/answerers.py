"""Who may answer a paused turn's request, over HTTP or any route an app writes.

A question is its session owner's to answer. An approval whose tool or agent names an
`approver_role` is answered by a principal holding that role (or `admin`) in the session's
organisation, and not by the owner unless they hold it; any other approval by the owner or
an admin of the organisation. `runtime.resume` itself checks nothing: the app (or the
route helpers) decide who calls it.
"""

from __future__ import annotations

from turnkit.errors import ApproverRequiredError
from turnkit.projection import PendingDecision
from turnkit.store import SessionRecord
from turnkit.tenancy import ADMIN_ROLE, Principal

__all__ = ("check_answerer", "may_answer")


def may_answer(
    decision: PendingDecision, session: SessionRecord | None, principal: Principal | None
) -> bool | None:
    """Whether `principal` may answer `decision` (None: it may not even see the turn).

    False: the session's owner, for an approval that needs a role they do not hold.
    """
    pid, organisation = (principal.id, principal.organisation) if principal else (None, None)
    owns = session is not None and session.visible_to(pid, organisation)
    if decision.kind != "approval":
        return True if owns else None
    in_org = (
        principal is not None
        and session is not None
        and session.organisation in (None, principal.organisation)
    )
    roles = principal.roles if principal is not None and in_org else frozenset()
    role = decision.approver_role
    if ADMIN_ROLE in roles or (role is not None and role in roles) or (role is None and owns):
        return True
    return False if owns else None


def check_answerer(
    decision: PendingDecision, session: SessionRecord | None, principal: Principal | None
) -> None:
    """Refuse an answer `principal` may not give (`ApproverRequiredError`).

    For a caller who may not even see the turn, check `may_answer` first (a 404 hides it).
    """
    if may_answer(decision, session, principal) is False:
        raise ApproverRequiredError(
            f"this approval is answered by a principal with the role "
            f"{decision.approver_role!r} (or admin) in the session's organisation",
            role=decision.approver_role,
        )
