"""Requests that change something only from the app's own origin (against request forgery).

```python
app.add_middleware(CrossOriginProtection, origins=["https://chat.example.com"])
```

A page on another site can make a visitor's browser send a form, or a `fetch` in
`no-cors` mode, to your API with the visitor's cookies: a POST with no body (create a
session, Stop, Retry) needs no CORS preflight. Browsers say where such a request comes
from (`Sec-Fetch-Site` to HTTPS and localhost, else `Origin`), so a request other than
GET, HEAD or OPTIONS that a browser sent from another origin gets 403
`cross-origin-request` and reaches no route, unless its origin is listed. Requests that
carry neither header (curl, SDKs, other servers) are not a browser's and pass. This is
the check of Go's `net/http.CrossOriginProtection`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from turnkit.errors import ConfigurationError
from turnkit.http.problems import problem_response

__all__ = ("CrossOriginProtection", "checked_origins")

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # CORS still guards what is read

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(value: str, source: str) -> str:
    """`value` as browsers write an `Origin`: lower case, no default port."""
    text = value.strip().lower()
    if text == "*":
        return text

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"{source}: {value!r} is not an origin ({why}); write scheme://host[:port], "
            "such as https://chat.example.com"
        )

    scheme, _, rest = text.partition("://")
    if not rest or not _SCHEME.fullmatch(scheme):
        raise refuse("no scheme")
    if re.search(r"[\s\x00-\x1f\x7f]", text):
        raise refuse("it has a space or control character")
    if "*" in rest:
        raise refuse("no wildcards: list each origin")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise refuse("it has a path, query or fragment")
    if parts.username is not None:
        raise refuse("it has a user name")
    if not parts.hostname:
        raise refuse("no host")
    try:  # browsers send a non-ASCII name in its ASCII form (punycode)
        host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError:
        raise refuse("a host name that is not one") from None
    host = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def checked_origins(origins: Iterable[str], *, source: str = "origins") -> tuple[str, ...]:
    """`origins` written as browsers send them (`https://x.com:443` is `https://x.com`).

    Each is `scheme://host[:port]`, or `*` for any origin (no check).

    Raises:
        ConfigurationError: one is not an origin; the message names `source`.
    """
    if isinstance(origins, str):
        raise ConfigurationError(f"{source} is a list of origins, not the string {origins!r}")
    return tuple(_origin(o, source) for o in origins if o.strip())


def _host_of(origin: str) -> str | None:
    """The `host[:port]` of an `Origin` header; None for `null` or one that does not parse."""
    try:
        return urlsplit(origin).netloc or None
    except ValueError:
        return None


class CrossOriginProtection:
    """ASGI middleware answering browsers' cross-origin unsafe requests with 403.

    `origins` are the other origins trusted to send them (`https://chat.example.com`,
    exact: scheme, host and port); `*` trusts every origin (no check). The app's own
    origin needs no listing.
    """

    def __init__(self, app: ASGIApp, *, origins: Iterable[str] = ()) -> None:
        self.app = app
        self.origins = frozenset(checked_origins(origins))
        self.anyone = "*" in self.origins

    def allows(self, method: str, *, host: str, origin: str | None, fetch_site: str | None) -> bool:
        """Whether a request with these headers may reach the app (None: header absent)."""
        if self.anyone or method in _SAFE_METHODS:
            return True
        if fetch_site:  # browsers send it to HTTPS and localhost addresses
            return fetch_site in ("same-origin", "none") or self._trusts(origin)
        if origin is None:  # not a browser, or one too old to send `Origin` either
            return True
        # Plain HTTP, or an older browser: same origin when `Origin` names the request's host.
        # Only the scheme is not compared (`Host` has none); HSTS closes that gap.
        return _host_of(origin.lower()) == host.lower() or self._trusts(origin)

    def _trusts(self, origin: str | None) -> bool:
        return origin is not None and origin.strip().lower() in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an allowed request on; answer any other with a problem."""
        if scope["type"] != "http" or self.anyone or scope["method"] in _SAFE_METHODS:
            await self.app(scope, receive, send)  # websocket, lifespan, reads
            return
        headers = dict(scope.get("headers") or ())
        origin, fetch_site = headers.get(b"origin"), headers.get(b"sec-fetch-site")
        said = origin.decode("latin-1") if origin is not None else None
        allowed = self.allows(
            scope["method"],
            host=headers.get(b"host", b"").decode("latin-1"),
            origin=said,
            fetch_site=fetch_site.decode("latin-1").strip().lower() if fetch_site else None,
        )
        if allowed:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        detail = (
            f"a browser sent this {method} from {said!r}, an origin this server does not "
            "trust; list it in TURNKIT_ALLOWED_ORIGINS (CrossOriginProtection's `origins`) "
            "to allow it"
            if said is not None
            else f"a browser sent this {method} from another site, without an Origin header"
        )
        response = problem_response(403, "cross-origin-request", detail)
        await response(scope, receive, send)
