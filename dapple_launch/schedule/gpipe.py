"""GPipe: all forwards, then all backwards; every micro-batch's activations live at once."""

from __future__ import annotations

from .actions import Action, Kind, Schedule, with_communication


def gpipe(num_stages: int, num_micro_batches: int) -> Schedule:
    return with_communication("gpipe", compute_orders(num_stages, num_micro_batches), num_micro_batches)


def compute_orders(num_stages: int, num_micro_batches: int) -> list[list[Action]]:
    """Each stage's forwards, then its backwards (no communication: the planner's simulator implies it)."""
    return [
        [Action(Kind.FORWARD, m) for m in range(num_micro_batches)]
        + [Action(Kind.BACKWARD, m) for m in range(num_micro_batches)]
        for _ in range(num_stages)
    ]


def forward_only(num_stages: int, num_micro_batches: int) -> Schedule:
    """Evaluation: the forward half of any schedule, used by validation."""
    compute = [[Action(Kind.FORWARD, m) for m in range(num_micro_batches)] for _ in range(num_stages)]
    return with_communication("forward", compute, num_micro_batches, forward_only=True)
