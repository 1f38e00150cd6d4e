"""Which schedule runs the chosen layout: 1F1B's layout search, then every other family that applies.

The layout search (branch.py, warmup.py) proves its gap under 1F1B, whose bounds it was built on.
ZB-H1 runs the same layouts with the backward split (schedule/zero_bubble.py); its bubble is
smaller but it keeps S micro-batches on every stage where 1F1B keeps S - s, so it may not fit
where 1F1B does. Every layout the search kept (the best and its runners-up, each at its micro-batch
size) is costed under each allowed schedule by the simulator at every warm-up depth up to
strategy.max_warmup_depth, memory checked; local search under the family improves the best few;
the fastest that fits wins. What is proven is stated as such: the gap is over 1F1B layouts; the schedule is the best
of the allowed families on the layouts the search kept.
"""
from __future__ import annotations

from dataclasses import replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .build import MIN_MICRO_BATCHES
from .branch import replica_choices
from .cost import Costed, Limits, evaluate
from .polish import descend, shape_of
from .warmup import WARMUP_MAX_ACTIONS

# families costed on the layouts the 1F1B search keeps (the search itself runs 1F1B or GPipe)
ON_SEARCHED_LAYOUTS = ("zb_h1",)
# of the node budget, what local search under such a family may spend (each neighbour is simulated)
DESCENT_SHARE = 1 / 8


def search_family(limits: Limits) -> str:
    """The schedule the layout search runs under: 1F1B whenever a family sharing its layouts is allowed."""
    allowed = limits.schedules or (limits.schedule,)
    return "gpipe" if set(allowed) == {"gpipe"} else "1f1b"


def choose(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits,
           kept: list[Costed], starts: int = 3) -> tuple[Costed | None, list[Costed]]:
    """(best over the allowed schedules, every candidate costed, fastest first)."""
    allowed = limits.schedules or (limits.schedule,)
    out = [c for c in kept if c.schedule in allowed]
    for family in ON_SEARCHED_LAYOUTS:
        if family not in allowed:
            continue
        fam = replace(limits, schedule=family)
        seen, costed = set(), []
        for c in kept:
            key = (c.layout, c.micro_batch_size)
            if key in seen or c.num_micro_batches < MIN_MICRO_BATCHES[family](len(c.layout)):
                continue
            seen.add(key)
            for depth in range(1, limits.max_warmup_depth + 1):  # a deeper warm-up hides slow links, as for 1F1B
                if depth > 1 and len(c.layout) * c.num_micro_batches > WARMUP_MAX_ACTIONS:
                    break
                z = evaluate(profile, topology, c.layout, c.micro_batch_size, c.num_micro_batches, fam,
                             warmup_depth=depth, costs=c.costs)
                if z.fits:
                    z.extra["over"] = c  # the 1F1B candidate of the same layout, for the plan's note
                    costed.append(z)
        # The family's own optimum lies elsewhere (a smaller bubble rewards more stages): local
        # search under it, each neighbour simulated, from its best few starts.
        from .search import micro_batch_sizes  # (search.py imports this module)
        allowed_replicas = replica_choices(topology, global_batch)
        sizes = micro_batch_sizes(global_batch, limits)
        for z in sorted(costed, key=lambda c: c.iteration_s)[:starts]:
            if any(s.replicas not in allowed_replicas for s in z.layout) or shape_of(z, topology).layout(topology) != z.layout:
                continue
            better, _ = descend(z, profile, topology, global_batch, fam, allowed_replicas, sizes,
                                cost_budget=limits.search_nodes * DESCENT_SHARE / starts)
            if better is not z:
                costed.append(better)
        out += costed
    out.sort(key=lambda c: c.iteration_s)
    return (out[0] if out else None), out
