"""Turn states and the legal moves between them (DESIGN §4, seed 000 "Turn states")."""

from __future__ import annotations

from typing import Final, Literal

__all__ = ("TERMINAL_STATES", "TRANSITIONS", "TerminalStatus", "TurnStatus", "can_transition")

TurnStatus = Literal[
    "running",
    "awaiting_approval",
    "awaiting_input",
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
        {"awaiting_approval", "awaiting_input", "succeeded", "failed", "timed_out", "cancelled"}
    ),
    "awaiting_approval": frozenset({"running", "cancelled"}),
    "awaiting_input": frozenset({"running", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timed_out": frozenset(),
    "cancelled": frozenset(),
}
"""`cancelled` is reachable from every non-terminal state; terminal states never change."""


def can_transition(current: TurnStatus, target: TurnStatus) -> bool:
    """Whether a turn in `current` may move to `target`."""
    return target in TRANSITIONS[current]
