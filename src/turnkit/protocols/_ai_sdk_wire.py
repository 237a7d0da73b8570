"""The AI SDK's chat request on the wire, and the turnkit values the adapter reads from it.

`ChatRequest` is the body `DefaultChatTransport.sendMessages` posts; a message's `parts` are
kept as the client sent them and read here. `user_content` is the turn's content a user
message gives (its text, and its pictures) and `pending_answer` the answer an assistant
message carries to a turn's open pause (an approval response, or a question's tool output).
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from turnkit.blocks import ImagePart, TextPart
from turnkit.errors import InvalidInputError
from turnkit.pauses import CLARIFY_TOOL, Answer, Approve, Deny, Resolution, call_request_id
from turnkit.projection import PendingDecision
from turnkit.store import TurnRecord

__all__ = ("ChatRequest", "UIMessage", "pending_answer", "user_content")


class UIMessage(BaseModel):
    """One `UIMessage` of the SDK's request: `parts` are kept as the client sent them."""

    model_config = ConfigDict(extra="ignore")  # the SDK adds fields over versions
    id: str = Field(max_length=256)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, JsonValue]] = Field(max_length=10_000, fail_fast=True)


class ChatRequest(BaseModel):
    """The body `DefaultChatTransport.sendMessages` posts (extra `body` fields are ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    id: str = Field(min_length=1, max_length=128, description="The chat id: a session id.")
    # fail_fast: a body of a million bad messages stops at the first, not a million errors.
    messages: list[UIMessage] = Field(min_length=1, fail_fast=True)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = Field(default=None, alias="messageId")


# ── the turnkit values of a message ───────────────────────────────────────────────────


def user_content(message: UIMessage) -> str | list[TextPart | ImagePart]:
    """The turn's content: the message's text parts, and its pictures (`file` parts)."""
    texts: list[str] = []
    pictures: list[ImagePart] = []
    for part in message.parts:
        kind, text = part.get("type"), part.get("text")
        if kind == "text" and isinstance(text, str):
            texts.append(text)
        elif kind == "file":
            url, media_type = part.get("url"), part.get("mediaType")
            if not (isinstance(url, str) and isinstance(media_type, str)):
                raise InvalidInputError("a `file` part needs a `url` and a `mediaType`")
            if not media_type.startswith("image/"):
                raise InvalidInputError(
                    f"only pictures can be attached, not {media_type!r}", media_type=media_type
                )
            pictures.append(ImagePart(url=url, media_type=media_type))
    text = "\n".join(texts)
    if not pictures:
        return text
    return [TextPart(text=text), *pictures]


def pending_answer(
    record: TurnRecord, pause: PendingDecision, message: UIMessage
) -> tuple[str, Resolution]:
    """The answer the assistant message carries to the turn's open pause."""
    tools = [p for p in message.parts if str(p.get("type", "")).startswith(("tool-", "dynamic-"))]
    if pause.kind == "approval":
        for part in tools:
            approval = part.get("approval")
            if part.get("state") != "approval-responded" or not isinstance(approval, dict):
                continue
            if approval.get("id") != pause.request_id:
                continue
            reason = approval.get("reason")
            note = reason if isinstance(reason, str) else None
            decision = Approve(note=note) if approval.get("approved") is True else Deny(note=note)
            return pause.request_id, decision
        raise InvalidInputError(
            f"the turn waits for approval {pause.request_id!r}: answer it with "
            "addToolApprovalResponse before sending",
            request_id=pause.request_id,
        )
    for part in tools:
        call_id = part.get("toolCallId")
        if part.get("state") != "output-available" or not isinstance(call_id, str):
            continue
        output = part.get("output")
        if pause.asked is not None:  # handed over by an asked agent: the answer names it
            if not isinstance(output, dict) or output.get("requestId") != pause.request_id:
                continue
        elif call_request_id(record.turn_id, call_id) != pause.request_id:
            continue
        if isinstance(output, dict) and isinstance(output.get("answer"), str):
            output = output["answer"]
        return pause.request_id, Answer(
            text=output if isinstance(output, str) else json.dumps(output)
        )
    if pause.asked is not None:
        raise InvalidInputError(
            f"the turn waits for an answer to the {pause.asked.agent!r} agent's question: "
            "send it with addToolOutput for the call that asked that agent, output "
            f"{{answer, requestId: {pause.request_id!r}}}",
            request_id=pause.request_id,
        )
    raise InvalidInputError(
        f"the turn waits for an answer to its question: send it with addToolOutput for "
        f"the `{CLARIFY_TOOL}` call",
        request_id=pause.request_id,
    )
