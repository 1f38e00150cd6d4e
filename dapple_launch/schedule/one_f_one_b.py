"""DAPPLE's early-backward schedule (1F1B).

Stage s first runs `warmup` forwards (by default S - s - 1, the fewest that keep the pipeline
full), then strictly alternates one forward and one backward, then drains the remaining
backwards. At most warmup + 1 micro-batches are in flight on a stage, so activation memory is
bounded by the stage count, not by the micro-batch count as in GPipe.
"""

from __future__ import annotations

from .actions import Action, Kind, Schedule, actions_of, with_communication


def warmup_depth(stage: int, num_stages: int, num_micro_batches: int) -> int:
    return min(num_stages - stage - 1, num_micro_batches)


def deeper_warmup(num_stages: int, num_micro_batches: int, depth: int | tuple[int, ...]) -> tuple[int, ...]:
    """Warm-up forwards per stage when every stage but the last keeps `depth` times DAPPLE's
    in-flight count (S - s) micro-batches: depth 1 is the minimum. Deeper warm-up breaks the
    steady state's dependency cycles through slow links (cost.py: windows) for more memory.
    `depth`: one for every stage, or one per stage (a stage before a slow link wants more in flight
    than the others), each stage never below the next one's (ZB-H1's orders need it)."""
    S, M = num_stages, num_micro_batches
    depths = (depth,) * S if isinstance(depth, int) else tuple(depth)
    if len(depths) != S or min(depths) < 1:
        raise ValueError(f"warm-up depth must be >= 1 (1 = DAPPLE's minimum), one or one per stage ({S}), got {depth}")
    # (with fewer micro-batches than stages, M warm-up forwards and M - 1 run in the same order;
    # the larger is the form one_f_one_b accepts)
    out = [0] * S
    for s in range(S - 2, -1, -1):
        out[s] = max(min(M, depths[s] * (S - s)) - 1, warmup_depth(s, S, M), out[s + 1])
    return tuple(out)


def one_f_one_b(num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] | None = None) -> Schedule:
    """`warmup[s]`: forwards stage s runs before its first backward (default S - s - 1, capped at
    M); more lets a stage run further ahead (more memory, fewer stalls when links are slow)."""
    if num_micro_batches < 1:
        raise ValueError(f"1F1B needs at least 1 micro-batch, got {num_micro_batches}")
    S, M = num_stages, num_micro_batches
    if warmup is None:
        warmup = tuple(warmup_depth(s, S, M) for s in range(S))
    warmup = tuple(warmup)
    if (
        len(warmup) != S
        or any(not warmup_depth(s, S, M) <= w <= M for s, w in enumerate(warmup))
        or any(warmup[s] < warmup[s + 1] for s in range(S - 1))
    ):
        raise ValueError(
            f"1F1B warm-up {list(warmup)} is not valid for {S} stages and {M} micro-batches: stage s "
            f"needs between min(S - s - 1, M) and M warm-up forwards, never fewer than the next stage "
            f"(else the pipeline does not fill or deadlocks); e.g. {[warmup_depth(s, S, M) for s in range(S)]}"
        )
    return with_communication("1f1b", compute_orders(S, M, warmup), M)


def compute_orders(num_stages: int, num_micro_batches: int, warmup: tuple[int, ...]) -> list[list[Action]]:
    """Each stage's forwards and backwards in 1F1B order (no communication: with_communication
    adds it; the planner's simulator implies it). `warmup` as one_f_one_b, already validated."""
    return [stage_order(num_micro_batches, warmup[s]) for s in range(num_stages)]


def stage_order(num_micro_batches: int, warm: int) -> list[Action]:
    """One stage's 1F1B order after `warm` warm-up forwards: all a stage's order depends on."""
    M = num_micro_batches
    forward, backward = actions_of(Kind.FORWARD, M), actions_of(Kind.BACKWARD, M)
    order = list(forward[:warm])
    for m in range(warm, M):
        order += (forward[m], backward[m - warm])
    order += backward[max(0, M - warm) :]
    return order
