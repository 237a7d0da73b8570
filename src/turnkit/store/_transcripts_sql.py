"""The transcript side of `SqlStore`: what ended turns keep, and reading it back.

A turn's row is written in the transaction that ends it. Reading a turn's starting
transcript touches only the rows from the newest history-replacing turn on (or after the
turn the caller already holds), so a long session's earlier turns are not read again.
"""

from __future__ import annotations

import functools
import json
from typing import Any, cast

from pydantic import JsonValue
from sqlalchemy import Connection, bindparam, exists, func, select, update

from turnkit.events import MessageCompleteEvent, decode_event
from turnkit.ids import SessionId, TurnId
from turnkit.store import KeptTranscript, KeptTurn, TurnTranscript
from turnkit.store._schema import events, transcripts, turn_record, turns

__all__ = ("encoded", "keep", "kept", "kept_pg")


def encoded(transcript: TurnTranscript) -> dict[str, Any]:
    """The row values of `transcript` (encoded before its transaction starts)."""
    last = transcript.last_request
    return {
        "replaces_history": transcript.replaces_history,
        "messages": json.dumps(list(transcript.messages), ensure_ascii=False),
        "last_request": json.dumps(last, ensure_ascii=False) if last is not None else None,
    }


def keep(
    conn: Connection,
    insert: Any,
    turn_id: TurnId,
    values: dict[str, Any],
    *,
    owner: tuple[str, int] | None = None,
) -> None:
    """Store what `turn_id` added to its session's transcript (in its ending transaction).

    `values` come from `encoded`; `owner` is the turn's (session id, input seq) when the
    caller read it already. A turn with a last request takes over the session's one kept
    last request.
    """
    if owner is None:
        found = conn.execute(_OWNER, {"o_turn": turn_id}).first()
        if found is None:
            return
        owner = (found.session_id, found.input_seq)
    session_id, input_seq = owner
    if values["last_request"] is not None:
        conn.execute(_DROP_LAST_REQUEST, {"d_session": session_id, "d_turn": turn_id})
    conn.execute(
        _insert_row(insert),
        {"turn_id": turn_id, "session_id": session_id, "input_seq": input_seq, **values},
    )


@functools.cache
def _insert_row(insert: Any) -> Any:
    # A paused turn keeps the row a Stop would leave; its later pause or ending replaces it.
    statement = insert(transcripts)
    return statement.on_conflict_do_update(
        index_elements=["turn_id"],
        set_={
            name: getattr(statement.excluded, name)
            for name in ("replaces_history", "messages", "last_request")
        },
    )


_OWNER = select(turns.c.session_id, turns.c.input_seq).where(turns.c.turn_id == bindparam("o_turn"))
_DROP_LAST_REQUEST = (
    update(transcripts)
    .where(
        transcripts.c.session_id == bindparam("d_session"),
        transcripts.c.last_request.is_not(None),
        transcripts.c.turn_id != bindparam("d_turn"),
    )
    .values(last_request=None)
)


def kept(
    conn: Connection, session_id: SessionId, before: int, after: TurnId | None
) -> KeptTranscript:
    """What the session's turns before input `before` keep (see `TurnLedger`)."""
    floor, continues = 0, False  # rows strictly above `floor`
    if after is not None:
        seq = conn.execute(_SEQ_OF, {"s_turn": after, "s_session": session_id}).scalar_one_or_none()
        if seq is not None and seq < before:
            floor, continues = seq, True
    base = conn.execute(
        _NEWEST_REPLACING, {"k_session": session_id, "k_floor": floor, "k_before": before}
    ).scalar_one_or_none()
    if base is not None:  # history was replaced since: start there
        floor, continues = base - 1, False
    params = {"k_session": session_id, "k_floor": floor, "k_before": before}
    found: list[KeptTurn] = [
        _kept_turn(row.turn_id, row.input_seq, row.replaces_history, row.messages)
        for row in conn.execute(_KEPT_ROWS, params)
    ]
    found += _without_transcript(conn, params)
    found.sort(key=lambda t: t.input_seq)
    last = conn.execute(
        _LAST_REQUEST, {**params, "k_floor": floor if continues else 0}
    ).scalar_one_or_none()
    return KeptTranscript(turns=tuple(found), continues=continues, last_request=_decoded(last))


def _kept_turn(turn_id: str, input_seq: int, replaces_history: bool, messages: str) -> KeptTurn:
    """A kept row as the turn's part of the transcript (its messages are JSON text)."""
    return KeptTurn(
        turn_id=TurnId(turn_id),
        input_seq=input_seq,
        transcript=TurnTranscript.model_construct(
            messages=tuple(json.loads(messages)),
            replaces_history=bool(replaces_history),
            last_request=None,
        ),
    )


def _decoded(last_request: str | None) -> dict[str, JsonValue] | None:
    return cast(dict[str, JsonValue], json.loads(last_request)) if last_request else None


