"""Stopping a turn and answering a paused one, from wherever the turn is driven."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import JsonValue

from turnkit import otel
from turnkit.errors import (
    AgentNotFoundError,
    InvalidInputError,
    PauseAnsweredError,
    StoreUnavailableError,
)
from turnkit.events import AskedPause
from turnkit.ids import TurnId
from turnkit.pauses import ANSWERS, Answer, Approve, Deny, PauseRequest, Resolution
from turnkit.runtime._reads import RuntimeReads
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.driver import StopAsked
from turnkit.states import TERMINAL_STATES, TurnStatus, awaiting
from turnkit.store import Submission, TurnRecord
from turnkit.tenancy import Principal
from turnkit.tools import DELEGATED_SESSION_PREFIX, ToolArgumentsError, validated_arguments

__all__ = ("RuntimeControl",)


class RuntimeControl(RuntimeReads):
    """`SessionRuntime`'s Stop and resume."""

    async def cancel(self, turn_id: str, *, principal: Principal | str | None = None) -> TurnStatus:
        """Press Stop: end the turn `cancelled` from wherever it is driven.

        A turn driven in this process is cancelled at once (its model call aborted,
        `user-aborted` audited); a paused or queued turn is ended in the Store; a turn
        driven by another process is flagged and stops at once where that process hears
        it (PostgreSQL, `RuntimeConfig.listen_for_stops`), else at its driver's next
        lease renewal.
        Returns the turn's status after the call. `principal` is who pressed it: a paused
        turn's audit records it on each request it waited on (a `pauseAnswer` row,
        decision `stopped`).

        Raises:
            InvalidInputError: a turn of an agent asked as a tool that waits for a person:
                its asking turn waits with it and holds its card, so Stop the asking turn
                (which stops this one too) or answer the card.
        """
        record = await self.store.get_turn(TurnId(turn_id))
        if (
            record is not None
            and record.session_id.startswith(DELEGATED_SESSION_PREFIX)
            and record.status in ("awaiting_approval", "awaiting_input")
        ):
            raise InvalidInputError(
                f"turn {turn_id!r} belongs to an agent asked as a tool and waits for a person: "
                "its asking turn waits with it (see its pending card); stop the asking turn, "
                "which stops this one too",
                turn_id=turn_id,
            )
        return await self._stop(turn_id, principal)

    async def _stop(self, turn_id: str, principal: Principal | str | None) -> TurnStatus:
        """`cancel`, for any turn (the asked turns a stopped turn waited on included).

        The transaction that ends the turn stops what it asked in the Store; this process
        then stops a driver of theirs here at once and hands their readers the ending:
        the turn's driver here, if it wrote the ending (`_stop_asked_by`), else this Stop,
        for the asked turns that had not ended before it (read first: the Store's ending
        ends those no live driver holds).
        """
        key = TurnId(turn_id)
        self._stopping[key] = self._stopping.get(key, 0) + 1
        try:
            status, asked = await self.host.run_to_end(self._stop_here(key, principal))
            told = key in self._told_here
        finally:
            if (left := self._stopping.pop(key) - 1) > 0:
                self._stopping[key] = left
            else:
                self._told_here.discard(key)
        if status == "cancelled":  # ended in the Store, or by its driver here
            self.forget_ended(turn_id)
        if status in ("cancelled", "running") and not told:  # "running": flagged elsewhere
            await self._cancel_asked(turn_id, principal, asked)  # what it asked stops now too
        return status

    async def _stop_here(
        self, key: TurnId, principal: Principal | str | None
    ) -> tuple[TurnStatus, list[TurnId]]:
        """Stop `key` (see `_stop`); the turns it asked that had not ended before."""
        try:
            asked = await self.store.asked_turns(key)
        except StoreUnavailableError:  # a database blip must not delay cutting a driver here
            asked = []  # the ending's own transaction still stops them (`Store.commit`)
        if self._recovery is not None:  # a turn this process took over: stop it at once
            await self._recovery[2].stop(key, by=_id_of(principal))
        status = await self.host.cancel(key, by=_id_of(principal))
        if (
            status == "running"
            and self._recovery is not None
            and await self._recovery[2].stop(key, by=_id_of(principal))
        ):
            # the recovery loop claimed it meanwhile (its claim was in flight): stopped here
            record = await self.store.get_turn(key)
            status = record.status if record is not None else status
        return status, asked

    async def resume(
        self,
        turn_id: str,
        request_id: str,
        resolution: Resolution,
        *,
        deps: Any = NO_DEPS,
        principal: Principal | str | None = None,
    ) -> Submission:
        """Answer a paused turn's request and continue the *same* turn.

        `Approve()` lets the tool call run; `Deny(note=...)` turns it into a failed result
        the model reads; `Answer(text=...)` answers an `ask_user` question. The turn goes
        on from its checkpoint (nothing before the pause runs or is billed again), in this
        process when `RuntimeConfig.run_in_process`, else in a worker. Follow it with
        `reader().follow(turn_id, after_seq=...)` or the HTTP resume stream. The turn runs
        with the agent it was pinned to; `deps` (else the runtime's factory) are its tools'
        dependencies. `principal` is who answers: the turn's audit records it (a
        `pauseAnswer` row: who, when, which decision). A request an agent asked as a tool
        handed to the turn (`asked` on its event) is answered in that agent's turn first,
        with the same answer.

        Raises:
            PauseNotFoundError: the turn has no such request.
            PauseAnsweredError: the request was answered (or the turn ended) already.
            InvalidInputError: an approval answered with text, or a question with a decision;
                a `resolution` that is not an `Approve`, `Deny` or `Answer`; arguments a
                person changed that the tool refuses (checked when this runtime hosts the
                turn's agent; else the tool refuses them when the call runs, as a result
                the model reads); a turn of an agent asked as a tool (its requests are
                answered in the asking turn).
        """
        record = await self.turn(turn_id)
        if record.session_id.startswith(DELEGATED_SESSION_PREFIX):
            raise InvalidInputError(
                f"turn {turn_id!r} belongs to an agent asked as a tool: what it waits for is "
                "answered in the asking turn, which waits with it (see its pending card)",
                turn_id=turn_id,
            )
        return await self._answer(record, request_id, resolution, deps=deps, principal=principal)

    async def _answer(
        self,
        record: TurnRecord,
        request_id: str,
        resolution: Resolution,
        *,
        deps: Any,
        principal: Principal | str | None,
        drive: bool = True,
    ) -> Submission:
        """`resume`, for any turn; `drive`: go on in this process (with `run_in_process`)."""
        turn_id = record.turn_id
        if record.status == "awaiting_budget":
            raise InvalidInputError(
                f"turn {turn_id!r} waits on a budget: it resumes by itself once a limit is "
                "raised (set_budget_limit) or its period rolls over; cancel() ends it",
                turn_id=turn_id,
            )
        if not isinstance(resolution, Approve | Deny | Answer):
            raise InvalidInputError(
                "resolution is turnkit.Approve(), Deny(note=...) or Answer(text=...), "
                f"not {resolution!r}"
            )
        allowed = next(
            (kinds for pause, kinds in ANSWERS.items() if awaiting(pause) == record.status), None
        )
        if allowed is not None and resolution.kind not in allowed:
            raise InvalidInputError(
                f"turn {turn_id!r} is {record.status}: answer it with {' or '.join(allowed)}, "
                f"not {resolution.kind}",
                kind=resolution.kind,
            )
        # Not paused (or no such request): the Store says why it cannot be answered.
        paused = record.status.startswith("awaiting_")
        pause = await self.store.get_pause(turn_id, request_id) if paused else None
        asked = _asked_of(pause)
        driven_here = drive and self.config.run_in_process
        if asked is not None and not (driven_here and not await self._drivable(record)):
            # The asked agent's turn takes the answer first; not when this turn, driven
            # here, ends `agent-not-found` instead of following it: its ending stops it.
            await self._answer_asked(asked, resolution, deps=deps, principal=principal)
        elif isinstance(resolution, Approve) and resolution.arguments is not None:
            await self._check_changed_arguments(record, pause, resolution.arguments)
        cause = otel.resume_cause()  # taken now; kept once the answer is in
        answer = resolution.model_dump()
        await self.store.answer_pause(record.turn_id, request_id, answer, by=_id_of(principal))
        otel.note_resume(record.turn_id, cause)
        if drive and self.config.run_in_process:
            self.host.detach(record.turn_id, deps=deps, then_next=True)
        return Submission(
            session_id=record.session_id,
            turn_id=record.turn_id,
            input_seq=record.input_seq,
            delivery="queue",
            requested_delivery="queue",
            is_new=False,
        )

    async def _answer_asked(
        self,
        asked: AskedPause,
        resolution: Resolution,
        *,
        deps: Any,
        principal: Principal | str | None,
    ) -> None:
        """Answer the request of an asked agent's turn (which may hand one over in turn).

        The asking turn's call drives that turn again when it resumes. An answer given
        before (an answer retried after a failure) or a turn that ended meanwhile leaves
        the asking turn to find out when it follows the turn again.
        """
        record = await self.store.get_turn(asked.turn_id)
        if record is None or record.status in TERMINAL_STATES:
            return
        with contextlib.suppress(PauseAnsweredError):
            await self._answer(
                record, asked.request_id, resolution, deps=deps, principal=principal, drive=False
            )

    async def _drivable(self, record: TurnRecord) -> bool:
        """Whether this runtime has the agent `record` is pinned to (at its version)."""
        try:
            await self.runner().pinned_agent(record)
        except AgentNotFoundError:
            return False
        return True

    def _stop_asked(self) -> StopAsked:
        return self._stop_asked_by

    async def _stop_asked_by(self, turn_id: TurnId, stopped: Sequence[TurnId]) -> None:
        """A driver here wrote `turn_id`'s ending, which stopped `stopped` in the Store.

        A driver of one of them here stops at once (not at its next renewal), and their
        readers get their endings. A Stop of `turn_id` under way here leaves this to it.
        """
        if turn_id in self._stopping:
            self._told_here.add(turn_id)
        for asked in stopped:
            await self._stop(asked, None)

    async def _cancel_asked(
        self, turn_id: str, principal: Principal | str | None, linked: Sequence[TurnId]
    ) -> None:
        """Stop the asked agents' turns a stopped turn waited on, or that named it.

        `linked`: the turns it asked that had not ended before the Stop. Those its ending
        flagged for a driver here stop at once, not at that driver's next renewal; those
        it ended hand their readers here the `done`.
        """
        record = await self.store.get_turn(TurnId(turn_id))
        handed = (
            []
            if record is None
            else [
                decision.asked.turn_id
                for decision in (await self.turn_view(record)).decisions
                if decision.asked is not None
            ]
        )
        for asked in dict.fromkeys([*handed, *linked]):
            await self._stop(asked, principal)

    async def _check_changed_arguments(
        self, record: TurnRecord, pause: PauseRequest | None, arguments: Mapping[str, JsonValue]
    ) -> None:
        """Refuse changed arguments the approved call's tool would refuse (the pause stays).

        Checked against the tool the turn's pinned agent has here; on a runtime that does
        not host that agent, the tool checks them when the call runs.
        """
        name = pause.payload.get("tool_name") if pause is not None else None
        if not isinstance(name, str):
            return  # not this turn's request: the Store says so
        try:
            agent = await self.runner().pinned_agent(record)
        except AgentNotFoundError:
            return
        tool = agent.registry().get(name)
        if tool is None:
            return
        try:
            validated_arguments(tool, arguments)
        except ToolArgumentsError as exc:
            raise InvalidInputError(
                f"the changed arguments do not fit {name!r}: {exc.reason}; nothing was answered",
                tool=name,
            ) from exc


def _asked_of(pause: PauseRequest | None) -> AskedPause | None:
    """The asked agent's request a saved one stands for (None: the turn's own)."""
    asked = pause.payload.get("asked") if pause is not None else None
    return AskedPause.model_validate(asked) if asked is not None else None


def _id_of(principal: Principal | str | None) -> str | None:
    """The principal id the audit records (None: anonymous)."""
    return principal.id if isinstance(principal, Principal) else principal
