"""SSE framing: frames ready together go out in one write, and read back the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from httpx_sse._decoders import SSEDecoder
from tests.helpers import WriteRecorder

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.http import create_turnkit_router
from turnkit.http.sse import frames_to_sse
from turnkit.runtime.reader import KEEPALIVE, Frame
from turnkit.testing import ModelStep, ScriptedModel

API = "/api/harness"


def _decode(raw: bytes) -> list[tuple[str, str]]:
    """(id, data) of each event an SSE client dispatches from `raw`."""
    decoder, events = SSEDecoder(), []
    for line in raw.decode().splitlines():
        if (event := decoder.decode(line)) is not None:
            events.append((event.id, event.data))
    return events


async def _chunks(batches: list[object], max_frame_bytes: int = 1_000_000) -> list[bytes]:
    async def source() -> AsyncIterator[object]:
        for batch in batches:
            yield batch

    return [c async for c in frames_to_sse(source(), max_frame_bytes=max_frame_bytes, turn_id="t")]


async def test_a_batch_is_one_write_that_decodes_to_its_frames_in_order() -> None:
    batch = [Frame(1, b'{"n":1}'), Frame(None, b'{"n":2}'), Frame(2, b'{"n":3}')]
    [chunk] = await _chunks([batch])
    # An ephemeral frame has no id line: a client keeps the last id it saw.
    assert _decode(chunk) == [("1", '{"n":1}'), ("1", '{"n":2}'), ("2", '{"n":3}')]


async def test_a_keep_alive_is_a_comment_no_client_dispatches() -> None:
    chunks = await _chunks([KEEPALIVE, [Frame(1, b"{}")]])
    assert chunks[0] == b": keep-alive\n"
    assert _decode(b"".join(chunks)) == [("1", "{}")]


async def test_data_with_line_breaks_becomes_several_data_lines() -> None:
    [chunk] = await _chunks([[Frame(3, b'{"a":\n1,\r\n"b":2}')]])
    assert _decode(chunk) == [("3", '{"a":\n1,\n"b":2}')]


async def test_a_large_batch_is_written_in_pieces_of_about_64_kib() -> None:
    frames = [Frame(seq, b'"' + b"x" * 10_000 + b'"') for seq in range(1, 21)]
    chunks = await _chunks([frames])
    assert len(chunks) == 3  # 20 frames of ~10 kB: 7 + 7 + 6
    assert [int(i) for i, _ in _decode(b"".join(chunks))] == list(range(1, 21))


async def test_an_oversized_frame_in_a_batch_is_dropped_and_the_rest_sent() -> None:
    [chunk] = await _chunks([[Frame(1, b"{}"), Frame(2, b"x" * 50), Frame(3, b"{}")]], 40)
    assert b": dropped oversized frame seq=2 bytes=50\n" in chunk
    assert _decode(chunk) == [("1", "{}"), ("3", "{}")]


async def test_a_fast_turn_streams_in_far_fewer_writes_than_events(tmp_path: Path) -> None:
    """A model that never suspends: its deltas go out a batch per write, all of them, in order."""
    text = "abcdefghij" * 30
    model = ScriptedModel([ModelStep.text_reply(text, chunk_size=1)])
    runtime = SessionRuntime(
        agent=Agent(model=model, skip_stages=frozenset({"anchor-plan"})),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'fast.db'}"),
    )
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime))
    recording = WriteRecorder(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=recording), base_url="http://test"
    ) as http:
        response = await http.post(f"{API}/sessions/fast/execute", json={"content": "go"})
    await runtime.close()
    assert response.status_code == 200
    events: list[dict[str, Any]] = [json.loads(data) for _, data in _decode(response.content)]
    deltas = [e["text"] for e in events if e["type"] == "message.delta"]
    assert "".join(deltas) == text
    seqs = [e["seq"] for e in events if "seq" in e]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[-1]["type"] == "done"
    assert len(recording.writes) < len(events) / 4


async def test_a_database_outage_ends_the_stream_cleanly_with_a_retry() -> None:
    """The reader lost the Store mid-stream: no cut connection, a reconnect after it."""
    from turnkit.errors import StoreUnavailableError

    async def source() -> AsyncIterator[object]:
        yield [Frame(seq=7, data=b'{"seq":7}')]
        raise StoreUnavailableError("the database cannot be reached: refused")

    chunks = [c async for c in frames_to_sse(source(), max_frame_bytes=1_000, turn_id="t")]
    raw = b"".join(chunks)
    assert _decode(raw) == [("7", '{"seq":7}')]  # the outage dispatches no event of its own
    assert raw.endswith(
        b": the database is unavailable: reconnect with Last-Event-ID\nretry: 2000\n"
    )
    decoder = SSEDecoder()
    for line in raw.decode().splitlines():
        decoder.decode(line)
    assert decoder._retry == 2000  # the client waits 2 s before it reconnects
