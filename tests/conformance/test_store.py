"""The Store contract, run against SQLite and the real PostgreSQL (parametrised by `db`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from tests.helpers import new_input, step_event

from turnkit.audit import AuditPayloads, AuditRow, CallIdentity, CallShape, PlanGenerationPayload
from turnkit.blocks import TextBlock
from turnkit.errors import (
    LeaseLostError,
    RequestConflictError,
    SessionNotFoundError,
    StaleEpochError,
    StoreError,
)
from turnkit.events import DoneEvent, ErrorEvent, MessageCompleteEvent, TurnStartedEvent
from turnkit.ids import SessionId, TurnId
from turnkit.store import ClaimRequest, KeptTranscript, Store, Submission, TurnTranscript
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock

DB = tuple[str, str | None]


async def _events(store: Store, turn_id: TurnId) -> list[int]:
    return [e.seq async for e in store.read_events(turn_id)]


async def test_submit_commits_input_turn_and_first_event_together(store: SqlStore) -> None:
    sub = await store.submit(new_input(content="what is 2+2?"))
    assert sub.is_new
    assert sub.input_seq == 1
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.status == "running"
    assert record.lease_owner is None
    assert record.pinned == {"model": "m", "tools": ["add"]}
    [first] = [e.decode() async for e in store.read_events(sub.turn_id)]
    assert isinstance(first, TurnStartedEvent)
    assert (first.seq, first.content, first.input_seq) == (1, "what is 2+2?", 1)
    second = await store.submit(new_input())
    assert second.input_seq == 2


async def test_same_request_id_is_one_input_and_one_turn(store: SqlStore) -> None:
    first = await store.submit(new_input(request_id="req-1"))
    again = await store.submit(new_input(request_id="req-1"))
    assert not again.is_new
    assert (again.turn_id, again.input_seq) == (first.turn_id, first.input_seq)
    assert len(await store.list_turns(SessionId("s1"))) == 1
    other_session = await store.submit(new_input(session="s2", request_id="req-1"))
    assert other_session.is_new  # request ids are scoped to their session


async def test_a_reused_request_id_with_other_content_is_refused(store: SqlStore) -> None:
    first = await store.submit(new_input(request_id="req-1"))
    with pytest.raises(RequestConflictError) as refused:
        await store.submit(new_input(request_id="req-1", content="changed"))
    assert refused.value.code == "request-id-reused"
    [turn] = await store.list_turns(SessionId("s1"))  # nothing more was written
    assert turn.turn_id == first.turn_id


async def test_a_reused_request_id_with_other_pictures_is_refused(store: SqlStore) -> None:
    """The same text with another picture is another message, not a retry."""
    from turnkit.blocks import ImagePart

    cat, dog = ImagePart(data=b"\x89PNG cat"), ImagePart(data=b"\x89PNG dog")
    first = await store.submit(new_input(request_id="req-1", attachments=(cat,)))
    again = await store.submit(new_input(request_id="req-1", attachments=(cat,)))
    assert again.turn_id == first.turn_id  # a retry: the same turn
    for other in ((dog,), ()):
        with pytest.raises(RequestConflictError):
            await store.submit(new_input(request_id="req-1", attachments=other))
    assert len(await store.list_turns(SessionId("s1"))) == 1


async def test_guide_with_no_live_attempt_is_committed_as_queue(store: SqlStore) -> None:
    sub = await store.submit(new_input(delivery="guide"))
    assert (sub.delivery, sub.requested_delivery) == ("queue", "guide")
    [started] = [e.decode() async for e in store.read_events(sub.turn_id)]
    assert isinstance(started, TurnStartedEvent)
    assert (started.delivery, started.requested_delivery) == ("queue", "guide")


async def test_every_commit_reports_the_newest_guide_message(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    first = await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
    assert first.newest_guide_seq == 0
    guided = await store.submit(new_input(content="also this", delivery="guide"))
    assert (guided.turn_id, guided.delivery) == (sub.turn_id, "guide")
    later = await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 3)])
    assert later.newest_guide_seq == guided.input_seq == 2


async def test_reappending_an_event_changes_nothing(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    await store.commit(sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2)])
    await store.commit(
        sub.turn_id, epoch=lease.epoch, events=[step_event(sub, 2), step_event(sub, 3)]
    )
    assert await _events(store, sub.turn_id) == [1, 2, 3]
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.last_seq == 3


async def test_stale_epoch_is_rejected(store: SqlStore, clock: FakeClock) -> None:
    sub = await store.submit(new_input())
    old = await store.claim("w1", ttl_s=10, max_attempts=3)
    assert old is not None
    assert (old.epoch, old.attempt, old.took_over) == (1, 1, False)
    clock.advance(11)  # w1 stopped renewing: its lease expired
    new = await store.claim("w2", ttl_s=10, max_attempts=3)
    assert new is not None
    assert (new.epoch, new.attempt, new.took_over) == (2, 2, True)
    with pytest.raises(StaleEpochError, match="another driver owns it"):
        await store.commit(sub.turn_id, epoch=old.epoch, events=[step_event(sub, 2)])
    with pytest.raises(StaleEpochError):
        await store.renew(old, ttl_s=10)
    assert await _events(store, sub.turn_id) == [1]  # nothing of the stale commit landed
    await store.commit(sub.turn_id, epoch=new.epoch, events=[step_event(sub, 2)])


def _answer(sub: Submission, seq: int) -> MessageCompleteEvent:
    return MessageCompleteEvent(
        session_id=sub.session_id,
        turn_id=sub.turn_id,
        stage_id="tool-loop",
        ts=datetime.now(UTC),
        seq=seq,
        block=TextBlock(block_id=f"b{seq}", text="progress"),
    )


async def test_attempts_that_made_progress_do_not_count(store: SqlStore, clock: FakeClock) -> None:
    """Ten restarts of a long turn never end it; attempts that get nowhere do."""
    sub = await store.submit(new_input())
    seq = 1
    for attempt in range(1, 11):
        lease = await store.claim(f"w{attempt}", ttl_s=10, max_attempts=3)
        assert lease is not None, f"attempt {attempt} was refused"
        assert lease.attempt == attempt
        seq += 1
        await store.commit(sub.turn_id, epoch=lease.epoch, events=[_answer(sub, seq)])
        clock.advance(11)  # the driver is killed after committing progress
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == []
    stuck = await store.submit(new_input(session="s2"))
    for attempt in range(1, 4):  # three attempts that commit nothing of substance
        lease = await store.claim("w", ttl_s=10, max_attempts=3, turn_id=stuck.turn_id)
        assert lease is not None
        await store.commit(
            stuck.turn_id, epoch=lease.epoch, events=[step_event(stuck, attempt + 1)]
        )
        clock.advance(11)
    assert await store.claim("w", ttl_s=10, max_attempts=3, turn_id=stuck.turn_id) is None
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == [stuck.turn_id]


async def test_a_turn_handed_over_is_claimed_at_once_as_handed_over_and_costs_no_attempt(
    store: SqlStore, clock: FakeClock
) -> None:
    """A worker shutting down leaves its turn: taken over now, said so, never counted."""
    await store.submit(new_input())
    for attempt in range(1, 6):  # five deploys in a row, none of them getting anywhere
        lease = await store.claim(f"w{attempt}", ttl_s=60, max_attempts=3)
        assert lease is not None, f"attempt {attempt} was refused"
        assert (lease.attempt, lease.took_over, lease.handed_over) == (
            attempt,
            attempt > 1,
            attempt > 1,
        )
        renewed = await store.renew(lease, ttl_s=60)
        assert renewed.handed_over == lease.handed_over  # a renewal keeps what the claim said
        assert await store.hand_over(renewed) is True
        assert await store.hand_over(renewed) is False  # no longer this driver's
        # No clock moves: a turn handed over is free at once, whatever the clocks say.
    assert await store.sweep(ceiling_s=3600, max_attempts=3) == []
    clock.advance(61)  # one that dies instead does count, as before
    crashed = await store.claim("w6", ttl_s=10, max_attempts=3)
    assert crashed is not None
    assert crashed.handed_over
    clock.advance(11)
    after_crash = await store.claim("w7", ttl_s=10, max_attempts=3)
    assert after_crash is not None
    assert (after_crash.took_over, after_crash.handed_over) == (True, False)


async def test_a_lease_whose_turn_ended_is_lost_not_stale(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    await store.commit(sub.turn_id, epoch=lease.epoch, status="cancelled", release=True)
    with pytest.raises(LeaseLostError) as lost:
        await store.renew(lease, ttl_s=30)
    assert lost.value.code == "lease-lost"


async def test_a_live_lease_cannot_be_claimed(store: SqlStore, clock: FakeClock) -> None:
    await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=10, max_attempts=3)
    assert lease is not None
    clock.advance(9)
    lease = await store.renew(lease, ttl_s=10)
    clock.advance(9)  # 18 s after the claim, but renewed at 9 s
    assert await store.claim("w2", ttl_s=10, max_attempts=3) is None


async def test_a_claim_for_one_session_takes_its_turn_and_keeps_its_first_start(
    store: SqlStore, clock: FakeClock
) -> None:
    """A session's claim passes over older turns of other sessions; a takeover keeps when
    the turn first started."""
    await store.submit(new_input(session="s-other"))
    mine = await store.submit(new_input(session="s-mine"))
    first = await store.claim("w1", ttl_s=10, max_attempts=3, session_id=SessionId("s-mine"))
    assert first is not None
    assert (first.turn_id, first.epoch, first.took_over) == (mine.turn_id, 1, False)
    assert first.started_at == clock.now()
    assert await store.claim("w2", ttl_s=10, max_attempts=3, session_id=SessionId("s-mine")) is None
    clock.advance(11)  # w1 stopped renewing
    again = await store.claim(
        "w2", ttl_s=10, max_attempts=3, turn_id=mine.turn_id, session_id=SessionId("s-mine")
    )
    assert again is not None
    assert (again.epoch, again.attempt, again.took_over) == (2, 2, True)
    assert again.started_at == first.started_at
    assert again.expires_at == clock.now() + timedelta(seconds=10)
    record = await store.get_turn(mine.turn_id)
    assert record is not None
    assert (record.lease_owner, record.lease_epoch, record.attempts) == ("w2", 2, 2)
    assert record.started_at == first.started_at


async def test_two_workers_racing_for_one_run_exactly_one_wins(
    db: DB, store: SqlStore, clock: FakeClock
) -> None:
    await store.submit(new_input())
    url, schema = db
    others = [SqlStore.from_url(url, clock=clock, schema=schema) for _ in range(3)]
    try:
        leases = await asyncio.gather(
            store.claim("w0", ttl_s=30, max_attempts=3),
            *(s.claim(f"w{i + 1}", ttl_s=30, max_attempts=3) for i, s in enumerate(others)),
        )
    finally:
        for other in others:
            await other.close()
    winners = [lease for lease in leases if lease is not None]
    assert len(winners) == 1
    assert winners[0].epoch == 1


async def test_of_creates_racing_for_one_session_exactly_one_is_new(store: SqlStore) -> None:
    """`is_new` tells the create that made the session from those that found it made."""
    made = await asyncio.gather(
        *(store.create_session(SessionId("s1"), title=f"T{i}") for i in range(8))
    )
    assert sum(m.is_new for m in made) == 1
    assert len({m.title for m in made}) == 1  # each returns the session as stored
    again = await store.create_session(SessionId("s1"))
    found = await store.get_session(SessionId("s1"))
    assert found is not None
    assert (again.is_new, found.is_new) == (False, False)
    assert found == made[0]  # `is_new` is not part of what a session is


async def test_a_session_runs_its_turns_in_order(store: SqlStore) -> None:
    first = await store.submit(new_input())
    second = await store.submit(new_input(content="next"))
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    assert lease.turn_id == first.turn_id
    assert await store.claim("w2", ttl_s=30, max_attempts=3) is None  # second waits
    await store.commit(first.turn_id, epoch=lease.epoch, status="succeeded", release=True)
    nxt = await store.claim("w2", ttl_s=30, max_attempts=3)
    assert nxt is not None
    assert nxt.turn_id == second.turn_id


async def test_a_message_claims_its_turn_at_once_only_when_its_session_is_free(
    store: SqlStore, clock: FakeClock
) -> None:
    claim = ClaimRequest(owner="api-1", ttl_s=30, max_attempts=3)
    first = await store.submit(new_input(claim_for=claim))
    second = await store.submit(new_input(content="next", claim_for=claim))
    assert first.lease is not None
    assert first.record is not None
    assert (first.lease.owner, first.lease.epoch, first.lease.attempt) == ("api-1", 1, 1)
    assert first.lease.expires_at == clock.now() + timedelta(seconds=30)
    assert not first.lease.took_over
    assert (first.record.lease_owner, first.record.attempts) == ("api-1", 1)
    assert first.record.started_at == clock.now()
    assert (second.lease, second.record) == (None, None)  # waits for the first turn
    queued = await store.get_turn(second.turn_id)
    assert queued is not None
    assert (queued.lease_owner, queued.attempts, queued.started_at) == (None, 0, None)
    # the lease taken with the message is a real one: it renews, commits and releases
    lease = await store.renew(first.lease, ttl_s=30)
    await store.commit(first.turn_id, epoch=lease.epoch, status="succeeded", release=True)
    nxt = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert nxt is not None
    assert (nxt.turn_id, nxt.epoch, nxt.attempt) == (second.turn_id, 1, 1)
    third = await store.submit(new_input(session="s2", claim_for=claim))
    assert third.lease is not None  # another session is free


async def test_terminal_states_never_change(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    await store.commit(sub.turn_id, epoch=lease.epoch, status="succeeded")
    with pytest.raises(StoreError, match="cannot move from 'succeeded' to 'running'"):
        await store.commit(sub.turn_id, epoch=lease.epoch, status="running")
    with pytest.raises(StoreError, match="cannot move"):
        await store.commit(sub.turn_id, epoch=lease.epoch, status="cancelled")
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.status == "succeeded"


async def test_audit_rows_and_usage_rollup_commit_together(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    rows = [
        AuditRow(
            identity=CallIdentity(
                session_id=sub.session_id,
                turn_id=sub.turn_id,
                stage_id="tool-loop",
                seq_within_turn=i,
            ),
            call=CallShape(
                provider="p",
                model="m",
                family="f",
                rung=0,
                latency_ms=1.0,
                input_tokens=10 * i,
                output_tokens=i,
                cost_usd=0.5,
                outcome="ok",
            ),
        )
        for i in (1, 2)
    ]
    plan = AuditRow(
        identity=CallIdentity(
            session_id=sub.session_id,
            turn_id=sub.turn_id,
            stage_id="anchor-plan",
            seq_within_turn=3,
        ),
        call=None,
        payloads=AuditPayloads(planGeneration=PlanGenerationPayload(intent="x", depth="none")),
    )
    await store.commit(sub.turn_id, epoch=lease.epoch, audit=[*rows, plan])
    assert [r.identity.seq_within_turn for r in await store.read_audit(sub.turn_id)] == [1, 2, 3]
    usage = await store.read_usage(sub.turn_id)
    assert (usage.model_calls, usage.input_tokens, usage.output_tokens) == (2, 30, 3)
    assert usage.cost_usd == pytest.approx(1.0)
    stale = rows[0]
    with pytest.raises(StaleEpochError):
        await store.commit(sub.turn_id, epoch=lease.epoch + 5, audit=[stale])
    assert (await store.read_usage(sub.turn_id)).model_calls == 2


async def test_reads_come_in_bounded_pages(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    await store.commit(
        sub.turn_id, epoch=lease.epoch, events=[step_event(sub, n) for n in range(2, 8)]
    )
    seqs = [e.seq async for e in store.read_events(sub.turn_id, after_seq=2, page_size=2)]
    assert seqs == [3, 4, 5, 6, 7]


async def test_sweep_ends_runs_past_the_ceiling_and_leaves_paused_ones(
    store: SqlStore, clock: FakeClock
) -> None:
    running = await store.submit(new_input(session="a"))
    paused = await store.submit(new_input(session="b"))
    lease_a = await store.claim("w1", ttl_s=30, max_attempts=3, turn_id=running.turn_id)
    lease_b = await store.claim("w1", ttl_s=30, max_attempts=3, turn_id=paused.turn_id)
    assert lease_a is not None
    assert lease_b is not None
    await store.commit(
        paused.turn_id, epoch=lease_b.epoch, status="awaiting_approval", release=True
    )
    assert await store.sweep(ceiling_s=600, max_attempts=3) == []
    clock.advance(601)
    assert await store.sweep(ceiling_s=600, max_attempts=3) == [running.turn_id]
    record = await store.get_turn(running.turn_id)
    assert record is not None
    assert (record.status, record.error_code) == ("timed_out", "deadline-exceeded")
    tail = [e.decode() async for e in store.read_events(running.turn_id, after_seq=1)]
    assert [type(e) for e in tail] == [ErrorEvent, DoneEvent]
    assert isinstance(tail[1], DoneEvent)
    assert tail[1].status == "timed_out"
    paused_record = await store.get_turn(paused.turn_id)
    assert paused_record is not None
    assert paused_record.status == "awaiting_approval"
    with pytest.raises(StaleEpochError):  # the zombie driver is fenced out
        await store.commit(running.turn_id, epoch=lease_a.epoch, events=[step_event(running, 4)])


async def test_sweep_ends_runs_out_of_attempts(store: SqlStore, clock: FakeClock) -> None:
    sub = await store.submit(new_input())
    for _ in range(2):
        assert await store.claim("w", ttl_s=10, max_attempts=2) is not None
        clock.advance(11)
    assert await store.claim("w", ttl_s=10, max_attempts=2) is None
    assert await store.sweep(ceiling_s=3600, max_attempts=2) == [sub.turn_id]


async def test_migrations_are_at_head(store: SqlStore) -> None:
    from turnkit.store.migrate import head_revision

    assert await store.schema_revision() == head_revision()
    await store.setup()  # running it again is harmless


async def test_reappending_an_audit_row_counts_its_usage_once(store: SqlStore) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    row = AuditRow(
        identity=CallIdentity(
            session_id=sub.session_id, turn_id=sub.turn_id, stage_id="tool-loop",
            seq_within_turn=1,
        ),
        call=CallShape(
            provider="p", model="m", family="f", rung=0, latency_ms=1.0,
            input_tokens=7, output_tokens=3, outcome="ok",
        ),
    )  # fmt: skip
    await store.commit(sub.turn_id, epoch=lease.epoch, audit=[row])
    await store.commit(sub.turn_id, epoch=lease.epoch, audit=[row])
    usage = await store.read_usage(sub.turn_id)
    assert (usage.model_calls, usage.input_tokens) == (1, 7)
    assert len(await store.read_audit(sub.turn_id)) == 1


# ── kept transcripts ──────────────────────────────────────────────────────────────────


def _kept(text: str, *, replaces: bool = False, last: str | None = None) -> TurnTranscript:
    return TurnTranscript(
        messages=({"role": "user", "content": text}, {"role": "assistant", "content": "ok"}),
        replaces_history=replaces,
        last_request={"messages": [last], "tools_sha256": "t"} if last else None,
    )


async def _ended(store: SqlStore, transcript: TurnTranscript | None, session: str = "s1") -> TurnId:
    sub = await store.submit(new_input(session=session))
    lease = await store.claim("w1", ttl_s=10, max_attempts=3, turn_id=sub.turn_id)
    assert lease is not None
    if transcript is None:  # ended with no driver: Stop before it ran
        await store.commit(sub.turn_id, epoch=lease.epoch, status="cancelled", release=True)
    else:
        await store.commit(
            sub.turn_id, epoch=lease.epoch, status="succeeded", release=True, transcript=transcript
        )
    return sub.turn_id


def _texts(kept: KeptTranscript) -> list[str]:
    return [
        str(t.transcript.messages[0]["content"]) if t.transcript else f"<{t.turn_id}>"
        for t in kept.turns
    ]


async def test_a_turn_start_reads_only_the_turns_after_the_one_held(store: SqlStore) -> None:
    one = await _ended(store, _kept("one", last="d1"))
    two = await _ended(store, _kept("two", last="d2"))
    three = await _ended(store, _kept("three"))  # made no request: keeps no digests
    s1 = SessionId("s1")
    whole = await store.kept_transcript(s1, before_input_seq=4)
    assert (_texts(whole), whole.continues) == (["one", "two", "three"], False)
    assert [t.turn_id for t in whole.turns] == [one, two, three]
    assert whole.last_request == {"messages": ["d2"], "tools_sha256": "t"}
    after_one = await store.kept_transcript(s1, before_input_seq=4, after=one)
    assert (_texts(after_one), after_one.continues) == (["two", "three"], True)
    assert after_one.last_request == {"messages": ["d2"], "tools_sha256": "t"}
    after_two = await store.kept_transcript(s1, before_input_seq=4, after=two)
    assert (_texts(after_two), after_two.continues) == (["three"], True)
    assert after_two.last_request is None  # the newest kept one is the caller's already
    # Only the newest digests are kept: turn one's went when turn two ended.
    assert (await store.kept_transcript(s1, before_input_seq=2)).last_request is None


async def test_history_replaced_since_the_held_turn_starts_over_there(store: SqlStore) -> None:
    one = await _ended(store, _kept("one", last="d1"))
    await _ended(store, _kept("two"))
    await _ended(store, _kept("summary", replaces=True, last="d3"))
    await _ended(store, _kept("four"))
    kept = await store.kept_transcript(SessionId("s1"), before_input_seq=5, after=one)
    assert (_texts(kept), kept.continues) == (["summary", "four"], False)
    assert kept.turns[0].transcript is not None
    assert kept.turns[0].transcript.replaces_history
    assert kept.last_request == {"messages": ["d3"], "tools_sha256": "t"}


async def test_a_turn_that_kept_no_transcript_comes_with_its_record(store: SqlStore) -> None:
    await _ended(store, _kept("one"))
    stopped = await _ended(store, None)
    kept = await store.kept_transcript(SessionId("s1"), before_input_seq=3)
    assert [t.turn_id for t in kept.turns][1] == stopped
    [_, legacy] = kept.turns
    assert (legacy.transcript, legacy.answer) == (None, None)
    assert legacy.record is not None
    assert (legacy.record.status, legacy.record.content) == ("cancelled", "hello")


async def test_a_held_turn_of_a_deleted_session_is_not_continued(store: SqlStore) -> None:
    old = await _ended(store, _kept("before the delete"))
    assert await store.delete_session(SessionId("s1"))
    await _ended(store, _kept("new one"))
    await _ended(store, _kept("new two"))
    kept = await store.kept_transcript(SessionId("s1"), before_input_seq=3, after=old)
    assert (_texts(kept), kept.continues) == (["new one", "new two"], False)


async def test_progress_asked_together_answers_each_turn_as_its_record_does(
    store: SqlStore,
) -> None:
    """Seventy readers asking at once (more than one statement's worth) get their own turn."""
    subs = [await store.submit(new_input(session=f"p{i}")) for i in range(70)]
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    await store.commit(lease.turn_id, epoch=lease.epoch, events=[step_event(subs[0], 2)])
    unknown = TurnId("no-such-turn")
    asked = [*(s.turn_id for s in subs), unknown, subs[5].turn_id]
    answers = await asyncio.gather(*(store.turn_progress(t) for t in asked))
    assert answers[-2] is None
    for turn_id, progress in zip(asked, answers, strict=True):
        if turn_id == unknown:
            continue
        record = await store.get_turn(turn_id)
        assert record is not None
        assert progress is not None
        assert (progress.turn_id, progress.status, progress.last_seq, progress.attempts) == (
            record.turn_id,
            record.status,
            record.last_seq,
            record.attempts,
        )
        assert (progress.lease_owner, progress.lease_expires_at) == (
            record.lease_owner,
            record.lease_expires_at,
        )
    claimed = answers[[s.turn_id for s in subs].index(lease.turn_id)]
    assert claimed is not None
    assert claimed.lease_owner == "w1"
    assert claimed.last_seq == 2
    assert claimed.lease_expires_at is not None
    assert claimed.lease_expires_at.tzinfo is not None


async def test_a_renewal_extends_the_lease_and_reports_stop_pressed(
    store: SqlStore, clock: FakeClock
) -> None:
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=10, max_attempts=3)
    assert lease is not None
    clock.advance(5)
    renewed = await store.renew(lease, ttl_s=10)
    assert renewed.expires_at == clock.now() + timedelta(seconds=10)
    assert (renewed.epoch, renewed.owner, renewed.cancel_requested) == (lease.epoch, "w1", False)
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert record.lease_expires_at == renewed.expires_at
    assert await store.cancel(sub.turn_id) == "running"  # a live driver ends it
    after_stop = await store.renew(renewed, ttl_s=10)
    assert after_stop.cancel_requested


