"""How close is the held transcripts' byte estimate to the memory they really take?

Runs one session of `--turns` turns in one process on SQLite (each turn: the user's
message, a tool call, its result, the answer; sizes and alphabet by `--mix`), with a
model that keeps nothing, then compares the estimate the runtime holds the session's
transcript under (`Held.size`) with two measures of what it takes:

- **freed**: traced memory (tracemalloc) freed when the runtime forgets the session
  and garbage is collected, the caches of what is derived from messages by value
  emptied first (they share objects with the hold for a while): what the hold keeps;
- **walked**: a walk of every object reachable from what is held (each counted once by
  `sys.getsizeof`; classes, modules and functions left out).

It also times `size_of` on one turn's messages (it runs on every turn).

Run:  .venv/bin/python benchmarks/held_size.py [--turns 200] [--mix chat,tools,unicode]
          [--json PATH]
Prints a table (and writes it as JSON with `--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.context.transcript import DerivedCache
from turnkit.events import DoneEvent
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.runtime._held import size_of

MIXES: dict[str, tuple[str, int, int]] = {
    # (alphabet, characters of a message and of an answer, characters of a tool result)
    "chat": ("plain words of a chat ", 80, 120),
    "tools": ("plain words of a chat ", 200, 4_000),
    "unicode": ("żółć 汉字 ", 120, 600),
}


def _text(alphabet: str, chars: int, salt: int) -> str:
    body = (alphabet * (chars // len(alphabet) + 1))[:chars]
    return f"{salt}:{body}"


class _Model:
    """A model that calls `look_up` once a turn, then answers; it keeps no request."""

    def __init__(self, mix: str) -> None:
        self.alphabet, self.chars, _ = MIXES[mix]
        self.turn = 0

    @property
    def model(self) -> str:
        return "held-size"

    @property
    def provider(self) -> str:
        return "held-size"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if request.messages[-1].role == "user":
            self.turn += 1
            yield ToolCallDelta(
                index=0,
                tool_call_id=f"call_{self.turn}",
                name="look_up",
                arguments=json.dumps({"topic": f"topic {self.turn}", "depth": 2}),
            )
            yield Finish("tool_use", Usage(input_tokens=10, output_tokens=5))
            return
        yield TextDelta(_text(self.alphabet, self.chars, self.turn))
        yield Finish("end_turn", Usage(input_tokens=10, output_tokens=5))


def _caches() -> list[DerivedCache[Any]]:
    """The caches of what is derived from messages, kept by value for a while."""
    return [o for o in gc.get_objects() if isinstance(o, DerivedCache)]


def _walk(root: object) -> int:
    """Bytes of every object reachable from `root`, each counted once."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip) or obj is None or isinstance(obj, bool):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                    stack.append(getattr(obj, slot))
        if hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.append(vars(obj))
    return total


async def _session(mix: str, turns: int, root: Path) -> dict[str, Any]:
    alphabet, chars, result_chars = MIXES[mix]

    @tool
    async def look_up(topic: str, depth: int) -> str:
        """Look a topic up."""
        return _text(alphabet, result_chars, depth)

    agent = Agent(model=_Model(mix), tools=[look_up], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{root / f'{mix}.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:

        async def one(n: int, session: str = "s") -> None:
            done = None
            async for event in runtime.execute_message(session, _text(alphabet, chars, n)):
                if isinstance(event, DoneEvent):
                    done = event
            assert done is not None
            assert done.status == "succeeded", done

        for n in range(turns):
            # a task of its own, as a server runs each request: what a turn sets in its
            # context (LangGraph's config) does not outlive it
            await asyncio.create_task(one(n))
        # the process keeps some of its last turn's state until the next turn: make that
        # another session's, so only the hold keeps this one's
        await asyncio.create_task(one(0, "other"))
        held = runtime._held
        session, kept = next(iter(held._held.items()))  # "s": the least recently used
        messages = kept.known.messages
        count, estimate, walked = len(messages), kept.size, _walk(kept)
        history = json.loads(json.dumps(messages))  # a copy, timed after without tracemalloc
        del kept, messages
        for cache in _caches():  # what they share with the hold is the hold's to free
            cache.by_value.clear()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        held.forget(session)
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
        return {
            "mix": mix,
            "messages": count,
            "estimate": estimate,
            "freed": freed,
            "walked": walked,
            "history": history,
        }


def _timed(history: list[Any], rounds: int = 2_000) -> tuple[float, float]:
    """µs `size_of` takes on one turn's messages (the last four), and on all of them."""
    per_turn = history[-4:]  # the message, the call, its result, the answer
    started = time.perf_counter()
    for _ in range(rounds):
        size_of(per_turn)
    turn = (time.perf_counter() - started) / rounds * 1e6
    started = time.perf_counter()
    for _ in range(rounds // 20):
        size_of(history)
    return turn, (time.perf_counter() - started) / (rounds // 20) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--mix", default="chat,tools,unicode")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [await _session(mix, args.turns, Path(tmp)) for mix in args.mix.split(",")]
    tracemalloc.stop()
    print(
        "| mix | messages | estimate | freed | walked | freed ÷ estimate | walked ÷ estimate "
        "| size_of: a turn's messages, all |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for r in runs:
        turn, whole = _timed(r["history"])
        row = {k: v for k, v in r.items() if k != "history"}
        rows.append(row | {"size_of_turn_us": turn, "size_of_all_us": whole})
        print(
            f"| {r['mix']} | {r['messages']} | {r['estimate']:,} | {r['freed']:,} | "
            f"{r['walked']:,} | {r['freed'] / r['estimate']:.2f} | "
            f"{r['walked'] / r['estimate']:.2f} | {turn:.1f} µs, {whole:,.0f} µs |"
        )

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"turns": args.turns, "rows": rows}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
