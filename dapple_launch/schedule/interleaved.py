"""Interleaved 1F1B (Megatron-LM; torch's ScheduleInterleaved1F1B): v chunks per rank.

The model is cut into S = v·P stages and rank r holds stages r, r + P, …, r + (v - 1)P, so a
micro-batch visits every rank v times. Forwards go in groups of P micro-batches, chunk by chunk:
forward number k (k = 0 … vM - 1) runs chunk (k // P) mod v on micro-batch (k // vP)·P + k mod P;
backwards the same with the chunks reversed. Rank r runs (v - 1)·P + 2(P - 1 - r) warm-up forwards,
then one forward and one backward in turn, then the remaining backwards. Each stage is 1/v of a
rank's share, so the fill and drain — the bubble — shrink by v; the price is v times the transfers,
and up to P + (P - 1)/v micro-batches' worth of activations on rank 0 (a micro-batch of one chunk
is 1/v of a stage's). Constraint: M a multiple of P (the groups), v >= 2.
"""

from __future__ import annotations

from .actions import Kind
from .ranks import RankSchedule, Step


def interleaved_constraint(num_ranks: int, num_micro_batches: int, chunks: int) -> str:
    """'' when valid, else the rule broken with the nearest valid values."""
    P, M, v = num_ranks, num_micro_batches, chunks
    if v < 2:
        return f"interleaved 1F1B needs at least 2 chunks per rank (strategy.chunks), got {v}; 1 chunk is plain 1F1B"
    if P < 1 or M < P or M % P:
        lower, upper = max(P, M // P * P), (M // P + 1) * P
        near = sorted({lower, upper}) if lower != M else [upper]
        return (
            f"interleaved 1F1B runs micro-batches in groups of the {P} ranks: {M} micro-batches is not a "
            f"multiple of {P}; use {' or '.join(map(str, near))}"
        )
    return ""


def interleaved_1f1b(num_ranks: int, num_micro_batches: int, chunks: int, hop_warmup: int = 2) -> RankSchedule:
    """`hop_warmup`: the warm-up forwards each hop from the last rank adds (Megatron's 2; interleaved
    zero bubble runs 1, since its W's fill what the extra forwards would, at less memory)."""
    P, M, v = num_ranks, num_micro_batches, chunks
    why = interleaved_constraint(P, M, v)
    if why:
        raise ValueError(why)
    total = v * M
    orders = []
    for r in range(P):

        def forward(k: int) -> Step:
            return Step(Kind.FORWARD, (k // P) % v * P + r, k // (P * v) * P + k % P)

        def backward(k: int) -> Step:
            return Step(Kind.BACKWARD, (v - 1 - (k // P) % v) * P + r, k // (P * v) * P + k % P)

        warm = min((v - 1) * P + hop_warmup * (P - 1 - r), total)
        order = [forward(k) for k in range(warm)]
        for k in range(total - warm):
            order += [forward(warm + k), backward(k)]
        order += [backward(k) for k in range(total - warm, total)]
        orders.append(tuple(order))
    placement = tuple((s % P,) for s in range(v * P))
    return RankSchedule("interleaved_1f1b", v * P, M, tuple(orders), placement)
