"""Input checks shared by every way in (SDK and HTTP): typed errors, nothing written."""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

from turnkit.agent import Effort
from turnkit.blocks import ContentPart, ImagePart, TextPart
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    ContentTooLargeError,
    EmptyContentError,
    InvalidInputError,
    InvalidSessionIdError,
)
from turnkit.ids import SessionId, is_valid_session_id

__all__ = (
    "MAX_PICTURES",
    "MessageContent",
    "TurnRequest",
    "check_session_id",
    "check_text",
    "check_title",
    "split_content",
    "validate_request",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRequest:
    """One validated request to run a turn (built by `SessionRuntime.submit`)."""

    session_id: SessionId
    content: str
    attachments: tuple[ImagePart, ...] = ()
    request_id: str | None = None
    effort: Effort | None = None


MAX_PICTURES = 20
"""Pictures one message may carry (the current message's own are never released)."""
MAX_PICTURE_BYTES = 20 * 1024 * 1024
"""The largest picture one message may carry inline (`ImagePart.data` or a `data:` URL)."""

MessageContent = str | Sequence[ContentPart]
"""What a person sends: text, or parts (text and pictures)."""


def inline_bytes(picture: ImagePart) -> int:
    """The bytes a picture carries inline: its `data`, or a `data:` URL's (0 for a link)."""
    if picture.data is not None:
        return len(picture.data)
    url = picture.url or ""
    if url[:5].lower() != "data:":
        return 0
    head, _, payload = url.partition(",")
    if not head.lower().endswith(";base64"):
        return len(payload)
    padding = len(payload) - len(payload.rstrip("="))
    return len(payload) * 3 // 4 - padding


def split_content(content: MessageContent) -> tuple[str, tuple[ImagePart, ...]]:
    """A message's text (its text parts, one paragraph each) and its pictures."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, Sequence):
        raise InvalidInputError(
            f"a message is text or a sequence of parts, not {type(content).__name__}"
        )
    texts: list[str] = []
    pictures: list[ImagePart] = []
    for part in content:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ImagePart):
            pictures.append(part)
        else:
            raise InvalidInputError(
                f"a message part must be a TextPart or an ImagePart, not {type(part).__name__}"
            )
    return "\n\n".join(texts), tuple(pictures)


def check_session_id(session_id: str) -> SessionId:
    """The id, or `InvalidSessionIdError`."""
    if not is_valid_session_id(session_id):
        raise InvalidSessionIdError(
            f"session id {session_id!r} has an unknown format: use 1-128 letters, digits "
            "or `_ . : -`, starting with a letter or digit",
            session_id=session_id,
        )
    return SessionId(session_id)


def check_text(value: str, what: str) -> str:
    """The text, or `InvalidInputError` if no database can store it.

    Refused: the NUL character, and a lone surrogate (U+D800-U+DFFF, as a file name decoded
    with `surrogateescape` carries), which is not text UTF-8 can encode.
    """
    if "\x00" in value:
        raise InvalidInputError(
            f"{what} contains the NUL character (U+0000), which cannot be stored: remove it",
            field=what,
        )
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidInputError(
                f"{what} contains a lone surrogate (U+{ord(value[exc.start]):04X} at "
                f"character {exc.start}), which is not valid Unicode text: remove it",
                field=what,
            ) from None
    return value


MAX_TITLE_CHARS = 500
"""The longest session title a caller may give (at creation or in a rename)."""


def check_title(title: str) -> str:
    """A session title a caller gave, or `InvalidInputError` (nothing is written then).

    1-500 characters, not only white space, and text a database can store: as the HTTP
    bodies of `POST /sessions` and `PATCH /sessions/{id}` check it.
    """
    if (
        not isinstance(title, str)
        or not title.strip()
        or len(title) > MAX_TITLE_CHARS
        or "\x00" in title
    ):
        raise InvalidInputError(
            "a session title is 1-500 characters, not only white space, without NUL"
        )
    return check_text(title, "the title")  # a lone surrogate: storable by no database


def validate_request(
    config: RuntimeConfig,
    session_id: str,
    message: MessageContent,
    request_id: str | None,
    effort: Effort | None,
) -> TurnRequest:
    """Check a message before anything is written."""
    sid = check_session_id(session_id)
    if effort is not None and effort not in get_args(Effort):
        raise InvalidInputError(
            f"effort {effort!r} is not one of {list(get_args(Effort))}", effort=str(effort)
        )
    content, attachments = split_content(message)
    if not content.strip() and not attachments:
        raise EmptyContentError("the message is empty: send some text", session_id=session_id)
    if len(attachments) > MAX_PICTURES:
        raise InvalidInputError(
            f"the message carries {len(attachments)} pictures; at most {MAX_PICTURES} fit "
            "one message",
            pictures=len(attachments),
        )
    for picture in attachments:
        size = inline_bytes(picture)
        if size > MAX_PICTURE_BYTES:
            raise ContentTooLargeError(
                f"a picture has {size} bytes; the limit is {MAX_PICTURE_BYTES}",
                chars=size,
                limit=MAX_PICTURE_BYTES,
            )
    if len(content) > config.max_content_chars:
        raise ContentTooLargeError(
            f"the message has {len(content)} characters; the limit is "
            f"{config.max_content_chars} (`RuntimeConfig.max_content_chars`)",
            chars=len(content),
            limit=config.max_content_chars,
        )
    if request_id is not None and not 0 < len(request_id) <= 128:
        raise InvalidInputError(
            f"request_id must be 1-128 characters, got {len(request_id)}",
            request_id=request_id,
        )
    check_text(content, "the message")
    if request_id is not None:
        check_text(request_id, "request_id")
    for picture in attachments:
        if picture.url is not None:
            _check_picture_url(check_text(picture.url, "a picture's url"))
    return TurnRequest(
        session_id=sid,
        content=content,
        attachments=attachments,
        request_id=request_id,
        effort=effort,
    )


def _check_picture_url(url: str) -> None:
    """A picture comes by `http(s)` or as a `data:image/...` URL; anything else is refused."""
    lowered = url.lower()
    if lowered.startswith("data:") and not lowered.startswith("data:image/"):
        kind = url[5:].split(";", 1)[0].split(",", 1)[0][:40] or "no media type"
        raise InvalidInputError(
            f"a picture's data: URL must carry an image type (data:image/...), not {kind!r}",
            url=url[:200],
        )
    head, _, payload = url.partition(",")
    if lowered.startswith("data:") and not payload:
        raise InvalidInputError("a picture's data: URL holds no bytes", url=url[:200])
    if lowered.startswith("data:") and head.lower().endswith(";base64"):
        try:
            binascii.a2b_base64(payload, strict_mode=True)
        except (binascii.Error, ValueError):
            raise InvalidInputError(
                "a picture's data: URL says base64 but its data is not base64", url=url[:200]
            ) from None
    if not lowered.startswith(("http://", "https://", "data:")):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise InvalidInputError(
            f"a picture's url must be http(s) or a data: URL, not {scheme!r}", url=url[:200]
        )
