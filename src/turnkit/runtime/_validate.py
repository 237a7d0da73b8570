"""Input checks shared by every way in (SDK and HTTP): typed errors, nothing written."""

from __future__ import annotations

from dataclasses import dataclass

from turnkit.agent import Effort
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    ContentTooLargeError,
    EmptyContentError,
    InvalidInputError,
    InvalidSessionIdError,
)
from turnkit.ids import SessionId, is_valid_session_id

__all__ = ("TurnRequest", "check_session_id", "validate_request")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRequest:
    """One validated request to run a turn (built by `SessionRuntime.submit`)."""

    session_id: SessionId
    content: str
    request_id: str | None = None
    effort: Effort | None = None


def check_session_id(session_id: str) -> SessionId:
    """The id, or `InvalidSessionIdError`."""
    if not is_valid_session_id(session_id):
        raise InvalidSessionIdError(
            f"session id {session_id!r} has an unknown format: use 1-128 letters, digits "
            "or `_ . : -`, starting with a letter or digit",
            session_id=session_id,
        )
    return SessionId(session_id)


def validate_request(
    config: RuntimeConfig,
    session_id: str,
    content: str,
    request_id: str | None,
    effort: Effort | None,
) -> TurnRequest:
    """Check a message before anything is written."""
    sid = check_session_id(session_id)
    if not content.strip():
        raise EmptyContentError("the message is empty: send some text", session_id=session_id)
    if len(content) > config.max_content_chars:
        raise ContentTooLargeError(
            f"the message has {len(content)} characters; the limit is "
            f"{config.max_content_chars} (`RuntimeConfig.max_content_chars`)",
            chars=len(content),
            limit=config.max_content_chars,
        )
    if request_id is not None and not 0 < len(request_id) <= 128:
        raise InvalidInputError(
            f"request_id must be 1-128 characters, got {len(request_id)}",
            request_id=request_id,
        )
    return TurnRequest(session_id=sid, content=content, request_id=request_id, effort=effort)
