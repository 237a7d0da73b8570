"""Turn states and the legal moves between them."""

from __future__ import annotations

from typing import Final, Literal

__all__ = (
    "PAUSED_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "TerminalStatus",
    "TurnStatus",
    "awaiting",
    "can_transition",
)

TurnStatus = Literal[
    "running",
    "awaiting_approval",
    "awaiting_input",
    "awaiting_budget",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
]
TerminalStatus = Literal["succeeded", "failed", "timed_out", "cancelled"]

TERMINAL_STATES: Final[frozenset[TurnStatus]] = frozenset(
    {"succeeded", "failed", "timed_out", "cancelled"}
)

TRANSITIONS: Final[dict[TurnStatus, frozenset[TurnStatus]]] = {
    "running": frozenset(
        {
            "awaiting_approval",
            "awaiting_input",
            "awaiting_budget",
            "succeeded",
            "failed",
            "timed_out",
            "cancelled",
        }
    ),
    "awaiting_approval": frozenset({"running", "cancelled"}),
    "awaiting_input": frozenset({"running", "cancelled"}),
    "awaiting_budget": frozenset({"running", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timed_out": frozenset(),
    "cancelled": frozenset(),
}
"""`cancelled` is reachable from every non-terminal state; terminal states never change."""


PAUSED_STATES: Final[frozenset[TurnStatus]] = frozenset(
    {"awaiting_approval", "awaiting_input", "awaiting_budget"}
)
"""A paused turn: no task, no lease; an answer (or a raised budget) resumes it."""

_AWAITING: Final[dict[str, TurnStatus]] = {
    "approval": "awaiting_approval",
    "clarification": "awaiting_input",
    "budget": "awaiting_budget",
}


def awaiting(pause_kind: str) -> TurnStatus:
    """The status of a turn paused on a request of `pause_kind`."""
    return _AWAITING[pause_kind]


def can_transition(current: TurnStatus, target: TurnStatus) -> bool:
    """Whether a turn in `current` may move to `target`."""
    return target in TRANSITIONS[current]
