"""The transcripts a runtime holds between a session's turns take the memory it budgets.

Each session's transcript is held so its next turn reads only the turns since; the hold
is bounded by `RuntimeConfig.held_transcript_bytes`, counted with an estimate of what the
held messages take. The estimate must be the memory they really take (within a quarter),
else an operator's bound is exceeded several times over.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import sys
import tracemalloc
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Literal, cast

import pytest

from tests.conftest import RuntimeFactory
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.context._sealed import seal
from turnkit.context.transcript import TranscriptMessage, from_transcript
from turnkit.events import DoneEvent
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.runtime._held import size_of

Alphabet = Literal["ascii", "unicode"]
WORDS: dict[Alphabet, str] = {"ascii": "plain words of a chat ", "unicode": "żółć 汉字 "}


def _text(alphabet: Alphabet, chars: int, salt: object) -> str:
    words = WORDS[alphabet]
    return f"{salt}:{(words * (chars // len(words) + 1))[:chars]}"


class _Model:
    """Calls `look_up` once a turn, then answers. It keeps no request (`ScriptedModel`
    keeps every one, and with it the messages whose memory is measured)."""

    def __init__(self, alphabet: Alphabet) -> None:
        self.alphabet = alphabet
        self.turn = 0

    @property
    def model(self) -> str:
        return "held"

    @property
    def provider(self) -> str:
        return "held"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if request.messages[-1].role == "user":
            self.turn += 1
            arguments = json.dumps({"topic": f"topic {self.turn}"})
            yield ToolCallDelta(index=0, tool_call_id=f"c{self.turn}", name="look_up",
                                arguments=arguments)  # fmt: skip
            yield Finish("tool_use", Usage(input_tokens=10, output_tokens=5))
            return
        yield TextDelta(_text(self.alphabet, 200, self.turn))
        yield Finish("end_turn", Usage(input_tokens=10, output_tokens=5))


def _agent(alphabet: Alphabet) -> Agent:
    @tool
    async def look_up(topic: str) -> str:
        """Look a topic up."""
        return _text(alphabet, 600, topic)

    return Agent(model=_Model(alphabet), tools=[look_up], skip_stages=frozenset({"anchor-plan"}))


async def _turns(runtime: SessionRuntime, session: str, count: int, alphabet: Alphabet) -> None:
    async def one(n: int) -> None:
        ended = [e async for e in runtime.execute_message(session, _text(alphabet, 120, n))]
        assert isinstance(ended[-1], DoneEvent)
        assert ended[-1].status == "succeeded"

    for n in range(count):  # each turn a task of its own, as a server runs requests:
        await asyncio.create_task(one(n))  # what a turn sets in its context ends with it


def _taken(runtime: SessionRuntime) -> int:
    """The memory the held transcripts take: each object reachable from what is held,
    counted once (`sys.getsizeof`; classes, modules and functions are not the hold's).

    On SQLite this is within 1% of the traced memory freed when the runtime lets go of
    them (`benchmarks/held_size.py`); the walk does not depend on when other references
    to a finished turn's messages (the checkpointer's writes) are let go.
    """
    seen: set[int] = set()
    stack: list[object] = list(runtime._held._held.values())
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, bool | type | ModuleType | Callable):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(cast("dict[object, object]", obj).keys())
            stack.extend(cast("dict[object, object]", obj).values())
        elif isinstance(obj, list | tuple):
            stack.extend(cast("list[object]", obj))
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                    stack.append(getattr(obj, slot))
        if hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


@pytest.mark.parametrize("alphabet", ["ascii", "unicode"])
async def test_the_held_estimate_is_within_a_quarter_of_what_a_session_takes(
    runtime_factory: RuntimeFactory, db: tuple[str, str | None], alphabet: Alphabet
) -> None:
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    runtime = runtime_factory(_agent(alphabet), config=config)
    await _turns(runtime, "long", 30, alphabet)
    assert list(runtime._held._held) == ["long"]
    estimate, taken = runtime._held.size, _taken(runtime)
    assert taken > 50_000  # 29 turns of four messages
    assert 0.75 <= estimate / taken <= 1.25, (estimate, taken)


async def test_a_runtime_holds_no_more_memory_than_it_is_configured_to(
    runtime_factory: RuntimeFactory, db: tuple[str, str | None]
) -> None:
    """Sessions beyond the bound are let go, least recently used first, at the memory
    they really take."""
    url, schema = db
    budget = 100_000
    config = RuntimeConfig(database_url=url, database_schema=schema, held_transcript_bytes=budget)
    runtime = runtime_factory(_agent("ascii"), config=config)
    for session in range(6):
        await _turns(runtime, f"s{session}", 10, "ascii")
    kept = list(runtime._held._held)
    assert 1 < len(kept) < 6
    assert kept == [f"s{n}" for n in range(6 - len(kept), 6)]  # the oldest went first
    taken = _taken(runtime)
    assert budget * 0.5 < taken <= budget * 1.25, taken


async def test_a_runtime_configured_to_hold_nothing_reads_every_turn_whole(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    config = RuntimeConfig(database_url=database_url, held_transcript_bytes=0)
    runtime = runtime_factory(_agent("ascii"), config=config)
    await _turns(runtime, "s", 3, "ascii")
    assert not runtime._held._held
    assert runtime._held.size == 0


def test_a_held_message_keeps_one_copy_of_its_text() -> None:
    """A held message is decoded from the Store: the `ModelMessage` a request builds from it
    holds its own strings, not those of the equal message the turn sent (which the cache
    of messages by value still kept), so the text is not held twice."""
    sent: TranscriptMessage = {"role": "tool", "content": _text("ascii", 500, "r"),
                               "tool_call_id": "c1"}  # fmt: skip
    [first] = from_transcript([sent])
    assert first.content is sent["content"]  # as the turn sent it
    stored = seal(cast(TranscriptMessage, json.loads(json.dumps(sent))))
    assert stored["content"] == sent["content"]
    assert stored["content"] is not sent["content"]
    [built] = from_transcript([stored])
    assert built.content is stored["content"]
    assert built.tool_call_id is stored["tool_call_id"]


@pytest.mark.parametrize("form", ["data", "url"])
def test_a_held_picture_is_counted_at_the_memory_it_takes(form: str) -> None:
    """A picture sent as base64 `data` is held twice: the text, and the bytes its
    `ModelMessage` decodes from it."""
    encoded = base64.b64encode(bytes(range(256)) * 300).decode()
    picture = (
        {"kind": "image", "data": encoded, "media_type": "image/png"}
        if form == "data"
        else {"kind": "image", "url": f"data:image/png;base64,{encoded}"}
    )
    stored = json.dumps({"role": "user", "content": [{"kind": "text", "text": "Look."}, picture]})
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        held = seal(cast(TranscriptMessage, json.loads(stored)))
        from_transcript([held])  # what a request builds from it, kept on it
        gc.collect()
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        if started:
            tracemalloc.stop()
    assert 0.75 <= size_of([held]) / taken <= 1.25, (size_of([held]), taken)
