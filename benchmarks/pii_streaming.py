"""What the `pii-redaction` plugin costs a streamed answer, against the same turn without it.

One turn streams an answer of `--sizes` characters (plain prose with an email address, a
phone and a card number every few hundred characters) in 8-character chunks through
`execute_message` on SQLite; the floor is the same turn with no plugin. Sizes and the two
contenders run interleaved, `--rounds` times; the table shows the median wall time, its
spread (min-max) over rounds and the ratio to the floor. Every run checks that the
streamed deltas add up to the masked answer and that no value went out unmasked.

Run:  .venv/bin/python benchmarks/pii_streaming.py [--sizes 20000,50000] [--rounds 3]
Writes JSON (default benchmarks/results/pii_streaming.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.plugins.pii import PiiRedaction
from turnkit.testing import ModelStep, ScriptedModel, collect_events

WORDS = ("plain", "words", "here", "and", "some", "more", "text", "to", "read", "about")
VALUES = ("jane.doe@example.com", "+47 912 34 567", "4111 1111 1111 1111")


def answer(size: int) -> str:
    """Prose of `size` characters with a value every 40 words."""
    out: list[str] = []
    n = 0
    while sum(map(len, out)) + len(out) < size:
        out.append(VALUES[n // 40 % 3] if n % 40 == 39 else WORDS[n % len(WORDS)])
        n += 1
    return " ".join(out)[:size]


async def one_turn(text: str, pii: bool, db: Path) -> float:
    model = ScriptedModel([ModelStep.text_reply(text, chunk_size=8)])
    agent = Agent(
        model=model, plugins=[PiiRedaction()] if pii else [], skip_stages=frozenset({"anchor-plan"})
    )
    async with SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as rt:
        started = time.perf_counter()
        events = await collect_events(rt.execute_message("s1", "write"), limit=len(text))
        took = time.perf_counter() - started
    shown = "".join(e.text for e in events if e.type == "message.delta")
    if pii:
        leaked = [v for v in VALUES if v in shown]
        assert not leaked, f"went out unmasked: {leaked}"
    else:
        assert shown == text
    return took


async def main(sizes: list[int], rounds: int) -> dict[str, object]:
    times: dict[tuple[int, bool], list[float]] = {(s, p): [] for s in sizes for p in (False, True)}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for size in sizes:
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for pii in order:
                    db = Path(tmp) / f"r{round_}-{size}-{pii}.db"
                    times[(size, pii)].append(await one_turn(answer(size), pii, db))
    rows = []
    for size in sizes:
        floor = statistics.median(times[(size, False)])
        for pii in (False, True):
            got = times[(size, pii)]
            rows.append({
                "contender": "pii-redaction" if pii else "no plugin (floor)",
                "size": size,
                "median_s": statistics.median(got),
                "min_s": min(got),
                "max_s": max(got),
                "x_floor": statistics.median(got) / floor,
            })  # fmt: skip
    print(f"pii-redaction on a streamed answer — {platform.python_version()}, 8-char chunks, "
          f"{rounds} interleaved rounds\n")  # fmt: skip
    print(f"{'contender':<20} {'chars':>8} {'median s':>9} {'min-max s':>13} {'× floor':>8}")
    for row in rows:
        spread = f"{row['min_s']:.2f}-{row['max_s']:.2f}"
        print(f"{row['contender']:<20} {row['size']:>8} {row['median_s']:>9.3f} {spread:>13} "
              f"{row['x_floor']:>8.2f}")  # fmt: skip
    return {"when": datetime.now(UTC).isoformat(), "python": platform.python_version(),
            "rounds": rounds, "rows": rows}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000")
    parser.add_argument("--rounds", type=int, default=3)
    default_json = Path(__file__).parent / "results" / "pii_streaming.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()
    result = asyncio.run(main([int(s) for s in args.sizes.split(",")], args.rounds))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
