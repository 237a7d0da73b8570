"""Model calls, tokens and cache-eligible prompt prefix per turn: turnkit vs PydanticAI vs
the OpenAI Agents SDK on one scripted 3-turn conversation, against one fake server.

The server (OpenAI-compatible chat completions on 127.0.0.1, streaming and not) decides each
reply from the request, not from a FIFO, so frameworks may make as many calls as they like.
Instructions: "You are a concise assistant. Use the add tool for arithmetic."; turns:
"What is 1 + 2?" -> add(a=1, b=2), then "1 + 2 = 3."; "Thanks!" -> "You are welcome.";
"And 3 + 4?" -> add(a=3, b=4), then "3 + 4 = 7.". Conversations continue idiomatically:
turnkit, `execute_message` three times on one session (SQLite in a temp dir); PydanticAI,
`agent.run(text, message_history=previous.all_messages())`; the Agents SDK, `Runner.run(
agent, previous.to_input_list() + [{"role": "user", "content": text}])` (its documented
manual conversation management; tracing off). Peers' OpenAI clients have `max_retries=0`.

Counting, the same for every request: the canonical prompt is the `tools` block, then each
message (JSON, sort_keys); input tokens = the sum of their tiktoken o200k_base counts
(litellm's bundled offline encodings; the JSON names the counter). A request's
cache-eligible prefix = the tokens of the segments it shares from the start with the
previous request of the same conversation (across turns; 0 for the first); a turn's prefix
share = its prefix tokens / its input tokens. Output tokens = the assistant text + tool-call
arguments the server sent. Other request fields (tool_choice, stream...) are not counted.
"uncached" = input - prefix tokens; "breaks" counts requests that do not start with the
whole previous request (the first differing message is printed).

Run:  .venv/bin/python benchmarks/agent_loop_tokens.py [--json PATH]
Prints a table and writes JSON (default benchmarks/results/agent_loop_tokens.json).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_LITELLM = importlib.util.find_spec("litellm")
if _LITELLM and _LITELLM.submodule_search_locations:  # litellm's offline tiktoken files
    _dir = Path(next(iter(_LITELLM.submodule_search_locations)), "litellm_core_utils/tokenizers")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_dir))

SYSTEM = "You are a concise assistant. Use the add tool for arithmetic."
TURNS = [
    ("What is 1 + 2?", "1 + 2 = 3."),
    ("Thanks!", "You are welcome."),
    ("And 3 + 4?", "3 + 4 = 7."),
]
PACKAGES = ("turnkit", "litellm", "pydantic-ai-slim", "openai-agents", "openai", "tiktoken")
Json = dict[str, Any]


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


def _counter() -> tuple[str, Callable[[str], int]]:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")
        return "tiktoken o200k_base", lambda s: len(enc.encode(s, disallowed_special=()))
    except Exception:
        pass
    try:
        import litellm

        litellm.token_counter(text="probe")
        return "litellm.token_counter", lambda s: int(litellm.token_counter(text=s))
    except Exception:
        return "len(utf-8 bytes)/4", lambda s: (len(s.encode()) + 3) // 4


COUNTER, count_tokens = _counter()


class FakeServer:
    """`POST /v1/chat/completions` on 127.0.0.1; replies from the request, records bodies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[Json] = []
        self.tag: tuple[str, int] = ("", 0)
        self._ids = itertools.count(1)
        paths = ("/v1/chat/completions", "/chat/completions")
        routes = [Route(p, self._chat, methods=["POST"]) for p in paths]
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        cfg = uvicorn.Config(Starlette(routes=routes), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, args=([self._sock],), daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        for _ in range(1000):  # at most 10 s
            if self._server.started:
                return self
            time.sleep(0.01)
        raise RuntimeError("fake server did not start")

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def _reply(self, messages: list[Json], turn: int) -> tuple[str, Json | None]:
        users = [str(m.get("content")) for m in messages if m.get("role") == "user"]
        question = users[-1] if users else ""
        if messages and messages[-1].get("role") == "tool":
            return TURNS[turn][1], None
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        if "+" in question and len(numbers) >= 2:
            args = json.dumps({"a": numbers[0], "b": numbers[1]})
            function = {"name": "add", "arguments": args}
            return "", {"id": f"call_{next(self._ids)}", "type": "function", "function": function}
        return "You are welcome.", None

    async def _chat(self, request: Request) -> Response:
        body: Json = await request.json()
        with self.lock:
            framework, turn = self.tag
            text, call = self._reply(list(body.get("messages") or []), turn)
            out = text + (call["function"]["arguments"] if call else "")
            record = {"framework": framework, "turn": turn, "body": body, "out": out}
            self.records.append(record)
        model, created = body.get("model", "fake"), int(time.time())
        base = {"id": f"chatcmpl-{len(self.records)}", "created": created, "model": model}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        finish = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message: Json = {"role": "assistant", "content": text or None}
            if call:
                message["tool_calls"] = [call]
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            whole = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return JSONResponse(whole)
        with_usage = (body.get("stream_options") or {}).get("include_usage")
        stream = self._sse(base, text, call, finish, usage if with_usage else None)
        return StreamingResponse(stream, media_type="text/event-stream")

    @staticmethod
    async def _sse(
        base: Json, text: str, call: Json | None, finish: str, usage: Json | None
    ) -> AsyncIterator[bytes]:
        def chunk(delta: Json | None, reason: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            choices = [] if delta is None else [choice]
            body = {**base, "object": "chat.completion.chunk", "choices": choices, **extra}
            return f"data: {json.dumps(body)}\n\n".encode()

        if call:
            head = {**call, "index": 0, "function": {"name": "add", "arguments": ""}}
            yield chunk({"role": "assistant", "content": None, "tool_calls": [head]})
            args = call["function"]["arguments"]
            for i in range(0, len(args), 6):
                piece = {"index": 0, "function": {"arguments": args[i : i + 6]}}
                yield chunk({"tool_calls": [piece]})
        else:
            yield chunk({"role": "assistant", "content": ""})
            for i in range(0, len(text), 5):
                yield chunk({"content": text[i : i + 5]})
        yield chunk({}, finish)
        if usage is not None:
            yield chunk(None, usage=usage)
        yield b"data: [DONE]\n\n"


Runner = Callable[[FakeServer], Awaitable[list[str]]]


async def run_turnkit(server: FakeServer) -> list[str]:
    from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
    from turnkit.models.litellm import LiteLLMClient

    model = LiteLLMClient("openai/fake", api_base=server.base_url, api_key="sk-bench")
    agent = Agent(instructions=SYSTEM, model=model, tools=[tool(add)])
    with tempfile.TemporaryDirectory() as tmp:
        config = RuntimeConfig(database_url=f"sqlite:///{tmp}/b.db")
        async with SessionRuntime(agent=agent, config=config) as runtime:
            for turn, (text, _) in enumerate(TURNS):
                server.tag = ("turnkit", turn)
                async for _event in runtime.execute_message("s1", text):
                    pass
            return [t.answer or "" for t in await runtime.history("s1")]


async def run_pydantic_ai(server: FakeServer) -> list[str]:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-bench", max_retries=0)
    model = OpenAIChatModel("fake", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, instructions=SYSTEM, tools=[add])
    answers: list[str] = []
    history: list[Any] | None = None
    for turn, (text, _) in enumerate(TURNS):
        server.tag = ("pydantic-ai", turn)
        result = await agent.run(text, message_history=history)
        history = result.all_messages()
        answers.append(str(result.output))
    return answers


async def run_openai_agents(server: FakeServer) -> list[str]:
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-bench", max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="fake", openai_client=client)
    tools: list[agents.Tool] = [agents.function_tool(add)]
    agent = agents.Agent(name="assistant", instructions=SYSTEM, model=model, tools=tools)
    answers: list[str] = []
    items: list[Any] = []
    for turn, (text, _) in enumerate(TURNS):
        server.tag = ("openai-agents", turn)
        result = await agents.Runner.run(agent, [*items, {"role": "user", "content": text}])
        items = result.to_input_list()
        answers.append(str(result.final_output))
    return answers


def segments(body: Json) -> list[str]:
    """The canonical prompt: the tools block, then each message (JSON, sort_keys)."""
    tools = json.dumps(body["tools"], sort_keys=True) if body.get("tools") else ""
    return [tools, *(json.dumps(m, sort_keys=True) for m in body.get("messages") or [])]


def measure(records: list[Json]) -> tuple[list[Json], list[Json]]:
    """Per turn plus a total, and per request. A request that does not start with the whole
    previous request is a prefix break; `diverged` shows the first segment that differs."""
    keys = ("calls", "input_tokens", "output_tokens", "prefix_tokens", "breaks")
    rows: list[Json] = [dict.fromkeys(keys, 0) for _ in range(len(TURNS) + 1)]
    requests: list[Json] = []
    previous: list[str] = []
    for record in records:
        current = segments(record["body"])
        pairs = enumerate(zip(previous, current, strict=False))
        same = next((i for i, (a, b) in pairs if a != b), min(len(previous), len(current)))
        sizes = [count_tokens(seg) for seg in current]
        request = {"turn": record["turn"] + 1, "input_tokens": sum(sizes)}
        request |= {"output_tokens": count_tokens(record["out"]), "diverged": None}
        request |= {"prefix_tokens": sum(sizes[:same]), "appended": len(current) - same}
        if previous and same < len(previous):
            after = current[same] if same < len(current) else None
            request["diverged"] = {"segment": same, "before": previous[same], "after": after}
        requests.append(request)
        previous = current
        for row in (rows[record["turn"]], rows[-1]):
            row["calls"] += 1
            row["breaks"] += request["diverged"] is not None
            for key in ("input_tokens", "output_tokens", "prefix_tokens"):
                row[key] += request[key]
    for row in rows:
        row["prefix_share"] = row["prefix_tokens"] / row["input_tokens"] if row["calls"] else 0.0
    return rows, requests


async def bench(server: FakeServer) -> dict[str, Json]:
    runners: list[Runner] = [run_turnkit, run_pydantic_ai, run_openai_agents]
    results: dict[str, Json] = {}
    for name, runner in zip(("turnkit", "pydantic-ai", "openai-agents"), runners, strict=True):
        try:
            answers = await asyncio.wait_for(runner(server), timeout=120)
        except ImportError as exc:  # a peer not installed; any other failure is a crash
            results[name] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
            continue
        with server.lock:
            mine = [r for r in server.records if r["framework"] == name]
        turns, requests = measure(mine)
        ok = answers == [answer for _, answer in TURNS]
        results[name] = {"available": True, "answers": answers, "answers_ok": ok}
        results[name] |= {"turns": turns, "requests": requests, "bodies": [r["body"] for r in mine]}
    return results


def verdict(results: dict[str, Json]) -> tuple[bool | None, bool | None]:
    """(no more calls than any peer, per turn and total; prefix share >= 90% from turn 2);
    None when it cannot be judged (turnkit did not run, or no peer did)."""
    if not results["turnkit"]["available"]:
        return None, None
    ours = results["turnkit"]["turns"]
    peers = [r["turns"] for n, r in results.items() if n != "turnkit" and r["available"]]
    fewest = all(row["calls"] <= p[i]["calls"] for p in peers for i, row in enumerate(ours))
    return fewest if peers else None, all(
        row["prefix_share"] >= 0.9 for row in ours[1 : len(TURNS)]
    )


def report(results: dict[str, Json]) -> None:
    print(
        f"tokens: {COUNTER}; prefix = cache-eligible prefix tokens / input tokens; "
        "uncached = input - prefix tokens"
    )
    head = ("turn", "calls", "input", "output", "prefix", "uncached", "breaks")
    print(f"{'framework':<14}" + "".join(f"{h:>9}" for h in head))
    for name, res in results.items():
        if not res["available"]:
            print(f"{name:<14}unavailable: {res['reason']}")
            continue
        for i, row in enumerate(res["turns"]):
            label = str(i + 1) if i < len(TURNS) else "total"
            keys = ("calls", "input_tokens", "output_tokens")
            new = row["input_tokens"] - row["prefix_tokens"]
            cells = [
                label,
                *(row[k] for k in keys),
                f"{row['prefix_share']:.1%}",
                new,
                row["breaks"],
            ]
            print(f"{name:<14}" + "".join(f"{c:>9}" for c in cells))
        for n, req in enumerate(res["requests"]):
            if div := req["diverged"]:
                where = f"request {n} (turn {req['turn']}) segment {div['segment']}"
                print(f"  break: {where}: {div['before'][:150]!r} -> {div['after']!r:.150}")
        if not res["answers_ok"]:
            print(f"  WARNING: {name} answered {res['answers']!r}")
    goals = (
        "no more model calls than any peer (per turn and total)",
        "cache-eligible prefix share >= 90% from turn 2 on",
    )
    for goal, met in zip(goals, verdict(results), strict=True):
        print(f"turnkit goal, {goal}: {'n/a' if met is None else 'MET' if met else 'NOT MET'}")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="Calls, tokens and prompt-prefix reuse per turn.")
    default = Path(__file__).parent / "results" / "agent_loop_tokens.json"
    parser.add_argument("--json", type=Path, default=default, help=f"default: {default}")
    args = parser.parse_args()
    with FakeServer() as server:
        results = asyncio.run(bench(server))
    report(results)
    fewest, cached = verdict(results)
    env: Json = {"python": sys.version.split()[0], "platform": platform.platform()}
    env |= {"token_counter": COUNTER, "packages": {p: _version(p) for p in PACKAGES}}
    goals = {"fewest_calls": fewest, "prefix_share_ge_90_from_turn_2": cached}
    out = {"environment": env, "goals": goals, "frameworks": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    if not results["turnkit"].get("answers_ok"):
        raise SystemExit("turnkit did not give the scripted conversation's answers")


if __name__ == "__main__":
    main()
