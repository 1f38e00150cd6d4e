"""Chimera (Li & Hoefler, SC'21): two pipelines in opposite directions over the same D ranks.

The down pipeline runs stage i on rank i, the up pipeline stage i on rank D - 1 - i: each rank
holds two stages (two weight copies) and each stage sits on two ranks, whose gradients are
all-reduced together after the stage's last backward. Micro-batches go in units of D: in unit u,
the first D/2 take the down pipeline and the rest the up one. Each rank runs its steps in the order
of the basic unit's slots, units concatenated (with h = D/2, offset o = 2D·u, j = 0 … h - 1):
down micro-batch uD + j has F(stage w) at slot o + w + 2j and B(stage w) at o + 2D - 1 - w + 2j on
rank w; up micro-batch uD + h + j has F(stage D-1-w) at o + D - 1 - w + 2j and B(stage D-1-w) at
o + D + w + 2j on rank w. No two steps of a rank share a slot. Bubble (D - 2)/(2N + D - 2) when a
backward costs what a forward does; with T_B = 2 T_F the simulator's figure is the one to trust
(SCHEDULES.md: concatenated units can lose to 1F1B). Constraints: D even, N a multiple of D.
"""

from __future__ import annotations

from .actions import Kind
from .ranks import RankSchedule, Step


def chimera_constraint(num_ranks: int, num_micro_batches: int) -> str:
    D, N = num_ranks, num_micro_batches
    if D < 2 or D % 2:
        return (
            f"Chimera pairs a down and an up pipeline over an even number of device groups: {D} stages; "
            f"use {max(2, D - 1 if D > 1 else 2)} or {D + 1}"
            if D % 2
            else f"Chimera needs at least 2 device groups, got {D}"
        )
    if N < D or N % D:
        lower, upper = max(D, N // D * D), (N // D + 1) * D
        near = sorted({lower, upper}) if lower != N else [upper]
        return (
            f"Chimera runs micro-batches in units of the {D} device groups (half down, half up): {N} "
            f"micro-batches is not a multiple of {D}; use {' or '.join(map(str, near))}"
        )
    return ""


def chimera(num_ranks: int, num_micro_batches: int) -> RankSchedule:
    D, N = num_ranks, num_micro_batches
    why = chimera_constraint(D, N)
    if why:
        raise ValueError(why)
    h = D // 2
    slots: list[list[tuple[int, Step]]] = [[] for _ in range(D)]
    for u in range(N // D):
        o = 2 * D * u
        for j in range(h):
            down, up = u * D + j, u * D + h + j
            for w in range(D):
                slots[w] += [
                    (o + w + 2 * j, Step(Kind.FORWARD, w, down)),
                    (o + 2 * D - 1 - w + 2 * j, Step(Kind.BACKWARD, w, down)),
                    (o + D - 1 - w + 2 * j, Step(Kind.FORWARD, D - 1 - w, up)),
                    (o + D + w + 2 * j, Step(Kind.BACKWARD, D - 1 - w, up)),
                ]
    orders = []
    for w in range(D):
        taken = [slot for slot, _ in slots[w]]
        assert len(set(taken)) == len(taken), "Chimera's slots collide"  # the construction's invariant
        orders.append(tuple(step for _, step in sorted(slots[w])))
    placement = tuple((s, D - 1 - s) for s in range(D))  # the down pipeline's group, then the up one's
    return RankSchedule("chimera", D, N, tuple(orders), placement)
