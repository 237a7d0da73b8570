"""The litellm transport: `litellm.acompletion`'s stream read into turnkit chunks.

`LiteLLMClient` sends a call here when the direct transport (`_direct`, `_openai_stream`)
does not take it. Like `stream_chat`, `stream_litellm` yields the deltas and leaves the
finish reason, whether a tool call streamed, and the usage in a `StreamState`, so the
client ends both transports the same way. litellm arrives as an argument, as in `_errors`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import ModuleType

from turnkit.models import ModelChunk, TextDelta, ThinkingDelta, ToolCallDelta
from turnkit.models._openai_stream import StreamState, broken_stream, tool_call_piece

__all__ = ("close_stream", "delta_chunks", "stream_litellm")


async def stream_litellm(
    litellm: ModuleType, kwargs: dict[str, object], state: StreamState
) -> AsyncGenerator[ModelChunk, None]:
    """Call `litellm.acompletion(**kwargs)` and yield its deltas; `state` holds the rest.

    litellm's stream is closed on the way out, also when the consumer stops early.
    """
    state.words_dropped = True
    response = await litellm.acompletion(**kwargs)
    said_anything = False
    try:
        _refuse_a_web_page(response)
        async for chunk in response:
            said_anything = said_anything or _says_something(chunk)
            chunk_usage = getattr(chunk, "usage", None)
            if chunk_usage is not None:
                state.usage = chunk_usage
            # litellm names the requested model on its chunks; the provider's own word is
            # kept aside in `_hidden_params`.
            hidden = getattr(chunk, "_hidden_params", None)
            said = hidden.get("provider_response_model") if isinstance(hidden, dict) else None
            if isinstance(said, str) and said:
                state.model = said
            choices = getattr(chunk, "choices", None) or ()
            for choice in choices[:1]:
                reason = getattr(choice, "finish_reason", None)
                if reason:
                    state.finish_reason = str(reason)
                delta = getattr(choice, "delta", None)
                state.note(getattr(delta, "content", None), getattr(delta, "refusal", None))
                for piece in delta_chunks(delta):
                    state.saw_tool_call = state.saw_tool_call or isinstance(piece, ToolCallDelta)
                    if isinstance(piece, ThinkingDelta):
                        state.note(None, None, piece.text)
                    yield piece
        if not said_anything:
            _refuse_a_whole_answer(response)
    finally:
        await close_stream(response)


def _says_something(chunk: object) -> bool:
    """Whether a chunk carries a delta or usage (litellm adds an empty closing one)."""
    if getattr(chunk, "usage", None) is not None:
        return True
    for choice in getattr(chunk, "choices", None) or ():
        if delta_chunks(getattr(choice, "delta", None)):
            return True
    return False


def _refuse_a_whole_answer(response: object) -> None:
    """Raise when a 200 `application/json` body gave no event: a server ignoring `stream`.

    litellm reads no event from one whole answer and ends the stream as a finished, empty
    one; the direct transport reads the answer. Refused (retriable), never an empty answer.
    """
    kind = _content_type(response)
    if isinstance(kind, str) and kind.lower().startswith("application/json"):
        raise broken_stream(
            f"the response is one JSON answer, not a stream (content-type {kind!r}): the "
            "server ignored `stream`; use transport='auto', which reads such an answer"
        )


def _content_type(response: object) -> object:
    hidden = getattr(response, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    return headers.get("llm_provider-content-type") if isinstance(headers, dict) else None


def _refuse_a_web_page(response: object) -> None:
    """Raise when the 200 that litellm streams from is an HTML page (a proxy's error page).

    litellm reads no event from such a body and ends the stream as a finished, empty
    answer; the direct transport refuses any body that is not a chat-completion stream,
    and this keeps the two alike where a provider's stream can never be HTML.
    """
    kind = _content_type(response)
    if isinstance(kind, str) and kind.lower().startswith("text/html"):
        raise broken_stream(
            f"the response is not a chat-completion stream (content-type {kind!r}): check "
            "that api_base is the address of the provider's API"
        )


def delta_chunks(delta: object) -> list[ModelChunk]:
    """One litellm delta as turnkit chunks: thinking, then text, then tool-call pieces."""
    if delta is None:
        return []
    out: list[ModelChunk] = []
    reasoning = getattr(delta, "reasoning_content", None)
    if isinstance(reasoning, str) and reasoning:
        out.append(ThinkingDelta(reasoning))
    content = getattr(delta, "content", None)
    if isinstance(content, str) and content:
        out.append(TextDelta(content))
    for position, call in enumerate(getattr(delta, "tool_calls", None) or ()):
        index = getattr(call, "index", None)
        call_id = getattr(call, "id", None)
        function = getattr(call, "function", None)
        name = getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
        piece = tool_call_piece(index, position, call_id, name, arguments)
        if piece is not None:
            out.append(piece)
    return out


async def close_stream(response: object) -> None:
    """Close litellm's stream so its HTTP connection is released (also on cancellation)."""
    aclose = getattr(response, "aclose", None)
    close = getattr(response, "close", None)
    try:
        if callable(aclose):
            await aclose()
        elif callable(close):
            close()
    except Exception:  # noqa: BLE001 - best-effort cleanup must not hide the real outcome
        pass
