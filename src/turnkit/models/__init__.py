"""The model port: neutral request, chunk and response types, and the `ModelClient` protocol.

Vendor shapes (litellm, OpenAI) never cross this line; `turnkit.models.litellm` translates
at the edge. A `ModelFamily` (see `turnkit.models.family`) is itself a `ModelClient`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from turnkit.blocks import ContentPart, ImagePart, TextPart
from turnkit.output import OutputShape

__all__ = (
    "ALLOW_NETWORK",
    "Content",
    "estimate_tokens",
    "pictures_in",
    "text_of",
    "Finish",
    "ModelClient",
    "ModelMessage",
    "ModelRequest",
    "ModelResponse",
    "ModelChunk",
    "ModelSettings",
    "RungFailed",
    "RungStarted",
    "STOP_REASONS",
    "StopReason",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
    "ToolCallPart",
    "ToolSpec",
    "Usage",
    "closing_stream",
)

ALLOW_NETWORK = True
"""Tests set this to False so that no model client can reach a real provider by accident."""

StopReason = Literal["end_turn", "tool_use", "max_tokens", "content_filter", "error"]
STOP_REASONS: Final[tuple[StopReason, ...]] = get_args(StopReason)
"""Why a call ended: its answer is complete, it calls tools, it hit the output limit, the
provider's content filter stopped it (a refusal: what it wrote may be cut, or nothing), or
the provider ended it with an error."""
Role = Literal["system", "user", "assistant", "tool"]
Content = str | tuple[ContentPart, ...]
"""A message's content: plain text, or parts (text and pictures)."""

_TOKENS_PER_PICTURE = 800
"""A rough count for one picture when the client cannot count (most cost 85-1,600)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallPart:
    """A tool call inside an assistant message; `arguments` is the raw JSON text."""

    tool_call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMessage:
    """One chat message in provider-neutral form."""

    role: Role
    content: Content = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    tool_call_id: str | None = None
    """Set on `tool` messages: the call this message answers."""
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as offered to the model: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, object]


class ModelSettings(BaseModel):
    """Sampling settings for the agent's reasoning calls; unset fields are not sent.

    Set them on the `Agent` (`settings=`) and override them per message; a message's
    settings are merged over the agent's, field by field.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    """Output tokens per call (reasoning included); the provider's own cap when unset."""
    seed: int | None = None
    stop: tuple[str, ...] | None = Field(default=None, max_length=4, fail_fast=True)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)

    def merged(self, override: ModelSettings | None) -> ModelSettings:
        """These settings with every field `override` sets replaced."""
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_none=True))

    def sent(self) -> dict[str, object]:
        """The fields that are set, as request parameters."""
        out = self.model_dump(exclude_none=True)
        if "stop" in out:
            out["stop"] = list(out["stop"])
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """Everything one model call sends."""

    messages: tuple[ModelMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    thinking_budget: int = 0
    """Reasoning tokens allowed for this call (0 = reasoning off)."""
    max_output_tokens: int | None = None
    tool_choice: Literal["auto", "none"] = "auto"
    """`none`: the tools are offered (so the prompt prefix stays the same) but not usable."""
    purpose: Literal["plan", "tool-loop", "synthesize", "utility"] = "tool-loop"
    settings: ModelSettings | None = None
    """Sampling settings (the agent's, merged with the message's); None sends none."""
    output: OutputShape | None = None
    """The JSON shape the answer must have (the agent's `output_type`); None: free text."""

    def output_cap(self) -> int | None:
        """Output tokens this call may use: `max_output_tokens`, else the settings' cap."""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return self.settings.max_tokens if self.settings is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens and cost of one call."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0


# ── streamed chunks ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of reasoning summary."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a tool call; `index` ties pieces of one call together."""

    index: int
    tool_call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """The call ended; `usage` is the call's total.

    `stop_reason` is one of `STOP_REASONS`: any other is refused here (`ValueError`), so a
    hand-written client's OpenAI-style `"length"` cannot pass for a complete answer.
    """

    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    response_model: str | None = None
    """The model the provider says answered (`gpt-4o-2024-08-06` for `gpt-4o`), when it said."""
    refusal: str = ""
    """The words the model declined with, when it refused (OpenAI's `refusal`, sent apart
    from the text): never text of the answer. A refusal ends with `content_filter`."""

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"Finish.stop_reason is one of {', '.join(STOP_REASONS)}, not "
                f"{self.stop_reason!r} (OpenAI's 'stop' is 'end_turn', 'length' is "
                "'max_tokens', 'tool_calls' is 'tool_use', 'content_filter' stays)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RungStarted:
    """A family began an attempt on one rung (sent before that rung's chunks)."""

    rung: int
    model: str
    provider: str
    address: str | None = None
    """The rung's `api_base`, when it names one (None: the provider's own address)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RungFailed:
    """A family's rung failed; chunks seen since the last `RungStarted` are void."""

    rung: int
    model: str
    provider: str
    error: Exception
    latency_ms: float
    next_rung: int | None
    next_model: str | None


ModelChunk = TextDelta | ThinkingDelta | ToolCallDelta | Finish | RungStarted | RungFailed


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResponse:
    """A whole response, assembled from chunks."""

    text: str
    thinking: str
    tool_calls: tuple[ToolCallPart, ...]
    stop_reason: StopReason
    usage: Usage
    refusal: str = ""
    """The words the model declined with (`Finish.refusal`), apart from `text`."""


class ModelClient(Protocol):
    """Anything that can stream one model call.

    `stream` yields chunks and ends with exactly one `Finish`; it raises
    `turnkit.errors.ProviderError` (with `is_retriable`) when the provider fails.
    Cancelling the consuming task must abort the underlying provider request.
    """

    @property
    def model(self) -> str:
        """The model name, as audit rows show it."""
        ...

    @property
    def provider(self) -> str:
        """The provider name, as audit rows show it."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one call."""
        ...


def text_of(content: Content) -> str:
    """The text of a message's content (pictures left out)."""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def pictures_in(content: Content) -> int:
    """How many pictures a message's content carries."""
    if isinstance(content, str):
        return 0
    return sum(1 for part in content if isinstance(part, ImagePart))


def estimate_tokens(request: ModelRequest) -> int:
    """A provider-neutral token estimate of a request (about four characters a token).

    Used when a client cannot count its own tokens; litellm-backed clients count exactly.
    """
    chars = 0
    pictures = 0
    for message in request.messages:
        chars += len(text_of(message.content)) + 4
        pictures += pictures_in(message.content)
        chars += sum(len(c.name) + len(c.arguments) + 8 for c in message.tool_calls)
    chars += sum(len(t.name) + len(t.description) + len(str(t.parameters)) for t in request.tools)
    return chars // 4 + 1 + pictures * _TOKENS_PER_PICTURE


class closing_stream:
    """Close a model stream on the way out, like `contextlib.aclosing`.

    `async with closing_stream(client.stream(request)) as chunks:` calls the stream's
    `aclose` (where it has one) instead of leaving an unfinished generator, and the
    provider connection inside it, to the garbage collector.
    """

    __slots__ = ("_stream",)

    def __init__(self, stream: AsyncIterator[ModelChunk]) -> None:
        self._stream = stream

    async def __aenter__(self) -> AsyncIterator[ModelChunk]:
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()
