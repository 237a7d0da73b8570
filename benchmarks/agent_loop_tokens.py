"""Model calls, tokens and cache-eligible prompt prefix per turn: turnkit vs PydanticAI vs
the OpenAI Agents SDK, on the same scripted 3-turn conversation.

Each framework talks to the same fake OpenAI-compatible chat-completions server on
127.0.0.1 (streaming and non-streaming; it decides each reply from the request, not from a
FIFO, so a framework may make as many calls as it likes). The conversation, with the
instructions "You are a concise assistant. Use the add tool for arithmetic.":

1. "What is 1 + 2?" -> tool call add(a=1, b=2), then "1 + 2 = 3."
2. "Thanks!"        -> "You are welcome."
3. "And 3 + 4?"     -> tool call add(a=3, b=4), then "3 + 4 = 7."

How each framework continues the conversation: turnkit, three `execute_message` calls on one
session of a `SessionRuntime` (SQLite in a temp dir); PydanticAI, `agent.run(text,
message_history=previous.all_messages())`; the Agents SDK, `Runner.run(agent,
previous.to_input_list() + [{"role": "user", "content": text}])` (its documented manual
conversation management; tracing disabled). Peers' OpenAI clients have `max_retries=0`.

Counting, the same for every request of every framework: the canonical prompt is the
`tools` block (JSON, sort_keys) then each message (JSON, sort_keys); input tokens are the
sum of their o200k_base tiktoken counts (litellm's bundled offline encodings; the JSON says
which counter ran). The cache-eligible prefix of a request is the tokens of the segments it
shares, from the start, with the previous request of the same conversation (across turns;
0 for the first); a turn's prefix share = its prefix tokens / its input tokens. Output
tokens count the assistant text + tool-call arguments the server sent back. Request fields
other than tools/messages (tool_choice, stream...) are not counted.

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

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_LITELLM = importlib.util.find_spec("litellm")
if _LITELLM and _LITELLM.submodule_search_locations:  # litellm's offline tiktoken files
    _dir = Path(next(iter(_LITELLM.submodule_search_locations)), "litellm_core_utils/tokenizers")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_dir))

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SYSTEM = "You are a concise assistant. Use the add tool for arithmetic."
TURNS = [
    ("What is 1 + 2?", "1 + 2 = 3."),
    ("Thanks!", "You are welcome."),
    ("And 3 + 4?", "3 + 4 = 7."),
]
FRAMEWORKS = ("turnkit", "pydantic-ai", "openai-agents")
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
        try:
            import litellm

            litellm.token_counter(text="probe")
            return "litellm.token_counter", lambda s: int(litellm.token_counter(text=s))
        except Exception:
            return "len(utf-8 bytes)/4", lambda s: (len(s.encode()) + 3) // 4


COUNTER, count_tokens = _counter()


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


class FakeServer:
    """`POST /v1/chat/completions` on 127.0.0.1; replies from the request, records bodies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[Json] = []
        self.tag: tuple[str, int] = ("", 0)
        self._ids = itertools.count(1)
        routes = [
            Route(p, self._chat, methods=["POST"])
            for p in ("/v1/chat/completions", "/chat/completions")
        ]
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        cfg = uvicorn.Config(Starlette(routes=routes), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, args=([self._sock],), daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def _reply(self, messages: list[Json], turn: int) -> tuple[str, Json | None]:
        question = next(
            (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
        )
        if messages and messages[-1].get("role") == "tool":
            return TURNS[turn][1], None
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        if "+" in question and len(numbers) >= 2:
            args = json.dumps({"a": numbers[0], "b": numbers[1]})
            call = {
                "id": f"call_{next(self._ids)}",
                "type": "function",
                "function": {"name": "add", "arguments": args},
            }
            return "", call
        return "You are welcome.", None

    async def _chat(self, request: Request) -> Response:
        body: Json = await request.json()
        with self.lock:
            framework, turn = self.tag
            text, call = self._reply(list(body.get("messages") or []), turn)
            out = text + (call["function"]["arguments"] if call else "")
            self.records.append(
                {
                    "framework": framework,
                    "turn": turn,
                    "body": body,
                    "output_tokens": count_tokens(out),
                }
            )
        base = {
            "id": f"chatcmpl-{len(self.records)}",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "system_fingerprint": "fp_fake",
        }
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        finish = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message: Json = {"role": "assistant", "content": text or None}
            if call:
                message["tool_calls"] = [call]
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            return JSONResponse(
                {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._sse(base, text, call, finish, usage if with_usage else None),
            media_type="text/event-stream",
        )

    @staticmethod
    async def _sse(
        base: Json, text: str, call: Json | None, finish: str, usage: Json | None
    ) -> AsyncIterator[bytes]:
        def chunk(delta: Json | None, reason: str | None = None, **extra: Any) -> bytes:
            choices = (
                []
                if delta is None
                else [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]
            )
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
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from agents import set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-bench", max_retries=0)
    model = OpenAIChatCompletionsModel(model="fake", openai_client=client)
    agent = Agent(name="assistant", instructions=SYSTEM, model=model, tools=[function_tool(add)])
    answers: list[str] = []
    items: list[Any] = []
    for turn, (text, _) in enumerate(TURNS):
        server.tag = ("openai-agents", turn)
        result = await Runner.run(agent, [*items, {"role": "user", "content": text}])
        items = result.to_input_list()
        answers.append(str(result.final_output))
    return answers


def segments(body: Json) -> list[str]:
    tools = body.get("tools")
    head = [json.dumps(tools, sort_keys=True)] if tools else [""]
    return head + [json.dumps(m, sort_keys=True) for m in body.get("messages") or []]


def measure(records: list[Json]) -> list[Json]:
    """Per turn (0-based) plus a total: calls, input/output/prefix tokens, prefix share."""
    rows = [
        {"calls": 0, "input_tokens": 0, "output_tokens": 0, "prefix_tokens": 0}
        for _ in range(len(TURNS) + 1)
    ]
    previous: list[str] = []
    for record in records:
        current = segments(record["body"])
        same = 0
        for old, new in zip(previous, current, strict=False):
            if old != new:
                break
            same += 1
        previous = current
        for row in (rows[record["turn"]], rows[-1]):
            row["calls"] += 1
            row["input_tokens"] += sum(count_tokens(s) for s in current)
            row["output_tokens"] += record["output_tokens"]
            row["prefix_tokens"] += sum(count_tokens(s) for s in current[:same])
    for row in rows:
        row["prefix_share"] = row["prefix_tokens"] / row["input_tokens"] if row["calls"] else 0.0
    return rows


async def bench(server: FakeServer) -> dict[str, Json]:
    runners: dict[str, Runner] = {
        "turnkit": run_turnkit,
        "pydantic-ai": run_pydantic_ai,
        "openai-agents": run_openai_agents,
    }
    results: dict[str, Json] = {}
    for name, runner in runners.items():
        try:
            answers = await asyncio.wait_for(runner(server), timeout=120)
        except Exception as exc:
            results[name] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
            continue
        with server.lock:
            mine = [r for r in server.records if r["framework"] == name]
        expected = [answer for _, answer in TURNS]
        results[name] = {
            "available": True,
            "answers": answers,
            "answers_ok": answers == expected,
            "turns": measure(mine),
            "requests": [r["body"] for r in mine],
        }
    return results


def verdict(results: dict[str, Json]) -> tuple[bool, bool]:
    tk = results["turnkit"]
    if not tk["available"]:
        return False, False
    peers = [r["turns"] for n, r in results.items() if n != "turnkit" and r["available"]]
    fewest = all(tk["turns"][i]["calls"] <= p[i]["calls"] for p in peers for i in range(4))
    cached = all(tk["turns"][i]["prefix_share"] >= 0.9 for i in range(1, len(TURNS)))
    return fewest, cached


def report(results: dict[str, Json]) -> None:
    print(f"tokens: {COUNTER}; prefix share = cache-eligible prefix tokens / input tokens")
    print(f"{'framework':<14}{'turn':>6}{'calls':>7}{'input':>8}{'output':>8}{'prefix':>9}")
    for name, res in results.items():
        if not res["available"]:
            print(f"{name:<14} unavailable: {res['reason']}")
            continue
        for i, row in enumerate(res["turns"]):
            label = str(i + 1) if i < len(TURNS) else "total"
            print(
                f"{name:<14}{label:>6}{row['calls']:>7}{row['input_tokens']:>8}"
                f"{row['output_tokens']:>8}{row['prefix_share']:>8.1%}"
            )
        if not res["answers_ok"]:
            print(f"{name:<14} WARNING: answers {res['answers']!r}")
    fewest, cached = verdict(results)
    print(
        f"turnkit: no more model calls than any peer (per turn and total): "
        f"{'MET' if fewest else 'NOT MET'}; cache-eligible prefix share >= 90% from turn 2 "
        f"on: {'MET' if cached else 'NOT MET'}"
    )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "agent_loop_tokens.json"
    )
    args = parser.parse_args()
    with FakeServer() as server:
        results = asyncio.run(bench(server))
    report(results)
    fewest, cached = verdict(results)
    out = {
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "token_counter": COUNTER,
            "packages": {p: _version(p) for p in PACKAGES},
        },
        "goals": {"fewest_calls": fewest, "prefix_share_ge_90_from_turn_2": cached},
        "frameworks": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
