"""`chat {model}` spans (one per rung a call tries) and `execute_tool {tool}` spans."""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Awaitable
from contextvars import Token
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from pydantic import JsonValue

from turnkit.blocks import TextPart
from turnkit.errors import ErrorCode, TurnkitError
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RungFailed,
    RungStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallPart,
    text_of,
)
from turnkit.otel._state import Active, active, capture_content
from turnkit.otel._turn import stage_span
from turnkit.telemetry import Recorder
from turnkit.tools import AskedAgentWaits

__all__ = ("ChatTrace", "chat", "tool_fallback", "traced_tool")

ToolOutcome = tuple[str | None, ErrorCode, JsonValue, str]
"""What running one tool call gives the dispatcher: problem, code, output, who answered."""

# litellm's provider names where the semantic conventions spell them differently.
_PROVIDERS = {
    "bedrock": "aws.bedrock",
    "bedrock_converse": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}


def _requested_model(model: str, provider: str) -> str:
    """The model's own name, without the provider prefix litellm routes by.

    `gen_ai.provider.name` carries the provider: `openai/gpt-4o-mini` is `gpt-4o-mini`.
    """
    prefix = f"{provider}/"
    return model[len(prefix) :] if model.startswith(prefix) and len(model) > len(prefix) else model


_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def error_type(exc: BaseException) -> str:
    """`error.type`: turnkit's error code, else the exception's qualified class name."""
    if isinstance(exc, TurnkitError):
        return exc.code
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class ChatTrace:
    """One model call's spans; this base is the no-op used when no provider is configured."""

    def saw(self, chunk: ModelChunk) -> None:
        """A chunk of the call's stream (rungs open and close spans; the first delta times)."""

    def answered(self, response: ModelResponse) -> None:
        """The call returned `response` (after the answer guardrails)."""

    def failed(self, exc: BaseException) -> None:
        """The call raised."""

    def close(self) -> None:
        """The call is over however it ended (a span still open was cut short)."""


NO_CHAT = ChatTrace()


def chat(recorder: Recorder, stage: str, family: str, request: ModelRequest) -> ChatTrace:
    """Spans for one model call on `family` in `stage` (a no-op without a provider)."""
    found = active()
    if found is None:
        return NO_CHAT
    return _LiveChat(found, recorder, stage, family, request)


