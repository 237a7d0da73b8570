"""A session's model-facing transcript: kept as sent, never rebuilt differently.

Each turn stores what it added (its opening message, the calls, tool results and notes
its requests carried, and its answer) when it ends. The next turn's first request starts
with exactly those bytes, so the provider's prompt cache keeps matching. A turn that
compacted or released pictures stores the whole list instead. Turns stored before
transcripts were kept fall back to their message and answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from pydantic import JsonValue

from turnkit.agent import Agent
from turnkit.context._known import KnownHistory, digests_of
from turnkit.context._sealed import seal
from turnkit.context.prefix import PreviousRequest, compact, expand
from turnkit.context.transcript import PartJson, TranscriptMessage
from turnkit.graph import turn_part
from turnkit.runtime._held import Held, HeldTranscripts, size_of
from turnkit.states import TerminalStatus
from turnkit.store import KeptTranscript, Store, TurnRecord, TurnTranscript
from turnkit.telemetry import Recorder

__all__ = (
    "answer_filtered",
    "answer_kept",
    "ended_transcript",
    "opening_message",
    "session_transcript",
)

_UNCHECKED_INPUT = (
    "[this message never reached the input guardrails (its turn did not keep what it "
    "sent) and is not shown]"
)
"""What the model reads, with input guardrails in play, for the message of a turn that
stored no transcript: a Stop before it ran, an orphan. Its raw text was never checked."""

_OUTPUT_LIMIT_NOTE = (
    "[my previous answer failed: agent_output_limit_exceeded — the output limit was "
    "reached before it was complete]"
)
_FILTERED_NOTE = (
    "[my previous answer failed: content-filtered — the provider's content filter stopped "
    "it before it had any text]"
)

_CUT_NOTE = (
    "[my previous answer was cut: content_filter — the provider's content filter stopped it "
    "after the text above, so it is incomplete]"
)
"""Follows an answer the content filter cut after some text: the model's own note, as
after the output limit, so the next turn knows its answer did not end where it meant."""


def opening_message(record: TurnRecord) -> TranscriptMessage:
    """The user message that opens `record`'s turn (with its pictures, if any)."""
    content: str | list[PartJson] = record.content
    if record.attachments:
        content = [
            {"kind": "text", "text": record.content},
            *(
                {k: str(v) for k, v in p.model_dump(mode="json", exclude_none=True).items()}
                for p in record.attachments
            ),
        ]
    return {"role": "user", "content": content, "input_seq": record.input_seq, "opens_turn": True}


async def session_transcript(
    store: Store,
    agent: Agent,
    record: TurnRecord,
    held: HeldTranscripts | None = None,
    *,
    guarded: bool = False,
    system_prompt: str | None = None,
) -> tuple[list[TranscriptMessage], PreviousRequest | None, KnownHistory]:
    """The transcript `record`'s turn starts from, the session's last request, its history.

    It opens with one system message: `system_prompt` (the agent's instructions with the
    runtime's guidance: `RuntimeConfig.system_prompt`), else the instructions alone.

    The history is the transcript between its system message and the turn's own. With
    `held`, the Store is asked only for the turns after the one held for the session, and
    what the turn starts from is held in its place. `guarded`: input guardrails are in
    play, so a message no guardrail was seen checking (a turn that stored no transcript)
    is withheld.
    """
    prompt = agent.instructions if system_prompt is None else system_prompt
    system: TranscriptMessage = {"role": "system", "content": prompt}
    if record.input_seq <= 1:  # a session's first turn has no history to read
        return [system, opening_message(record)], None, KnownHistory()
    session = record.session_id
    have = held.get(session) if held is not None else None
    if have is not None and have.input_seq >= record.input_seq:
        have = None  # held from a later turn: not this one's history
    if have is not None and have.guarded != guarded:
        have = None  # built for an agent with other input guardrails: not this one's view
    kept = await store.kept_transcript(
        session,
        before_input_seq=record.input_seq,
        after=have.through if have is not None else None,
    )
    start = have if kept.continues else None
    known, size = _history(start, kept, guarded=guarded)
    last = kept.last_request or (start.last_request if start is not None else None)
    if held is not None and kept.turns:
        newest = kept.turns[-1]
        held.hold(
            session,
            Held(
                through=newest.turn_id,
                input_seq=newest.input_seq,
                known=known,
                last_request=last,
                size=size,
                guarded=guarded,
            ),
        )
    transcript = [system, *known.messages, opening_message(record)]
    previous: PreviousRequest | None = None
    if last:  # stored beside the history: what it shares with it is counted, not listed
        stored = cast(PreviousRequest, {**last, "between_turns": True})
        previous = expand(stored, digests_of(transcript, known), known)
    return transcript, previous, known