async def test_a_stop_by_the_lease_holder_ends_the_turn_despite_its_live_lease(
    store: SqlStore,
) -> None:
    """The holder's drivers have stopped: its own lease must not keep the turn running."""
    sub = await store.submit(new_input())
    lease = await store.claim("w1", ttl_s=30, max_attempts=3)
    assert lease is not None
    assert await store.cancel(sub.turn_id, stopped_owner="w2") == "running"  # not the holder
    assert await store.cancel(sub.turn_id, stopped_owner="w1") == "cancelled"
    record = await store.get_turn(sub.turn_id)
    assert record is not None
    assert (record.status, record.lease_owner) == ("cancelled", None)
    stored = [e.decode() async for e in store.read_events(sub.turn_id)]
    assert [e.seq for e in stored] == [1, 2]
    assert isinstance(stored[-1], DoneEvent)
    assert stored[-1].status == "cancelled"
    with pytest.raises(StaleEpochError):  # the stopped driver can write nothing more
        await store.renew(lease, ttl_s=30)


async def test_renewals_asked_together_extend_each_lease_and_refuse_a_stale_one(
    store: SqlStore, clock: FakeClock
) -> None:
    """Renewals due at once share a transaction; one stale lease fails alone."""
    for i in range(3):
        await store.submit(new_input(session=f"r{i}"))
    leases = [
        await store.claim(f"w{i}", ttl_s=ttl, max_attempts=3) for i, ttl in enumerate((30, 30, 5))
    ]
    assert all(lease is not None for lease in leases)
    first, second, third = (lease for lease in leases if lease is not None)
    clock.advance(6)  # the third's lease lapses and another driver takes its turn over
    taken = await store.claim("w9", ttl_s=10, max_attempts=3, turn_id=third.turn_id)
    assert taken is not None
    results = await asyncio.gather(
        store.renew(first, ttl_s=10),
        store.renew(second, ttl_s=20),
        store.renew(third, ttl_s=10),
        return_exceptions=True,
    )
    assert isinstance(results[2], StaleEpochError)
    renewed = [r for r in results[:2] if not isinstance(r, BaseException)]
    assert [r.expires_at for r in renewed] == [
        clock.now() + timedelta(seconds=10),
        clock.now() + timedelta(seconds=20),
    ]
    for lease in renewed:
        record = await store.get_turn(lease.turn_id)
        assert record is not None
        assert (record.lease_owner, record.lease_expires_at) == (lease.owner, lease.expires_at)


