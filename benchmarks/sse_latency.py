"""SSE latency and throughput of turnkit's HTTP routes, over loopback, against a plain floor.

For each replay buffer (in-memory; Redis where `_services.REDIS_URL` says, when it
answers) the quickstart app (`create_app`) is served by a real uvicorn server on a free
127.0.0.1 port with a fresh temp SQLite database, and an httpx + httpx-sse client measures:

1. first event after POST `/execute` (instant model, anchor-plan skipped, no tools), and
   the whole turn (POST sent → `done` received), each turn followed by a request to the
   floor (4.) sending as many events: the ratio is taken against these interleaved floor
   samples. Every client reads each stream to its end, so the connection is kept;
2. resume of a finished turn (`Last-Event-ID` = a seq in the middle → first replayed event)
   and of a live turn (model streams 200 chunks 5 ms apart; the client drops the stream
   after a few events, pauses a random 0-5 ms so that reconnects land at random phases of
   the chunk clock, and reconnects with the last id it saw → first event). The live figure
   therefore includes waiting for the model's next chunk (uniform 0-5 ms); the JSON also
   has that event's delivery time alone (its `ts` → received);
3. sustained events/s through one stream: a model streaming `--events` chunks with no delay,
   events received / (POST sent → `done` received). Two models: "streaming" suspends once
   per chunk (as a client reading a socket does) and "burst" never suspends (like
   `ScriptedModel`: the driver emits every delta before the publisher runs once);
4. the floor: a plain FastAPI + sse-starlette endpoint on the same kind of server yielding
   the same number of pre-built events of the same size (no turnkit); for the rates it
   runs twice, never suspending (against the burst model) and suspending once per event
   (`asyncio.sleep(0)`, against the streaming model).

By default uvicorn runs as a task in the client's event loop (`--server task`): server and
client work then add up on one thread, nothing else. `--server thread` runs it in a thread
with its own loop instead; measured on 2 cores that gives the same latencies within ~10%
but halves every rate, the floor's included (22k vs 44k events/s): the two threads hand
the GIL back and forth on every event, a cost no real, out-of-process client imposes.
Every stream also checks what it received (durable seqs gap-free, in order, ending in
`done`; deltas adding up to the answer); failures are printed and counted, never hidden.

Run:  .venv/bin/python benchmarks/sse_latency.py [--turns 200] [--events 5000] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/sse_latency.json).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import multiprocessing
import os
import platform
import random
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _procs
import _services

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import uvicorn
from fastapi import FastAPI
from httpx_sse import aconnect_sse
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import MessageDeltaEvent, encode_event
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, Usage, text_of
from turnkit.quickstart import create_app
from turnkit.replay import ReplayBuffer
from turnkit.replay.memory import InMemoryReplayBuffer

HOST = "127.0.0.1"
REDIS_URL = _services.REDIS_URL
API = "/api/harness"
CHUNK = "abcdefgh"  # every streamed chunk: 8 characters, like ScriptedModel's default
ANSWER = "The sum of two and three is five."
LIVE_CHUNKS, LIVE_DELAY_MS, LIVE_DROP_AFTER = 200, 5.0, 5
STREAM_TIMEOUT_S = 60.0  # no single stream may take longer than this
WARMUP = 5
VERIFY_LIVE = 3  # live turns read to the end after the reconnect (the rest are cancelled)
_DIRECTIVE = re.compile(r"^bench chunks=(\d+) delay_ms=([0-9.]+)( burst)?$")
FIRST, DONE = "first event after POST", "turn done after POST"
RESUME_DONE, RESUME_LIVE = "resume finished turn → 1st event", "resume live turn → 1st event"
RATE_FLOOR = "events/s, one stream"
RATE_FLOOR_SUSPENDING = "events/s, suspending per event"
RATE_STREAM, RATE_BURST = "events/s, streaming model", "events/s, burst model"
METRICS = (
    FIRST,
    DONE,
    RESUME_DONE,
    RESUME_LIVE,
    RATE_FLOOR,
    RATE_FLOOR_SUSPENDING,
    RATE_STREAM,
    RATE_BURST,
)


# ── the model ────────────────────────────────────────────────────────────────────────


class BenchModel:
    """A `ModelClient` answering at once; `bench chunks=N delay_ms=D` streams N chunks.

    Streaming suspends once per chunk (`asyncio.sleep(D)`, also for D = 0), as a client
    reading a socket does; `… burst` never suspends, like `ScriptedModel`, so the driver
    runs the whole stream before the publisher gets the loop and publishes it in one batch.
    """

    @property
    def model(self) -> str:
        return "bench"

    @property
    def provider(self) -> str:
        return "bench"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        users = (m.content for m in reversed(request.messages) if m.role == "user")
        user = text_of(next(users, ""))
        match = _DIRECTIVE.match(user.strip())
        if match is None:
            for start in range(0, len(ANSWER), 8):
                yield TextDelta(ANSWER[start : start + 8])
            yield Finish("end_turn", Usage(input_tokens=8, output_tokens=9))
            return
        chunks, delay, burst = int(match[1]), float(match[2]) / 1000, bool(match[3])
        for _ in range(chunks):
            if not burst:
                await asyncio.sleep(delay)
            yield TextDelta(CHUNK)
        yield Finish("end_turn", Usage(input_tokens=8, output_tokens=chunks * 2))


def bench_message(chunks: int, delay_ms: float = 0.0, *, burst: bool = False) -> str:
    return f"bench chunks={chunks} delay_ms={delay_ms:g}" + (" burst" if burst else "")


# ── serving ──────────────────────────────────────────────────────────────────────────


def _uvicorn(app: Any) -> uvicorn.Server:
    return uvicorn.Server(
        uvicorn.Config(
            app,
            loop="asyncio",
            http="h11",
            ws="none",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )


def _serve_in_child(make_app: Callable[[], Any], sock: socket.socket) -> None:
    """A `--server process` child: build the app here and serve it on the parent's socket."""
    _uvicorn(make_app()).run(sockets=[sock])


