"""`turnkit db copy`: every turnkit row and every thread's checkpoints, into an empty database.

The source is opened as the reading commands open it (never created, never migrated, a
schema at another revision refused) and only read, in one read transaction held for the
whole copy: a snapshot of its tables (see `turnkit.store._copy_sql.held`; on PostgreSQL
its checkpoints are read in the same snapshot, on SQLite in a snapshot of the checkpoint
file taken right after). The target is migrated to this turnkit's schema, as a writing
command does, and must hold no turnkit row. The checkpoints go first, through the target's
checkpointer; then the rows, table by table, parents first, in one target transaction
committed once every table is in. A database lost or failing mid-copy stops it with one
line that says what the target holds: no turnkit row (perhaps some checkpoints, which the
next copy writes again), so the copy can simply be run again.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TextIO, TypeVar

from sqlalchemy import Table
from sqlalchemy.exc import DBAPIError

from turnkit.cli._inspect import existing_store
from turnkit.errors import ConfigurationError, StoreError, StoreUnavailableError, TurnkitError
from turnkit.graph import open_checkpointer
from turnkit.graph._copy import (
    Saver,
    checkpoint_threads,
    open_checkpoint_reader,
    read_thread,
    write_thread,
)
from turnkit.store._copy_sql import (
    TABLES,
    Held,
    count_rows,
    held,
    insert_rows,
    read_pages,
    rows_present,
    running_turns,
)
from turnkit.store._engine_pg import first_line, is_unreachable, unstorable_text
from turnkit.store.migrate import head_revision
from turnkit.store.sql import SqlStore, shown_url

__all__ = ("copy_database",)

T = TypeVar("T")


def _where(url: str, schema: str | None) -> str:
    return shown_url(url) + (f" (schema {schema})" if schema else "")


class _Progress:
    """Which side the copy is working on, and what it has written to the target."""

    def __init__(self) -> None:
        self.side: str | None = None  # None: not copying (a refusal is said as it is)
        self.threads = 0  # threads whose checkpoints went to the target
        self.committing = False
        self.committed = False
        self.done: tuple[int, int, int] | None = None  # rows, threads, checkpoints copied

    async def on(self, side: str, step: Awaitable[T]) -> T:
        self.side = side
        return await step

    def stopped(self, exc: BaseException) -> StoreError:
        """The one-line error for a database that failed mid-copy (see the module doc)."""
        cause = exc
        while isinstance(cause, TurnkitError) and cause.__cause__ is not None:
            cause = cause.__cause__  # the driver's own words, not a wrapper's advice
        lost = isinstance(exc, StoreUnavailableError) or is_unreachable(exc)
        what = "cannot be reached" if lost else "failed"
        said = (
            f"the copy stopped: the {self.side} database {what} "
            f"({type(cause).__name__}: {first_line(cause)}); "
        )
        if self.committing and lost:  # a commit refused is rolled back; a lost one, unknown
            said += (
                "the link was lost as the target committed, so it holds either the whole "
                "copy or no turnkit row: `turnkit db copy --dry-run` with the same --to says "
                "which (if none, copy again)"
            )
        else:
            said += "the target holds no turnkit row (they go in one transaction, not committed)"
            if self.threads:
                said += (
                    f", and may hold checkpoints of up to {self.threads:,} thread(s), "
                    "which the next copy writes again"
                )
            said += ": copy again" + (" once it is back" if lost else "")
        error = StoreUnavailableError if lost else StoreError
        return error(said, side=self.side)


def _a_database_error(exc: BaseException) -> bool:
    """A database's failure (lost, refusing), not a bug: said in one line, not a trace."""
    if isinstance(exc, StoreUnavailableError | DBAPIError | OSError | sqlite3.Error):
        return True
    return type(exc).__module__.split(".")[0] == "asyncpg"


