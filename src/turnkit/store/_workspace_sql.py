"""The workspace side of `SqlStore`: session files (each function runs in one transaction)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, or_, select

from turnkit.errors import SessionNotFoundError
from turnkit.ids import SessionId, TurnId
from turnkit.store._schema import aware, sessions, workspace_files
from turnkit.store._workspace import WorkspaceFile

__all__ = ("list_", "read", "write")

_files = workspace_files
_SESSION = select(sessions.c.session_id).where(sessions.c.session_id == bindparam("w_session"))
_FILE = select(_files).where(
    _files.c.session_id == bindparam("w_session"), _files.c.path == bindparam("w_path")
)
_FILES = select(_files).where(_files.c.session_id == bindparam("w_session"))


def _file(row: Any) -> WorkspaceFile:
    updated = aware(row.updated_at)
    assert updated is not None
    return WorkspaceFile(
        session_id=SessionId(row.session_id),
        path=row.path,
        content=row.content,
        media_type=row.media_type,
        size=row.size,
        version=row.version,
        updated_at=updated,
        turn_id=TurnId(row.turn_id) if row.turn_id is not None else None,
    )


@functools.cache
def _upsert(insert: Any) -> Any:
    """Insert at version 1, or replace and bump the version only when something changed."""
    new = insert(_files)
    return new.on_conflict_do_update(
        index_elements=["session_id", "path"],
        set_={
            "content": new.excluded.content,
            "media_type": new.excluded.media_type,
            "size": new.excluded.size,
            "version": _files.c.version + 1,
            "turn_id": new.excluded.turn_id,
            "updated_at": new.excluded.updated_at,
        },
        where=or_(
            _files.c.content != new.excluded.content,
            _files.c.media_type != new.excluded.media_type,
        ),
    ).returning(*_files.c)


def write(
    conn: Connection,
    insert: Any,
    *,
    session_id: SessionId,
    path: str,
    content: str,
    media_type: str,
    size: int,
    turn_id: TurnId | None,
    now: datetime,
) -> WorkspaceFile:
    """Create or replace a file (path and content checked already); return it as stored."""
    if conn.execute(_SESSION, {"w_session": session_id}).first() is None:
        raise SessionNotFoundError(
            f"no session {session_id!r}: create it before writing {path!r}",
            session_id=session_id,
        )
    row = conn.execute(
        _upsert(insert),
        {
            "session_id": session_id,
            "path": path,
            "content": content,
            "media_type": media_type,
            "size": size,
            "version": 1,
            "turn_id": turn_id,
            "updated_at": now,
        },
    ).first()
    if row is None:  # the same content again: the stored file stays as it is
        row = conn.execute(_FILE, {"w_session": session_id, "w_path": path}).first()
        assert row is not None
    return _file(row)


def read(conn: Connection, session_id: SessionId, path: str) -> WorkspaceFile | None:
    """One file."""
    row = conn.execute(_FILE, {"w_session": session_id, "w_path": path}).first()
    return _file(row) if row is not None else None


def list_(conn: Connection, session_id: SessionId) -> list[WorkspaceFile]:
    """A session's files in code point order of their paths (the same on every database)."""
    rows = conn.execute(_FILES, {"w_session": session_id}).all()
    return sorted((_file(r) for r in rows), key=lambda f: f.path)
