"""ZB-V (Qi et al., ICLR'24 §6; torch's ScheduleZBVZeroBubble): two chunks per rank in a V.

S = 2P stages; rank r holds stage r (chunk 0, on the way down) and stage 2P - 1 - r (chunk 1, on
the way back), so the turn from stage P - 1 to P stays on rank P - 1 and the last stage, where the
loss is, sits on rank 0 beside the first. Backwards are split into I and W. Per rank, counting as
if there were n = max(2P - 1, M) micro-batches and dropping the steps of micro-batches >= M:
2(P - r) - 1 forwards of chunk 0; r pairs F(chunk 1), F(chunk 0); P - r triples F, I, W of chunk 1;
then, while forwards remain, F(chunk 0) if any is left, I and W of chunk 0, F, I and W of chunk 1;
then r pairs I(chunk 0), I(chunk 1); P - r pairs I(chunk 0), W(chunk 0); then the W's left, chunk 1
first. With T_F = T_I = T_W no rank idles after its warm-up; each rank keeps about P micro-batches'
activations of a half-size stage pair (1F1B's memory, balanced across ranks).
"""

from __future__ import annotations

from .actions import Kind
from .ranks import RankSchedule, Step


def zbv(num_ranks: int, num_micro_batches: int) -> RankSchedule:
    P, M = num_ranks, num_micro_batches
    if P < 1 or M < 1:
        raise ValueError(f"ZB-V needs at least 1 rank and 1 micro-batch, got {P} and {M}")
    n = max(2 * P - 1, M)
    orders = []
    for r in range(P):
        stage = (r, 2 * P - 1 - r)
        count = {(kind, c): 0 for kind in (Kind.FORWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD) for c in (0, 1)}
        order: list[Step] = []

        def step(kind: Kind, c: int) -> None:
            m = count[(kind, c)]
            count[(kind, c)] = m + 1
            if m < M:
                order.append(Step(kind, stage[c], m))

        F, I, W = Kind.FORWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD
        for _ in range(2 * (P - r) - 1):
            step(F, 0)
        for _ in range(r):
            step(F, 1)
            step(F, 0)
        for _ in range(P - r):
            step(F, 1)
            step(I, 1)
            step(W, 1)
        while count[(F, 1)] < count[(F, 0)] or count[(F, 0)] < n:
            if count[(F, 0)] < n:
                step(F, 0)
            step(I, 0)
            step(W, 0)
            step(F, 1)
            step(I, 1)
            step(W, 1)
        for _ in range(r):
            step(I, 0)
            step(I, 1)
        for _ in range(P - r):
            step(I, 0)
            step(W, 0)
        while count[(W, 1)] < count[(I, 1)]:
            step(W, 1)
        while count[(W, 0)] < count[(I, 0)]:
            step(W, 0)
        orders.append(tuple(order))
    placement = tuple((s if s < P else 2 * P - 1 - s,) for s in range(2 * P))
    return RankSchedule("zbv", 2 * P, M, tuple(orders), placement)