async def copy_database(args: argparse.Namespace, out: TextIO) -> int:
    """`turnkit db copy --from URL --to URL`: one line per table, then a summary."""
    source_at, target_at = (args.from_url, args.from_schema), (args.to_url, args.to_schema)
    if source_at == target_at:
        raise ConfigurationError("--from and --to name the same database: nothing to copy")
    started = time.perf_counter()
    progress = _Progress()
    try:
        copied = await _copy(args, out, progress)
    except Exception as exc:
        if progress.side is None or not _a_database_error(exc):
            raise
        if not progress.committed:
            raise progress.stopped(exc) from exc
        copied = progress.done  # the source's read ended badly after the commit: no matter
    if copied is None:
        return 0  # a dry run
    rows, threads, checkpoints = copied
    took = time.perf_counter() - started
    out.write(
        f"copied {rows:,} row(s) in {len(TABLES)} tables and {checkpoints:,} checkpoint(s) "
        f"of {threads:,} thread(s) in {took:.1f} s\n"
    )
    return 0


async def _copy(
    args: argparse.Namespace, out: TextIO, progress: _Progress
) -> tuple[int, int, int] | None:
    """The copy (None for a dry run): rows, threads, checkpoints copied."""
    async with existing_store(args.from_url, args.from_schema) as source:
        progress.side = "source"
        _refuse_running(args, await running_turns(source), progress)
        progress.side = None
        out.write(f"from {_where(args.from_url, args.from_schema)}\n")
        out.write(f"to   {_where(args.to_url, args.to_schema)}\n")
        if args.dry_run:
            progress.side = "source"
            async with held(source, write=False) as snapshot, _reader(args, snapshot) as reader:
                counts = await count_rows(snapshot)
                threads = await checkpoint_threads(reader) if reader is not None else []
            progress.side = None
            await _dry_run(args, counts, len(threads), out)
            return None
        # The target's tables first, its checkpoints' too: on PostgreSQL creating those
        # (CREATE INDEX CONCURRENTLY) waits for every snapshot open in the database.
        async with _empty_target(args, out) as target, _target_saver(args, progress) as saver:
            progress.side = "source"
            async with held(source, write=False) as snapshot, _reader(args, snapshot) as reader:
                _refuse_running(args, await running_turns(snapshot), progress)  # meanwhile?
                threads = await checkpoint_threads(reader) if reader is not None else []
                checkpoints = await _copy_checkpoints(reader, saver, threads, progress, out)
                progress.side = "target"
                async with held(target, write=True) as writing:
                    rows = await _copy_rows(snapshot, writing, args.batch_size, progress, out)
                    progress.side, progress.committing = "target", True
                progress.committing, progress.committed = False, True
                progress.done = (rows, len(threads), checkpoints)
    return progress.done


def _refuse_running(args: argparse.Namespace, running: int, progress: _Progress) -> None:
    if running and not args.force:
        progress.side = None
        raise StoreError(
            f"the source has {running} running or queued turn(s), and a process driving "
            "them would go on writing there: stop its API processes and workers first "
            "(paused turns may stay), or pass --force to copy them as they are",
            running=running,
        )


@contextlib.asynccontextmanager
async def _reader(args: argparse.Namespace, snapshot: Held) -> AsyncIterator[Saver | None]:
    """The source's checkpoints, read in the snapshot of its tables where it can be shared."""
    exported = await snapshot.export_snapshot()
    async with open_checkpoint_reader(
        args.from_url, schema=args.from_schema, snapshot=exported
    ) as reader:
        yield reader


class _TargetSaver:
    """The target's checkpointer; `flush` writes what it holds back, and closes it."""

    def __init__(self, saver: Saver, close: Callable[[], Awaitable[None]]) -> None:
        self.saver, self._close = saver, close
        self.open = True

    async def flush(self) -> None:
        self.open = False
        await self._close()


@contextlib.asynccontextmanager
async def _target_saver(
    args: argparse.Namespace, progress: _Progress
) -> AsyncIterator[_TargetSaver]:
    progress.side = "target"
    saver, close = await open_checkpointer(args.to_url, schema=args.to_schema)
    target = _TargetSaver(saver, close)
    try:
        yield target
    finally:
        if target.open:  # the copy failed: what the saver holds is not wanted
            with contextlib.suppress(Exception):
                await close()


