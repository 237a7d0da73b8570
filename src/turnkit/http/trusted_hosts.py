"""Requests only for the host names the server answers to (against DNS rebinding).

```python
app.add_middleware(TrustedHosts, hosts=["chat.example.com"])
```

A web page on another site can make a browser send requests to a server on the user's own
machine or network under a name the attacker controls (DNS rebinding): the browser then
treats the answers as that site's own. A server that checks the `Host` header answers such
requests with 400 `host-not-allowed`, and they reach no route. `turnkit serve` on a
loopback address allows `localhost`, `127.0.0.1` and `::1` by default.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from turnkit.errors import ConfigurationError
from turnkit.http.problems import problem_response

__all__ = ("LOOPBACK_HOSTS", "TrustedHosts", "host_name")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""What a server on a loopback address answers to by default."""


def host_name(header: str) -> str:
    """The name in a `Host` header: no port, no IPv6 brackets, no trailing dot, lower case."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        name = header[1 : header.find("]")] if "]" in header else header
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


class TrustedHosts:
    """ASGI middleware answering requests for other host names with 400 `host-not-allowed`.

    `hosts` are names (`chat.example.com`), addresses, or `*.example.com` for any
    subdomain; `*` allows every host (no check). Requests for the `exempt` paths (below
    where the app is mounted) pass whatever their host: the quickstart app exempts its
    health probes, which orchestrators and load balancers send by address.
    """

    def __init__(self, app: ASGIApp, *, hosts: Iterable[str], exempt: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = tuple(host_name(h) for h in hosts if h.strip())  # `x.com:443` is x.com
        if not self.hosts:
            raise ConfigurationError("TrustedHosts needs at least one host name (or '*')")
        self.anyone = "*" in self.hosts
        self.exempt = frozenset(exempt)

    def allows(self, name: str) -> bool:
        """Whether a request for `name` (from `host_name`) may reach the app."""
        if self.anyone:
            return True
        for host in self.hosts:
            if name == host or (host.startswith("*.") and name.endswith(host[1:])):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a request for an allowed host on; answer any other with a problem."""
        if scope["type"] != "http" or self.anyone or _path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        name = host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.allows(name):
            await self.app(scope, receive, send)
            return
        response = problem_response(
            400,
            "host-not-allowed",
            f"this server does not answer to the host {name!r}; list it in "
            "TURNKIT_ALLOWED_HOSTS (TrustedHosts' `hosts`) to allow it",
        )
        await response(scope, receive, send)


def _path(scope: Scope) -> str:
    """The request's path below where the app is mounted (Starlette keeps the whole path)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
