"""Running plugin hooks inside a turn: errors contained and audited, guardrails applied.

Every hook runs through `call_hook`: a hook that raises is logged and audited under the
plugin's name, and the turn goes on, unless the plugin is `required`. Guardrail verdicts
become `guardrail` events (checkpoint, kind, subject, action; never the text); `redact`
replaces the text, `block` ends the turn `guardrail-blocked`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import JsonValue

from turnkit.blocks import ToolResultBlock
from turnkit.errors import GuardrailBlockedError, PluginFailedError
from turnkit.events import DurableEvent, GuardrailEvent, PluginEmittedEvent, PluginSignalEvent
from turnkit.ids import SessionId, StageId, TurnId
from turnkit.models import ModelRequest, ModelResponse, text_of
from turnkit.plugins import ModelCallView, Plugin, ToolCall, Verdict, overrides
from turnkit.stages._types import StageContext, TranscriptMessage

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

    def audit(self, payload: JsonValue) -> None:
        self.stage.recorder.audit(
            self.stage_id, call=None, plugin_payloads={type(self.plugin).name: payload}
        )

    async def emit(self, name: str, data: Mapping[str, JsonValue], *, durable: bool = True) -> None:
        plugin = type(self.plugin).name
        fields = {"plugin": plugin, "name": f"plugin.{plugin}.{name}", "data": dict(data)}
        if durable:
            self.stage.recorder.durable(PluginEmittedEvent, self.stage_id, **fields)
        else:
            await self.stage.recorder.ephemeral(PluginSignalEvent, self.stage_id, **fields)


async def call_hook(
    ctx: StageContext, stage_id: StageId, hook: str, *args: Any
) -> list[tuple[Plugin, Any]]:
    """Run `hook` on every plugin that has it, in order: (plugin, result) of those that ran."""
    out: list[tuple[Plugin, Any]] = []
    for plugin in ctx.plugins:
        if not overrides(plugin, hook):
            continue
        name = type(plugin).name
        try:
            result = await getattr(plugin, hook)(_Context(ctx, plugin, stage_id), *args)
        except (GuardrailBlockedError, PluginFailedError):
            raise
        except Exception as exc:
            log.warning("plugin %s failed in %s: %s", name, hook, exc)
            ctx.recorder.audit(
                stage_id, call=None, plugin_payloads={name: {"hook": hook, "error": repr(exc)}}
            )
            if type(plugin).required:
                raise PluginFailedError(
                    f"plugin {name!r} failed in {hook} and is required: {exc}",
                    plugin=name,
                    hook=hook,
                ) from exc
            continue
        out.append((plugin, result))
    return out


def answer_hold(ctx: StageContext, text: str) -> int | None:
    """How much of the end of the answer so far the plugins hold back (see `Plugin`).

    None: a plugin's `answer_hold` raised (logged), and the rest of the block is held until
    it ends; a `required` plugin fails the turn instead.
    """
    hold = 0
    for plugin in ctx.plugins:
        if not overrides(plugin, "answer_hold"):
            continue
        try:
            hold = max(hold, int(plugin.answer_hold(text)))
        except Exception as exc:
            name = type(plugin).name
            log.warning("plugin %s failed in answer_hold: %s", name, exc)
            if type(plugin).required:
                raise PluginFailedError(
                    f"plugin {name!r} failed in answer_hold and is required: {exc}",
                    plugin=name,
                    hook="answer_hold",
                ) from exc
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
    ctx: StageContext, stage_id: StageId, transcript: list[TranscriptMessage]
) -> list[TranscriptMessage]:
    """Notes plugins append before a reasoning call (kept: later calls carry them too)."""
    if not ctx.plugins:
        return []
    view = ModelCallView(
        stage_id=stage_id,
        messages=tuple((str(m["role"]), _text(m)) for m in transcript),
    )
    notes: list[TranscriptMessage] = []
    for _, found in await call_hook(ctx, stage_id, "before_model_request", view):
        for note in found or ():
            if isinstance(note, str) and note.strip():
                notes.append({"role": "system", "content": note})
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
        if isinstance(reason, str) and reason.strip():
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
) -> str:
    """Run the guardrails of `checkpoint` on `text`; the text to go on with.

    Raises:
        GuardrailBlockedError: a guardrail blocked it.
    """
    if not ctx.plugins:
        return text
    hook = {"input": "check_input", "tool_result": "check_tool_result", "answer": "check_answer"}[
        checkpoint
    ]
    args: Sequence[object] = (call, text) if checkpoint == "tool_result" else (text,)
    for plugin, verdict in await call_hook(ctx, stage_id, hook, *args):
        if not isinstance(verdict, Verdict):
            continue
        ctx.recorder.durable(
            GuardrailEvent,
            stage_id,
            checkpoint=checkpoint,
            kind=verdict.kind,
            subject=verdict.subject or subject,
            action=verdict.action,
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
    checked = await guard(ctx, "runtime", "input", text, subject="user message")
    if checked == text:
        return transcript
    content: Any = checked
    if not isinstance(opening["content"], str):  # keep the pictures, replace the text
        content = [{"kind": "text", "text": checked}] + [
            p for p in opening["content"] if p.get("kind") != "text"
        ]
    return [*transcript[:-1], {**opening, "content": content}]
