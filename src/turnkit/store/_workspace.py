"""Session workspace files: the value type and the rules a path and its content follow.

Kept apart from the SQL so every Store adapter checks a write the same way, before
anything is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from turnkit.errors import InvalidInputError
from turnkit.ids import SessionId, TurnId

__all__ = (
    "MAX_CONTENT_CHARS",
    "MAX_PATH_CHARS",
    "WorkspaceFile",
    "check_workspace_content",
    "check_workspace_path",
    "workspace_media_type",
)

MAX_PATH_CHARS = 200
MAX_CONTENT_CHARS = 1_000_000
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,62}"
_MEDIA_TYPE = re.compile(f"{_TOKEN}/{_TOKEN}")
_BY_SUFFIX = {".md": "text/markdown", ".json": "application/json", ".csv": "text/csv"}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkspaceFile:
    """A file in a session's workspace, as last written."""

    session_id: SessionId
    path: str
    content: str
    media_type: str
    size: int
    """Bytes of the UTF-8 encoded content."""
    version: int
    """1 on the first write; one more for each write that changed the file."""
    updated_at: datetime
    turn_id: TurnId | None
    """The turn that last changed the file (None: written outside a turn)."""


def check_workspace_path(path: str) -> str:
    """Return `path` if it is a valid workspace path, else raise `InvalidInputError`.

    A valid path is relative, 1-200 characters long, and made of segments of ASCII
    letters, digits, `.`, `_` and `-` joined by `/`; no segment is empty, `.` or `..`.
    """
    problem = _path_problem(path)
    if problem is not None:
        raise InvalidInputError(f"workspace path {path!r} {problem}", path=path)
    return path


def _path_problem(path: str) -> str | None:
    if not path:
        return "is empty: name a file such as `plan.md`"
    if len(path) > MAX_PATH_CHARS:
        return f"is longer than {MAX_PATH_CHARS} characters"
    if path.startswith("/"):
        return "must be relative (no leading `/`)"
    segments = path.split("/")
    if "" in segments:
        return "has an empty segment (`//` or a trailing `/`)"
    if any(s in (".", "..") for s in segments):
        return "may not contain `.` or `..` segments"
    if not all(_SEGMENT.fullmatch(s) for s in segments):
        return "may use only ASCII letters, digits, `.`, `_`, `-` and `/`"
    return None


def check_workspace_content(content: str) -> int:
    """The size in bytes of valid file content, else raise `InvalidInputError`.

    Content is text of at most 1,000,000 characters that encodes as UTF-8 and holds no
    NUL character (PostgreSQL text cannot store one).
    """
    if len(content) > MAX_CONTENT_CHARS:
        raise InvalidInputError(
            f"workspace file content has {len(content)} characters, more than the "
            f"{MAX_CONTENT_CHARS:,} allowed; nothing was written",
            chars=len(content),
        )
    if "\x00" in content:
        raise InvalidInputError("workspace file content holds a NUL character; nothing was written")
    try:
        return len(content.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"workspace file content is not valid UTF-8 text ({exc.reason} at {exc.start}); "
            "nothing was written"
        ) from exc


def workspace_media_type(path: str, media_type: str | None) -> str:
    """`media_type` if given (checked), else the one `path`'s extension suggests.

    `.md` is `text/markdown`, `.json` `application/json`, `.csv` `text/csv`, anything
    else `text/plain`.
    """
    if media_type is None:
        return _BY_SUFFIX.get(PurePosixPath(path).suffix.lower(), "text/plain")
    if not _MEDIA_TYPE.fullmatch(media_type):
        raise InvalidInputError(
            f"media type {media_type!r} is not a `type/subtype` such as `text/markdown` "
            "(no parameters: the content is always UTF-8); nothing was written"
        )
    return media_type.lower()
