"""What a device-group shape's rank orders fix for the bounds over its cuts (group_bound.py's tail
and queue terms), whatever the cut: the stage of each group's last step where that step is the
stage's last gradient step, and each group's steps before the first of its stages' last gradient
steps."""

from __future__ import annotations

from functools import lru_cache

from ..schedule.actions import CODE_OF, Kind
from .chunked import rank_orders


@lru_cache(maxsize=256)
def order_facts(family: str, groups: int, micro_batches: int, v: int):
    """(per group the stage of its last step where that is the stage's last gradient step, _queues)
    of the shape's rank orders: read once per (family, groups, micro-batches, v)."""
    orders = rank_orders(family, groups, micro_batches, v).encoded_orders  # (shared with the simulator's)
    gradient = (CODE_OF[Kind.BACKWARD], CODE_OF[Kind.WEIGHT_GRAD])
    last = {g: order[-1][1] for g, order in enumerate(orders) if order and order[-1][0] in gradient}
    return last, _queues(orders)


def _queues(orders) -> dict[int, dict[int, tuple[int, ...]]]:
    """Per group: its steps before the first of its stages' last gradient actions (B, or W under a
    split backward), counted per stage as (F, B, I, W). `orders`: encoded (kind code, stage,
    micro-batch), RankSchedule.encoded_orders (a rank walks 2-3 steps per micro-batch and stage:
    the codes, not the steps' attributes)."""
    backward, weight = CODE_OF[Kind.BACKWARD], CODE_OF[Kind.WEIGHT_GRAD]
    out = {}
    for g, order in enumerate(orders):
        last = {}
        for n, (code, stage, _) in enumerate(order):
            if code in (backward, weight):
                last[stage] = n
        counts: dict[int, list[int]] = {}
        for code, stage, _ in order[: min(last.values(), default=0)]:
            tally = counts.get(stage)
            if tally is None:
                tally = counts[stage] = [0, 0, 0, 0]
            tally[code] += 1
        out[g] = {s: tuple(c) for s, c in counts.items()}
    return out
