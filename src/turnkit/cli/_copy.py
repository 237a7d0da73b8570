"""`turnkit db copy`: every turnkit row and live turn's checkpoints, into an empty database.

The source is opened as the reading commands open it (never created, never migrated, a
schema at another revision refused) and only read. The target is migrated to this
turnkit's schema, as a writing command does, and must hold no turnkit row. Rows go table
by table, parents first, a page per transaction on each side; then the checkpoints of
every turn the source's checkpointer holds any of (paused turns resume from them).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

from turnkit.cli._inspect import existing_store
from turnkit.errors import ConfigurationError, StoreError
from turnkit.graph import open_checkpointer
from turnkit.graph._copy import copy_thread, open_checkpoint_reader, threads_with_checkpoints
from turnkit.store._copy_sql import (
    TABLES,
    count_rows,
    insert_rows,
    read_pages,
    rows_present,
    running_turns,
    turn_id_pages,
)
from turnkit.store.migrate import head_revision
from turnkit.store.sql import SqlStore, shown_url

__all__ = ("copy_database",)


def _where(url: str, schema: str | None) -> str:
    return shown_url(url) + (f" (schema {schema})" if schema else "")


async def copy_database(args: argparse.Namespace, out: TextIO) -> int:
    """`turnkit db copy --from URL --to URL`: one line per table, then a summary."""
    source_at, target_at = (args.from_url, args.from_schema), (args.to_url, args.to_schema)
    if source_at == target_at:
        raise ConfigurationError("--from and --to name the same database: nothing to copy")
    started = time.perf_counter()
    async with existing_store(*source_at) as source:
        running = await running_turns(source)
        if running and not args.force:
            raise StoreError(
                f"the source has {running} running or queued turn(s), and a process driving "
                "them would go on writing there: stop its API processes and workers first "
                "(paused turns may stay), or pass --force to copy them as they are",
                running=running,
            )
        counts = await count_rows(source)
        out.write(f"from {_where(*source_at)}\nto   {_where(*target_at)}\n")
        if args.dry_run:
            return await _dry_run(source, args, counts, out)
        async with _empty_target(args, out) as target:
            rows = await _copy_rows(source, target, args.batch_size, out)
        threads, checkpoints = await _copy_checkpoints(source, args, out)
    took = time.perf_counter() - started
    out.write(
        f"copied {rows:,} row(s) in {len(TABLES)} tables and {checkpoints:,} checkpoint(s) "
        f"of {threads:,} turn(s) in {took:.1f} s\n"
    )
    return 0


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


async def _copy_rows(source: SqlStore, target: SqlStore, size: int, out: TextIO) -> int:
    total = 0
    for table in TABLES:
        copied, started = 0, time.perf_counter()
        async for rows in read_pages(source, table, size=size):
            await insert_rows(target, table, rows)
            copied += len(rows)
        took = time.perf_counter() - started
        out.write(f"  {table.name:<24} {copied:>10,} row(s) in {took:.2f} s\n")
        out.flush()
        total += copied
    return total


async def _copy_checkpoints(
    source: SqlStore, args: argparse.Namespace, out: TextIO
) -> tuple[int, int]:
    """Copy the checkpoints of every turn the source holds any of: (turns, checkpoints)."""
    threads = checkpoints = 0
    started = time.perf_counter()
    async with open_checkpoint_reader(args.from_url, schema=args.from_schema) as reader:
        if reader is not None:
            saver, close = await open_checkpointer(args.to_url, schema=args.to_schema)
            try:
                async for ids in turn_id_pages(source, size=args.batch_size):
                    for thread_id in await threads_with_checkpoints(reader, ids):
                        checkpoints += await copy_thread(reader, saver, thread_id)
                        threads += 1
            finally:
                await close()  # writes what the saver held back
    took = time.perf_counter() - started
    out.write(f"  {'checkpoints':<24} {checkpoints:>10,} of {threads:,} turn(s) in {took:.2f} s\n")
    return threads, checkpoints


async def _dry_run(
    source: SqlStore, args: argparse.Namespace, counts: dict[str, int], out: TextIO
) -> int:
    for name, count in counts.items():
        out.write(f"  {name:<24} {count:>10,} row(s)\n")
    threads = 0
    async with open_checkpoint_reader(args.from_url, schema=args.from_schema) as reader:
        if reader is not None:
            async for ids in turn_id_pages(source, size=args.batch_size):
                threads += len(await threads_with_checkpoints(reader, ids))
    out.write(f"  {'checkpoints':<24} of {threads:,} turn(s)\n")
    out.write(f"target: {await _target_state(args.to_url, args.to_schema)}\n")
    out.write(
        f"would copy {sum(counts.values()):,} row(s) and the checkpoints of {threads:,} "
        "turn(s); nothing was written (--dry-run)\n"
    )
    return 0


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
