"""Turnkit events → AG-UI events: the `Translator` of one run (one HTTP response).

It sends only what the client does not hold already (`ClientView`, from the run's
`messages`), holds back a text block whose start it may have missed, and ends the run with
its outcome: success with usage, cancelled, an error, or an interrupt for a pause.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, assert_never, cast

from pydantic import JsonValue

from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    CheckpointCreatedEvent,
    ClarificationRequestedEvent,
    CompactionCompletedEvent,
    CompactionStartedEvent,
    DoneEvent,
    DurableEvent,
    ErrorEvent,
    GuardrailEvent,
    HeartbeatEvent,
    InputGuidedEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    MessageCitationsEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageEntitiesEvent,
    MessageSnapshotEvent,
    PluginEmittedEvent,
    PluginSignalEvent,
    ProviderCascadeEvent,
    RunFinishedEvent,
    SessionRenamedEvent,
    StepEndEvent,
    StepStartEvent,
    StreamEvent,
    TasksUpdatedEvent,
    ThinkingCompleteEvent,
    ThinkingDeltaEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
    TurnStartedEvent,
    UsageEvent,
    decode_event,
)
from turnkit.ids import TurnId
from turnkit.pauses import CLARIFY_TOOL
from turnkit.projection import PendingDecision, decision_of
from turnkit.protocols._agui_wire import InputMessage
from turnkit.protocols._asked import asked_usage

__all__ = ("SHUTDOWN", "AgUi", "ClientView", "Translator", "client_view")

SHUTDOWN: Final = "server-shutting-down"
"""The code of the `RUN_ERROR` a stream ends with when its server shuts down mid-run."""

log = logging.getLogger("turnkit.protocols")

AgUi = dict[str, JsonValue]
_APPROVAL_SCHEMA: Final[AgUi] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "note": {"type": "string"},
        "editedArgs": {"type": "object"},
    },
    "required": ["approved"],
}


def _ms(ts: datetime) -> int:
    """Integer milliseconds since the epoch (AG-UI timestamps)."""
    return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def _ev(kind: str, ts: datetime, **fields: JsonValue) -> AgUi:
    return {"type": kind, "timestamp": _ms(ts), **fields}


@dataclass(slots=True, kw_only=True)
class ClientView:
    """What the client says it holds already (its `messages`): only the rest is sent.

    `taken` holds the tool call ids of the turns before the run's (the messages before
    its last user message): turnkit's ids name calls per turn, and a server that numbers
    calls per response (`call_1` every time) repeats them across turns, while an AG-UI
    thread needs each id once. A call of the run's turn with such an id goes out renamed,
    unless the client holds it under that id after its last user message (a thread
    rebuilt from the session's history has the turn's calls under turnkit's ids).
    """

    texts: dict[str, str]
    arguments: dict[str, str]
    results: set[str]
    taken: set[str] = field(default_factory=set)
    current: set[str] = field(default_factory=set)
    reasoning: dict[str, str] = field(default_factory=dict)


def client_view(messages: Sequence[InputMessage]) -> ClientView:
    view = ClientView(texts={}, arguments={}, results=set())
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    for index, message in enumerate(messages):
        if message.role == "assistant":
            if isinstance(message.content, str) and message.message_id:
                view.texts[message.message_id] = message.content
            for call in message.tool_calls:
                view.arguments[call.tool_call_id] = call.function.arguments
                (view.taken if index < last_user else view.current).add(call.tool_call_id)
        elif message.role == "reasoning" and isinstance(message.content, str):
            view.reasoning[message.message_id] = message.content
        elif message.role == "tool" and message.tool_call_id:
            view.results.add(message.tool_call_id)
            (view.taken if index < last_user else view.current).add(message.tool_call_id)
    return view


@dataclass(slots=True)
class _Block:
    """A text block of this stream: the text the client holds, whether START was sent."""

    sent: str = ""
    opened: bool = False
    held: bool = False
    """Its deltas are not forwarded: the rest goes out with its `message.complete`."""
    blank: str = ""
    """White space the block started with, sent only once text follows it."""


class Translator:
    """Turns one turn's events into the AG-UI events of one run (one HTTP response)."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        turn_id: TurnId,
        client: ClientView,
        now: Callable[[], datetime],
    ) -> None:
        self.run: AgUi = {"threadId": thread_id, "runId": run_id}
        self.turn_id = turn_id
        self.client = client
        self.now = now
        self.tag = turn_id[-12:]  # renames a call id an earlier turn holds
        self.steps: list[str] = []
        self.blocks: dict[str, _Block] = {}
        self.parents: dict[str, str] = {}  # generation id → text block of the same call
        self.ask_user: str | None = None
        self.error: ErrorEvent | None = None
        self.usage: UsageEvent | RunFinishedEvent | None = None
        """The turn's totals: its `usage`, or the account a failed or stopped turn ends with."""
        self.model: str | None = None
        self.filtered = False
        """The turn's answer is one the provider's content filter cut after some text."""
        self.views = 0
        self.trusted_after: int | None = None  # set: only blocks begun after it are whole
        self.finished = False

    # ── state ──

    def restore(self, past: Sequence[StreamEvent]) -> None:
        """Take the state the log holds up to the cursor (events the client has)."""
        for event in past:
            self._remember(event)
            if isinstance(event, StepStartEvent):
                self.steps.append(event.step)
            elif isinstance(event, StepEndEvent) and event.step in self.steps:
                self.steps.remove(event.step)

    def notice(self, views: int, seq: int) -> None:
        """A later view of the buffer (after an outage): deltas before it were lost."""
        if views != self.views:
            self.views = views
            if views > 1:
                self.trusted_after = seq
                for block in self.blocks.values():
                    block.held = True

    def _remember(self, event: StreamEvent) -> None:
        if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
            self.filtered = event.block.filtered
        match event:
            case MessageCompleteEvent(generation_id=str() as generation, block=block) if (
                block.text.strip() or block.is_answer
            ):  # a message was sent (white space alone is none): the call's parent
                self.parents[generation] = block.block_id
            case ToolStartedEvent() if event.block.tool_name == CLARIFY_TOOL:
                self.ask_user = event.block.tool_call_id
            case ErrorEvent():
                self.error = event
            case UsageEvent():
                self.usage = event
            case RunFinishedEvent():
                self.usage, self.model = event, event.model
            case _:
                pass

    # ── the run's edges ──

    def opening(self, *, last: StreamEvent | None, waits_for: PendingDecision | None) -> list[AgUi]:
        """RUN_STARTED, the steps still open, and the run's end (or its pause) again."""
        now = self.now()
        out = [
            _ev("RUN_STARTED", now, **self.run, metadata={"turnkit": {"turnId": self.turn_id}}),
            *(_ev("STEP_STARTED", now, stepName=step) for step in self.steps),
        ]
        if isinstance(last, DoneEvent):
            out += self._ending(last, now)
        elif waits_for is not None:
            out += self._interrupt(waits_for, now)
        return out

    def abandon(
        self,
        message: str = "the turn's event stream ended before the turn did",
        code: str = "internal-error",
    ) -> list[AgUi]:
        """The stream stops before the run's end (the turn was deleted, the server stops)."""
        if self.finished:
            return []
        self.finished, now = True, self.now()
        return [*self._close(now), _ev("RUN_ERROR", now, message=message, code=code)]

    def _end_blocks(self, ts: datetime, *, discarded: bool = False) -> list[AgUi]:
        """End the open messages of blocks that will not complete; forget held ones.

        `discarded`: their rung failed over, and the next writes the text again; the
        message's `metadata` says so, for a client to leave it out.
        """
        mark: dict[str, JsonValue] = (
            {"metadata": {"turnkit": {"discarded": True}}} if discarded else {}
        )
        out = [_ev("TEXT_MESSAGE_END", ts, messageId=block_id, **mark)
               for block_id, block in self.blocks.items() if block.opened]  # fmt: skip
        self.blocks.clear()
        return out

    def _close(self, ts: datetime) -> list[AgUi]:
        out = self._end_blocks(ts)
        out += [_ev("STEP_FINISHED", ts, stepName=step) for step in reversed(self.steps)]
        self.steps.clear()
        return out

    def _ending(self, done: DoneEvent, ts: datetime) -> list[AgUi]:
        self.finished = True
        out = self._close(ts)
        out.append(
            _run_end(
                done,
                ts,
                run=self.run,
                turn_id=self.turn_id,
                usage=self.usage,
                tokens=self._tokens(),
                error=self.error,
                filtered=self.filtered,
            )
        )
        return out

    def _tokens(self) -> list[JsonValue] | None:
        """AG-UI's `usage` for the run that ends the turn: the turn's model calls.

        turnkit counts a turn's usage when it ends, so a run that pauses reports none and
        the run that ends the turn (succeeded, failed or stopped) reports the turn's:
        the runs of a thread add up to its turns' totals.
        """
        u = self.usage
        if u is None or u.model_calls == 0:
            return None
        tokens: AgUi = {
            "inputTokens": u.input_tokens,
            "outputTokens": u.output_tokens,
            "totalTokens": u.input_tokens + u.output_tokens,
            "cachedInputTokens": u.cached_tokens,
        }
        return [tokens | ({"model": self.model} if self.model else {})]

    def _interrupt(self, request: PendingDecision, ts: datetime) -> list[AgUi]:
        self.finished = True
        end = _run_interrupted(
            request,
            ts,
            run=self.run,
            turn_id=self.turn_id,
            ask_user=self.ask_user,
            wire=self.wire_id,
        )
        return [*self._close(ts), end]

    # ── events ──

    def feed(self, data: bytes) -> list[AgUi]:
        """The AG-UI events for one turnkit event's wire JSON (none if it is unreadable)."""
        try:
            event = decode_event(data)
        except ValueError:
            log.warning("skipped an unreadable event of turn %s", self.turn_id)
            return []
        self._remember(event)
        out = self._map(event, cast(AgUi, json.loads(data)))
        if isinstance(event, DurableEvent) and (self.trusted_after or 0) < event.seq:
            self.trusted_after = None  # committed after the view: later blocks are whole
        return out

    def _map(self, event: StreamEvent, raw: AgUi) -> list[AgUi]:  # noqa: C901 - a case per kind
        match event:
            case StepStartEvent():
                self.steps.append(event.step)
                return [_ev("STEP_STARTED", event.ts, stepName=event.step)]
            case StepEndEvent():
                if event.step not in self.steps:
                    return []
                self.steps.remove(event.step)
                return [_ev("STEP_FINISHED", event.ts, stepName=event.step)]
            case MessageDeltaEvent() | MessageSnapshotEvent():
                return self._text(event)
            case MessageCompleteEvent():
                return self._complete(event)
            case ToolStartedEvent():
                return self._tool_call(event)
            case ToolCompletedEvent() | ToolFailedEvent():
                return self._tool_result(event)
            case ProviderCascadeEvent():  # the failed rung's block never completes: end it
                return [*self._end_blocks(event.ts, discarded=True), self._custom(event, raw)]
            case TurnRecoveringEvent():  # a new attempt may write the open block again
                for block in self.blocks.values():
                    block.held = True
                return [self._custom(event, raw)]
            case ApprovalRequestedEvent() | ClarificationRequestedEvent():
                return [self._custom(event, raw), *self._interrupt(decision_of(event), event.ts)]
            case DoneEvent():
                return self._ending(event, event.ts)
            case ThinkingCompleteEvent():
                return [*self._reasoning(event), self._custom(event, raw)]
            case (
                TurnStartedEvent() | InputGuidedEvent() | ThinkingDeltaEvent()
                | ToolDeltaEvent() | JobDispatchedEvent()
                | JobProgressEvent() | JobCompletedEvent() | MessageCitationsEvent()
                | MessageEntitiesEvent() | GuardrailEvent() | CompactionStartedEvent()
                | CompactionCompletedEvent() | UsageEvent() | CheckpointCreatedEvent()
                | HeartbeatEvent() | ToolInDoubtEvent() | TasksUpdatedEvent()
                | RunFinishedEvent() | ErrorEvent() | PluginEmittedEvent() | PluginSignalEvent()
                | SessionRenamedEvent() | BudgetPausedEvent() | ApprovalAnsweredEvent()
            ):  # fmt: skip
                # A budget pause keeps the run open: the turn goes on by itself once the
                # limit is raised (nothing for the client to answer).
                return [self._custom(event, raw)]
            case _:
                assert_never(event)

    def _text(self, event: MessageDeltaEvent | MessageSnapshotEvent) -> list[AgUi]:
        """A delta appends; a snapshot (a reader joining mid-block) says what is there."""
        block_id = event.block_id
        block = self.blocks.get(block_id)
        if block is None:
            block = self.blocks[block_id] = _Block(sent=self.client.texts.get(block_id, ""))
            # A delta with no snapshot before it may follow deltas this stream never saw.
            unsure = block_id in self.client.texts or self.trusted_after is not None
            block.held = isinstance(event, MessageDeltaEvent) and unsure
        if isinstance(event, MessageSnapshotEvent):
            whole = event.text
        else:
            whole = block.sent + block.blank + event.text
        if block.held or not whole.startswith(block.sent):
            block.held = True  # the rest goes out with `message.complete`
            return []
        if not (block.opened or whole.strip()):
            block.blank = whole[len(block.sent) :]  # no message of white space alone
            return []
        block.blank = ""
        out = []
        if not block.opened:
            block.opened = True
            out.append(_ev("TEXT_MESSAGE_START", event.ts, messageId=block_id, role="assistant"))
        if rest := whole[len(block.sent) :]:
            out.append(_ev("TEXT_MESSAGE_CONTENT", event.ts, messageId=block_id, delta=rest))
        block.sent = whole
        return out

    def _complete(self, event: MessageCompleteEvent) -> list[AgUi]:
        text, block_id = event.block.text, event.block.block_id
        block = self.blocks.pop(block_id, None) or _Block(sent=self.client.texts.get(block_id, ""))
        if not (text.strip() or block.opened or event.block.is_answer):
            # Narration with no text (a call that only named tools), or only white space
            # beside its calls: nothing to show.
            return []
        out = []
        if not block.opened:
            out.append(_ev("TEXT_MESSAGE_START", event.ts, messageId=block_id, role="assistant"))
        if not text.startswith(block.sent):
            log.warning("the client holds text of block %s that the block does not start with",
                        block_id)  # fmt: skip
        elif rest := text[len(block.sent) :]:
            out.append(_ev("TEXT_MESSAGE_CONTENT", event.ts, messageId=block_id, delta=rest))
        # Which message is the answer (the rest is narration, or a failed answer), and
        # whether the provider's content filter cut it.
        turnkit: AgUi = {"answer": True} if event.block.is_answer else {}
        if event.block.is_answer and event.block.filtered:
            turnkit["filtered"] = True
        mark: dict[str, JsonValue] = {"metadata": {"turnkit": turnkit}} if turnkit else {}
        out.append(_ev("TEXT_MESSAGE_END", event.ts, messageId=block_id, **mark))
        return out

    def _reasoning(self, event: ThinkingCompleteEvent) -> list[AgUi]:
        """The thinking summary as a reasoning message, in a reasoning span of its own.

        Sent whole (the summary is committed at once), less the text the client holds.
        """
        block_id, text = event.block.block_id, event.block.summary
        held = self.client.reasoning.get(block_id, "")
        out = [
            _ev("REASONING_START", event.ts, messageId=block_id),
            _ev("REASONING_MESSAGE_START", event.ts, messageId=block_id, role="reasoning"),
        ]
        if text.startswith(held) and (rest := text[len(held) :]):
            out.append(_ev("REASONING_MESSAGE_CONTENT", event.ts, messageId=block_id, delta=rest))
        out.append(_ev("REASONING_MESSAGE_END", event.ts, messageId=block_id))
        out.append(_ev("REASONING_END", event.ts, messageId=block_id))
        return out

    def wire_id(self, tool_call_id: str) -> str:
        """The call's id on this thread: renamed when an earlier turn's call has it."""
        if tool_call_id in self.client.taken and tool_call_id not in self.client.current:
            return f"{tool_call_id}_{self.tag}"
        return tool_call_id

    def _tool_call(self, event: ToolStartedEvent) -> list[AgUi]:
        call, ts = event.block, event.ts
        call_id = self.wire_id(call.tool_call_id)
        start: AgUi = {"toolCallId": call_id, "toolCallName": call.tool_name}
        if event.generation_id is not None:
            # The calls of one model call go in one assistant message: its text's, or, when
            # it wrote none, the message the client made for its first call (by that id).
            parent = self.parents.setdefault(event.generation_id, call_id)
            if parent != call_id:
                start["parentMessageId"] = parent
        if call_id in self.client.results:
            # The client holds the call and its result: started again with no result,
            # `HttpAgent` would list it as a call still to run.
            return []
        arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
        held = self.client.arguments.get(call_id, "")
        out = [_ev("TOOL_CALL_START", ts, **start)]
        if arguments.startswith(held) and (rest := arguments[len(held) :]):
            out.append(_ev("TOOL_CALL_ARGS", ts, toolCallId=call_id, delta=rest))
        out.append(_ev("TOOL_CALL_END", ts, toolCallId=call_id))
        return out

    def _tool_result(self, event: ToolCompletedEvent | ToolFailedEvent) -> list[AgUi]:
        call_id = self.wire_id(event.tool_call_id)
        if call_id in self.client.results:
            return []  # the client has it already
        result = event.result
        fields: AgUi = {
            "messageId": f"result_{call_id}",
            "toolCallId": call_id,
            "role": "tool",
        }
        if isinstance(event, ToolFailedEvent) or result.is_error:
            fields["content"] = result.error or "the tool failed"
            code = event.code if isinstance(event, ToolFailedEvent) else "tool-error"
            fields["metadata"] = {"turnkit": {"isError": True, "code": code}}
        elif isinstance(result.output, str):
            fields["content"] = result.output
        else:
            fields["content"] = json.dumps(result.output, ensure_ascii=False)
        return [_ev("TOOL_CALL_RESULT", event.ts, **fields)]

    def _custom(self, event: StreamEvent, raw: AgUi) -> AgUi:
        return _ev("CUSTOM", event.ts, name=f"turnkit.{event.type}", value=raw)


