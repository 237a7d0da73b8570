"""Schema migrations applied to a database an older turnkit wrote (SQLite)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from tests.helpers import new_input

from turnkit.budgets import BudgetSubject
from turnkit.ids import SessionId, TurnId
from turnkit.store import TurnTranscript
from turnkit.store.migrate import _config, upgrade
from turnkit.store.sql import SqlStore

_OLD_TURN = """
INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content, agent, model,
    last_seq, lease_epoch, attempts, read_watermark, created_at, updated_at)
VALUES ('t-old', 's-old', 1, 'running', 'hi', 'a', 'm', 1, 0, 0, 0, :now, :now)
"""


def _columns(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[1] for row in conn.execute("PRAGMA table_info(tk_turns)")}


async def test_0005_drops_the_unused_read_watermark_and_keeps_the_turns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        upgrade(conn, "0004")  # the schema as the previous release left it, with a turn
        conn.execute(sa.text(_OLD_TURN), {"now": datetime(2026, 5, 1, tzinfo=UTC)})
    assert "read_watermark" in _columns(path)

    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        assert "read_watermark" not in _columns(path)
        record = await store.get_turn(TurnId("t-old"))
        assert record is not None
        assert (record.status, record.content) == ("running", "hi")
        lease = await store.claim("w1", ttl_s=10, max_attempts=3)
        assert lease is not None
        assert (lease.turn_id, lease.attempt) == ("t-old", 1)

    with engine.begin() as conn:  # and back: the column returns, filled with 0
        command.downgrade(_config(conn), "0004")
        assert conn.execute(sa.text("SELECT read_watermark FROM tk_turns")).scalar_one() == 0
    engine.dispose()


_TURN_WITH_TRANSCRIPT = """
INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content, agent, model,
    last_seq, lease_epoch, attempts, created_at, updated_at, transcript)
VALUES (:turn, 's-old', :seq, 'succeeded', 'hi', 'a', 'm', 3, 1, 1, :now, :now, :transcript)
"""


def _transcript_turn(turn: str, seq: int, transcript: dict[str, object]) -> dict[str, object]:
    return {
        "turn": turn,
        "seq": seq,
        "now": datetime(2026, 5, 1, 0, 0, seq, tzinfo=UTC),
        "transcript": json.dumps(transcript),
    }


async def test_0008_moves_transcripts_to_their_table_keeping_the_newest_digests(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    first = {
        "messages": [{"role": "user", "content": "hi", "input_seq": 1, "opens_turn": True}],
        "replaces_history": False,
        "last_request": {"messages": ["d1"], "tools_sha256": "t"},
    }
    second = {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "sum"}],
        "replaces_history": True,
        "last_request": {"messages": ["d2"], "tools_sha256": "t"},
    }
    with engine.begin() as conn:
        upgrade(conn, "0007")  # as the previous release left it: transcripts on the turns
        conn.execute(sa.text(_TURN_WITH_TRANSCRIPT), _transcript_turn("t-1", 1, first))
        conn.execute(sa.text(_TURN_WITH_TRANSCRIPT), _transcript_turn("t-2", 2, second))

    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        assert "transcript" not in _columns(path)
        kept = await store.kept_transcript(SessionId("s-old"), before_input_seq=3)
        assert [t.turn_id for t in kept.turns] == ["t-2"]  # from the replacing turn on
        assert kept.turns[0].transcript is not None
        assert list(kept.turns[0].transcript.messages) == second["messages"]
        assert kept.last_request == second["last_request"]
        earlier = await store.kept_transcript(SessionId("s-old"), before_input_seq=2)
        expected = TurnTranscript.model_validate({**first, "last_request": None})
        assert [t.transcript for t in earlier.turns] == [expected]  # its digests: dropped

    with engine.begin() as conn:  # and back: the column returns, filled again
        command.downgrade(_config(conn), "0007")
        rows = conn.execute(sa.text("SELECT turn_id, transcript FROM tk_turns ORDER BY 1")).all()
    assert [(r[0], json.loads(r[1])) for r in rows] == [
        ("t-1", {**first, "last_request": None}),
        ("t-2", second),
    ]
    engine.dispose()


_RUNNING_TURN = """
INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content, agent, model,
    last_seq, lease_epoch, attempts, created_at, updated_at)
