"""`turnkit sessions export ID`: everything the Store holds of one session, as JSON lines.

One object per line, each with its `kind`: the `session`, then per turn (oldest first)
the `turn`, its committed `event`s in `seq` order and its `audit` rows, then the
session's workspace `file`s, and last an `end` line with the counts, so a file cut short
is told from a whole one. Each turn's events are read up to the `last_seq` its record had
when it was read, so a turn still running is exported as far as it had got.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from turnkit.audit import AuditRow
from turnkit.errors import InvalidInputError, SessionNotFoundError
from turnkit.ids import SessionId
from turnkit.store import SessionRecord, TurnRecord
from turnkit.store._turns_sql import audit_blobs
from turnkit.store.sql import SqlStore

__all__ = ("export_session", "export_target")


@dataclass(slots=True)
class _Counts:
    turns: int = 0
    events: int = 0
    audit_rows: int = 0
    files: int = 0
    unreadable_events: int = 0
    unreadable_audit_rows: int = 0


async def export_session(store: SqlStore, out: TextIO, session_id: SessionId) -> int:
    """Write the session's lines to `out`; `SessionNotFoundError` before any line if none."""
    session = await store.get_session(session_id)
    if session is None:
        raise SessionNotFoundError(f"no session {session_id!r}", session_id=session_id)
    counts = _Counts()
    _line(out, _session(session))
    for turn in await store.list_turns(session_id):
        counts.turns += 1
        _line(out, _turn(turn))
        async for stored in store.read_events(turn.turn_id):
            if stored.seq > turn.last_seq:
                break  # written after the record was read: the next export has it
            try:
                text = stored.data.decode()
                json.loads(text)
            except ValueError:  # damaged in the database: say so, and go on
                counts.unreadable_events += 1
                _line(out, _unreadable(turn.turn_id, stored.seq, stored.type, stored.data))
                continue
            counts.events += 1
            out.write(f'{{"kind":"event","turn_id":"{turn.turn_id}","event":')
            out.write(text)
            out.write("}\n")
        for blob in await store._tx(audit_blobs, turn.turn_id, write=False):
            try:
                row = AuditRow.model_validate_json(blob)
            except ValueError:  # damaged, or a newer turnkit's kind: say so, and go on
                counts.unreadable_audit_rows += 1
                _line(out, {"kind": "unreadable_audit", "turn_id": turn.turn_id,
                            "bytes": len(blob)})  # fmt: skip
                continue
            counts.audit_rows += 1
            audit: dict[str, object] = {
                "kind": "audit",
                "turn_id": turn.turn_id,
                "row": row.model_dump(mode="json"),
            }
            _line(out, audit)
    for file in await store.list_files(session_id):
        counts.files += 1
        _line(
            out,
            {
                "kind": "file",
                "path": file.path,
                "media_type": file.media_type,
                "version": file.version,
                "updated_at": _when(file.updated_at),
                "turn_id": file.turn_id,
                "content": file.content,
            },
        )
    end = asdict(counts)
    if not end["unreadable_audit_rows"]:  # the end line as documented unless there are any
        del end["unreadable_audit_rows"]
    _line(out, {"kind": "end", "session_id": session_id, **end})
    return 0


@contextlib.contextmanager
def export_target(path: str | None, stdout: TextIO) -> Iterator[TextIO]:
    """Where the lines go: `stdout`, or `path` written whole or not at all.

    The file is written beside `path` and renamed onto it only once every line is in, so
    an export that fails leaves no file; an existing `path` is refused before anything is
    read (an export is not a backup to overwrite).
    """
    if path is None:
        yield stdout
        return
    target = Path(path)
    exists = InvalidInputError(f"{path} exists: name a new file (an export never overwrites)")
    if target.exists():
        raise exists
    partial = target.with_name(f".{target.name}.partial")
    try:  # only its owner may read it: it holds the conversations
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInputError(
            f"{partial} exists: another export to {path} is running, or one was cut short "
            "(delete it and export again)"
        ) from None
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(partial, target)  # unlike a rename, refuses a file that appeared meanwhile
        except FileExistsError:
            raise exists from None
        except OSError:  # a file system without hard links (FAT, some network mounts)
            if target.exists():
                raise exists from None
            os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _when(moment: datetime) -> str:
    """A row's time as the events and audit rows write theirs: ISO 8601, UTC as `Z`."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _unreadable(turn_id: str, seq: int, kind: str, data: bytes) -> dict[str, object]:
    return {"kind": "unreadable_event", "turn_id": turn_id, "seq": seq, "type": kind,
            "bytes": len(data)}  # fmt: skip


def _line(out: TextIO, record: dict[str, object]) -> None:
    out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")


def _session(session: SessionRecord) -> dict[str, object]:
    return {
        "kind": "session",
        "session_id": session.session_id,
        "title": session.title,
        "principal": session.principal,
        "organisation": session.organisation,
        "parent_session": session.parent_session,
        "messages": session.last_input_seq,
        "created_at": _when(session.created_at),
        "updated_at": _when(session.updated_at),
    }


def _turn(turn: TurnRecord) -> dict[str, object]:
    return {
        "kind": "turn",
        "turn_id": turn.turn_id,
        "input_seq": turn.input_seq,
        "status": turn.status,
        "error_code": turn.error_code,
        "content": turn.content,
        "attachments": [part.model_dump(mode="json") for part in turn.attachments],
        "agent": turn.agent,
        "model": turn.model,
        "attempts": turn.attempts,
        "last_seq": turn.last_seq,
        "summary": turn.summary.model_dump(mode="json") if turn.summary else None,
        "created_at": _when(turn.created_at),
        "started_at": _when(turn.started_at) if turn.started_at else None,
        "updated_at": _when(turn.updated_at),
    }
