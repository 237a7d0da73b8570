"""Turn-scoped callback tokens: how work running in another process reports back to a turn.

A tool that hands work to a job runner or a remote service passes it
`ToolContext.callback_token`. The token names only the turn: it is an HMAC of the turn id
under `RuntimeConfig.callback_secret` (the same secret in every process), so any process
can check it, in constant time, without storing anything. A callback re-derives the
caller's organisation, principal and department from the turn itself — never from the
request — and reaches only a running turn.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from turnkit.errors import CallbackTokenError
from turnkit.tenancy import Principal

__all__ = ("CallbackScope", "callback_token", "check_callback_token")

_PREFIX: Final = "tkcb_"


def callback_token(secret: str, turn_id: str) -> str:
    """The token for `turn_id` under `secret`."""
    digest = hmac.new(secret.encode(), f"turnkit-callback:{turn_id}".encode(), hashlib.sha256)
    return _PREFIX + digest.hexdigest()


def check_callback_token(secret: str | None, turn_id: str, token: str) -> None:
    """Raise `CallbackTokenError` unless `token` is `turn_id`'s (compared in constant time)."""
    if secret is None:
        raise CallbackTokenError(
            "this runtime takes no callbacks: it has no RuntimeConfig(callback_secret=...)",
            turn_id=turn_id,
        )
    expected = callback_token(secret, turn_id).encode()
    if not hmac.compare_digest(expected, token.encode("utf-8", "replace")):
        raise CallbackTokenError(
            f"the callback token was not issued for turn {turn_id!r}", turn_id=turn_id
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CallbackScope:
    """Who a callback acts for, re-derived from its turn (never from the request)."""

    turn_id: str
    session_id: str
    principal: Principal | None
    organisation: str
    department: str | None
