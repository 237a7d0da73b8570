"""The commands that tidy a database: `turnkit sweep` and `turnkit sessions prune`.

They open the database as the reading commands do (`existing_store`: never created, never
migrated; a schema at another revision is refused), and a runtime on that store to reach
the graph checkpoints, which they delete as a running process does: the swept turns',
and a pruned session's turns' after its rows (and first, any a pruning interrupted
between the two left behind).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TextIO

from turnkit.cli._inspect import existing_store
from turnkit.config import RuntimeConfig, env_keep_ended_checkpoints
from turnkit.demo import demo_agent
from turnkit.errors import ConfigurationError
from turnkit.runtime import SessionRuntime
from turnkit.runtime._retention import (
    RetentionBatch,
    check_retention,
    forget_orphaned_checkpoints,
    idle_cutoff,
    idle_session_batches,
)
from turnkit.store.sql import SqlStore, first_line

__all__ = ("prune_sessions", "sweep")


@contextlib.asynccontextmanager
async def _runtime_on(store: SqlStore, config: RuntimeConfig) -> AsyncIterator[SessionRuntime]:
    """A runtime on `store` (left open for the caller): its checkpointer, no turns run."""
    runtime = SessionRuntime(agent=demo_agent(), store=store, config=config)
    try:
        await runtime.open()
        yield runtime
    finally:
        await runtime.close()


async def sweep(config: RuntimeConfig, out: TextIO) -> int:
    """`turnkit sweep`: end orphaned turns, then delete their checkpoints.

    Only the turns this sweep ended: nothing resumes them. A checkpointer that cannot be
    reached leaves them (their sessions' deletion takes them): one line, exit code 1.
    """
    async with existing_store(config.database_url, config.database_schema) as store:
        return await _sweep(store, config, out)


async def _sweep(store: SqlStore, config: RuntimeConfig, out: TextIO) -> int:
    ended = await store.sweep(ceiling_s=config.ceiling_s, max_attempts=config.max_attempts)
    out.write(f"swept {len(ended)} turn(s)\n" + "".join(f"  {t}\n" for t in ended))
    out.flush()
    if not ended:
        return 0
    if config.keep_ended_checkpoints:
        out.write("kept their checkpoints (TURNKIT_KEEP_ENDED_CHECKPOINTS)\n")
        return 0
    try:
        async with _runtime_on(store, config) as runtime:
            await runtime.forget_checkpoints(ended)
    except Exception as exc:  # noqa: BLE001 - the turns have ended: say what stays
        sys.stderr.write(
            f"turnkit: could not delete the checkpoints of the {len(ended)} swept turn(s) "
            f"({first_line(exc)}); they stay until their sessions are deleted\n"
        )
        return 1
    out.write(f"deleted the checkpoints of {len(ended)} turn(s)\n")
    return 0


async def prune_sessions(args: argparse.Namespace, out: TextIO) -> int:
    """`turnkit sessions prune`: delete idle sessions in batches, one line per batch.

    A dry run lists each session it would delete instead. The last line sums it up.
    """
    for flag in ("principal", "organisation"):
        if getattr(args, flag) is not None:  # the prune is not narrowed to one owner
            raise ConfigurationError(
                f"`turnkit sessions prune` takes no --{flag}: it deletes every idle session"
            )
    check_retention(args.idle_for, args.limit)  # argparse has checked them already
    config = RuntimeConfig(
        database_url=args.database_url,
        database_schema=args.database_schema,
        auto_migrate=False,
        keep_ended_checkpoints=env_keep_ended_checkpoints(os.environ),
    )
    async with existing_store(config.database_url, config.database_schema) as store:
        return await _prune(
            store, config, out, idle_for=args.idle_for, limit=args.limit, dry_run=args.dry_run
        )


async def _prune(
    store: SqlStore,
    config: RuntimeConfig,
    out: TextIO,
    *,
    idle_for: timedelta,
    limit: int | None,
    dry_run: bool,
) -> int:
    sessions = turns = 0
    async with _runtime_on(store, config) as runtime:
        idle_before = idle_cutoff(runtime.clock.now(), idle_for)
        out.write(f"sessions idle for {_span(idle_for)}: last active before {_when(idle_before)}\n")
        if not dry_run and (orphaned := await forget_orphaned_checkpoints(runtime)):
            out.write(
                f"  deleted the checkpoints of {orphaned} turn(s) already deleted "
                "(an earlier prune was interrupted)\n"
            )
        batches = idle_session_batches(
            runtime, idle_before=idle_before, limit=limit, dry_run=dry_run
        )
        async for batch in batches:
            sessions += len(batch.session_ids)
            turns += batch.turns
            out.write(_listed(batch) if dry_run else _deleted(batch))
            out.flush()
    verb = "would delete" if dry_run else "deleted"
    out.write(
        f"{verb} {sessions} session(s) with {turns} turn(s)"
        + ("; nothing was deleted (--dry-run)\n" if dry_run else "\n")
    )
    return 0


def _deleted(batch: RetentionBatch) -> str:
    if not batch.sessions:  # each one came back since it was found
        return ""
    times = [s.last_active for s in batch.sessions]
    return (
        f"  deleted {len(batch.sessions)} session(s) with {batch.turns} turn(s), last active "
        f"{_when(min(times))} to {_when(max(times))}\n"
    )


def _listed(batch: RetentionBatch) -> str:
    return "".join(
        f"  would delete {s.session_id}  {len(s.turn_ids)} turn(s)  last active "
        f"{_when(s.last_active)}\n"
        for s in batch.sessions
    )


def _span(duration: timedelta) -> str:
    """`90d`, `1d12h`, `30m`: as `--idle-for` takes it."""
    seconds = round(duration.total_seconds())
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or f"{duration.total_seconds():g}s"


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S")