def _history(
    start: Held | None, kept: KeptTranscript, *, guarded: bool = False
) -> tuple[KnownHistory, int]:
    """The history after the system message (and its size): `start`'s, then `kept`'s.

    Its messages are sealed: no hook changes them in place, so what the prefix check
    and the request encoding derive from each is kept on it, across the session's turns.
    """
    known = start.known if start is not None else KnownHistory()
    size = start.size if start is not None else 0
    for turn in kept.turns:
        stored = turn.transcript
        if stored is None:
            assert turn.record is not None
            added = [seal(m) for m in _legacy(turn.record, turn.answer, guarded=guarded)]
        else:
            added = [seal(cast(TranscriptMessage, m)) for m in stored.messages]
            if stored.replaces_history:  # the whole list, its own system message first
                known, size, added = KnownHistory(), 0, added[1:]
        known = known.extended(added)
        size += size_of(added)
    return known, size


def _legacy(
    turn: TurnRecord, answer: str | None, *, guarded: bool = False
) -> list[TranscriptMessage]:
    """A turn with no stored transcript: its message and answer (or why it has none).

    `guarded`: its raw text may be what an input guardrail would block or mask, and no
    record says what the guardrails made of it, so the model reads a note instead.
    """
    opening = opening_message(turn)
    if guarded:
        opening = {**opening, "content": _UNCHECKED_INPUT}
    out: list[TranscriptMessage] = [opening]
    if answer is not None:
        out.append({"role": "assistant", "content": answer})
    elif turn.error_code == "agent_output_limit_exceeded":
        out.append({"role": "assistant", "content": _OUTPUT_LIMIT_NOTE})
    return out


def ended_transcript(
    rec: Recorder,
    status: TerminalStatus,
    code: str | None,
    message: str | None,
    *,
    refusal: str | None = None,
) -> TurnTranscript:
    """What the turn adds to its session's transcript as it ends.

    A turn that ended without an answer keeps what its requests carried, answers any
    tool call left without a result, and says why it ended, so the next turn's model
    knows (and the next request still starts with this turn's last one). `refusal`: the
    words a `content-filtered` turn's model declined with.
    """
    messages = list(rec.notes.transcript)
    if status == "succeeded" and answer_filtered(rec):
        messages.append({"role": "assistant", "content": _CUT_NOTE})
    if status != "succeeded":
        messages += _unanswered_calls(messages, rec.notes.result_messages)
        if not (status == "cancelled" and answer_kept(rec)):  # stopped once answered
            note = _ending_note(status, code, message, refusal)
            messages.append({"role": "assistant", "content": note})
    last: dict[str, JsonValue] | None = None
    if rec.notes.last_request is not None:
        # Stored beside the session's transcript, which the next turn's list starts with:
        # what the request shares with it is counted, not listed (`compact`).
        known = rec.notes.known
        kept = compact(rec.notes.last_request, digests_of(messages, known), known)
        last = {k: cast(JsonValue, v) for k, v in kept.items() if k != "between_turns"}
    own, part = turn_part(rec, messages)  # what checkpoints keep is what is stored
    return TurnTranscript(
        messages=tuple(_json(m) for m in own),
        replaces_history=part == "replaced",
        last_request=last,
    )


def answer_kept(rec: Recorder) -> bool:
    """Whether the turn's answer is kept.

    Staged by synthesize, or in the log (an earlier attempt's, whichever stage wrote it).
    """
    return rec.notes.answer_kept or rec.journal.answer_kept


def answer_filtered(rec: Recorder) -> bool:
    """Whether the turn's answer is one the provider's content filter cut after some text.

    Synthesize says so; an attempt that took over after it committed the answer reads it
    from the log (the answer's block is `filtered`).
    """
    return rec.notes.answer_filtered or rec.journal.answer_filtered


def _json(message: TranscriptMessage) -> dict[str, JsonValue]:
    return cast(dict[str, JsonValue], dict(message))


def _unanswered_calls(
    messages: list[TranscriptMessage], came_in: Mapping[str, TranscriptMessage]
) -> list[TranscriptMessage]:
    """Results for the calls of the newest assistant message that have none yet.

    A result that came in before the ending (`came_in`) is kept as it is; a call still
    running, or waiting for a person, gets a failed one.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "assistant":
            answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
            return [
                came_in.get(call["id"])
                or {
                    "role": "tool",
                    "content": "Error: the turn ended before this call finished",
                    "tool_call_id": call["id"],
                }
                for call in message.get("tool_calls", [])
                if call["id"] not in answered
            ]
    return []


def _ending_note(
    status: TerminalStatus, code: str | None, message: str | None, refusal: str | None
) -> str:
    """Why the turn has no answer, as the model's own note (its next turn reads it).

    A missing answer the model cannot do better on at once (the output limit, the
    content filter, its own refusal) reads as its own, in words meant for it; any other
    ending quotes the error.
    """
    if code == "agent_output_limit_exceeded":
        return _OUTPUT_LIMIT_NOTE
    if code == "content-filtered":
        said = (refusal or "").strip()
        return (
            f'[my previous answer failed: content-filtered — I refused: "{said}"]'
            if said
            else _FILTERED_NOTE
        )
    if status == "cancelled":
        return "[the person stopped this turn before I answered]"
    return (
        f"[this turn ended without an answer: {code or status}{f' — {message}' if message else ''}]"
    )
