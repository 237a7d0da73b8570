from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnkit.models import (
    Finish,
    ModelChunk,
    ModelRequest,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallPart,
    Usage,
    closing_stream,
    estimate_tokens,
)

__all__ = ("ModelStep", "ScriptedModel", "UnexpectedModelCall", "call", "raw_call")

_ids = itertools.count(1)


class UnexpectedModelCall(AssertionError):
    """The scripted model was called after its script ran out."""


def call(name: str, /, *, tool_call_id: str | None = None, **arguments: Any) -> ToolCallPart:
    """A tool call for a script: `call("search", query="q3")`."""
    return ToolCallPart(
        tool_call_id=tool_call_id or f"call_{next(_ids)}",
        name=name,
        arguments=json.dumps(arguments),
    )


def raw_call(name: str, arguments: str, /, *, tool_call_id: str | None = None) -> ToolCallPart:
    """A tool call whose argument text is taken as is (for malformed-JSON cases)."""
    return ToolCallPart(
        tool_call_id=tool_call_id or f"call_{next(_ids)}", name=name, arguments=arguments
    )


def _estimate_tokens(text: str) -> int:
    return len(text) // 4 + 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStep:
    """One scripted model response. Build with the class methods."""

    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    error: Exception | None = None
    responder: Callable[[ModelRequest], ModelStep] | None = None
    stop_reason: StopReason | None = None
    chunk_size: int = 8
    hang_after_text: bool = False
    usage: Usage | None = None
    refusal: str = ""

    @classmethod
    def text_reply(cls, text: str, *, thinking: str = "", chunk_size: int = 8) -> ModelStep:
        """Answer with `text`, streamed in pieces of `chunk_size` characters."""
        return cls(text=text, thinking=thinking, chunk_size=chunk_size)

    @classmethod
    def tool_call_reply(cls, *calls: ToolCallPart, text: str = "") -> ModelStep:
        """Call tools (optionally after some narration `text`)."""
        return cls(text=text, tool_calls=calls)

    @classmethod
    def fail(cls, error: Exception) -> ModelStep:
        """Raise `error` instead of answering (e.g. `ProviderError(status_code=429)`)."""
        return cls(error=error)

    @classmethod
    def respond(cls, fn: Callable[[ModelRequest], ModelStep]) -> ModelStep:
        """Decide the response from the request."""
        return cls(responder=fn)

    @classmethod
    def truncated(cls, text: str = "", *calls: ToolCallPart) -> ModelStep:
        """Stop on the provider's output limit (`max_tokens`)."""
        return cls(text=text, tool_calls=calls, stop_reason="max_tokens")

    @classmethod
    def filtered(cls, text: str = "", *calls: ToolCallPart, refusal: str = "") -> ModelStep:
        """Stop on the provider's content filter (`content_filter`), after `text` if any.

        `refusal`: the words the model declined with (OpenAI's `refusal`, `Finish.refusal`).
        """
        return cls(text=text, tool_calls=calls, stop_reason="content_filter", refusal=refusal)

    @classmethod
    def cut(cls, text: str, error: Exception) -> ModelStep:
        """Stream `text`, then raise `error`: a stream that breaks mid-answer.

        With a retriable `ProviderError` in a `ModelFamily`, the next rung answers and
        the text streamed so far is abandoned (`provider.cascade`).
        """
        return cls(text=text, error=error)

    @classmethod
    def hang(cls, text: str = "") -> ModelStep:
        """Stream `text`, then wait until the call is cancelled."""
        return cls(text=text, hang_after_text=True)


