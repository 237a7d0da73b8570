"""The caller as the protocol routes know it: the `Principal` the app's `auth` names.

The AI SDK and AG-UI routes take the same `auth` dependency as `create_turnkit_router`:
it may return a `turnkit.Principal`, a bare principal id or None (anonymous). A chat or
thread is its principal's within its organisation, and a message is admitted as the
harness routes admit it: the organisation and department must be served, and their
agents, tools and budgets apply.
"""

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from turnkit.errors import missing_extra
from turnkit.store import SessionRecord
from turnkit.tenancy import DEFAULT_ORGANISATION, AuthDependency, Principal, principal_from_auth

try:
    from fastapi import Depends
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The protocol routes", "fastapi", exc) from exc

__all__ = ("Caller", "caller_of", "sees")

Caller = Principal | None
"""A caller as the protocol routes know it (None: anonymous)."""


def caller_of(auth: AuthDependency) -> Callable[..., Awaitable[Caller]]:
    """The dependency for the caller: `auth`'s answer, as a `Principal` (or None)."""

    async def caller(found: Any) -> Caller:
        return principal_from_auth(found)

    # Spelled out for FastAPI: `auth` is local to this call, not a module-level name.
    caller.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("found", inspect.Parameter.KEYWORD_ONLY, default=Depends(auth))]
    )
    return caller


def sees(caller: Caller, session: SessionRecord) -> bool:
    """Whether `caller` may see `session` (its chat or thread)."""
    if caller is None:
        return session.visible_to(None, DEFAULT_ORGANISATION)
    return session.visible_to(caller.id, caller.organisation)
