"""Seeded random interleavings of the public `SessionRuntime` API, checked against a model.

Each seed drives one database through a random sequence of steps: new messages in up to
three sessions (detached with `start`, or streamed with `execute_message`, some while a
turn of the session runs, waits for a person or is queued), retries of a `request_id`,
Stop, answers to approvals (approve, deny, approve with changed arguments) and questions,
reads of a turn's log from a random `after_seq`, leaving a stream, and closing the runtime
to open a new one on the same database. The model is a function of each request (the
message says what the turn should do: answer, call a counting tool, a failing tool, a
tool that times out, a tool that needs approval, `ask_user`, or hang until stopped).

After every step the committed logs are checked; at the end every turn is brought to its
end (pauses answered, hanging turns stopped) and the user-visible invariants are checked:
one `done` per turn, gap-free seqs, resumed reads equal to full reads, no committed tool
call run again, approvals honoured, cancelled logs frozen, each request's transcript
holding every earlier turn's message and answer once and in order, retries returning the
same turn, and no exception but turnkit's typed errors.

A Stop that lands after the model's answer streamed keeps, in the log, `history` and the
next model's transcript alike, either the turn's answer (kept before the Stop: no note
that the person stopped it) or, as a Stop mid-answer does, the text as an interrupted
block followed by the note "the person stopped this turn before I answered".

`TURNKIT_FUZZ_SEEDS` (default 20) and `TURNKIT_FUZZ_STEPS` (default 25) size the run;
`TURNKIT_FUZZ_SEED=N` runs that one seed. A failure names its seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from turnkit import Agent, Answer, Approve, Deny, RuntimeConfig, SessionRuntime, tool
from turnkit.errors import PauseAnsweredError, RequestConflictError, TurnkitError
from turnkit.events import StreamEvent
from turnkit.ids import TurnId
from turnkit.models import ModelRequest
from turnkit.testing import ModelStep, ScriptedModel, call
from turnkit.tools import ToolContext

SEEDS = int(os.environ.get("TURNKIT_FUZZ_SEEDS", "20"))
STEPS = int(os.environ.get("TURNKIT_FUZZ_STEPS", "25"))
ONE_SEED = os.environ.get("TURNKIT_FUZZ_SEED")
KINDS = ("plain", "note", "boom", "slow", "pay", "ask", "hang")
MESSAGE = re.compile(r"^m(\d+) (\w+)$")
ANSWER = re.compile(r"^answer m(\d+)$")
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}
PAUSED = {"awaiting_approval", "awaiting_input", "awaiting_budget"}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(str(getattr(part, "text", "")) for part in content)
    return ""


@dataclass
class Turn:
    n: int
    session: str
    kind: str
    turn_id: TurnId
    request_id: str | None
    content: str
    decisions: list[str] = field(default_factory=list)
    """`approve`, `edit`, `deny`, `answer`: answers resume accepted."""
    ended: int = 0
    """Events in the log when its ending was first seen (0: not yet)."""
    frozen_at: int | None = None
    """Events in the log when Stop returned `cancelled`: nothing may follow."""


@dataclass
class Seen:
    """A model request: which turn's message it was for, and its transcript."""

    n: int
    messages: list[int]
    answers: list[int]
    raw: list[str] = field(default_factory=list)
    noted: list[int] = field(default_factory=list)
    """The answers the note that the person stopped the turn follows."""


