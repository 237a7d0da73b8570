"""The one table every fault test prints, and the counts that go into it.

Every fault test reports the same six rows — trials, lost, duplicated, stuck, tool re-runs,
effects applied twice — plus rows of its own. A row a test does not measure prints `-`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.worker_agent import read_log

__all__ = ("FaultTable", "percentile", "seq_faults", "tool_effects")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultTable:
    """What one fault test saw; None means "not measured by this test"."""

    trials: int
    lost: int | None = None
    duplicated: int | None = None
    stuck: int | None = None
    tool_reruns: int | None = None
    applied_twice: int | None = None
    extra: Mapping[str, object] = field(default_factory=dict[str, object])
    """The test's own rows (recovery times, cuts, server errors …), printed after the six."""

    def rows(self) -> dict[str, object]:
        standard: dict[str, object] = {
            "trials": self.trials,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "stuck": self.stuck,
            "tool re-runs": self.tool_reruns,
            "effects applied twice": self.applied_twice,
        }
        return {**standard, **self.extra}

    def show(
        self, title: str, capsys: pytest.CaptureFixture[str], *, save: Path | None = None
    ) -> None:
        """Print the table past pytest's capture (and save it as JSON when asked)."""
        rows = self.rows()
        with capsys.disabled():
            print(f"\n{title}:")
            for name, value in rows.items():
                print(f"  {name:24} {'-' if value is None else value}")
        if save is not None:
            save.write_text(json.dumps(rows))

    @property
    def failures(self) -> tuple[int, int, int, int]:
        """(lost, duplicated, stuck, applied twice), unmeasured ones as 0: all 0 to pass."""
        return (
            self.lost or 0,
            self.duplicated or 0,
            self.stuck or 0,
            self.applied_twice or 0,
        )


def seq_faults(received: Iterable[int], last_seq: int) -> tuple[int, int]:
    """(lost, duplicated) of the durable seqs a client received against the stored log."""
    seqs = list(received)
    return len(set(range(1, last_seq + 1)) - set(seqs)), len(seqs) - len(set(seqs))


def tool_effects(log: Path) -> tuple[int, int]:
    """(tool re-runs, effects applied twice) from the test agent's call log.

    A re-run under the same idempotency key is harmless; a call run under two different
    keys would apply its effect twice.
    """
    runs = [line for line in read_log(log) if line["event"] == "tool"]
    keys_per_call: dict[tuple[str, str], set[str]] = defaultdict(set)
    by_key: dict[str, int] = defaultdict(int)
    for line in runs:
        keys_per_call[(str(line["turn"]), str(line["call"]))].add(str(line["key"]))
        by_key[str(line["key"])] += 1
    reruns = sum(n - 1 for n in by_key.values())
    return reruns, sum(1 for keys in keys_per_call.values() if len(keys) > 1)


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (0.0 for no values)."""
    if not values:
        return 0.0
    ranked = sorted(values)
    return ranked[max(0, round(fraction * len(ranked)) - 1)]