class _LiveChat(ChatTrace):
    def __init__(
        self, found: Active, recorder: Recorder, stage: str, family: str, request: ModelRequest
    ) -> None:
        self.found = found
        parent = stage_span(recorder, stage)
        self.parent = trace.set_span_in_context(parent) if parent is not None else None
        self.base: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.conversation.id": recorder.session_id,
            "turnkit.turn_id": recorder.turn_id,
            "turnkit.stage": stage,
            "turnkit.family": family,
            **_request_attributes(request),
        }
        if capture_content():  # the request is the same on every rung: serialise it once
            self.base["gen_ai.input.messages"] = _messages_json(request.messages)
        self.index = -1
        self.span: Span | None = None
        self.token: Token[Context] | None = None
        self.metric: dict[str, Any] = {}
        self.started = 0.0
        self.first_chunk = False

    def saw(self, chunk: ModelChunk) -> None:
        match chunk:
            case TextDelta() | ThinkingDelta() | ToolCallDelta():
                if not self.first_chunk and self.span is not None:
                    self.first_chunk = True
                    elapsed = time.perf_counter() - self.started
                    self.found.time_to_first_chunk.record(elapsed, self.metric)
            case RungStarted():
                self._start(chunk)
            case RungFailed():
                self._end(chunk.error)
                if chunk.next_rung is not None:
                    self.found.cascade_steps.add(
                        1,
                        {
                            "turnkit.family": self.base["turnkit.family"],
                            "turnkit.from_model": chunk.model,
                            "turnkit.to_model": chunk.next_model or "",
                            "error.type": error_type(chunk.error),
                        },
                    )
            case Finish():
                self._finish(chunk)

    def _start(self, chunk: RungStarted) -> None:
        self.index += 1
        provider = _PROVIDERS.get(chunk.provider, chunk.provider)
        model = _requested_model(chunk.model, chunk.provider)
        attributes = {
            **self.base,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "turnkit.model": chunk.model,
            "turnkit.rung": chunk.rung,
            "turnkit.fallback_index": self.index,
            **_server(chunk.address),
        }
        self.span = self.found.tracer.start_span(
            f"chat {model}", context=self.parent, kind=SpanKind.CLIENT, attributes=attributes
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        self.metric = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
        }
        self.started = time.perf_counter()
        self.first_chunk = False

    def _finish(self, chunk: Finish) -> None:
        span, usage = self.span, chunk.usage
        if span is None:
            return
        # What the provider says answered (a dated snapshot, a router's pick), else the
        # model asked for: the request model is all a client that says nothing tells us.
        model = chunk.response_model or self.metric["gen_ai.request.model"]
        span.set_attribute("gen_ai.response.model", model)
        reason = _FINISH.get(chunk.stop_reason, chunk.stop_reason)
        span.set_attribute("gen_ai.response.finish_reasons", (reason,))
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
        span.set_attribute("turnkit.cost_usd", usage.cost_usd)
        self.metric["gen_ai.response.model"] = model
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            self.found.token_usage.record(count, {**self.metric, "gen_ai.token.type": kind})

    def answered(self, response: ModelResponse) -> None:
        if self.span is not None and capture_content():
            message = ModelMessage(
                role="assistant", content=response.text, tool_calls=response.tool_calls
            )
            self.span.set_attribute("gen_ai.output.messages", _messages_json((message,)))
        self._end(None)

    def failed(self, exc: BaseException) -> None:
        self._end(exc)

    def close(self) -> None:
        if self.span is not None:
            self._end(None, cut="cancelled" if _cancelling() else "incomplete")

    def _end(self, exc: BaseException | None, *, cut: str | None = None) -> None:
        span = self.span
        if span is None:
            return
        error = error_type(exc) if exc is not None else cut
        metric = self.metric
        if error is not None:
            span.set_attribute("error.type", error)
            # A provider's message may quote the request: only with content capture on.
            said = str(exc) if exc is not None and capture_content() else error
            span.set_status(Status(StatusCode.ERROR, said))
            if exc is not None:
                _record(span, exc)
                status = getattr(exc, "status_code", None)  # the provider's HTTP answer
                if isinstance(status, int):
                    span.set_attribute("http.response.status_code", status)
            metric = {**metric, "error.type": error}
        self.found.duration.record(time.perf_counter() - self.started, metric)
        span.end()
        self.span = None
        if self.token is not None:
            otel_context.detach(self.token)
            self.token = None


def traced_tool(
    recorder: Recorder, call: ToolCallPart, run: Awaitable[ToolOutcome], *, in_doubt: bool = False
) -> Awaitable[ToolOutcome]:
    """`run` (one tool call) inside an `execute_tool {tool}` span; as is without a provider.

    `in_doubt`: an earlier attempt started the call and never finished it (it is
    reconciled or run again).
    """
    found = active()
    if found is None:
        return run
    return _traced_tool(found, recorder, call, run, in_doubt)