async def test_a_token_limit_past_32_bits_is_kept(store: SqlStore) -> None:
    """An organisation's monthly cap may pass 2,147,483,647 tokens (it failed to store)."""
    from turnkit.budgets import BudgetLimit

    big = BudgetLimit(scope="organisation", organisation="acme", tokens=5_000_000_000)
    await store.set_budget_limit(big)
    assert await store.budget_limits("acme") == [big]


async def test_rename_and_delete_for_a_caller_touch_only_a_session_it_may_see(
    store: SqlStore,
) -> None:
    """`visible_to` is `SessionRecord.visible_to`, checked by the statement that writes."""
    await store.create_session(SessionId("mine"), principal="ada", organisation="acme")
    await store.create_session(SessionId("older"), principal="ada")  # from before organisations
    await store.create_session(SessionId("nobodys"))
    callers = [("ada", "acme"), ("ada", "other"), ("bob", "acme"), (None, None)]
    for sid in ("mine", "older", "nobodys"):
        record = await store.get_session(SessionId(sid))
        assert record is not None
        for caller in callers:
            may = record.visible_to(*caller)
            if may:
                renamed = await store.rename_session(SessionId(sid), "T", visible_to=caller)
                assert renamed.title == "T"
            else:
                with pytest.raises(SessionNotFoundError):
                    await store.rename_session(SessionId(sid), "T", visible_to=caller)
                assert not await store.delete_session(SessionId(sid), visible_to=caller)
                assert await store.get_session(SessionId(sid)) is not None
    assert await store.delete_session(SessionId("older"), visible_to=("ada", "other"))
    assert await store.delete_session(SessionId("nobodys"), visible_to=(None, None))
    assert not await store.delete_session(SessionId("nobodys"), visible_to=(None, None))
    assert await store.delete_session(SessionId("mine"))  # the app's own: any session
