"""DAPPLE's early-backward schedule (1F1B).

Stage s first runs `warmup` forwards (by default S - s - 1, the fewest that keep the pipeline
full), then strictly alternates one forward and one backward, then drains the remaining
backwards. At most warmup + 1 micro-batches are in flight on a stage, so activation memory is
bounded by the stage count, not by the micro-batch count as in GPipe.
"""
from __future__ import annotations

from .actions import Action, Kind, Schedule, with_communication


def warmup_depth(stage: int, num_stages: int, num_micro_batches: int) -> int:
    return min(num_stages - stage - 1, num_micro_batches)


def one_f_one_b(num_stages: int, num_micro_batches: int, extra_warmup: int = 0) -> Schedule:
    """`extra_warmup` > 0 lets early stages run further ahead (more memory, fewer stalls
    when communication is slow): the planner's warm-up depth knob."""
    if num_micro_batches < 1:
        raise ValueError(f"1F1B needs at least 1 micro-batch, got {num_micro_batches}")
    compute = []
    for s in range(num_stages):
        warm = min(warmup_depth(s, num_stages, num_micro_batches) + (extra_warmup if s < num_stages - 1 else 0),
                   num_micro_batches)
        order = [Action(Kind.FORWARD, m) for m in range(warm)]
        next_f, next_b = warm, 0
        while next_f < num_micro_batches:
            order.append(Action(Kind.FORWARD, next_f))
            next_f += 1
            order.append(Action(Kind.BACKWARD, next_b))
            next_b += 1
        order += [Action(Kind.BACKWARD, m) for m in range(next_b, num_micro_batches)]
        compute.append(order)
    return with_communication("1f1b", compute, num_micro_batches)