# ── the run's end ─────────────────────────────────────────────────────────────────────


def _run_end(
    done: DoneEvent,
    ts: datetime,
    *,
    run: AgUi,
    turn_id: TurnId,
    usage: UsageEvent | RunFinishedEvent | None,
    tokens: list[JsonValue] | None,
    error: ErrorEvent | None,
    filtered: bool = False,
) -> AgUi:
    """RUN_FINISHED or RUN_ERROR, for a turn that is done.

    `usage`: the turn's totals (turnkit's `result.usage`, with `asked` when it asked agents
    as tools); `tokens`: its own calls as AG-UI's `usage`, which every ending carries (a
    failed or stopped turn's calls count too); `filtered`: the provider's content filter
    cut the answer (`result.filtered`).
    """
    extra: AgUi = {} if tokens is None else {"usage": tokens}
    match done.status:
        case "succeeded":
            result: AgUi = {"turnId": turn_id}
            if (u := usage) is not None:
                totals: AgUi = {
                    "modelCalls": u.model_calls,
                    "inputTokens": u.input_tokens,
                    "outputTokens": u.output_tokens,
                    "cachedTokens": u.cached_tokens,
                    "costUsd": u.cost_usd,
                }
                if u.asked is not None:  # what the agents it asked as tools spent, apart
                    totals["asked"] = asked_usage(u.asked)
                result["usage"] = totals
            if filtered:
                result["filtered"] = True
            outcome: AgUi = {"type": "success"}
            return _ev("RUN_FINISHED", ts, **run, outcome=outcome, result=result, **extra)
        case "cancelled":
            return _ev("RUN_FINISHED", ts, **run, outcome={"type": "cancelled"}, **extra)
        case "failed" | "timed_out":
            message = error.message if error else f"the turn {done.status}"
            code = error.code if error else (done.error_code or done.status)
            return _ev("RUN_ERROR", ts, message=message, code=code, **extra)
        case _:
            assert_never(done.status)