class World:
    """One seed: the runtime under test and everything the test expects of it."""

    def __init__(self, seed: int, url: str, schema: str | None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = RuntimeConfig(
            database_url=url,
            database_schema=schema,
            recover_in_process=True,
            lease_ttl_s=2.0,
        )
        self.turns: list[Turn] = []
        self.by_id: dict[str, Turn] = {}
        self.sessions = [f"s{seed}-{i}" for i in range(self.rng.randint(1, 3))]
        self.epoch = 0
        self.invocations: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        """tool_call_id → (epoch, arguments) per time the tool ran."""
        self.reran: list[str] = []
        """Tool calls that ran again once their result was committed."""
        self.seen: list[Seen] = []
        self.streams: list[tuple[Turn, asyncio.Task[None]]] = []
        self.trace: list[str] = []
        self.runtime = self._runtime()

    # ── the agent ─────────────────────────────────────────────────────────────────

    def _runtime(self) -> SessionRuntime:
        world = self

        async def ran(ctx: ToolContext, **arguments: Any) -> None:
            world.invocations.setdefault(ctx.tool_call_id, []).append((world.epoch, arguments))
            async for event in world.runtime.events(ctx.turn_id):  # the log as the tool starts
                if getattr(event, "tool_call_id", None) == ctx.tool_call_id and event.type in (
                    "tool.completed",
                    "tool.failed",
                ):
                    world.reran.append(f"{ctx.tool_call_id} ran after its result (seq {event.seq})")

        @tool
        async def note(ctx: ToolContext, key: str) -> str:
            """Write a note."""
            await ran(ctx, key=key)
            return f"noted {key}"

        @tool
        async def boom(ctx: ToolContext, key: str) -> str:
            """A tool that fails."""
            await ran(ctx, key=key)
            raise RuntimeError(f"boom {key}")

        @tool(timeout_s=0.05)
        async def slow(ctx: ToolContext, key: str) -> str:
            """A tool that takes too long."""
            await ran(ctx, key=key)
            await asyncio.sleep(5)
            return "late"

        @tool(approval="always")
        async def pay(ctx: ToolContext, key: str, amount: int) -> str:
            """Pay: a person approves each call."""
            await ran(ctx, key=key, amount=amount)
            return f"paid {amount}"

        model = ScriptedModel([ModelStep.respond(self._respond)], repeat_last=True)
        agent = Agent(model=model, tools=[note, boom, slow, pay], clarifications=True)
        return SessionRuntime(agent=agent, config=self.config)

    def _respond(self, request: ModelRequest) -> ModelStep:
        mine: list[int] = []
        answers: list[int] = []
        noted: list[int] = []
        last_user = -1
        for at, message in enumerate(request.messages):
            text = _text(message.content).strip()
            if message.role == "user" and (found := MESSAGE.match(text)):
                mine.append(int(found.group(1)))
                last_user = at
            elif message.role == "assistant" and (found := ANSWER.match(text)):
                answers.append(int(found.group(1)))
            elif message.role == "assistant" and text == STOPPED_NOTE and _answers(request, at):
                noted.append(answers[-1])  # the note right after an answer
        assert mine, f"a model request without a fuzz message: {request.messages}"
        n = mine[-1]
        raw = [
            f"{m.role}:{_text(m.content)[:60]!r}:{[c.name for c in m.tool_calls]}"
            for m in request.messages
        ]
        self.seen.append(Seen(n, mine, answers, raw, noted))
        kind = self.turns_by_n()[n].kind
        if any(m.role == "tool" for m in request.messages[last_user + 1 :]):
            return ModelStep.text_reply(f"answer m{n}")
        key = f"m{n}"
        tool_call_id = f"c{self.seed}_{n}"
        if kind == "plain":
            return ModelStep.text_reply(f"answer m{n}")
        if kind == "hang":
            return ModelStep.hang()
        if kind == "pay":
            pay = call("pay", key=key, amount=n, tool_call_id=tool_call_id)
            return ModelStep.tool_call_reply(pay)
        if kind == "ask":
            return ModelStep.tool_call_reply(
                call("ask_user", question=f"which {key}?", tool_call_id=tool_call_id)
            )
        return ModelStep.tool_call_reply(call(kind, key=key, tool_call_id=tool_call_id))

    def turns_by_n(self) -> dict[int, Turn]:
        return {t.n: t for t in self.turns}

    # ── helpers ───────────────────────────────────────────────────────────────────

    async def typed(self, what: str, op: Callable[[], Any]) -> Any:
        """Run one operation: only turnkit's typed errors may come out of it."""
        self.trace.append(what)
        try:
            return await op()
        except TurnkitError as exc:
            self.trace.append(f"  -> {exc.code}")
            raise
        except Exception as exc:
            raise AssertionError(f"{what} raised an untyped {exc!r}") from exc

    async def log(self, turn_id: TurnId, after: int = 0) -> list[StreamEvent]:
        return [e async for e in self.runtime.events(turn_id, after_seq=after)]

    async def status(self, turn: Turn) -> str:
        record = await self.runtime.turn(turn.turn_id)
        return str(record.status)

    # ── operations ────────────────────────────────────────────────────────────────

    async def send(self) -> None:
        session = self.rng.choice(self.sessions)
        n = len(self.turns) + 1
        kind = self.rng.choice(KINDS)
        content = f"m{n} {kind}"
        request_id = f"r{n}" if self.rng.random() < 0.5 else None
        if self.rng.random() < 0.3:
            await self._stream(session, n, kind, content, request_id)
            return
        sub = await self.typed(
            f"start {session} {content!r} request_id={request_id}",
            lambda: self.runtime.start(session, content, request_id=request_id),
        )
        assert sub.is_new, sub
        self._add(Turn(n, session, kind, sub.turn_id, request_id, content))

    def _add(self, turn: Turn) -> None:
        self.turns.append(turn)
        self.by_id[turn.turn_id] = turn

    async def _stream(
        self, session: str, n: int, kind: str, content: str, request_id: str | None
    ) -> None:
        self.trace.append(f"execute_message {session} {content!r} request_id={request_id}")
        stream = self.runtime.execute_message(session, content, request_id=request_id)
        first = await anext(stream)
        assert first.type == "turn.started", first
        turn = Turn(n, session, kind, first.turn_id, request_id, content)
        self._add(turn)

        async def drain() -> None:
            try:
                async for _ in stream:
                    pass
            except TurnkitError:
                pass
            finally:
                await stream.aclose()

        self.streams.append((turn, asyncio.create_task(drain())))

    async def retry(self) -> None:
        keyed = [t for t in self.turns if t.request_id is not None]
        if not keyed:
            return await self.send()
        turn = self.rng.choice(keyed)
        if self.rng.random() < 0.2:
            other = turn.content + " again"
            with pytest.raises(RequestConflictError):
                await self.typed(
                    f"start retry {turn.request_id} with other content",
                    lambda: self.runtime.start(turn.session, other, request_id=turn.request_id),
                )
            return None
        if self.rng.random() < 0.3:
            self.trace.append(f"execute_message retry {turn.request_id}")
            replayed = self.runtime.execute_message(
                turn.session, turn.content, request_id=turn.request_id
            )
            first = await anext(replayed)
            await replayed.aclose()
            assert first.turn_id == turn.turn_id, (first, turn)
            return None
        sub = await self.typed(
            f"start retry {turn.request_id}",
            lambda: self.runtime.start(turn.session, turn.content, request_id=turn.request_id),
        )
        assert sub.turn_id == turn.turn_id, (sub, turn)
        assert not sub.is_new, sub
        return None

    async def stop(self) -> None:
        if not self.turns:
            return
        turn = self.rng.choice(self.turns)
        status = await self.typed(
            f"cancel m{turn.n} ({turn.kind})", lambda: self.runtime.cancel(turn.turn_id)
        )
        self.trace.append(f"  -> {status}")
        assert status in TERMINAL, f"Stop of m{turn.n} in one process left it {status}"
        if status == "cancelled" and turn.frozen_at is None:
            turn.frozen_at = len(await self.log(turn.turn_id))

    async def answer(self) -> None:
        session = self.rng.choice(self.sessions)
        waiting = await self.typed(f"pending {session}", lambda: self.runtime.pending(session))
        if not waiting:
            return
        decision = self.rng.choice(waiting)
        turn = self.by_id[decision.turn_id]
        if decision.kind == "clarification":
            kind, resolution = "answer", Answer(text=f"reply to m{turn.n}")
        else:
            kind = self.rng.choice(["approve", "edit", "deny"])
            resolution = {
                "approve": Approve(),
                "edit": Approve(arguments={"key": f"m{turn.n}", "amount": 1000 + turn.n}),
                "deny": Deny(note="no"),
            }[kind]
        try:
            await self.typed(
                f"resume m{turn.n} {kind}",
                lambda: self.runtime.resume(decision.turn_id, decision.request_id, resolution),
            )
        except PauseAnsweredError:  # Stopped meanwhile (a stream left), or answered
            assert await self.status(turn) in TERMINAL | {"running"}, turn
            return
        turn.decisions.append(kind)
        if self.rng.random() < 0.3:  # the same answer again: refused, nothing changes
            with pytest.raises(PauseAnsweredError):
                await self.typed(
                    f"resume m{turn.n} again",
                    lambda: self.runtime.resume(decision.turn_id, decision.request_id, resolution),
                )

    async def read(self) -> None:
        if not self.turns:
            return
        turn = self.rng.choice(self.turns)
        full = await self.log(turn.turn_id)
        after = self.rng.randint(0, len(full))
        part = await self.log(turn.turn_id, after)
        seqs = [e.seq for e in part]
        assert seqs == list(range(after + 1, after + 1 + len(part))), (after, seqs)
        assert part[: len(full) - after] == full[after:], f"m{turn.n} from {after}"
        if full and full[-1].type == "done":
            followed = [
                e
                async for e in self.runtime.follow(turn.turn_id, after_seq=after)
                if getattr(e, "seq", None) is not None
            ]
            assert followed == full[after:], f"follow m{turn.n} from {after}"

    async def leave(self) -> None:
        live = [(t, task) for t, task in self.streams if not task.done()]
        if not live:
            return await self.send()
        turn, task = self.rng.choice(live)
        self.trace.append(f"leave the stream of m{turn.n}")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None

    async def restart(self) -> None:
        self.trace.append("restart")
        await self.typed("close", self.runtime.close)
        await asyncio.gather(*(task for _, task in self.streams), return_exceptions=True)
        self.epoch += 1
        self.runtime = self._runtime()
        await self.typed("open", self.runtime.open)

    async def pause(self) -> None:
        await asyncio.sleep(self.rng.choice([0, 0.001, 0.01, 0.05]))

    # ── invariants ────────────────────────────────────────────────────────────────

    async def check_logs(self, *, every: bool = False) -> None:
        """The logs' invariants: of every turn at the end, else of the turns not ended."""
        assert not self.reran, self.reran
        for turn in self.turns:
            if turn.ended and not every:
                continue
            record = await self.runtime.turn(turn.turn_id)
            log = await self.log(turn.turn_id)
            after = await self.runtime.turn(turn.turn_id)
            seqs = [e.seq for e in log]
            assert seqs == list(range(1, len(log) + 1)), f"m{turn.n} seqs {seqs}"
            dones = [e for e in log if e.type == "done"]
            assert len(dones) <= 1, f"m{turn.n} ended {len(dones)} times"
            if dones:
                assert log[-1].type == "done", f"m{turn.n}: {log[-1].type} after done"
                assert dones[0].status == after.status, (dones[0], after.status)
            if record.status in TERMINAL:
                assert dones, f"m{turn.n} is {record.status} with no done event"
                turn.ended = len(log)
            if turn.ended:
                assert len(log) == turn.ended, f"m{turn.n} grew after it ended: {log[-2:]}"
            if turn.frozen_at is not None:
                assert len(log) == turn.frozen_at, f"m{turn.n} grew after Stop: {log[-2:]}"
                assert record.status == "cancelled", record.status

    async def settle(self) -> None:
        """Answer every pause, stop every hanging turn, wait for every turn to end."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = {t.n: await self.status(t) for t in self.turns}
            if all(s in TERMINAL for s in statuses.values()):
                return
            for session in self.sessions:
                for decision in await self.runtime.pending(session):
                    turn = self.by_id[decision.turn_id]
                    asks = decision.kind == "clarification"
                    answer = Answer(text="fine") if asks else Approve()
                    try:
                        await self.runtime.resume(decision.turn_id, decision.request_id, answer)
                        turn.decisions.append("answer" if asks else "approve")
                    except PauseAnsweredError:
                        pass
            for turn in self.turns:
                hanging = turn.kind == "hang" and statuses[turn.n] not in TERMINAL
                if hanging and await self.runtime.cancel(turn.turn_id) == "cancelled":
                    turn.frozen_at = turn.frozen_at or len(await self.log(turn.turn_id))
            await asyncio.sleep(0.05)
        left = {t.n: await self.status(t) for t in self.turns}
        raise AssertionError(f"turns did not end: {left}")

    async def check_end(self) -> None:
        await self.check_logs(every=True)
        turns = self.turns_by_n()
        # each session's history: our turns, in the order sent, each once
        for session in self.sessions:
            expected = [t.turn_id for t in self.turns if t.session == session]
            if not expected:  # `history` of a session with no message: session-not-found
                continue
            history = await self.runtime.history(session)
            assert [h.turn_id for h in history] == expected, f"history of {session}"
            for h in history:
                turn = self.by_id[h.turn_id]
                if h.status == "succeeded":
                    assert h.answer == f"answer m{turn.n}", (turn, h.answer)
                elif turn.kind != "hang":
                    assert h.status == "cancelled", (turn, h.status, h.error_code)
        await self._check_tools()
        # transcripts: every earlier turn's message once, in order; answers once
        for seen in self.seen:
            turn = turns[seen.n]
            earlier = [t for t in self.turns if t.session == turn.session and t.n < seen.n]
            assert seen.messages == [t.n for t in earlier] + [seen.n], (
                f"m{seen.n}'s request holds messages {seen.messages}"
            )
            # a succeeded turn's answer; a stopped turn's text, if it was committed first,
            # as its answer (no note follows) or as an interrupted block (the note follows)
            kept = {t.n: await self._answered(t) for t in earlier}
            answered = [n for n, how in kept.items() if how]
            read = [a for a in seen.answers if a != seen.n]
            assert read == answered, (
                f"m{seen.n}'s request holds answers {seen.answers}, expected {answered}: {seen.raw}"
            )
            noted = [n for n, how in kept.items() if how == "interrupted"]
            assert [a for a in seen.noted if a != seen.n] == noted, (
                f"m{seen.n}'s request notes a Stop after {seen.noted}, expected {noted}: {seen.raw}"
            )

    async def _check_tools(self) -> None:
        """Each tool call ran once per runtime at most; approvals honoured, denials too."""
        for turn in self.turns:
            call_id = f"c{self.seed}_{turn.n}"
            runs = self.invocations.get(call_id, [])
            epochs = [epoch for epoch, _ in runs]
            assert len(epochs) == len(set(epochs)), f"m{turn.n} ran twice in one runtime: {runs}"
            if turn.kind == "pay":
                if "deny" in turn.decisions[:1]:
                    assert not runs, f"denied m{turn.n} ran: {runs}"
                if turn.decisions[:1] == ["edit"] and runs:
                    assert all(a["amount"] == 1000 + turn.n for _, a in runs), runs
                if turn.decisions[:1] == ["approve"] and runs:
                    assert all(a["amount"] == turn.n for _, a in runs), runs
                if not turn.decisions:
                    assert not runs, f"m{turn.n} ran with no approval: {runs}"
                status = await self.status(turn)
                if turn.decisions[:1] in (["approve"], ["edit"]) and status == "succeeded":
                    assert runs, f"approved m{turn.n} succeeded without running"

    async def _answered(self, turn: Turn) -> str | None:
        """How the turn's whole answer was kept ("answer", "interrupted"), None if not."""
        log = await self.log(turn.turn_id)
        blocks = [e.block for e in log if e.type == "message.complete"]
        whole = f"answer m{turn.n}"
        # a Stop mid-stream keeps what was streamed as an interrupted block
        cut = [b.text for b in blocks if getattr(b, "interrupted", False)]
        assert all(whole.startswith(t) for t in cut), f"m{turn.n} cut at {cut}"
        texts = [b.text for b in blocks if not getattr(b, "interrupted", False)]
        assert texts in ([], [whole]), f"m{turn.n} answered {texts}"
        assert len(blocks) <= 1, f"m{turn.n} has {len(blocks)} answers"
        status = log[-1].status if log and log[-1].type == "done" else None
        assert status != "succeeded" or texts, f"m{turn.n} succeeded with no answer"
        assert status in ("succeeded", "cancelled") or not texts, (turn, status)
        if texts:
            return "answer"
        return "interrupted" if whole in cut else None

    async def close(self) -> None:
        await self.runtime.close()
        await asyncio.gather(*(task for _, task in self.streams), return_exceptions=True)


STOPPED_NOTE = "[the person stopped this turn before I answered]"
OPERATIONS: list[tuple[str, int]] = [
    ("send", 8),
    ("retry", 2),
    ("stop", 2),
    ("answer", 4),
    ("read", 3),
    ("leave", 1),
    ("restart", 1),
    ("pause", 3),
]


async def run_seed(seed: int, url: str, schema: str | None, steps: int) -> None:
    world = World(seed, url, schema)
    await world.runtime.open()
    try:
        for session in world.sessions:
            await world.runtime.create_session(session)
        names = [name for name, _ in OPERATIONS]
        weights = [weight for _, weight in OPERATIONS]
        for _ in range(steps):
            name = world.rng.choices(names, weights)[0]
            await getattr(world, name)()
            await world.check_logs()
        await world.settle()
        await asyncio.gather(*(task for _, task in world.streams), return_exceptions=True)
        await world.check_end()
    except BaseException as exc:
        trace = "\n  ".join(world.trace[-60:])
        raise AssertionError(
            f"seed {seed} failed (TURNKIT_FUZZ_SEED={seed}): {exc!r}\n  {trace}"
        ) from exc
    finally:
        await world.close()


def _answers(request: ModelRequest, at: int) -> bool:
    """Whether the message before `at` is a fuzz answer."""
    return at > 0 and ANSWER.match(_text(request.messages[at - 1].content).strip()) is not None


def _seeds() -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return list(range(SEEDS))


async def test_random_operations(db: tuple[str, str | None], tmp_path: Path) -> None:
    url, schema = db
    for seed in _seeds():
        if schema is None:  # SQLite: a file per seed
            url = f"sqlite:///{tmp_path / f'seed{seed}.db'}"
        await run_seed(seed, url, schema, STEPS)
