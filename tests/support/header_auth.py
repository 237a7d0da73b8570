"""An auth dependency as an app would write it: the caller from a trusted proxy's headers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, HTTPException

from turnkit import Principal


async def header_auth(
    x_user: Annotated[str | None, Header()] = None,
    x_org: Annotated[str | None, Header()] = None,
    x_dept: Annotated[str | None, Header()] = None,
) -> Principal:
    """The caller the proxy vouched for; none: 401."""
    if not x_user:
        raise HTTPException(401, "sign in first")
    return Principal(id=x_user, organisation=x_org or "default", department=x_dept)
