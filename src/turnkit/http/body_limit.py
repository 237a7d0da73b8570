"""A bound on request bodies, checked while they arrive rather than after they are read.

```python
app.add_middleware(RequestBodyLimit, max_bytes=64 * 1024 * 1024)
```

A body whose `Content-Length` is over the bound is refused before any of it is read; a
body without one (chunked) is refused as soon as what arrived passes the bound. Either way
the client gets 413 `content-too-large` as a problem body, and no route sees the request.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnkit.errors import ConfigurationError
from turnkit.http.problems import problem_response

__all__ = ("DEFAULT_MAX_BODY_BYTES", "RequestBodyLimit", "checked_bound")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""What `turnkit serve` accepts by default: two of the largest inline pictures, in base64."""


class BodyTooLargeError(HTTPException):
    """The body passed the bound while a route was reading it.

    An `HTTPException`, so FastAPI's body parsing passes it on as it is; whatever the app
    answers to it, the middleware sends its own 413 instead.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _detail(max_bytes))


def _detail(max_bytes: int) -> str:
    return f"the request body is over {max_bytes} bytes, the most this server accepts"


def checked_bound(max_bytes: int) -> int:
    """`max_bytes`, once it is a whole number of 1 or more.

    Raises:
        ConfigurationError: it is not.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigurationError(f"max_bytes is a whole number of 1 or more, not {max_bytes!r}")
    return max_bytes


class RequestBodyLimit:
    """ASGI middleware refusing request bodies over `max_bytes` with 413 `content-too-large`."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = checked_bound(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, counting its body; refuse it once it passes the bound."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = over = False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if over and not started:  # the app's own answer to the refusal: ours goes instead
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLargeError:
            if started:  # a route that streams its answer while it reads: nothing to add
                raise
        if over and not started:  # raised through, or answered by the app's own handler
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(413, "content-too-large", _detail(self.max_bytes))
        response.headers["Connection"] = "close"  # the rest of the body is never read
        await response(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    """The request's `Content-Length`, or 0 when it has none (or one that is not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server refuses a malformed length itself
    return 0
