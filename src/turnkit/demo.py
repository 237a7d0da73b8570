"""The offline demo: a rule-based stand-in for an LLM and two small tools.

`DemoModel` is NOT a language model. It follows fixed rules (use the calculator for
arithmetic, count words when asked, otherwise explain itself) so that `turnkit run`
shows a real tool-using turn with no server and no API key. Every answer it writes
starts with `[demo model]`.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import AsyncIterator, Callable
from typing import Final

from turnkit.agent import DEFAULT_SYNTHESIS_INSTRUCTIONS, Agent
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
    estimate_tokens,
    text_of,
)
from turnkit.tools import FunctionTool, tool

__all__ = ("DEMO_MODEL_NAME", "DemoModel", "calculator", "demo_agent", "word_count")

DEMO_MODEL_NAME: Final = "turnkit-demo"

_ARITHMETIC = re.compile(r"[-+(]*\d[\d.\s]*(?:[-+*/%^()]+\s*[\d.(][\d.\s)]*)+")
_OPS: dict[type[ast.AST], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / % ** and parentheses are allowed")


@tool
def calculator(expression: str) -> float | int:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / % ** and parentheses, e.g. "(2 + 3) * 4".
    """
    value = _evaluate(ast.parse(expression.replace("^", "**"), mode="eval"))
    return int(value) if value.is_integer() else round(value, 10)


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


def _question(messages: tuple[ModelMessage, ...]) -> tuple[str, list[str]]:
    """The user's last message and the tool results that came after it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        text = text_of(message.content)
        # A separate synthesis call appends its closing instruction as a user message.
        if message.role == "user" and text != DEFAULT_SYNTHESIS_INSTRUCTIONS:
            results = [text_of(m.content) for m in messages[index + 1 :] if m.role == "tool"]
            return text, results
    return "", []


class DemoModel:
    """A rule-based offline stand-in for an LLM (see the module docstring). Not an LLM."""

    @property
    def model(self) -> str:
        """`turnkit-demo`."""
        return DEMO_MODEL_NAME

    @property
    def provider(self) -> str:
        """`turnkit-demo` (offline, no network)."""
        return "turnkit-demo"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Answer by rule."""
        text, call = self._decide(request)
        for word in re.findall(r"\S+\s*", text):
            yield TextDelta(word)
        if call is not None:
            name, args = call
            yield ToolCallDelta(
                index=0,
                tool_call_id=f"demo_{len(request.messages)}",
                name=name,
                arguments=json.dumps(args),
            )
        yield Finish(
            "tool_use" if call else "end_turn",
            Usage(input_tokens=estimate_tokens(request), output_tokens=len(text) // 4 + 1),
        )

    def _decide(self, request: ModelRequest) -> tuple[str, tuple[str, dict[str, str]] | None]:
        messages = request.messages
        offered = {t.name for t in request.tools}
        question, results = _question(messages)
        if request.purpose == "plan":
            return '{"intent": "answer", "depth": "none"}', None
        if request.purpose == "tool-loop" and not results:
            match = _ARITHMETIC.search(question)
            if match and "calculator" in offered:
                return "Let me work that out.", (
                    "calculator",
                    {"expression": match.group(0).strip()},
                )
            if "word" in question.lower() and "word_count" in offered:
                return "Counting words.", ("word_count", {"text": question})
        if results:
            return (
                f"[demo model] Using the tool result {results[-1]}: "
                f'that is the answer to "{question}".',
                None,
            )
        return (
            f'[demo model] You said: "{question}". I am turnkit\'s offline demo model, not an '
            'LLM: ask me some arithmetic ("what is 12*7?") to see a tool call, or run '
            '`turnkit run --model openai/gpt-4o-mini "..."` with an API key for a real model.',
            None,
        )


def demo_agent(model: str | None = None) -> Agent:
    """The agent `turnkit run` uses: the demo model (or `model`) with the demo tools."""
    tools: list[FunctionTool] = [calculator, word_count]
    return Agent(
        name="demo",
        instructions="You are a concise assistant. Use the calculator for arithmetic.",
        model=model if model is not None else DemoModel(),
        tools=tools,
    )
