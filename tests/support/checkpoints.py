"""Checkpoints and configs for the checkpoint saver tests (SQLite and PostgreSQL alike)."""

from __future__ import annotations

from typing import Any

THREAD = "turn-1"


def checkpoint(n: int) -> Any:
    """The `n`th checkpoint of a thread: one inline channel, ids that sort by `n`."""
    return {
        "v": 4,
        "id": f"1f0a0000-0000-6000-8000-{n:012d}",
        "ts": "2026-05-01T12:00:00+00:00",
        "channel_values": {"content": f"state {n}"},
        "channel_versions": {"content": n + 1},
        "versions_seen": {},
    }


def config(parent: int | None = None, thread: str = THREAD) -> Any:
    """A thread's config, naming checkpoint `parent` when given."""
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = checkpoint(parent)["id"]
    return {"configurable": conf}