class Served:
    """The app `make_app` builds, on a uvicorn server bound to a free 127.0.0.1 port.

    Yields the base URL. `mode`: "task" (in this event loop), "thread" (a thread with its
    own loop) or "process" (a child process: `make_app` must then be picklable).
    """

    def __init__(self, make_app: Callable[[], Any], mode: str) -> None:
        self.mode = mode
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they
        # are TCP; without it Nagle + delayed ACK add ~40 ms to keep-alive responses.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.make_app = make_app
        self.server = _uvicorn(make_app()) if mode != "process" else None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._process: multiprocessing.process.BaseProcess | None = None

    def _alive(self) -> bool:
        if self._process is not None:
            return self._process.is_alive()
        if self._thread is not None:
            return self._thread.is_alive()
        return self._task is not None and not self._task.done()

    async def _answers(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(HOST, self.port)
        except OSError:
            return False
        writer.close()
        return True

    async def __aenter__(self) -> str:
        if self.mode == "process":
            context = multiprocessing.get_context("spawn")
            self._process = context.Process(
                target=_serve_in_child, args=(self.make_app, self.sock), daemon=True
            )
            self._process.start()
            deadline = time.monotonic() + 60
            while not await self._answers():
                if not self._alive() or time.monotonic() > deadline:
                    await self._stop()
                    raise RuntimeError("the uvicorn process did not start (see its log above)")
                await asyncio.sleep(0.05)
            return f"http://{HOST}:{self.port}"
        assert self.server is not None
        serve = self.server.serve(sockets=[self.sock])
        if self.mode == "thread":
            self._thread = threading.Thread(
                target=asyncio.run, args=(serve,), name="uvicorn", daemon=True
            )
            self._thread.start()
        else:
            self._task = asyncio.create_task(serve, name="uvicorn")
        deadline = time.monotonic() + 30
        while not self.server.started:  # task or thread
            if not self._alive() or time.monotonic() > deadline:
                await self._stop()
                raise RuntimeError("uvicorn did not start (see its log above)")
            await asyncio.sleep(0.01)
        return f"http://{HOST}:{self.port}"

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._process is not None:
            self._process.terminate()  # SIGTERM: uvicorn shuts down gracefully
            await asyncio.to_thread(self._process.join, 20)
            if self._process.is_alive():
                self._process.kill()
                print("  note: the uvicorn process did not stop within 20 s; killed")
            self.sock.close()
            return
        assert self.server is not None
        self.server.should_exit = True
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 20)
        elif self._task is not None:
            await asyncio.wait({self._task}, timeout=20)
        if self._alive():
            self.server.force_exit = True
            print("  note: uvicorn did not stop within 20 s; forced", file=sys.stderr)
            await asyncio.sleep(1)
        if self._task is not None and self._task.done() and not self._task.cancelled():
            self._task.result()  # surface a crash of the server task
        self.sock.close()


