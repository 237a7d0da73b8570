"""`SqlSessions`: `SqlStore`'s sessions, their retention, usage report and workspace files.

A base of `SqlStore`: the `SessionDirectory`, `Retention` and `Workspace` methods, on the
statements of `_sessions_sql`, `_retention_sql`, `_usage_sql` and `_workspace_sql`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from turnkit.ids import SessionId, TurnId
from turnkit.store import (
    IdleSession,
    SessionRecord,
    WorkspaceFile,
    _retention_sql as retention_sql,
    _sessions_sql as sessions_sql,
    _usage_sql as usage_sql,
    _workspace_sql as workspace_sql,
)
from turnkit.store._engine import SqlEngine
from turnkit.store._usage import UsageLine
from turnkit.store._workspace import (
    check_workspace_content,
    check_workspace_path,
    workspace_media_type,
)

__all__ = ("SqlSessions",)


class SqlSessions(SqlEngine):
    """Create, find, list, name and delete sessions; report usage; keep a session's files."""

    async def create_session(
        self,
        session_id: SessionId,
        *,
        principal: str | None = None,
        organisation: str | None = None,
        title: str | None = None,
        parent: SessionId | None = None,
    ) -> SessionRecord:
        """Create a session if it does not exist; return it (`is_new`: this call created it)."""
        owner = (principal, organisation if principal is not None else None)
        return await self._tx(
            sessions_sql.create, self._insert, session_id, owner, title, self._clock.now(), parent
        )

    async def get_session(self, session_id: SessionId) -> SessionRecord | None:
        """One session, or None."""
        if self._async_engine is not None:
            return await self._pg_driver(sessions_sql.get_pg, session_id)
        return await self._hot_tx(sessions_sql.get, session_id, write=False)

    async def list_sessions(
        self,
        *,
        principal: str | None = None,
        organisation: str | None = None,
        anonymous: bool = False,
        limit: int = 100,
    ) -> list[SessionRecord]:
        """Sessions, most recently active first (see `SessionDirectory.list_sessions`)."""
        owner = (principal, organisation)
        return await self._tx(sessions_sql.list_, owner, anonymous, limit, write=False)

    async def delegated_sessions(self, session_id: SessionId) -> list[SessionId]:
        """The sessions agents asked as tools answered in for `session_id`, 16 levels deep."""
        return await self._tx(sessions_sql.delegated, session_id, write=False)

    async def rename_session(
        self,
        session_id: SessionId,
        title: str,
        *,
        visible_to: tuple[str | None, str | None] | None = None,
    ) -> SessionRecord:
        """Set a session's title (`SessionNotFoundError` if there is none it may see)."""
        return await self._tx(sessions_sql.rename, session_id, title, self._clock.now(), visible_to)

    async def name_session(
        self, session_id: SessionId, title: str, *, current: str | None = None
    ) -> bool:
        """Name a session only while its title is still `current` (see `SessionDirectory`)."""
        return await self._tx(sessions_sql.name_if, session_id, title, current, self._clock.now())

    async def delete_session(
        self,
        session_id: SessionId,
        *,
        visible_to: tuple[str | None, str | None] | None = None,
    ) -> bool:
        """Delete a session's chat data and files (audit rows stay); False if none to see."""
        return await self._tx(sessions_sql.remove, session_id, visible_to)

    async def idle_sessions(
        self, *, idle_before: datetime, limit: int, after: IdleSession | None = None
    ) -> list[IdleSession]:
        """Sessions idle since before `idle_before`, oldest first (see `Retention`)."""
        return await self._tx(retention_sql.idle, idle_before, limit, after, write=False)

    async def delete_idle_sessions(
        self, session_ids: Sequence[SessionId], *, idle_before: datetime
    ) -> list[SessionId]:
        """Delete those of `session_ids` still idle, in one transaction (see `Retention`)."""
        return await self._tx(retention_sql.remove_idle, session_ids, idle_before)

    async def existing_turns(self, turn_ids: Sequence[TurnId]) -> set[TurnId]:
        """Those of `turn_ids` the Store still holds (see `Retention`)."""
        return await self._tx(retention_sql.existing_turns, turn_ids, write=False)

    async def usage_report(
        self,
        *,
        by: Literal["session", "principal", "department", "day"],
        principal: str | None = None,
        anonymous: bool = False,
        since: datetime | None = None,
        until: datetime | None = None,
        organisation: str | None = None,
    ) -> list[UsageLine]:
        """Tokens, calls and USD summed by session, principal, department or day."""
        return await self._tx(
            usage_sql.report, by, principal, anonymous, since, until, organisation, write=False
        )

    # ── workspace files ─────────────────────────────────────────────────────────────

    async def write_file(
        self,
        session_id: SessionId,
        path: str,
        content: str,
        *,
        media_type: str | None = None,
        turn_id: TurnId | None = None,
    ) -> WorkspaceFile:
        """Create or replace a session file; the same content again changes nothing."""
        checked = check_workspace_path(path)
        size = check_workspace_content(content)
        kind = workspace_media_type(checked, media_type)
        return await self._tx(
            lambda conn: workspace_sql.write(
                conn,
                self._insert,
                session_id=session_id,
                path=checked,
                content=content,
                media_type=kind,
                size=size,
                turn_id=turn_id,
                now=self._clock.now(),
            )
        )

    async def read_file(self, session_id: SessionId, path: str) -> WorkspaceFile | None:
        """One session file, or None."""
        checked = check_workspace_path(path)
        return await self._tx(workspace_sql.read, session_id, checked, write=False)

    async def list_files(self, session_id: SessionId) -> list[WorkspaceFile]:
        """A session's files, ordered by path."""
        return await self._tx(workspace_sql.list_, session_id, write=False)