@dataclass(slots=True)
class ScriptedModel:
    """A deterministic `ModelClient` that plays a FIFO script of `ModelStep`s.

    It records every request in `calls`, counts calls cancelled mid-stream in `aborted`,
    and raises `UnexpectedModelCall` when called after the script ran out (it never wraps
    around). `assert_complete()` checks the whole script was used.

    Example:
        ```python
        model = ScriptedModel([
            ModelStep.tool_call_reply(call("search", query="q3 revenue")),
            ModelStep.text_reply("Searched."),
            ModelStep.text_reply("Revenue rose 12% in Q3."),
        ])
        ```
    """

    steps: Sequence[ModelStep]
    name: str = "scripted"
    context_window: int | None = None
    """The context window to declare (compaction triggers at 85% of it); None: none."""
    repeat_last: bool = False
    """Answer every call past the script with the last step (for demos, not tests)."""
    calls: list[ModelRequest] = field(default_factory=list[ModelRequest])
    aborted: int = 0
    _cursor: int = 0

    @property
    def model(self) -> str:
        """The model name shown in audit rows."""
        return self.name

    @property
    def provider(self) -> str:
        """Always `scripted`."""
        return "scripted"

    def assert_complete(self) -> None:
        """Fail unless every scripted step was played and no call came after them.

        A call past the script raises `UnexpectedModelCall` inside the turn, where the
        runtime may only log it (a thinking summary or a session name that failed): this
        says so in the test.
        """
        if self._cursor < len(self.steps):
            raise AssertionError(
                f"{len(self.steps) - self._cursor} scripted step(s) were never played"
            )
        past = len(self.calls) - len(self.steps)
        if past > 0 and not self.repeat_last:
            raise AssertionError(
                f"ScriptedModel {self.name!r} was called {len(self.calls)} times; its script "
                f"has {len(self.steps)} step(s). The call(s) past it: "
                + ", ".join(repr(c.purpose) for c in self.calls[len(self.steps) :])
            )

    def __post_init__(self) -> None:
        given: Sequence[object] = self.steps  # an untyped caller's list may hold anything
        for at, step in enumerate(given):
            if not isinstance(step, ModelStep):
                hint = f": ModelStep.text_reply({step!r})" if isinstance(step, str) else ""
                raise TypeError(f"steps[{at}] is {step!r}, not a ModelStep{hint}")

    def _next_step(self, request: ModelRequest) -> ModelStep:
        if self._cursor >= len(self.steps):
            if self.repeat_last and self.steps:
                step = self.steps[-1]
            else:
                raise UnexpectedModelCall(
                    f"ScriptedModel {self.name!r} was called {len(self.calls)} times but its "
                    f"script has {len(self.steps)} step(s); the call past it: "
                    f"{request.purpose!r}"
                )
        else:
            step = self.steps[self._cursor]
            self._cursor += 1
        while step.responder is not None:
            answered: object = step.responder(request)
            if not isinstance(answered, ModelStep):
                raise TypeError(
                    f"a ModelStep.respond function returned {answered!r}, not a ModelStep"
                )
            step = answered
        if step.tool_calls and not request.tools:
            raise UnexpectedModelCall(
                f"ScriptedModel {self.name!r} step {self._cursor} calls "
                f"{[c.name for c in step.tool_calls]} but this call ({request.purpose!r}) "
                "offers no tools: its calls would be dropped. Give the agent the tools, or "
                "script a text reply"
            )
        return step

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Play the next step."""
        self.calls.append(request)
        step = self._next_step(request)
        if step.error is not None and not step.text:
            raise step.error
        finished = False
        try:
            async with closing_stream(self._play(step, request)) as chunks:
                async for chunk in chunks:
                    finished = isinstance(chunk, Finish)
                    yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:  # closed before its `Finish`: the call was cut off
                self.aborted += 1
            raise

    async def _play(self, step: ModelStep, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        size = max(1, step.chunk_size)
        for start in range(0, len(step.thinking), size):
            yield ThinkingDelta(step.thinking[start : start + size])
        for start in range(0, len(step.text), size):
            yield TextDelta(step.text[start : start + size])
        if step.error is not None:  # `cut`: the stream breaks after its text
            raise step.error
        if step.hang_after_text:
            await asyncio.Event().wait()  # until cancelled
        for index, part in enumerate(step.tool_calls):
            half = len(part.arguments) // 2
            yield ToolCallDelta(
                index=index,
                tool_call_id=part.tool_call_id,
                name=part.name,
                arguments=part.arguments[:half],
            )
            yield ToolCallDelta(index=index, arguments=part.arguments[half:])
        stop: StopReason = step.stop_reason or ("tool_use" if step.tool_calls else "end_turn")
        usage = step.usage or Usage(
            input_tokens=estimate_tokens(request),
            output_tokens=_estimate_tokens(step.text + step.thinking)
            + sum(_estimate_tokens(c.arguments) for c in step.tool_calls),
        )
        yield Finish(stop, usage, refusal=step.refusal)