async def _traced_tool(
    found: Active,
    recorder: Recorder,
    call: ToolCallPart,
    run: Awaitable[ToolOutcome],
    in_doubt: bool,
) -> ToolOutcome:
    parent = stage_span(recorder, "tool-loop")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.tool_call_id,
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": recorder.session_id,
        "turnkit.turn_id": recorder.turn_id,
    }
    if in_doubt:
        attributes["turnkit.tool.in_doubt"] = True
    capture = capture_content()
    if capture:
        attributes["gen_ai.tool.call.arguments"] = call.arguments
    span = found.tracer.start_span(
        f"execute_tool {call.name}",
        context=trace.set_span_in_context(parent) if parent is not None else None,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
    )
    # What escapes (a guardrail's block, a required plugin's failure) is recorded by type
    # only, unless contents are captured: its message may quote the tool's arguments.
    with trace.use_span(span, end_on_exit=True, record_exception=False,
                        set_status_on_exception=False):  # fmt: skip
        try:
            problem, code, output, answered_by = outcome = await run
        except asyncio.CancelledError:  # a Stop, a deadline, a lost lease, a worker leaving
            span.set_attribute("error.type", "cancelled")
            span.set_status(Status(StatusCode.ERROR, "cancelled"))
            raise
        except AskedAgentWaits:  # not a failure: the turn waits for a person with the agent
            span.set_attribute("turnkit.tool.waits_for_person", True)
            raise
        except Exception as exc:
            span.set_attribute("error.type", error_type(exc))
            span.set_status(Status(StatusCode.ERROR, str(exc) if capture else error_type(exc)))
            _record(span, exc)
            raise
        if answered_by != call.name:
            span.set_attribute("turnkit.tool.answered_by", answered_by)
        if problem is not None:
            span.set_attribute("error.type", code)
            # The tool's own words may quote its arguments: only with content capture on.
            span.set_status(Status(StatusCode.ERROR, problem if capture else code))
        elif capture:
            span.set_attribute("gen_ai.tool.call.result", json.dumps(output, default=str))
    return outcome


def tool_fallback(from_tool: str, to_tool: str | None, reason: str) -> None:
    """A tool class's fallback step: a `turnkit.tool.fallback` event on its call's span.

    The member's own words (`reason`, which may quote the arguments) only with content
    capture on; nothing without a provider or outside a recording span.
    """
    if active() is None:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes: dict[str, Any] = {"turnkit.tool.from": from_tool}
    if to_tool is not None:
        attributes["turnkit.tool.to"] = to_tool
    if capture_content():
        attributes["turnkit.tool.fallback.reason"] = reason
    span.add_event("turnkit.tool.fallback", attributes)


def _server(address: str | None) -> dict[str, Any]:
    """`server.address` and `server.port` of a rung's `api_base` (none for the default)."""
    if address is None:
        return {}
    try:
        parts = urlsplit(address)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # not a URL the client could have used
        return {}
    if not parts.hostname:
        return {}
    return {"server.address": parts.hostname, **({"server.port": port} if port else {})}


def _record(span: Span, exc: BaseException) -> None:
    """The `exception` event: whole with content capture on, else its type only.

    `exception.type` is the error's type either way (turnkit's code), so grouping by it
    does not change when capture is switched; the stack names the class. The stack of
    turnkit's own error stops at it: the error it was raised from (a provider's, as the
    client library raised it) may quote a credential that turnkit's message masks.
    """
    if capture_content():
        attributes = {"exception.type": error_type(exc)}
        if isinstance(exc, TurnkitError):
            stack = "".join(traceback.format_exception(exc, chain=False))
            attributes["exception.stacktrace"] = stack
        span.record_exception(exc, attributes=attributes)
    else:
        span.add_event("exception", {"exception.type": error_type(exc)})


def _request_attributes(request: ModelRequest) -> dict[str, Any]:
    settings = request.settings
    out: dict[str, Any] = {}
    if request.max_output_tokens is not None:
        out["gen_ai.request.max_tokens"] = request.max_output_tokens
    if settings is not None:
        for name, value in (
            ("temperature", settings.temperature),
            ("top_p", settings.top_p),
            ("seed", settings.seed),
            ("max_tokens", settings.max_tokens),
        ):
            if value is not None:
                out[f"gen_ai.request.{name}"] = value
    return out


def _messages_json(messages: tuple[ModelMessage, ...]) -> str:
    """Messages in the conventions' shape: role and parts (text, tool calls, responses)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.tool_call_id,
                    "response": text_of(message.content),
                }
            )
        elif isinstance(message.content, str):
            if message.content:
                parts.append({"type": "text", "content": message.content})
        else:
            for part in message.content:
                if isinstance(part, TextPart):
                    parts.append({"type": "text", "content": part.text})
                else:
                    parts.append({"type": part.kind})
        for tool_call in message.tool_calls:
            parts.append(
                {
                    "type": "tool_call",
                    "id": tool_call.tool_call_id,
                    "name": tool_call.name,
                    "arguments": tool_call.arguments,
                }
            )
        out.append({"role": message.role, "parts": parts})
    return json.dumps(out, default=str)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
