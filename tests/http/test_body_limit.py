"""The quickstart app refuses oversized request bodies while they arrive, over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI, Request
from tests.support.server import serve

from turnkit import RuntimeConfig, SessionRuntime
from turnkit.demo import demo_agent
from turnkit.errors import ConfigurationError
from turnkit.http.body_limit import DEFAULT_MAX_BODY_BYTES, RequestBodyLimit
from turnkit.quickstart import create_app, max_body_bytes_from_env

LIMIT = 64 * 1024


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    runtime = SessionRuntime(
        agent=demo_agent(), config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'b.db'}")
    )
    with serve(create_app(runtime, max_body_bytes=LIMIT)) as url:
        yield url


def _sessions(url: str) -> list[str]:
    listed = httpx.get(f"{url}/api/harness/sessions", timeout=10).json()
    return [s["sessionId"] for s in listed]


def test_a_declared_length_over_the_bound_is_refused_before_the_route(base_url: str) -> None:
    body = {"content": "x" * (LIMIT + 10)}
    response = httpx.post(f"{base_url}/api/harness/sessions/big/execute", json=body, timeout=10)
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "content-too-large"
    assert str(LIMIT) in problem["detail"]
    assert "big" not in _sessions(base_url)  # nothing was written


def test_a_chunked_body_is_cut_off_once_it_passes_the_bound(base_url: str) -> None:
    """No length declared: the server answers 413 once the bound passes and reads no more."""
    where = urlsplit(base_url)
    chunk = b"y" * 4096
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    sent = 0
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/harness/sessions/chunked/execute HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'f\r\n{"content": "xx\r\n'
        )
        answer = b""
        sock.settimeout(0.05)
        for _ in range(4096):  # up to 16 MiB, unless the server stops reading first
            try:
                sock.sendall(frame)
                sent += len(chunk)
            except OSError:  # the server closed the connection
                break
            try:
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        sock.settimeout(10)
        try:
            while more := sock.recv(65536):  # the server closes: the loop ends
                answer += more
        except ConnectionResetError:
            pass
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"content-too-large" in answer
    assert b"connection: close" in answer.lower()
    assert sent < 8 * LIMIT  # it stopped well before the 16 MiB the client had to send
    assert "chunked" not in _sessions(base_url)


def test_a_body_under_the_bound_runs_its_turn(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/api/harness/sessions/small/execute",
        json={"content": "What is 2+3?"},
        timeout=30,
    )
    assert response.status_code == 200
    assert '"type":"done","status":"succeeded"' in response.text
    assert "small" in _sessions(base_url)


def test_a_refused_body_closes_the_connection_without_reading_the_rest(base_url: str) -> None:
    """A client that declares 10 GB gets its answer at once; the server reads none of it."""
    where = urlsplit(base_url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/harness/sessions/huge/execute HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{"
        )
        answer = b""
        while chunk := sock.recv(65536):  # the server closes: the loop ends
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"content-too-large" in answer


def test_the_bound_comes_from_the_environment() -> None:
    assert max_body_bytes_from_env({}) == DEFAULT_MAX_BODY_BYTES
    assert max_body_bytes_from_env({"TURNKIT_MAX_BODY_BYTES": ""}) == DEFAULT_MAX_BODY_BYTES
    assert max_body_bytes_from_env({"TURNKIT_MAX_BODY_BYTES": "1048576"}) == 1048576
    assert max_body_bytes_from_env({"TURNKIT_MAX_BODY_BYTES": "off"}) is None
    for bad in ("0", "-5", "64MB"):
        with pytest.raises(ConfigurationError, match="TURNKIT_MAX_BODY_BYTES"):
            max_body_bytes_from_env({"TURNKIT_MAX_BODY_BYTES": bad})


def test_an_app_of_your_own_gets_the_same_problem_body_either_way() -> None:
    """The guide's snippet: a plain FastAPI app, no turnkit problem handlers installed."""
    app = FastAPI()
    app.add_middleware(RequestBodyLimit, max_bytes=LIMIT)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b"z" * LIMIT

    with serve(app) as url:
        assert httpx.post(f"{url}/echo", content=b"z" * 10, timeout=10).json() == {"bytes": 10}
        declared = httpx.post(f"{url}/echo", content=b"z" * (LIMIT + 1), timeout=10)
        streamed = httpx.post(f"{url}/echo", content=chunks(), timeout=10)
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "content-too-large"


def test_a_bound_below_one_byte_is_refused_when_the_app_is_made(tmp_path: Path) -> None:
    runtime = SessionRuntime(
        agent=demo_agent(), config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'z.db'}")
    )
    for bad in (0, -1):
        with pytest.raises(ConfigurationError, match="a whole number of 1 or more"):
            create_app(runtime, max_body_bytes=bad)
