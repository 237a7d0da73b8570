"""What an attempt starts from: the turn's log so far, read back into its Recorder."""

from __future__ import annotations

from collections.abc import Sequence

from turnkit.audit import AskedTurnPayload, AuditPayloads, AuditRow, UnreadableEventPayload
from turnkit.clock import Clock
from turnkit.journal import Journal
from turnkit.runtime._transcript import opening_message
from turnkit.stages._message_list import result_text
from turnkit.store import Lease, Store, TurnRecord, UnreadableEvent, decode_events
from turnkit.telemetry import Publish, Recorder

__all__ = ("context_tokens", "open_recorder")


async def open_recorder(
    *, store: Store, lease: Lease, record: TurnRecord, clock: Clock, publish: Publish
) -> tuple[Recorder, list[UnreadableEvent]]:
    """The attempt's Recorder, and the committed events it could not decode (left out).

    A first attempt starts from its `turn.started`; a later one reads back what the
    earlier ones committed (events, audit rows, usage), so it repeats none of it.
    """
    journal, audit_rows = Journal(), list[AuditRow]()
    usage = None
    skipped: list[UnreadableEvent] = []
    if lease.last_seq > 1:  # an earlier attempt got further than turn.started
        events, skipped = await decode_events(store.read_events(lease.turn_id))
        journal = Journal.of(events)
        audit_rows = await store.read_audit(lease.turn_id)
        usage = await store.read_usage(lease.turn_id)
    journal.keys.add("turn.started")
    asked_spent: dict[str, AskedTurnPayload] = {}
    for row in audit_rows:  # an answer's verdict is what its attempt committed
        check = row.payloads.output_check
        if check is not None and check.generation_id is not None:
            journal.answer_problems[check.generation_id] = check.problems
        if (spent := row.payloads.asked_turn) is not None:  # counted once, whoever asks again
            asked_spent[spent.turn_id] = spent
    recorder = Recorder(
        store=store,
        session_id=lease.session_id,
        turn_id=lease.turn_id,
        epoch=lease.epoch,
        clock=clock,
        publish=publish,
        last_seq=lease.last_seq,
        last_audit_seq=len(audit_rows),
        journal=journal,
        usage=usage,
    )
    _audit_unreadable(recorder, skipped, audit_rows)
    recorder.notes.context_tokens = context_tokens(audit_rows)
    recorder.notes.asked_spent = asked_spent
    recorder.notes.transcript = [opening_message(record)]  # until the setup has run
    recorder.notes.request_text = record.content
    for call_id, (block, _) in journal.results.items():
        recorder.notes.full_results[call_id] = result_text(block)
    if lease.last_seq > 1:
        recorder.notes.newest_guide_seq = 2**62  # resumed: look for guides at the first request
        # An answer resets the turn's attempts: a later attempt follows one that had it.
        recorder.notes.answered_before = lease.attempt > 1
        recorder.notes.tool_calls = sum(1 for k in journal.keys if k.startswith("tool.started:"))
    return recorder, skipped


def context_tokens(rows: Sequence[AuditRow]) -> int:
    """The context size an earlier attempt's latest call on the turn's own model left."""
    for row in reversed(rows):
        payloads = row.payloads
        if (
            row.call is not None
            and row.call.outcome == "ok"
            and row.identity.stage_id in ("tool-loop", "synthesize")
            and payloads.compaction is None
            and payloads.thinking_summary is None
        ):
            return row.call.input_tokens + row.call.output_tokens
    return 0


def _audit_unreadable(
    rec: Recorder, skipped: Sequence[UnreadableEvent], audit_rows: Sequence[AuditRow]
) -> None:
    """Stage an `unreadableEvent` row per skipped event an earlier attempt did not audit."""
    audited = {
        row.payloads.unreadable_event.seq
        for row in audit_rows
        if row.payloads.unreadable_event is not None
    }
    for item in skipped:
        if item.seq in audited:
            continue
        rec.audit(
            "runtime",
            call=None,
            payloads=AuditPayloads(
                unreadableEvent=UnreadableEventPayload(
                    seq=item.seq,
                    event_type=item.type,
                    reason=item.reason,
                    size_bytes=item.size_bytes,
                )
            ),
        )
