"""AG-UI's `RunAgentInput` on the wire, and the turnkit values the adapter reads from it.

The models are camelCase on the wire and accept unknown fields, as AG-UI allows; only what
the adapter reads is checked. `user_content` is the turn's content (the last user message)
and `resolution_of` the turnkit answer a `resume` entry gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from turnkit.blocks import ImagePart, TextPart
from turnkit.errors import InvalidInputError
from turnkit.pauses import Answer, Approve, Deny, Resolution
from turnkit.projection import PendingDecision

__all__ = (
    "ForwardedProps",
    "InputMessage",
    "InputToolCall",
    "ResumeEntry",
    "RunAgentInput",
    "resolution_of",
    "user_content",
)

_DISMISSED: Final = "(The person dismissed the question without answering.)"

# ── RunAgentInput: camelCase on the wire; unknown fields are accepted, as AG-UI allows ──

_WIRE = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)


class _Function(BaseModel):
    model_config = _WIRE
    name: str
    arguments: str = ""


class InputToolCall(BaseModel):
    """A tool call inside an assistant message the client holds."""

    model_config = _WIRE
    tool_call_id: str = Field(alias="id")
    function: _Function


class InputMessage(BaseModel):
    """One message of the client's conversation; only what the adapter reads is checked."""

    model_config = _WIRE
    message_id: str = Field(default="", alias="id")
    role: str
    content: JsonValue = None
    tool_calls: tuple[InputToolCall, ...] = Field(default=(), fail_fast=True)
    tool_call_id: str | None = None


class ResumeEntry(BaseModel):
    """The answer to one interrupt: `payload` is `{"approved": bool}` or `{"answer": str}`."""

    model_config = _WIRE
    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: JsonValue = None


class ForwardedProps(BaseModel):
    """What the adapter reads of `forwardedProps`: a hosted agent's name and the effort."""

    model_config = _WIRE
    agent: str | None = None
    effort: Literal["off", "low", "medium", "high"] | None = None


class RunAgentInput(BaseModel):
    """AG-UI's run request. `tools`, `context` and `state` are accepted and not used."""

    model_config = _WIRE
    thread_id: str = Field(min_length=1, max_length=128)
    run_id: str = Field(min_length=1, max_length=128)
    parent_run_id: str | None = None
    state: JsonValue = None
    # fail_fast: a body of a million bad items stops at the first, not a million errors.
    messages: tuple[InputMessage, ...] = Field(default=(), fail_fast=True)
    tools: tuple[JsonValue, ...] = Field(default=(), fail_fast=True)
    context: tuple[JsonValue, ...] = Field(default=(), fail_fast=True)
    forwarded_props: ForwardedProps = Field(default_factory=ForwardedProps)
    resume: tuple[ResumeEntry, ...] | None = Field(default=None, fail_fast=True)
    """The interrupts answered; an empty list is no resume, as AG-UI reads it."""

    @field_validator("resume")
    @classmethod
    def _empty_is_none(
        cls, value: tuple[ResumeEntry, ...] | None
    ) -> tuple[ResumeEntry, ...] | None:
        return value or None


# ── the turnkit values of an input ────────────────────────────────────────────────────


def user_content(messages: Sequence[InputMessage]) -> str | list[TextPart | ImagePart]:
    """The last user message's content: text, or text and image parts."""
    for message in reversed(messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        if isinstance(message.content, list):
            return [_part(part) for part in message.content]
        raise InvalidInputError("a user message's content is text or a list of parts")
    raise InvalidInputError("the input has no user message: its last one is the turn's content")


def _part(part: JsonValue) -> TextPart | ImagePart:
    """An AG-UI content part as a turnkit one (text, or an image by URL or inline data)."""
    fields = part if isinstance(part, dict) else {}
    source = fields.get("source")
    try:
        if fields.get("type") == "text" and isinstance(text := fields.get("text"), str):
            return TextPart(text=text)
        if fields.get("type") == "image" and isinstance(source, dict):
            where = {"url": "url", "data": "data"}.get(str(source.get("type")))
            if where is not None:
                return ImagePart.model_validate(
                    {where: source.get("value"), "media_type": source.get("mimeType", "image/png")}
                )
    except ValidationError as exc:
        raise InvalidInputError(f"an image part does not fit: {exc.errors()[0]['msg']}") from exc
    if fields.get("type") == "image":
        kind = source.get("type") if isinstance(source, dict) else None
        raise InvalidInputError(
            f"an image part's source must be of type 'url' or 'data', not {kind!r}"
        )
    raise InvalidInputError(
        f"content parts of type {fields.get('type')!r} are not supported (text and image are)"
    )


def resolution_of(request: PendingDecision, entry: ResumeEntry) -> Resolution:
    """The turnkit answer a resume entry gives."""
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    try:
        if request.kind == "approval":
            if entry.status == "cancelled":
                return Deny(note="The person cancelled instead of approving.")
            approved, note = payload.get("approved"), payload.get("note")
            edited = payload.get("editedArgs")
            if isinstance(approved, bool) and (
                edited is None or (approved and isinstance(edited, dict))
            ):
                text = note if isinstance(note, str) else None
                if not approved:
                    return Deny(note=text)
                return Approve(note=text, arguments=edited)
            raise InvalidInputError(
                'answer an approval with the payload {"approved": true | false, "note"?: "…", '
                '"editedArgs"?: {…}} (editedArgs, the call\'s arguments as the person changed '
                "them, go with approved: true only)"
            )
        if entry.status == "cancelled":
            return Answer(text=_DISMISSED)
        answer = entry.payload if isinstance(entry.payload, str) else payload.get("answer")
        if isinstance(answer, str):
            return Answer(text=answer)
        raise InvalidInputError('answer a question with the payload {"answer": "…"}')
    except ValidationError as exc:
        raise InvalidInputError(
            f"the resume payload does not fit: {exc.errors()[0]['msg']}"
        ) from exc
