"""Running plugin hooks inside a turn: errors contained and audited, guardrails applied.

Every hook runs through `call_hook`: a hook that raises is logged and audited under the
plugin's name, and the turn goes on, unless the plugin is `required`. Guardrail verdicts
become `guardrail` events (checkpoint, kind, subject, action; never the text); `redact`
replaces the text, `block` ends the turn `guardrail-blocked`.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from pydantic import JsonValue

from turnkit.blocks import ToolResultBlock
from turnkit.errors import GuardrailBlockedError, PluginFailedError
from turnkit.events import DurableEvent, GuardrailEvent, PluginEmittedEvent, PluginSignalEvent
from turnkit.ids import SessionId, StageId, ToolCallId, TurnId
from turnkit.models import ModelRequest, ModelResponse, text_of
from turnkit.plugins import (
    Enrichment,
    ModelCallView,
    Note,
    Plugin,
    ToolCall,
    Verdict,
    overrides,
)
from turnkit.stages._titles import opening_title
from turnkit.stages._types import StageContext, TranscriptMessage
from turnkit.tenancy import Principal

__all__ = (
    "after_model_response",
    "call_hook",
    "after_tool_call",
    "before_model_request",
    "before_tool_call",
    "call_view",
    "guard",
    "guard_input",
    "on_events",
)

log = logging.getLogger("turnkit.plugins")

Checkpoint = Literal["input", "tool_result", "answer"]


@dataclass(slots=True)
class _Context:
    """The `PluginContext` one plugin gets in one stage."""

    stage: StageContext
    plugin: Plugin
    stage_id: StageId
    replaying: bool = False
    """Asked again for a request an earlier attempt made: what it writes is written already."""

    @property
    def session_id(self) -> SessionId:
        return self.stage.recorder.session_id

    @property
    def turn_id(self) -> TurnId:
        return self.stage.recorder.turn_id

    @property
    def agent(self) -> str:
        return self.stage.agent.name

    @property
    def principal(self) -> str | None:
        return self.stage.principal

    @property
    def caller(self) -> Principal | None:
        return self.stage.caller

    @property
    def deps(self) -> object:
        return self.stage.deps

    def audit(self, payload: JsonValue) -> None:
        if self.replaying:
            return
        self.stage.recorder.audit(
            self.stage_id, call=None, plugin_payloads={type(self.plugin).name: payload}
        )

    async def emit(self, name: str, data: Mapping[str, JsonValue], *, durable: bool = True) -> None:
        if self.replaying:
            return
        plugin = type(self.plugin).name
        fields = {"plugin": plugin, "name": f"plugin.{plugin}.{name}", "data": dict(data)}
        if durable and self.stage.recorder.log_closed:
            log.warning(
                "plugin %s emitted %r after turn %s's ending was committed: not sent",
                plugin,
                name,
                self.turn_id,
            )
        elif durable:
            self.stage.recorder.durable(PluginEmittedEvent, self.stage_id, **fields)
        else:
            await self.stage.recorder.ephemeral(PluginSignalEvent, self.stage_id, **fields)


async def call_hook(
    ctx: StageContext, stage_id: StageId, hook: str, *args: Any, replaying: bool = False
) -> list[tuple[Plugin, Any]]:
    """Run `hook` on every plugin that has it, in order: (plugin, result) of those that ran.

    `replaying`: the hook is asked again about what an earlier attempt did (its audit rows
    and events are not written twice).
    """
    out: list[tuple[Plugin, Any]] = []
    for plugin in ctx.plugins:
        if overrides(plugin, hook):
            ran, result = await _call_one(ctx, stage_id, plugin, hook, *args, replaying=replaying)
            if ran:
                out.append((plugin, result))
    return out


async def _call_one(
    ctx: StageContext,
    stage_id: StageId,
    plugin: Plugin,
    hook: str,
    *args: Any,
    replaying: bool = False,
    recorded: set[str] | None = None,
) -> tuple[bool, Any]:
    """One plugin's hook: (True, its result), or (False, None) when it failed (recorded).

    A result of the wrong type is a failure too: a hook that returns `"no"` where a
    `Verdict` belongs would otherwise silently do nothing. Whatever a hook raises is its
    plugin's failure, turnkit's own errors included: a plugin that is not `required`
    cannot end the turn by raising one. `recorded`: see `_failed`.
    """
    try:
        with ctx.recorder.notes.waiting_on(f"plugin {type(plugin).name!r} ({hook})"):
            result = await getattr(plugin, hook)(_Context(ctx, plugin, stage_id, replaying), *args)
        if hook in _OBSERVERS and result is not None:
            _observer_returned(plugin, hook, result)
        wrong = _wrong_return(hook, result)
        if wrong is not None:
            raise TypeError(wrong)
    except Exception as exc:  # noqa: BLE001 - recorded; a required plugin fails the turn
        _failed(ctx, stage_id, plugin, hook, exc, recorded=recorded)
        return False, None
    return True, result


def _failed(
    ctx: StageContext,
    stage_id: StageId,
    plugin: Plugin,
    hook: str,
    exc: Exception,
    *,
    recorded: set[str] | None = None,
) -> None:
    """Log and audit a hook's failure; a `required` plugin's fails the turn.

    The log line carries the exception's type, and its traceback the first time the hook
    fails in the attempt.

    `recorded`: the plugins whose failure is already recorded for what is checked again
    and again (a streamed block's text, chunk by chunk): each is logged and audited once
    there, not once per chunk.
    """
    name = type(plugin).name
    if recorded is None or name not in recorded:
        if recorded is not None:
            recorded.add(name)
        traced = ctx.recorder.notes.plugin_tracebacks
        first = (name, hook) not in traced
        traced.add((name, hook))
        log.warning(
            "plugin %s failed in %s: %s: %s",
            name,
            hook,
            type(exc).__name__,
            exc,
            exc_info=exc if first else None,
        )
        ctx.recorder.audit(
            stage_id, call=None, plugin_payloads={name: {"hook": hook, "error": repr(exc)}}
        )
    if type(plugin).required:
        raise PluginFailedError(
            f"plugin {name!r} failed in {hook} and is required: {exc}", plugin=name, hook=hook
        ) from exc


_RETURNS: Mapping[str, tuple[tuple[type, ...], str]] = {
    "before_model_request": ((list, tuple), "a list of notes (strings or Notes)"),
    "before_tool_call": ((str,), "a reason (a string) to deny the call"),
    "enrich_message": ((Enrichment,), "an Enrichment"),
    "check_input": ((Verdict,), "a Verdict"),
    "check_tool_result": ((Verdict,), "a Verdict"),
    "check_answer": ((Verdict,), "a Verdict"),
}
"""What a hook may return besides None (the other hooks' results are not read)."""

_OBSERVERS: Final = frozenset({"after_model_response", "after_tool_call", "on_event"})
"""Hooks that only observe: what one returns changes nothing, which its author is told."""

_told: set[tuple[str, str]] = set()
"""(plugin, hook) pairs warned about a value their observing hook returned."""


def _observer_returned(plugin: Plugin, hook: str, result: object) -> None:
    """Warn once a process that an observing hook returned a value, which is dropped.

    Not a failure: a hook that happens to return what it awaited (`return await log(...)`)
    must not fail a `required` plugin's turns.
    """
    key = (type(plugin).name, hook)
    if key not in _told:
        _told.add(key)
        log.warning(
            "plugin %s: %s returned %s %.80r, which changes nothing (it observes; return "
            "None)",
            key[0], hook, type(result).__name__, result,
        )  # fmt: skip


def _wrong_return(hook: str, result: object) -> str | None:
    expected = _RETURNS.get(hook)
    if expected is None or result is None:
        return None
    kinds, what = expected
    fits = isinstance(result, kinds)
    if fits and hook == "before_model_request":
        fits = all(isinstance(note, str | Note) for note in result)  # type: ignore[attr-defined]
    if fits:
        return None
    return f"{hook} returned {type(result).__name__} {result!r:.80}; return {what} or None"


def answer_hold(ctx: StageContext, stage_id: StageId, text: str) -> int | None:
    """How much of the end of the answer so far the plugins hold back (see `Plugin`).

    None: a plugin's `answer_hold` failed (logged and audited), and the rest of the block
    is held until it ends; a `required` plugin fails the turn instead.
    """
    hold = 0
    for plugin in ctx.plugins:
        if not overrides(plugin, "answer_hold"):
            continue
        try:
            found: object = plugin.answer_hold(text)
            if isinstance(found, bool) or not isinstance(found, numbers.Integral):
                raise TypeError(
                    f"answer_hold returned {type(found).__name__}; return a whole number of "
                    "characters"
                )
            hold = max(hold, int(found))
        except Exception as exc:  # noqa: BLE001 - recorded; the rest of the block is held
            _failed(ctx, stage_id, plugin, "answer_hold", exc)
            return None
    return hold


def call_view(
    stage_id: StageId, request: ModelRequest, response: ModelResponse | None = None
) -> ModelCallView:
    """What plugins see of a reasoning call."""
    return ModelCallView(
        stage_id=stage_id,
        messages=tuple((m.role, text_of(m.content)) for m in request.messages),
        response_text=response.text if response is not None else "",
        tool_calls=tuple(c.name for c in response.tool_calls) if response is not None else (),
    )


async def before_model_request(
    ctx: StageContext,
    stage_id: StageId,
    transcript: list[TranscriptMessage],
    *,
    replaying: bool = False,
) -> list[TranscriptMessage]:
    """Notes plugins append before a reasoning call (kept: later calls carry them too).

    `replaying`: for a request an earlier attempt made, whose answer is reused.
    """
    if not ctx.plugins:
        return []
    view = ModelCallView(
        stage_id=stage_id,
        messages=tuple((str(m["role"]), _text(m)) for m in transcript),
    )
    notes: list[TranscriptMessage] = []
    hooked = await call_hook(ctx, stage_id, "before_model_request", view, replaying=replaying)
    for _, found in hooked:
        for note in found or ():
            text, standing = (note.text, note.standing) if isinstance(note, Note) else (note, False)
            if not text.strip():
                continue
            message: TranscriptMessage = {"role": "system", "content": text}
            if standing:
                message["standing"] = True  # compaction keeps it (as the plan's note)
            notes.append(message)
    return notes


async def after_model_response(
    ctx: StageContext, stage_id: StageId, request: ModelRequest, response: ModelResponse
) -> None:
    """Tell plugins about a finished reasoning call (their view is built only for them)."""
    if ctx.plugins:
        view = call_view(stage_id, request, response)
        await call_hook(ctx, stage_id, "after_model_response", view)


async def before_tool_call(ctx: StageContext, call: ToolCall) -> str | None:
    """The first reason a plugin gives to deny the call, or None."""
    if not ctx.plugins:
        return None
    for plugin, reason in await call_hook(ctx, "tool-loop", "before_tool_call", call):
        if reason is not None and reason.strip():
            return f"denied by {type(plugin).name}: {reason}"
    return None


async def after_tool_call(ctx: StageContext, call: ToolCall, result: ToolResultBlock) -> None:
    """Tell plugins about a finished tool call."""
    if ctx.plugins:
        await call_hook(ctx, "tool-loop", "after_tool_call", call, result)


async def guard(
    ctx: StageContext,
    stage_id: StageId,
    checkpoint: Checkpoint,
    text: str,
    *,
    subject: str,
    call: ToolCall | None = None,
    input_seq: int | None = None,
    recorded: set[str] | None = None,
) -> str:
    """Run the guardrails of `checkpoint` on `text`; the text to go on with.

    `recorded`: the plugins whose failure on this text is already recorded (see `_failed`).

    Raises:
        GuardrailBlockedError: a guardrail blocked it.
    """
    if not ctx.plugins:
        return text
    hook = {"input": "check_input", "tool_result": "check_tool_result", "answer": "check_answer"}[
        checkpoint
    ]
    for plugin in ctx.plugins:
        if not overrides(plugin, hook):
            continue
        # Each guardrail checks what the ones before it let through (their redactions too).
        args: Sequence[object] = (call, text) if checkpoint == "tool_result" else (text,)
        ran, verdict = await _call_one(ctx, stage_id, plugin, hook, *args, recorded=recorded)
        if not ran or verdict is None:
            continue
        ctx.recorder.durable(
            GuardrailEvent,
            stage_id,
            checkpoint=checkpoint,
            kind=verdict.kind,
            subject=verdict.subject or subject,
            action=verdict.action,
            tool_call_id=ToolCallId(call.tool_call_id) if call is not None else None,
            **({"input_seq": input_seq} if input_seq is not None else {}),
        )
        if verdict.action == "block":
            await ctx.recorder.flush()
            raise GuardrailBlockedError(
                f"the guardrail {type(plugin).name!r} blocked the {subject} ({verdict.kind})",
                plugin=type(plugin).name,
                checkpoint=checkpoint,
                kind=verdict.kind,
            )
        if verdict.action == "redact" and verdict.replacement is not None:
            text = verdict.replacement
    return text


BLOCKED_INPUT = "[this message was blocked by a guardrail and is not shown]"
"""What the model reads, in later turns, in place of a message an input guardrail blocked."""


BLOCKED_TITLE: Final = "Blocked message"
"""A session's name when its opening message was blocked (the message named it)."""


async def _retitle(ctx: StageContext, text: str, title: str) -> None:
    """Rename a session its opening message `text` named, while that name still stands.

    The name is read off the message when it is committed, before any guardrail sees it:
    a list of chats must not show what a guardrail blocked or redacted.
    """
    rec = ctx.recorder
    await rec.store.name_session(rec.session_id, title, current=opening_title(text))


def _text(message: TranscriptMessage) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


async def on_events(ctx: StageContext, events: Sequence[DurableEvent]) -> None:
    """Tell plugins about committed events (what they stage goes out with the next commit)."""
    for event in events:
        await call_hook(ctx, event.stage_id, "on_event", event)


async def guard_input(
    ctx: StageContext, transcript: list[TranscriptMessage]
) -> list[TranscriptMessage]:
    """The input guardrails on the turn's opening message (the transcript's last one)."""
    if not ctx.plugins or not transcript:
        return transcript
    opening = transcript[-1]
    text = _text(opening)
    try:
        checked = await guard(ctx, "runtime", "input", text, subject="user message")
    except GuardrailBlockedError:
        # What the turn keeps for the next turn's model: never the message it blocked.
        withheld = {**opening, "content": BLOCKED_INPUT}
        ctx.recorder.notes.transcript = [*transcript[:-1], cast(TranscriptMessage, withheld)]
        await _retitle(ctx, text, BLOCKED_TITLE)
        raise
    if checked == text:
        return transcript
    ctx.recorder.notes.request_text = checked  # what the plan, naming and summary calls read
    await _retitle(ctx, text, opening_title(checked))
    content: Any = checked
    if not isinstance(opening["content"], str):  # keep the pictures, replace the text
        content = [{"kind": "text", "text": checked}] + [
            p for p in opening["content"] if p.get("kind") != "text"
        ]
    return [*transcript[:-1], {**opening, "content": content}]
