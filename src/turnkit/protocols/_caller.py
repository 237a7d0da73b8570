"""The caller as the protocol routes know it: a principal id of the default organisation.

The AI SDK and AG-UI routes take the same `auth` dependency as `create_turnkit_router`:
it may return a `turnkit.Principal`, a bare principal id or None (anonymous). They know a
caller by id alone, so a caller of another organisation or of a department is refused
with 403 here (a department's budgets and agents would not apply): such a caller uses the
harness routes.
"""

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from turnkit.errors import missing_extra
from turnkit.tenancy import (
    DEFAULT_DEPARTMENT,
    DEFAULT_ORGANISATION,
    AuthDependency,
    principal_from_auth,
)

try:
    from fastapi import Depends, HTTPException
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The protocol routes", "fastapi", exc) from exc

__all__ = ("CallerId", "caller_id")

_DEFAULT = (None, DEFAULT_DEPARTMENT)
"""A department the routes serve: none named, or the default one by its name."""

CallerId = str | None
"""A caller as the protocol routes compare it: a principal id (None: anonymous)."""


def caller_id(auth: AuthDependency) -> Callable[..., Awaitable[CallerId]]:
    """The dependency for the caller's id: `auth`'s answer, refused (403) off the default."""

    async def caller(found: Any) -> CallerId:
        principal = principal_from_auth(found)
        if principal is None:
            return None
        department = principal.department
        if principal.organisation != DEFAULT_ORGANISATION or department not in _DEFAULT:
            raise HTTPException(
                403,
                "the AI SDK and AG-UI routes serve callers of the default organisation with "
                "no department; callers of other organisations use the harness routes "
                "(create_turnkit_router)",
            )
        return principal.id

    # Spelled out for FastAPI: `auth` is local to this call, not a module-level name.
    caller.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("found", inspect.Parameter.KEYWORD_ONLY, default=Depends(auth))]
    )
    return caller
