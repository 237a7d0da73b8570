"""Requests in the OpenAI chat format: what both transports send for a model call.

Neutral `ModelMessage`s and `ToolSpec`s become OpenAI chat dicts here, and nowhere else:
`LiteLLMClient` builds one set of call arguments from them, which the direct stream and
litellm's path both send.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from turnkit.blocks import ContentPart, ImagePart, TextPart
from turnkit.errors import InvalidInputError
from turnkit.models import Content, ModelMessage, ToolSpec, text_of
from turnkit.models.call_ids import fresh_call_id

__all__ = ("NOTE_PREFIX", "message_dicts", "part_dict", "tool_dict")

NOTE_PREFIX = (
    "Operator note (not from the user): the following was originally a mid-conversation "
    "system-role reminder."
)
"""What a system note sent as a user message starts with (litellm's words for Anthropic)."""


def part_dict(part: ContentPart) -> dict[str, object]:
    """One text or picture part as an OpenAI content part (a picture's bytes as a data URL)."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    url = part.url
    if url is None:
        assert part.data is not None  # an ImagePart has exactly one of url and data
        url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _content(content: Content) -> object:
    return content if isinstance(content, str) else [part_dict(p) for p in content]


class _SentIds:
    """The id each tool call goes by in one request: its own, unless a provider would refuse it.

    turnkit names new calls safely and uniquely, but a session an older turnkit wrote may
    repeat an id across turns (some servers number calls per response) or keep one with
    other characters, which Anthropic refuses (a repeated id) and OpenAI too (over 40
    characters). Such a call and the tool message answering it go by a fresh id, worked out
    from the messages before them only: the same list sends the same bytes every time.
    """

    __slots__ = ("_given", "_used")

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._given: dict[str, str] = {}
        """A call's id as stored, and the id its latest call goes by."""

    def call(self, given: str) -> str:
        sent = fresh_call_id(given, self._used)
        self._used.add(sent)
        self._given[given] = sent
        return sent

    def answer(self, given: str) -> str:
        return self._given.get(given, given)


def _message_dict(
    message: ModelMessage, *, omit_empty: bool = False, ids: _SentIds | None = None
) -> dict[str, object]:
    """One neutral message as an OpenAI chat message (a tool's pictures left out)."""
    ids = ids if ids is not None else _SentIds()
    out: dict[str, object] = {"role": message.role}
    if message.role == "assistant" and message.tool_calls:
        said = text_of(message.content)
        if said or not omit_empty:  # OpenAI's: no `content`, as its SDK sends it (not null)
            out["content"] = said or None
        out["tool_calls"] = [
            {
                "id": ids.call(call.tool_call_id),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    elif message.role == "tool":
        out["content"] = text_of(message.content)
    else:
        out["content"] = _content(message.content)
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidInputError(
                "a 'tool' message needs tool_call_id: set it to the id of the call it answers"
            )
        out["tool_call_id"] = ids.answer(message.tool_call_id)
    elif message.name:
        out["name"] = message.name
    return out


def message_dicts(
    messages: Sequence[ModelMessage], *, notes_in_place: bool = False, omit_empty: bool = False
) -> list[dict[str, object]]:
    """Neutral messages as OpenAI chat messages.

    OpenAI-style tool messages carry text only, so the pictures a batch of tool results
    returned follow that batch as one user message (deterministically, so the prompt
    prefix stays byte-identical from call to call).

    `omit_empty`: an assistant's tool calls with no text go without `content` (OpenAI's
    SDK drops a null one, so both of its transports send the same bytes); other
    providers get `null`, which some OpenAI-style servers require.

    `notes_in_place`: for a provider whose API has one system prompt, into which litellm
    moves every system message (Gemini's), a system message after the conversation began
    (a plan, a skill, a plugin's note) goes as a user message saying it is an operator's
    note, where it stands, as litellm itself does for Anthropic. Moved to the system
    prompt, every earlier turn's notes would pile up there, out of place, and change the
    start of every later request.
    """
    out: list[dict[str, object]] = []
    pictures: list[dict[str, object]] = []
    began = False
    ids = _SentIds()
    for message in messages:
        if message.role != "tool" and pictures:
            out.append({"role": "user", "content": pictures})
            pictures = []
        if notes_in_place and began and message.role == "system":
            out.append({"role": "user", "content": f"{NOTE_PREFIX}\n\n{text_of(message.content)}"})
            continue
        began = began or message.role != "system"
        sent = _message_dict(message, omit_empty=omit_empty, ids=ids)
        out.append(sent)
        if message.role == "tool" and not isinstance(message.content, str):
            shown = [part_dict(p) for p in message.content if isinstance(p, ImagePart)]
            if shown:
                label = f"Pictures returned by tool call {sent['tool_call_id']}:"
                pictures += [{"type": "text", "text": label}, *shown]
    if pictures:
        out.append({"role": "user", "content": pictures})
    return out


def tool_dict(tool: ToolSpec) -> dict[str, object]:
    """A tool's spec as an OpenAI function tool."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
