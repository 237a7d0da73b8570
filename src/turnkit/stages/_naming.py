"""Thread naming in two writes.

A name read off the opening message lands at once; the background model's better name,
asked for once the opening turn has settled, replaces it only while the first still
stands.
"""

from __future__ import annotations

import logging
from typing import Final

from turnkit.audit import AuditPayloads, ThreadNamingPayload
from turnkit.models import ModelMessage, ModelRequest
from turnkit.stages._calls import call_model
from turnkit.stages._titles import TITLE_CHARS, opening_title
from turnkit.stages._types import StageContext

__all__ = ("NAMING_PROMPT", "name_thread", "opening_title")

log = logging.getLogger("turnkit.naming")

NAMING_PROMPT: Final = (
    "Name this conversation for a list of chats: at most six words, no quotes, no final "
    "period, in the language of the message. Answer with the name only."
)


async def name_thread(ctx: StageContext, opening: str) -> None:
    """Ask the background model for a better name; apply it only over the opening name.

    The background model is the organisation's (`Organisation.background_model`), else
    the agent's utility model. Runs after the session's opening turn has settled (the
    driver leaves it running): the turn never waits for it, and its log gets no event
    from it. The call is audited on the turn, as a row of its own stage (`threadNaming`,
    stage `thread-naming`): it counts in the turn's usage rollup and budgets, not in the
    turn's `run.finished` or `usage` event (written before it). A person's rename (even
    one typed mid-turn) always survives; no background model, a failed call or a budget
    with no room leaves the first name standing.
    """
    rec = ctx.recorder
    namer = ctx.naming
    if namer is None:
        return
    first = opening_title(opening)
    session = await rec.store.get_session(rec.session_id)
    if session is None or session.title != first:
        return  # renamed (or named when created): nothing to improve
    request = ModelRequest(
        messages=(
            ModelMessage(role="system", content=NAMING_PROMPT),
            ModelMessage(role="user", content=opening[:2000]),
        ),
        purpose="utility",
        tool_choice="none",  # no tool to call: nothing to show as one being written
    )
    if ctx.budget is not None and not await ctx.budget.has_room(request):
        return  # naming never pauses a turn: the first name stands
    try:
        result = await call_model(
            ctx,
            "thread-naming",
            namer,
            request,
            block_key="title",
            stream_text=False,
            reserve=False,
        )
    except Exception as exc:  # noqa: BLE001 - the first name stands; the call is audited
        log.warning("naming session %s failed: %s", rec.session_id, exc)
        await _audited(ctx)
        return
    # A title is one line of text any store keeps (as a person's rename is checked): no
    # NUL; of a model that went on after it (an explanation), its first line with words.
    said = result.response.text.replace("\x00", "")
    line = next((part for part in said.splitlines() if part.strip()), "")
    title = " ".join(line.split()).strip("\"'").strip()
    title = title[: TITLE_CHARS * 2]
    # The rename goes first: the row then says truly whether it was applied. A process
    # that dies between the two keeps the name and loses the row of this one small call.
    applied = bool(title) and await rec.store.name_session(rec.session_id, title, current=first)
    rec.audit(
        "thread-naming",
        call=result.shape,
        payloads=AuditPayloads(
            threadNaming=ThreadNamingPayload(title_chars=len(title), applied=applied)
        ),
    )
    await _audited(ctx)


async def _audited(ctx: StageContext) -> None:
    """Commit the naming call's audit rows (and usage) to the settled turn."""
    try:
        await ctx.recorder.flush()
    except Exception as exc:  # noqa: BLE001 - e.g. the session was deleted meanwhile
        log.warning("auditing the naming call of %s failed: %s", ctx.recorder.turn_id, exc)
