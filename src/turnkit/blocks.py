"""Typed turn blocks: what a turn leaves behind, in order."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)

from turnkit.errors import InvalidInputError
from turnkit.ids import ToolCallId

__all__ = (
    "BLOCK_ADAPTER",
    "Block",
    "ContentPart",
    "ImagePart",
    "TextPart",
    "TextBlock",
    "ThinkingSummaryBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UserBlock",
)

_CONFIG = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def _problems(error: ValidationError) -> str:
    said = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"])
        what = str(item["ctx"]["error"]) if item["type"] == "value_error" else item["msg"]
        said.append(f"{where}: {what}" if where else what)
    return "; ".join(said)


class _Part(BaseModel):
    """A message part: built wrong in Python, `InvalidInputError` (as over HTTP).

    Pydantic calls this `__init__` for a part inside a model it validates too; there the
    error, a `ValueError`, becomes a line of that model's `ValidationError`.
    """

    if not TYPE_CHECKING:  # the pydantic plugin's typed signature stays for type checkers

        def __init__(self, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as exc:
                name = type(self).__name__
                raise InvalidInputError(f"{name}: {_problems(exc)}") from exc


class TextPart(_Part):
    """A piece of text inside a message that also carries pictures."""

    model_config = _CONFIG
    kind: Literal["text"] = "text"
    text: str


class ImagePart(_Part):
    """A picture: by `url` (http(s) or a `data:` URL), or as raw `data` with a media type."""

    model_config = _CONFIG
    kind: Literal["image"] = "image"
    url: str | None = None
    data: (
        Annotated[bytes, WithJsonSchema({"type": "string", "contentEncoding": "base64"})] | None
    ) = None
    """The picture's bytes (base64 in JSON)."""
    media_type: str = "image/png"
    """The picture's MIME type, e.g. `image/png` or `image/jpeg`."""

    @field_validator("data", mode="before")
    @classmethod
    def _from_base64(cls, value: object) -> object:
        """Text is base64 (as in JSON; either alphabet); bytes are taken as they are."""
        if isinstance(value, str):
            try:
                standard = value.replace("-", "+").replace("_", "/")
                return base64.b64decode(standard, validate=True)
            except ValueError as exc:
                raise ValueError("`data` text must be base64") from exc
        return value

    @field_validator("media_type", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        """MIME types ignore case: `IMAGE/PNG` is `image/png`."""
        return value.lower() if isinstance(value, str) else value

    @field_serializer("data", when_used="json")
    def _to_base64(self, value: bytes | None) -> str | None:
        return None if value is None else base64.b64encode(value).decode()

    @model_validator(mode="after")
    def _one_source(self) -> ImagePart:
        if (self.url is None) == (self.data is None):
            raise ValueError("an image needs exactly one of `url` or `data`")
        if self.data is not None and not self.data:
            raise ValueError("an image's `data` is empty")
        if not self.media_type.startswith("image/"):
            raise ValueError(f"media_type {self.media_type!r} is not an image type")
        return self


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="kind")]
"""One part of a multimodal user message or tool result."""


class UserBlock(BaseModel):
    """The user's message that opened the turn."""

    model_config = _CONFIG
    kind: Literal["user"] = "user"
    text: str
    attachments: tuple[ImagePart, ...] = ()
    """Pictures the person attached to the message."""


class TextBlock(BaseModel):
    """Assistant text: narration written in a tool-using pass, or the answer."""

    model_config = _CONFIG
    kind: Literal["text"] = "text"
    block_id: str
    """Stable id of the block; deltas of the same block carry it."""
    text: str
    is_answer: bool = False
    """True only for the one block the synthesize stage wrote."""
    interrupted: bool = False
    """Stop cut the block while it was being written: this is its text so far."""
    # Written only when true: a turnkit from before the field reads every other answer's
    # block (during a rolling deploy, a process of either may take a turn over).
    filtered: bool = Field(default=False, exclude_if=lambda filtered: not filtered)
    """The provider's content filter stopped the call after this text: it is incomplete."""


class ThinkingSummaryBlock(BaseModel):
    """A safe summary of what the model considered; raw reasoning never leaves the runtime."""

    model_config = _CONFIG
    kind: Literal["thinking"] = "thinking"
    block_id: str
    summary: str


class ToolUseBlock(BaseModel):
    """A tool call the model made; `arguments` is `{}` when they were not a JSON object."""

    model_config = _CONFIG
    kind: Literal["tool_use"] = "tool_use"
    tool_call_id: ToolCallId
    tool_name: str
    arguments: dict[str, JsonValue]


def _unset(value: object) -> bool:
    return value is None


class ToolResultBlock(BaseModel):
    """What a tool answered, or why it failed; the model reads both."""

    model_config = _CONFIG
    kind: Literal["tool_result"] = "tool_result"
    tool_call_id: ToolCallId
    tool_name: str
    output: JsonValue = None
    """The tool's return value as JSON (None when it failed)."""
    is_error: bool = False
    error: str | None = None
    """Why the call failed, written for the model to read."""
    arguments: dict[str, JsonValue] | None = Field(default=None, exclude_if=_unset)
    """The arguments the call ran with when a person changed them at approval (absent: the
    model's, as its `tool.started` shows them; left out then, so a reader of an earlier
    version still reads the block)."""


Block = Annotated[
    UserBlock | TextBlock | ThinkingSummaryBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="kind"),
]
BLOCK_ADAPTER: TypeAdapter[Block] = TypeAdapter(Block)