class FloorBody(BaseModel):
    """The floor's request body: a message like turnkit's, and how many events to send."""

    content: str
    n: int
    suspend: bool = False


def floor_app(payload: str, max_events: int) -> FastAPI:
    """A plain sse-starlette endpoint yielding `n` pre-built events (no turnkit)."""
    prebuilt = [ServerSentEvent(data=payload, id=str(i)) for i in range(1, max_events + 1)]
    app = FastAPI()

    @app.post("/floor/execute")
    async def execute(body: FloorBody) -> EventSourceResponse:
        async def frames() -> AsyncIterator[ServerSentEvent]:
            for event in prebuilt[: body.n]:
                if body.suspend:  # as the streaming model does once per chunk
                    await asyncio.sleep(0)
                yield event

        return EventSourceResponse(
            frames(), headers={"X-Turn-Id": "floor", "Cache-Control": "no-store"}, ping=None
        )

    return app


# ── reading a stream ─────────────────────────────────────────────────────────────────


@dataclass
class Read:
    """What one SSE connection delivered, with client-side timestamps (perf_counter)."""

    t_sent: float
    t_first: float | None = None
    t_end: float | None = None
    status: int = 0
    turn_id: str | None = None
    events: int = 0
    seqs: list[int] = field(default_factory=list[int])
    first_type: str | None = None
    first_age_ms: float | None = None
    """Receipt of the first event minus its `ts` (when the runtime produced it)."""
    last_id: str | None = None
    deltas: list[str] = field(default_factory=list[str])
    answer: str | None = None
    done: bool = False

    @property
    def first_ms(self) -> float:
        assert self.t_first is not None
        return (self.t_first - self.t_sent) * 1000

    @property
    def total_s(self) -> float:
        assert self.t_end is not None
        return self.t_end - self.t_sent


async def read_stream(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
    max_events: int = 100_000,
) -> Read:
    """Read one SSE stream to its end (or `stop_after` events, then drop the connection)."""
    read = Read(t_sent=time.perf_counter())
    async with (
        asyncio.timeout(STREAM_TIMEOUT_S),
        aconnect_sse(client, method, url, json=body, headers=headers or {}) as source,
    ):
        read.status = source.response.status_code
        read.turn_id = source.response.headers.get("x-turn-id")
        if read.status != 200:
            await source.response.aread()
            raise RuntimeError(f"{method} {url} answered {read.status}: {source.response.text}")
        async for sse in source.aiter_sse():
            event = json.loads(sse.data)
            kind = event.get("type")
            if read.t_first is None:
                read.t_first = time.perf_counter()
                read.first_type = kind
                produced = datetime.fromisoformat(event["ts"])
                read.first_age_ms = (datetime.now(UTC) - produced).total_seconds() * 1000
            read.events += 1
            read.last_id = sse.id or None
            if "seq" in event:
                read.seqs.append(event["seq"])
            if kind == "message.delta":
                read.deltas.append(event["text"])
            elif kind == "message.complete":
                read.answer = event["block"]["text"]
            elif kind == "done":
                read.done = True
                read.t_end = time.perf_counter()
            # After `done` the server ends the body: read on to its end, as a browser does
            # and as the floor's client does, so the connection is kept for the next request.
            if read.events >= max_events:
                break
            if stop_after is not None and read.events >= stop_after:
                break
        if read.t_end is None:
            read.t_end = time.perf_counter()
    return read