@contextlib.asynccontextmanager
async def _empty_target(args: argparse.Namespace, out: TextIO) -> AsyncIterator[SqlStore]:
    """The target store, migrated to this turnkit's schema; refused unless it is empty."""
    target = SqlStore.from_url(args.to_url, schema=args.to_schema)
    try:
        before = await target.schema_revision()
        if before is not None:  # refused before it is migrated: it is someone's database
            _refuse_rows(args, await rows_present(target))
        await target.setup()
        _refuse_rows(args, sum((await count_rows(target)).values()))
        out.write(f"target schema: {before or 'empty'} → {head_revision()}\n")
        yield target
    finally:
        await target.close()


def _refuse_rows(args: argparse.Namespace, present: int) -> None:
    if present:
        raise StoreError(
            f"{_where(args.to_url, args.to_schema)} already holds {present:,} turnkit "
            "row(s): copy into an empty database (a new SQLite file, or a new --to-schema)",
            url=shown_url(args.to_url),
        )


async def _copy_rows(
    source: Held, target: Held, size: int, progress: _Progress, out: TextIO
) -> int:
    total = 0
    for table in TABLES:
        copied, started = 0, time.perf_counter()
        pages = read_pages(source, table, size=size)
        while (rows := await progress.on("source", anext(pages, None))) is not None:
            try:
                await progress.on("target", insert_rows(target, table, rows))
            except Exception as exc:
                if unstorable_text(exc) is None:
                    raise
                raise _unstorable(table, rows) from exc
            copied += len(rows)
        took = time.perf_counter() - started
        out.write(f"  {table.name:<24} {copied:>10,} row(s) in {took:.2f} s\n")
        out.flush()
        total += copied
    return total


def _unstorable(table: Table, rows: list[dict[str, object]]) -> StoreError:
    """The target refused a text (a NUL character): copying again would fail the same way."""
    key = [c.key for c in table.primary_key.columns]
    where = next(
        (
            (tuple(row[k] for k in key), name)
            for row in rows
            for name, value in row.items()
            if isinstance(value, str) and "\x00" in value
        ),
        None,
    )
    said = (
        f"a row of {table.name}"
        if where is None
        else (f"{table.name} {where[0]!r} (column {where[1]})")
    )
    return StoreError(
        f"the copy stopped: {said} holds a character the target cannot store (NUL, "
        "U+0000); the target holds no turnkit row (they go in one transaction, not "
        "committed). Copying again fails the same way: remove the character in the "
        "source first",
        table=table.name,
    )


async def _copy_checkpoints(
    reader: Saver | None,
    target: _TargetSaver,
    threads: list[str],
    progress: _Progress,
    out: TextIO,
) -> int:
    """Copy the checkpoints of every thread the source holds any of: how many."""
    checkpoints = 0
    started = time.perf_counter()
    for thread_id in threads:
        assert reader is not None
        thread = await progress.on("source", read_thread(reader, thread_id))
        progress.threads += 1
        checkpoints += await progress.on("target", write_thread(target.saver, thread))
    await progress.on("target", target.flush())  # writes what the saver held back
    took = time.perf_counter() - started
    out.write(
        f"  {'checkpoints':<24} {checkpoints:>10,} of {len(threads):,} thread(s) in {took:.2f} s\n"
    )
    return checkpoints


async def _dry_run(
    args: argparse.Namespace, counts: dict[str, int], threads: int, out: TextIO
) -> None:
    for name, count in counts.items():
        out.write(f"  {name:<24} {count:>10,} row(s)\n")
    out.write(f"  {'checkpoints':<24} of {threads:,} thread(s)\n")
    out.write(f"target: {await _target_state(args.to_url, args.to_schema)}\n")
    out.write(
        f"would copy {sum(counts.values()):,} row(s) and the checkpoints of {threads:,} "
        "thread(s); nothing was written (--dry-run)\n"
    )


async def _target_state(url: str, schema: str | None) -> str:
    """What the copy would find at the target (read only: nothing is created)."""
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    if path is not None and not Path(path).exists():  # noqa: ASYNC240 - one stat
        return "no database yet: the copy creates it"
    target = SqlStore.from_url(url, schema=schema)
    try:
        revision = await target.schema_revision()
        present = await rows_present(target) if revision is not None else 0
    finally:
        await target.close()
    if revision is None:
        return "no turnkit tables yet: the copy creates them"
    if present:
        return f"holds {present:,} turnkit row(s): the copy would be refused"
    return f"empty, schema at {revision} (the copy brings it to {head_revision()})"