VALUES ('t-old', 's-old', 1, 'running', 'hi', 'a', 'm', 1, 1, 1, :now, :now)
"""
_GUIDE = """
INSERT INTO tk_inputs (session_id, seq, content, requested_delivery, delivery, turn_id,
    created_at)
VALUES ('s-old', :seq, 'also', 'guide', 'guide', 't-old', :now)
"""


async def test_0010_notes_each_turn_newest_guide_on_its_row(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    now = datetime(2026, 5, 1, tzinfo=UTC)
    with engine.begin() as conn:
        upgrade(conn, "0009")  # a running turn that two guide messages joined
        conn.execute(sa.text(_RUNNING_TURN), {"now": now})
        for seq in (2, 3):
            conn.execute(sa.text(_GUIDE), {"seq": seq, "now": now})

    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        result = await store.commit(TurnId("t-old"), epoch=1)
        assert result.newest_guide_seq == 3
        assert await store.guided_inputs(TurnId("t-old"), after_input_seq=1) == [
            (2, "also", None),
            (3, "also", None),
        ]
    engine.dispose()


async def test_0013_gives_each_owned_session_its_first_turn_organisation(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    now = datetime(2026, 5, 1, tzinfo=UTC)
    with engine.begin() as conn:
        upgrade(conn, "0012")  # alice of acme's session, a turnless one, and nobody's
        for sid, principal in (("s-acme", "alice"), ("s-new", "alice"), ("s-open", None)):
            conn.execute(
                sa.text(
                    "INSERT INTO tk_sessions (session_id, principal, last_input_seq,"
                    " created_at, updated_at) VALUES (:s, :p, 1, :now, :now)"
                ),
                {"s": sid, "p": principal, "now": now},
            )
        for sid, org in (("s-acme", "acme"), ("s-open", "acme")):
            conn.execute(
                sa.text(
                    "INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content,"
                    " agent, model, organisation, principal, last_seq, lease_epoch, attempts,"
                    " created_at, updated_at)"
                    " VALUES (:t, :s, 1, 'succeeded', 'hi', 'a', 'm', :o, 'alice', 3, 1, 1,"
                    " :now, :now)"
                ),
                {"t": f"t-{sid}", "s": sid, "o": org, "now": now},
            )

    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        found = {sid: await store.get_session(SessionId(sid)) for sid in ("s-acme", "s-new")}
        opened = await store.get_session(SessionId("s-open"))
        # Its owner's next message gives a turnless one the owner's organisation.
        await store.submit(new_input(session="s-new", principal="alice", organisation="acme"))
        claimed = await store.get_session(SessionId("s-new"))
    assert claimed is not None
    assert claimed.organisation == "acme"
    assert found["s-acme"] is not None
    assert found["s-acme"].organisation == "acme"
    assert found["s-acme"].visible_to("alice", "acme")
    assert not found["s-acme"].visible_to("alice", "globex")
    assert found["s-new"] is not None
    assert found["s-new"].organisation is None  # no turn to tell: matched by the id alone
    assert opened is not None
    assert opened.organisation is None  # nobody owns it
    engine.dispose()


async def test_0016_counts_each_limits_spend_from_the_first_check_that_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        upgrade(conn, "0015")  # a limit, and a turn of this month that spent 700 tokens
        conn.execute(
            sa.text(
                "INSERT INTO tk_budget_limits (scope, organisation, key, period, tokens,"
                " updated_at) VALUES ('principal', 'default', 'ann', 'month', 10000, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content,"
                " agent, model, principal, last_seq, lease_epoch, attempts, created_at,"
                " updated_at) VALUES ('t1', 's1', 1, 'succeeded', 'hi', 'a', 'm', 'ann',"
                " 3, 1, 1, :now, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tk_usage (turn_id, session_id, model_calls, input_tokens,"
                " output_tokens, cached_tokens, cost_usd) VALUES ('t1', 's1', 1, 600, 100, 0, 0)"
            )
        )

    def counted() -> tuple[object, ...]:
        with engine.begin() as conn:
            return tuple(
                conn.execute(
                    sa.text("SELECT spent_period, spent_tokens FROM tk_budget_limits")
                ).one()
            )

    ann = BudgetSubject(organisation="default", department="default", principal="ann",
                        session_id="s2")  # fmt: skip
    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        assert counted() == (None, 0)  # not counted yet: a read scans
        [use] = await store.budget_uses(ann)
        assert use.spent_tokens == 700
        assert counted() == (None, 0)
        reservation, [use] = await store.reserve_budget(
            ann, turn_id=TurnId("t2"), usd=0.0, tokens=100, ttl_s=60
        )
        assert reservation is not None
        assert use.spent_tokens == 700
        [use] = await store.budget_uses(ann)
        assert (use.spent_tokens, use.reserved_tokens) == (700, 100)
        assert counted() == (now.strftime("%Y-%m"), 700)  # counted from now on

    with engine.begin() as conn:  # and back: the counts go
        command.downgrade(_config(conn), "0015")
        columns = {row[1] for row in conn.execute(sa.text("PRAGMA table_info(tk_budget_limits)"))}
    assert "spent_period" not in columns
    engine.dispose()


async def test_0017_a_turn_start_looks_only_at_the_turns_since_the_one_held(
    tmp_path: Path,
) -> None:
    """Which turns since the transcript a runtime holds stored none is a range of the index,
    not a walk over every turn the session ever had."""
    from sqlalchemy.dialects import sqlite

    from turnkit.store._transcripts_sql import _WITHOUT_TRANSCRIPT

    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        upgrade(conn, "0016")
    async with SqlStore.from_url(f"sqlite:///{path}"):  # opening upgrades to head
        pass
    query = str(_WITHOUT_TRANSCRIPT.compile(dialect=sqlite.dialect()))
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", ("s", 10, 12))]
    assert any("input_seq>? AND input_seq<?" in step for step in plan), plan


def _turn_schema(conn: sa.Connection) -> tuple[set[str], set[str | None]]:
    found = sa.inspect(conn)
    columns = {c["name"] for c in found.get_columns("tk_turns")}
    return columns, {i["name"] for i in found.get_indexes("tk_turns")}


async def test_0018_an_asked_turn_names_the_turn_that_asked_it(store: SqlStore) -> None:
    """On both stores. A turn asked under an older turnkit names nobody, and is still
    stopped with its asking turn through the request it handed over; one asked since
    names the asking turn, and is stopped with it though it handed over nothing. The
    downgrade drops the column and its index again."""
    from pydantic import JsonValue

    from turnkit.events import ApprovalRequestedEvent, AskedPause
    from turnkit.pauses import PauseRequest

    old = await store.submit(new_input("s-old"))
    old_asked = await store.submit(new_input("tk-sub.old", asked_by=old.turn_id))
    lease = await store.claim("w", ttl_s=10, max_attempts=3, turn_id=old.turn_id)
    assert lease is not None
    asked: dict[str, JsonValue] = {
        "agent": "refunds",
        "session_id": "tk-sub.old",
        "turn_id": old_asked.turn_id,
        "request_id": "req-a",
    }
    handed = ApprovalRequestedEvent(
        session_id=old.session_id, turn_id=old.turn_id, stage_id="tool-loop",
        ts=datetime.now(UTC), seq=2, request_id="req-1", tool_call_id="c1",
        tool_name="refund", arguments={}, summary="refunds: refund",
        asked=AskedPause.model_validate(asked),
    )  # fmt: skip
    await store.commit(
        old.turn_id,
        epoch=lease.epoch,
        events=[handed],
        status="awaiting_approval",
        release=True,
        pause=PauseRequest(
            request_id="req-1", kind="approval", tool_call_id="c1", payload={"asked": asked}
        ),
    )
    await store._migrate(lambda conn: command.downgrade(_config(conn), "0017"))
    columns, indexes = await store._migrate(_turn_schema)
    assert "asked_by" not in columns
    assert "ix_turn_asked_by" not in indexes
    await store._migrate(upgrade)  # the older turnkit's turns, as this one finds them
    columns, indexes = await store._migrate(_turn_schema)
    assert "asked_by" in columns
    assert "ix_turn_asked_by" in indexes

    new = await store.submit(new_input("s-new"))
    new_asked = await store.submit(new_input("tk-sub.new", asked_by=new.turn_id))
    assert await store.cancel(old.turn_id) == "cancelled"
    assert await store.cancel(new.turn_id) == "cancelled"
    for turn in (old_asked, new_asked):
        record = await store.get_turn(turn.turn_id)
        assert record is not None
        assert record.status == "cancelled"