def check_seqs(read: Read, after: int) -> str | None:
    """None when the durable seqs run after+1, after+2, … to a `done`; else what is wrong."""
    expected = list(range(after + 1, after + 1 + len(read.seqs)))
    if read.seqs != expected:
        return f"seqs {read.seqs[:12]}… after cursor {after}, expected {expected[:12]}…"
    if not read.done:
        return f"the stream ended after {read.events} events without `done`"
    return None


# ── measurements ─────────────────────────────────────────────────────────────────────


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def latency(name: str, values: Sequence[float], **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"metric": name, "n": len(values), **extra}
    if values:
        row |= {
            "p50_ms": statistics.median(values),
            "p99_ms": pct(values, 99),
            "max_ms": max(values),
        }
    return row


@dataclass
class Findings:
    """Check failures of one buffer (reported, never fatal)."""

    problems: list[str] = field(default_factory=list[str])
    counts: dict[str, int] = field(default_factory=dict[str, int])

    def add(self, key: str, detail: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] <= 3:
            self.problems.append(f"{key}: {detail}")


async def first_events(
    client: httpx.AsyncClient,
    floor: httpx.AsyncClient,
    n: int,
    budget_s: float,
    tag: str,
    findings: Findings,
) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """Phase 1: instant-model turns, one at a time, each in a new session.

    Each turn is followed by a request to the floor that sends as many events, so both
    are measured interleaved, under the same conditions.
    """
    events = 0
    for i in range(WARMUP):
        warm = await read_stream(
            client, "POST", f"{API}/sessions/w{tag}-{i}/execute", body={"content": "hi"}
        )
        events = warm.events
        await read_stream(floor, "POST", "/floor/execute", body={"content": "hi", "n": events})
    gc.collect()
    first: list[float] = []
    whole: list[float] = []
    floor_first: list[float] = []
    floor_whole: list[float] = []
    shape: list[tuple[int, int]] = []  # (events, durable events) per turn
    finished: list[tuple[str, int]] = []
    deadline = time.monotonic() + budget_s
    for i in range(n):
        if time.monotonic() > deadline:
            break
        read = await read_stream(
            client, "POST", f"{API}/sessions/s{tag}-{i}/execute", body={"content": "hi"}
        )
        first.append(read.first_ms)
        whole.append(read.total_s * 1000)
        shape.append((read.events, len(read.seqs)))
        base = await read_stream(
            floor, "POST", "/floor/execute", body={"content": "hi", "n": events}
        )
        floor_first.append(base.first_ms)
        floor_whole.append(base.total_s * 1000)
        if (problem := check_seqs(read, 0)) is not None:
            findings.add("execute stream", problem)
        if "".join(read.deltas) != ANSWER:
            findings.add("execute deltas", f"deltas {''.join(read.deltas)!r} != answer {ANSWER!r}")
        if read.turn_id and read.seqs:
            finished.append((read.turn_id, read.seqs[-1]))
    return (
        [
            latency(
                FIRST,
                first,
                model="instant",
                requested=n,
                events_per_turn=statistics.median_low([e for e, _ in shape] or [0]),
                durable_per_turn=statistics.median_low([d for _, d in shape] or [0]),
                floor_p50_ms=statistics.median(floor_first) if floor_first else None,
            ),
            latency(
                DONE,
                whole,
                model="instant",
                requested=n,
                floor_p50_ms=statistics.median(floor_whole) if floor_whole else None,
            ),
        ],
        finished,
    )


