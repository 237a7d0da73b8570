"""Client-side CPU of streaming one OpenAI-compatible chat completion, per call and per chunk.

A small OpenAI-compatible server runs in a **subprocess** on 127.0.0.1 (plain asyncio,
HTTP/1.1 keep-alive, chunked `text/event-stream`, every event its own write). The model
name says how many content chunks to stream (`bench-50`); each stream ends with a finish
chunk, a usage chunk and `[DONE]`, as OpenAI's does with `stream_options.include_usage`.
The benchmark's process is the client alone, so `time.process_time()` counts only the
client's CPU. By default the events go out back to back, so one read often carries
several (the cost of parsing and translating chunks); `--gap-ms 1` paces them so that
each arrives in its own read, as from a real provider, which adds an event-loop wake-up
and a socket read per chunk to every contender.

Contenders, each consuming the whole stream and checking the text it got:

1. turnkit `LiteLLMClient`, default transport (the direct path for `openai/...` models);
2. turnkit `LiteLLMClient(transport="litellm")`;
3. `litellm.acompletion` alone (what the litellm transport costs without turnkit);
4. the openai SDK (`AsyncOpenAI().chat.completions.create(stream=True)`);
5. raw httpx: `AsyncClient.stream` + `aiter_lines` + `json.loads` of every `data:` line.

Interleaved: each of `--rounds` rounds runs `--calls` pairs of a short (`--short` chunks)
and a long (`--long` chunks) stream per contender, the contenders in a rotating order. Per
round, CPU per call is the long stream's, and CPU per extra chunk is (long - short) /
(long chunks - short chunks). Ratios against the openai SDK are taken round by round; the
table shows their median and min–max.

Run:  .venv/bin/python benchmarks/model_transport.py [--rounds 10] [--calls 20] [--json PATH]
Prints a table and writes JSON (default benchmarks/results/model_transport.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import _procs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HOST = "127.0.0.1"
PIECE = " token"
SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = "Write a few words about streaming."

# ── the server (subprocess) ─────────────────────────────────────────────────────────


def _event(payload: dict[str, Any]) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def _stream_events(model: str, chunks: int) -> list[bytes]:
    usage = {
        "prompt_tokens": 25,
        "completion_tokens": chunks,
        "total_tokens": 25 + chunks,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    events = [_event(_chunk(model, {"role": "assistant", "content": "", "refusal": None}))]
    events += [_event(_chunk(model, {"content": PIECE})) for _ in range(chunks)]
    events.append(_event(_chunk(model, {}, "stop")))
    events.append(_event({**_chunk(model, {}), "choices": [], "usage": usage}))
    events.append(b"e\r\ndata: [DONE]\n\n\r\n")
    events.append(b"0\r\n\r\n")
    return events


async def _serve(port: int, gap_s: float) -> None:
    cache: dict[str, list[bytes]] = {}
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in raw.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = json.loads(await reader.readexactly(length))
                model = str(body["model"])
                events = cache.get(model)
                if events is None:
                    events = cache[model] = _stream_events(model, int(model.rsplit("-", 1)[1]))
                writer.write(head)
                for event in events:
                    writer.write(event)
                    await writer.drain()
                    if gap_s:
                        await asyncio.sleep(gap_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, HOST, port)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _start_server(gap_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = _procs.start([sys.executable, __file__, "--serve", str(port), "--gap-ms",
                            str(gap_ms)])  # fmt: skip
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection((HOST, port), timeout=0.2).close()
                return process, f"http://{HOST}:{port}/v1"
            except OSError:
                time.sleep(0.05)
    except BaseException:
        _procs.stop([process])
        raise
    _procs.stop([process])
    raise RuntimeError("the benchmark server did not start")


# ── contenders ──────────────────────────────────────────────────────────────────────

Call = Callable[[int], Awaitable[str]]
"""Stream `bench-<chunks>` to its end and return the text received."""


def _messages() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def turnkit_call(base: str, transport: str) -> Call:
    from turnkit.models import ModelMessage, ModelRequest, TextDelta
    from turnkit.models.litellm import LiteLLMClient

    request = ModelRequest(
        messages=(
            ModelMessage(role="system", content=SYSTEM),
            ModelMessage(role="user", content=QUESTION),
        )
    )
    clients: dict[int, LiteLLMClient] = {}

    async def call(chunks: int) -> str:
        client = clients.get(chunks)
        if client is None:
            client = clients[chunks] = LiteLLMClient(
                f"openai/bench-{chunks}",
                api_base=base,
                api_key="sk-bench",
                transport=transport,  # type: ignore[arg-type]
            )
        text = []
        async for piece in client.stream(request):
            if isinstance(piece, TextDelta):
                text.append(piece.text)
        return "".join(text)

    return call


def litellm_call(base: str) -> Call:
    from turnkit.models._loader import load_litellm

    litellm = load_litellm()

    async def call(chunks: int) -> str:
        response = await litellm.acompletion(
            model=f"openai/bench-{chunks}",
            messages=_messages(),
            api_base=base,
            api_key="sk-bench",
            stream=True,
            stream_options={"include_usage": True},
        )
        text = []
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return "".join(text)

    return call


def openai_call(base: str) -> Call:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

    client = AsyncOpenAI(base_url=base, api_key="sk-bench", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]  # `_messages()`, as the SDK types them

    async def call(chunks: int) -> str:
        stream = await client.chat.completions.create(
            model=f"bench-{chunks}",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return "".join(text)

    return call


def httpx_call(base: str) -> Call:
    import httpx

    client = httpx.AsyncClient(timeout=60)
    headers = {"authorization": "Bearer sk-bench"}

    async def call(chunks: int) -> str:
        body = {
            "model": f"bench-{chunks}",
            "messages": _messages(),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text = []
        async with client.stream(
            "POST", f"{base}/chat/completions", json=body, headers=headers
        ) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    text.append(choices[0]["delta"]["content"])
        return "".join(text)

    return call


# ── measurement ─────────────────────────────────────────────────────────────────────


@dataclass
class Rounds:
    name: str
    call_cpu_ms: list[float] = field(default_factory=list)
    """Per round: CPU per long call."""
    short_cpu_ms: list[float] = field(default_factory=list)
    chunk_cpu_us: list[float] = field(default_factory=list)
    """Per round: CPU per extra chunk."""
    wall_ms: list[float] = field(default_factory=list)
    """Per round: wall time per long call."""


async def _timed(call: Call, chunks: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    text = await call(chunks)
    if text != PIECE * chunks:
        raise AssertionError(f"got {len(text)} characters, expected {len(PIECE * chunks)}")
    return time.process_time() - cpu, time.perf_counter() - wall


async def _batch(call: Call, short: int, long: int, calls: int) -> tuple[float, float, float]:
    """Mean CPU of a short and of a long call, and wall of a long one, taken in pairs.

    Short and long calls alternate, so a burst of other work on the machine lands on both
    and cancels out of their difference, the per-chunk cost.
    """
    gc.collect()
    short_cpu = long_cpu = long_wall = 0.0
    for _ in range(calls):
        short_cpu += (await _timed(call, short))[0]
        cpu, wall = await _timed(call, long)
        long_cpu, long_wall = long_cpu + cpu, long_wall + wall
    return short_cpu / calls, long_cpu / calls, long_wall / calls


async def measure(
    contenders: list[tuple[str, Call]], rounds: int, calls: int, short: int, long: int
) -> list[Rounds]:
    results = [Rounds(name) for name, _ in contenders]
    for _, call in contenders:  # warm up: imports, pools, first-call caches
        await _batch(call, short, long, 3)
    for r in range(rounds):
        order = list(range(len(contenders)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            short_cpu, long_cpu, long_wall = await _batch(contenders[i][1], short, long, calls)
            row = results[i]
            row.short_cpu_ms.append(short_cpu * 1e3)
            row.call_cpu_ms.append(long_cpu * 1e3)
            row.wall_ms.append(long_wall * 1e3)
            row.chunk_cpu_us.append((long_cpu - short_cpu) / (long - short) * 1e6)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return results


def _ratios(mine: list[float], peer: list[float]) -> dict[str, float]:
    per_round = [a / b for a, b in zip(mine, peer, strict=True)]
    return {
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=40, help="calls per batch")
    parser.add_argument("--short", type=int, default=2, help="content chunks, short stream")
    parser.add_argument("--long", type=int, default=50, help="content chunks, long stream")
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="server pause after each event (0: burst)"
    )
    default_json = Path(__file__).parent / "results" / "model_transport.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()

    versions = {name: metadata.version(name) for name in ("litellm", "openai", "httpx")}
    process, base = _start_server(args.gap_ms)
    try:
        contenders: list[tuple[str, Call]] = [
            ("turnkit LiteLLMClient (direct transport)", turnkit_call(base, "auto")),
            ("turnkit LiteLLMClient (transport='litellm')", turnkit_call(base, "litellm")),
            ("litellm.acompletion alone", litellm_call(base)),
            ("openai SDK AsyncOpenAI", openai_call(base)),
            ("raw httpx + json.loads", httpx_call(base)),
        ]
        results = await measure(contenders, args.rounds, args.calls, args.short, args.long)
    finally:
        _procs.stop([process], timeout=10)

    sdk = next(r for r in results if r.name.startswith("openai SDK"))
    rows: list[dict[str, Any]] = []
    for r in results:
        rows.append(
            {
                "name": r.name,
                "cpu_ms_per_call": statistics.median(r.call_cpu_ms),
                "cpu_ms_per_short_call": statistics.median(r.short_cpu_ms),
                "cpu_us_per_extra_chunk": statistics.median(r.chunk_cpu_us),
                "wall_ms_per_call": statistics.median(r.wall_ms),
                "x_openai_sdk_per_chunk": _ratios(r.chunk_cpu_us, sdk.chunk_cpu_us),
                "x_openai_sdk_per_call": _ratios(r.call_cpu_ms, sdk.call_cpu_ms),
                "rounds": {
                    "cpu_ms_per_call": r.call_cpu_ms,
                    "cpu_ms_per_short_call": r.short_cpu_ms,
                    "cpu_us_per_extra_chunk": r.chunk_cpu_us,
                    "wall_ms_per_call": r.wall_ms,
                },
            }
        )

    print(
        f"\nmodel transport: Python {platform.python_version()}, {os.cpu_count()} cores, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; {args.rounds} rounds x {args.calls} calls of {args.short} and {args.long} "
        f"chunks, server gap {args.gap_ms} ms\n"
    )
    header = (
        f"{'contender':44} {'CPU ms/call':>11} {'µs/chunk':>9} {'× SDK /chunk (min–max)':>23} "
        f"{'× SDK /call (min–max)':>22}"
    )
    print(header)
    for row in rows:
        chunk, call = row["x_openai_sdk_per_chunk"], row["x_openai_sdk_per_call"]
        print(
            f"{row['name']:44} {row['cpu_ms_per_call']:11.2f} "
            f"{row['cpu_us_per_extra_chunk']:9.1f} "
            f"{chunk['median']:8.2f} ({chunk['min']:.2f}–{chunk['max']:.2f})    "
            f"{call['median']:8.2f} ({call['min']:.2f}–{call['max']:.2f})"
        )
    _write(Path(args.json), vars(args), versions, rows)
    print(f"\nwrote {args.json}")


def _write(
    out: Path, args: dict[str, Any], versions: dict[str, str], rows: list[dict[str, Any]]
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version,
        "cores": os.cpu_count(),
        "ts": datetime.now(UTC).isoformat(),
        "versions": versions,
        "args": args,
        "results": rows,
    }
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        gap = float(sys.argv[sys.argv.index("--gap-ms") + 1]) / 1e3 if "--gap-ms" in sys.argv else 0
        asyncio.run(_serve(int(sys.argv[2]), gap))
    else:
        with _procs.stopped_at_end():
            asyncio.run(main())