KEPT_PG = """
WITH anchor AS (
    SELECT input_seq FROM tk_turns WHERE turn_id = $3 AND session_id = $1 AND input_seq < $2
), replaced AS (
    SELECT max(x.input_seq) AS seq FROM tk_transcripts x
    WHERE x.session_id = $1 AND x.replaces_history AND x.input_seq < $2
      AND x.input_seq > COALESCE((SELECT input_seq FROM anchor), 0)
), span AS (
    SELECT COALESCE(replaced.seq - 1, (SELECT input_seq FROM anchor), 0) AS floor,
           replaced.seq IS NULL AND EXISTS (SELECT 1 FROM anchor) AS continues
    FROM replaced
)
SELECT 0 AS part, NULL::text AS turn_id, NULL::int AS input_seq, span.continues AS flag,
    (SELECT x.last_request FROM tk_transcripts x
     WHERE x.session_id = $1 AND x.last_request IS NOT NULL AND x.input_seq < $2
       AND x.input_seq > CASE WHEN span.continues THEN span.floor ELSE 0 END
     ORDER BY x.input_seq DESC LIMIT 1) AS body,
    EXISTS (SELECT 1 FROM tk_turns t
            WHERE t.session_id = $1 AND t.input_seq > span.floor AND t.input_seq < $2
              AND NOT EXISTS (SELECT 1 FROM tk_transcripts x WHERE x.turn_id = t.turn_id)
    ) AS missing
FROM span
UNION ALL
SELECT 1, x.turn_id, x.input_seq, x.replaces_history, x.messages, false
FROM tk_transcripts x, span
WHERE x.session_id = $1 AND x.input_seq > span.floor AND x.input_seq < $2
ORDER BY part, input_seq
"""
"""`kept` as one statement: a summary row (whether it continues, the last request, whether
a turn in range stored no transcript), then the kept rows in order."""


async def kept_pg(
    conn: Any, session_id: SessionId, before: int, after: TurnId | None
) -> KeptTranscript | None:
    """`kept` on PostgreSQL in one round trip, or None if a turn in range kept nothing.

    Such a turn's record and answer are read by `kept`.
    """
    summary, *rows = await conn.fetch(KEPT_PG, session_id, before, after)
    if summary["missing"]:
        return None
    return KeptTranscript(
        turns=tuple(
            _kept_turn(row["turn_id"], row["input_seq"], row["flag"], row["body"]) for row in rows
        ),
        continues=bool(summary["flag"]),
        last_request=_decoded(summary["body"]),
    )


_SEQ_OF = select(turns.c.input_seq).where(
    turns.c.turn_id == bindparam("s_turn"), turns.c.session_id == bindparam("s_session")
)
_IN_RANGE = (
    transcripts.c.session_id == bindparam("k_session"),
    transcripts.c.input_seq > bindparam("k_floor"),
    transcripts.c.input_seq < bindparam("k_before"),
)
_NEWEST_REPLACING = select(func.max(transcripts.c.input_seq)).where(
    *_IN_RANGE, transcripts.c.replaces_history.is_(True)
)
_KEPT_ROWS = (
    select(
        transcripts.c.turn_id,
        transcripts.c.input_seq,
        transcripts.c.replaces_history,
        transcripts.c.messages,
    )
    .where(*_IN_RANGE)
    .order_by(transcripts.c.input_seq)
)
_LAST_REQUEST = (
    select(transcripts.c.last_request)
    .where(*_IN_RANGE, transcripts.c.last_request.is_not(None))
    .order_by(transcripts.c.input_seq.desc())
    .limit(1)
)
_WITHOUT_TRANSCRIPT = (
    select(turns)
    .where(
        turns.c.session_id == bindparam("k_session"),
        turns.c.input_seq > bindparam("k_floor"),
        turns.c.input_seq < bindparam("k_before"),
        ~exists().where(transcripts.c.turn_id == turns.c.turn_id),
    )
    .order_by(turns.c.input_seq)
)


def _without_transcript(conn: Connection, params: dict[str, Any]) -> list[KeptTurn]:
    """Turns in range that stored no transcript, with their records and answers."""
    records = [turn_record(row) for row in conn.execute(_WITHOUT_TRANSCRIPT, params)]
    if not records:
        return []
    answers: dict[str, str] = {}
    blobs = conn.execute(
        select(events.c.data)
        .where(
            events.c.turn_id.in_([r.turn_id for r in records]),
            events.c.type == "message.complete",
        )
        .order_by(events.c.turn_id, events.c.seq)
    )
    for (data,) in blobs:
        event = decode_event(bytes(data))
        if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
            answers[event.turn_id] = event.block.text
    return [
        KeptTurn(
            turn_id=r.turn_id,
            input_seq=r.input_seq,
            transcript=None,
            record=r,
            answer=answers.get(r.turn_id),
        )
        for r in records
    ]