async def resume_finished(
    client: httpx.AsyncClient,
    turns: list[tuple[str, int]],
    n: int,
    budget_s: float,
    findings: Findings,
) -> dict[str, Any]:
    """Phase 2a: reconnect to finished turns with a cursor in the middle."""
    samples: list[float] = []
    deadline = time.monotonic() + budget_s
    for i in range(min(n, len(turns) * 3) if turns else 0):
        if time.monotonic() > deadline:
            break
        turn_id, last_seq = turns[i % len(turns)]
        cursor = last_seq // 2
        read = await read_stream(
            client, "GET", f"{API}/turns/{turn_id}/stream", headers={"Last-Event-ID": str(cursor)}
        )
        samples.append(read.first_ms)
        if (problem := check_seqs(read, cursor)) is not None:
            findings.add("resume finished", problem)
    return latency(RESUME_DONE, samples, cursor="last_seq // 2", requested=n)


async def resume_live(
    client: httpx.AsyncClient, n: int, budget_s: float, tag: str, findings: Findings
) -> dict[str, Any]:
    """Phase 2b: drop a live turn's stream after a few events, reconnect with the last id."""
    samples: list[float] = []
    ages: list[float] = []
    first_kinds: dict[str, int] = {}
    rng = random.Random(20260101)
    deadline = time.monotonic() + budget_s
    for i in range(n):
        if time.monotonic() > deadline:
            break
        head = await read_stream(
            client,
            "POST",
            f"{API}/sessions/l{tag}-{i}/execute",
            body={"content": bench_message(LIVE_CHUNKS, LIVE_DELAY_MS)},
            stop_after=LIVE_DROP_AFTER,
        )
        assert head.turn_id is not None
        if head.done or head.last_id is None:
            findings.add("live head", f"turn ended or carried no id after {head.events} events")
            continue
        verify = i < VERIFY_LIVE
        await asyncio.sleep(rng.uniform(0, LIVE_DELAY_MS / 1000))  # a random chunk phase
        tail = await read_stream(
            client,
            "GET",
            f"{API}/turns/{head.turn_id}/stream",
            headers={"Last-Event-ID": head.last_id},
            stop_after=None if verify else 1,
        )
        samples.append(tail.first_ms)
        if tail.first_age_ms is not None:
            ages.append(tail.first_age_ms)
        kind = tail.first_type or "?"
        first_kinds[kind] = first_kinds.get(kind, 0) + 1
        if verify:
            if (problem := check_seqs(tail, int(head.last_id))) is not None:
                findings.add("resume live", problem)
            expected = CHUNK * LIVE_CHUNKS
            if tail.answer != expected:
                findings.add("resume live answer", f"answer of {len(tail.answer or '')} chars")
        else:
            cancel = await client.post(f"{API}/turns/{head.turn_id}/cancel")
            if cancel.status_code != 200:
                findings.add("cancel", f"{cancel.status_code} {cancel.text[:200]}")
    return latency(
        RESUME_LIVE,
        samples,
        model=f"{LIVE_CHUNKS} chunks, {LIVE_DELAY_MS:g} ms apart",
        dropped_after_events=LIVE_DROP_AFTER,
        first_event_types=first_kinds,
        requested=n,
        first_event_age=_spread(ages),
    )


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p99 of event ages (receipt − the event's `ts`), in ms."""
    return {"p50_ms": statistics.median(values), "p99_ms": pct(values, 99)} if values else None


async def throughput(
    metric: str,
    client: httpx.AsyncClient,
    url: Callable[[int], str],
    body: Callable[[], dict[str, Any]],
    events: int,
    reps: int,
    budget_s: float,
    findings: Findings | None,
) -> dict[str, Any]:
    """Phase 3: events/s of one stream, POST sent → last event received."""
    rates: list[float] = []
    counts: list[int] = []
    deadline = time.monotonic() + budget_s
    for rep in range(reps):
        if rep and time.monotonic() > deadline:
            break
        gc.collect()
        read = await read_stream(client, "POST", url(rep), body=body(), max_events=events + 1000)
        rates.append(read.events / read.total_s)
        counts.append(read.events)
        if findings is not None:
            if (problem := check_seqs(read, 0)) is not None:
                findings.add(f"{metric}: stream", problem)
            got = "".join(read.deltas)
            if got != CHUNK * events:
                findings.add(
                    f"{metric}: deltas",
                    f"{len(read.deltas)} of {events} deltas arrived "
                    f"({len(got)} of {len(CHUNK) * events} chars)",
                )
    return {
        "metric": metric,
        "n": len(rates),
        "rate_eps": statistics.median(rates) if rates else None,
        "rate_eps_all": rates,
        "events_received": counts,
        "chunks": events,
    }


def turnkit_app(database: Path, redis_prefix: str | None) -> Any:
    """The quickstart app on the bench model, with Redis's buffer if a prefix is given."""
    replay: ReplayBuffer = InMemoryReplayBuffer()
    if redis_prefix is not None:
        from turnkit.replay.redis import RedisReplayBuffer

        replay = RedisReplayBuffer.from_url(REDIS_URL, prefix=redis_prefix)
    agent = Agent(model=BenchModel(), skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{database}")
    return create_app(SessionRuntime(agent=agent, config=config, replay=replay))


async def bench_turnkit(
    name: str,
    redis_prefix: str | None,
    args: argparse.Namespace,
    tmp: Path,
    budget_s: float,
) -> dict[str, Any]:
    make_app = functools.partial(turnkit_app, tmp / f"{name}.db", redis_prefix)
    make_floor = functools.partial(floor_app, floor_payload(), FIRST_FLOOR_EVENTS)
    findings = Findings()
    tag = uuid.uuid4().hex[:8]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    async with (
        Served(make_app, args.server) as base,
        Served(make_floor, args.server) as floor_base,
        httpx.AsyncClient(base_url=base, timeout=STREAM_TIMEOUT_S) as client,
        httpx.AsyncClient(base_url=floor_base, timeout=STREAM_TIMEOUT_S) as floor,
    ):
        first, finished = await first_events(
            client, floor, args.turns, budget_s * 0.3, tag, findings
        )
        rows += first
        rows.append(await resume_finished(client, finished, args.turns, budget_s * 0.1, findings))
        rows.append(await resume_live(client, args.turns, budget_s * 0.25, tag, findings))
        for metric, burst in ((RATE_STREAM, False), (RATE_BURST, True)):
            row = await throughput(
                metric,
                client,
                functools.partial(_bulk_url, tag, burst),
                functools.partial(_bulk_body, args.events, burst),
                args.events,
                args.reps,
                budget_s * 0.15,
                findings,
            )
            floor_metric = RATE_FLOOR if burst else RATE_FLOOR_SUSPENDING
            rows.append(row | {"floor_metric": floor_metric})
    return {
        "buffer": name,
        "rows": rows,
        "wall_s": time.monotonic() - started,
        "check_failures": findings.counts,
        "problems": findings.problems,
    }


def _bulk_url(tag: str, burst: bool, rep: int) -> str:
    return f"{API}/sessions/b{tag}-{int(burst)}-{rep}/execute"


def _bulk_body(events: int, burst: bool) -> dict[str, Any]:
    return {"content": bench_message(events, burst=burst)}


def _floor_url(rep: int) -> str:
    return "/floor/execute"


def _floor_body(events: int, suspend: bool) -> dict[str, Any]:
    return {"content": "hi", "n": events, "suspend": suspend}


FIRST_FLOOR_EVENTS = 1000
"""Enough for an instant turn's events (the floor beside phase 1 sends as many)."""


def floor_payload() -> str:
    """The floor's event: a `message.delta` of the bulk turns' size."""
    sample = MessageDeltaEvent(
        session_id="s-floor-000000",
        turn_id=f"turn_{uuid.uuid4()}",
        stage_id="synthesize",
        ts=datetime.now(UTC),
        block_id=f"blk_{uuid.uuid4()}",
        text=CHUNK,
    )
    return encode_event(sample).decode()


async def bench_floor(
    args: argparse.Namespace, instant_events: int, durable_events: int, budget_s: float
) -> dict[str, Any]:
    payload = floor_payload()
    bulk = args.events + durable_events  # a bulk turn also sends turn.started … done
    make_app = functools.partial(floor_app, payload, max(bulk, instant_events))
    started = time.monotonic()
    async with (
        Served(make_app, args.server) as base,
        httpx.AsyncClient(base_url=base, timeout=STREAM_TIMEOUT_S) as client,
    ):
        body = {"content": "hi", "n": instant_events}
        for _ in range(WARMUP):
            await read_stream(client, "POST", "/floor/execute", body=body)
        gc.collect()
        first: list[float] = []
        whole: list[float] = []
        deadline = time.monotonic() + budget_s * 0.5
        for _ in range(args.turns):
            if time.monotonic() > deadline:
                break
            read = await read_stream(client, "POST", "/floor/execute", body=body)
            first.append(read.first_ms)
            whole.append(read.total_s * 1000)
        rows = [
            latency(FIRST, first, events=instant_events, requested=args.turns),
            latency(DONE, whole, events=instant_events, requested=args.turns),
        ]
        for metric, suspend in ((RATE_FLOOR, False), (RATE_FLOOR_SUSPENDING, True)):
            rows.append(
                await throughput(
                    metric,
                    client,
                    _floor_url,
                    functools.partial(_floor_body, bulk, suspend),
                    bulk,
                    args.reps,
                    budget_s * 0.25,
                    None,
                )
            )
    return {
        "buffer": "floor",
        "rows": rows,
        "wall_s": time.monotonic() - started,
        "check_failures": {},
        "problems": [],
    }


# ── Redis ────────────────────────────────────────────────────────────────────────────


def redis_available() -> str | None:
    """None when Redis answers PING at `REDIS_URL`, else why not."""
    try:
        import redis
    except ImportError:
        return "the redis package is not installed"
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Redis on {REDIS_URL} ({type(exc).__name__}: {exc})"
    return None


def redis_cleanup(prefix: str) -> int:
    """Delete every key under `prefix:`; returns how many keys are left afterwards."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=5)
    try:
        for _ in range(10):  # bounded: each pass deletes what one full SCAN finds
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if not keys:
                return 0
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        return len(list(client.scan_iter(match=f"{prefix}:*", count=1000)))
    finally:
        client.close()


# ── report ───────────────────────────────────────────────────────────────────────────


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    floor = {r["metric"]: r for r in results[0]["rows"]}
    print(
        f"\nSSE latency over loopback — Python {platform.python_version()} on "
        f"{os.cpu_count()} cores, uvicorn (h11) in a {args.server}, "
        f"{args.turns} turns, {args.events} chunks\n"
    )
    print(f"{'metric':36} {'buffer':7} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'events/s':>10} "
          f"{'× floor':>8}")  # fmt: skip
    for metric in METRICS:
        for result in results:
            row = next((r for r in result["rows"] if r["metric"] == metric), None)
            if row is None:
                continue
            p50 = f"{row['p50_ms']:9.2f}" if "p50_ms" in row else f"{'':9}"
            p99 = f"{row['p99_ms']:9.2f}" if "p99_ms" in row else f"{'':9}"
            rate = f"{row['rate_eps']:10,.0f}" if row.get("rate_eps") else f"{'':10}"
            base = floor.get(row.get("floor_metric", metric)) if result is not results[0] else None
            ratio = _x_floor(row, base)
            print(f"{metric:36} {result['buffer']:7} {row['n']:5} {p50} {p99} {rate} {ratio:>8}")
    print(
        "\n× floor: p50 / floor p50 (first event and whole turn: against floor requests "
        "interleaved with the turns), or floor rate / rate (higher = slower). The floor is "
        "sse-starlette alone: no Store, no buffer, no resume. Streaming model: suspends "
        "once per chunk, against the floor suspending once per event; burst model: never "
        "suspends, against the floor that never suspends."
    )
    delivery = ", ".join(
        f"{r['buffer']} p50 {row['first_event_age']['p50_ms']:.2f} / p99 "
        f"{row['first_event_age']['p99_ms']:.2f} ms"
        for r in results
        for row in r["rows"]
        if row["metric"].startswith("resume live") and row.get("first_event_age")
    )
    print(
        f"live resume: the model streams a chunk every {LIVE_DELAY_MS:g} ms and reconnects "
        f"land at random phases, so ~{LIVE_DELAY_MS / 2:g} ms of the p50 is waiting for the "
        f"next chunk; that event's delivery alone (its ts → received): {delivery or 'n/a'}."
    )
    for result in results[1:]:
        if result["check_failures"]:
            print(f"\nCHECK FAILURES ({result['buffer']}): {result['check_failures']}")
            for problem in result["problems"]:
                print(f"  {problem}")


def _x_floor(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    """p50 / floor p50, or floor rate / rate: how many times slower than the floor."""
    if base is None:
        return ""
    if row.get("p50_ms") and row.get("floor_p50_ms"):  # measured interleaved with it
        row["x_floor"] = row["p50_ms"] / row["floor_p50_ms"]
    elif row.get("p50_ms") and base.get("p50_ms"):
        row["x_floor"] = row["p50_ms"] / base["p50_ms"]
    elif row.get("rate_eps") and base.get("rate_eps"):
        row["x_floor"] = base["rate_eps"] / row["rate_eps"]
    else:
        return ""
    return f"{row['x_floor']:.1f}"


# ── main ─────────────────────────────────────────────────────────────────────────────


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200, help="samples per latency metric")
    parser.add_argument("--events", type=int, default=5000, help="chunks of the bulk turn")
    parser.add_argument("--reps", type=int, default=5, help="bulk streams per buffer")
    parser.add_argument("--server", choices=("task", "thread", "process"), default="task")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis buffer")
    parser.add_argument(
        "--budget", type=float, default=150.0, help="seconds for all phases (caps sample counts)"
    )
    default_json = Path(__file__).parent / "results" / "sse_latency.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()
    if args.turns < 1 or args.events < 1 or args.reps < 1:
        parser.error("--turns, --events and --reps must be at least 1")

    buffers: list[tuple[str, str | None]] = [("memory", None)]  # (name, Redis key prefix)
    prefix = f"turnkit-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    redis_note = "skipped (--no-redis)" if args.no_redis else redis_available()
    if redis_note is None:
        buffers.append(("redis", prefix))
        redis_note = f"{REDIS_URL}, prefix {prefix}"
    else:
        print(f"note: Redis buffer skipped — {redis_note}")

    share = args.budget / (len(buffers) + 0.4)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="turnkit-sse-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            for name, redis_prefix in buffers:
                print(f"running {name} buffer …", flush=True)
                results.append(await bench_turnkit(name, redis_prefix, args, tmp, share))
        finally:
            if any(name == "redis" for name, _ in buffers):
                left = redis_cleanup(prefix)
                if left:
                    print(f"warning: {left} Redis keys under {prefix}: were left", file=sys.stderr)
        # The floor sends as many events as turnkit did: an instant turn's, and the bulk
        # turn's chunks plus its durable events (turn.started … done).
        shape = results[0]["rows"][0]
        instant_events = max(1, shape["events_per_turn"])
        durable_events = shape["durable_per_turn"]
        print("running floor …", flush=True)
        results.insert(0, await bench_floor(args, instant_events, durable_events, share * 0.4))

    report(results, args)
    _write(Path(args.json), results, args, redis_note, instant_events)
    print(f"\nwrote {args.json}")


def _write(
    out: Path,
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    redis_note: str,
    instant_events: int,
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "server": f"uvicorn (h11, asyncio loop) in a {args.server}, {HOST}",
        "redis": redis_note,
        "floor_events_per_instant_turn": instant_events,
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    with _procs.stopped_at_end():  # its uvicorn child (daemonic) is stopped at exit
        asyncio.run(main())