def _run_interrupted(
    request: PendingDecision,
    ts: datetime,
    *,
    run: AgUi,
    turn_id: TurnId,
    ask_user: str | None,
    wire: Callable[[str], str],
) -> AgUi:
    """RUN_FINISHED with an interrupt outcome: the pause's question, and how to answer it."""
    turnkit: AgUi = {"turnId": turn_id}
    interrupt: AgUi = {"id": request.request_id}
    call_id = None if request.tool_call_id is None else wire(request.tool_call_id)
    if request.kind == "approval":
        interrupt |= {
            "reason": "tool_call",
            "message": request.summary,
            "toolCallId": call_id,
            "responseSchema": _APPROVAL_SCHEMA,
        }
        turnkit |= {
            "kind": "approval",
            "toolCallId": call_id,
            "toolName": request.tool_name,
            "arguments": request.arguments,
            "summary": request.summary,
        }
        if request.approver_role is not None:
            turnkit["approverRole"] = request.approver_role
    else:
        answer: AgUi = {"type": "string"}
        if request.choices:
            answer["examples"] = list(request.choices)
        schema: AgUi = {"type": "object", "properties": {"answer": answer}}
        interrupt |= {
            "reason": "input_required",
            "message": request.question,
            "responseSchema": schema | {"required": ["answer"]},
        }
        turnkit |= {
            "kind": "clarification",
            "question": request.question,
            "choices": list(request.choices),
        }
        # The call that waits: recorded on the request, else (older logs) the newest
        # `ask_user` call, unless an asked agent's question (older logs name no call).
        waiting = request.tool_call_id or (ask_user if request.asked is None else None)
        if waiting is not None:
            interrupt["toolCallId"] = turnkit["toolCallId"] = wire(waiting)
    if request.asked is not None:  # an agent asked as a tool waits for it: the answer goes on
        asked = request.asked
        turnkit["asked"] = {
            "agent": asked.agent,
            "sessionId": asked.session_id,
            "turnId": asked.turn_id,
            "requestId": asked.request_id,
        }
    interrupt["metadata"] = {"turnkit": turnkit}
    outcome: AgUi = {"type": "interrupt", "interrupts": [interrupt]}
    return _ev("RUN_FINISHED", ts, **run, outcome=outcome)
