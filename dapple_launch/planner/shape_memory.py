"""Whether a shape of device groups (chunked_search.py) can hold the model at any cut.

Each device of a group holds every stage on the group whole, its weights and optimizer state
(chunked.evaluate_chunked's memory; Chimera's stages sit on two groups each), and the activations
of the micro-batches in flight on those stages. Take the moment the first backward of the iteration
starts (a B, or an I under a split backward). Every backward needs its micro-batch's gradient from
the stage after, so the first runs on the last stage, on the micro-batch m* that stage's order
backs first. No backward has run anywhere yet, so nothing is freed: every stage still holds m*'s
activations, and each group every forward its order puts before its own last forward of m*, all of
which have run. So, at that moment, the groups together hold at least

    the model's weights and optimizer state (twice under Chimera) + Σ_s n_s kept_s,

with n_s the forwards of stage s so held (1 under Chimera, whose micro-batches take either of two
pipelines) and kept_s what one micro-batch leaves on the stage (ModelProfile.layer_bytes of its
layers, the input it received left out), at the samples a device of the largest group runs. The cut is open, so the
bound takes the least of Σ_s n_s kept_s over every cut: a programme over the layers, each stage at
least one. A shape whose groups' capacities sum to less fits no cut: no plan of it is admissible,
so the search neither scores nor bounds it.

Without recomputation only: "full" and "selective" shrink a stage's activations (there the weights
alone count); "auto" recomputes no stage of a group (cost.recompute_sets). The orders are read
only where the activations could decide it (held at twice the stage count, the most orders keep,
they pass the capacity) and the orders are short (ORDER_ACTIONS_READ); elsewhere micro-batch m*
alone counts, which only weakens the check: small models on large devices never build them.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import build_rank_schedule
from .limits import Limits

# the most actions a shape's rank orders may have for holds_model to build and read them (about
# 10 µs an action: a fuzzed profile of 60 layers on 32 devices at G 8192 built 160 orders of up to
# 1.5 M actions, 26 s, before this cap, and 95 of up to 30 k, 2.6 s, at that cap); skipping a
# shape's orders only weakens the check (Llama 3 70B's 32 groups on 1024 A100s: 6 k actions)
ORDER_ACTIONS_READ = 8_000


def holds_model(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
) -> bool:
    """Whether the groups' devices together can hold the weights and the activations in flight at
    the first backward (the docstring) at some cut of the shape (family, v, groups, b)."""
    L, P, M = profile.num_layers, len(groups), global_batch // b
    capacity = P * topology.device_memory_bytes * (1 - limits.memory_headroom) * (1 + 1e-12)
    held = profile.span(0, L)[3] * limits.optimizer_factor * (2 if family == "chimera" else 1)
    if limits.recompute in ("full", "selective"):
        return held <= capacity
    samples = math.ceil(b / max(groups))
    layer = [profile.layer_bytes(l, samples) for l in range(L)]  # (each stage's input left out)
    if held + sum(layer) > capacity:  # (micro-batch m* alone on every stage)
        return False
    S = 2 * P if family == "zbv" else v * P
    if family == "chimera" or held + min(M, 2 * S) * sum(layer) <= capacity:
        return True  # (no count the orders are likely to hold can decide it: not worth reading them)
    if S * M * 3 > ORDER_ACTIONS_READ:
        return True  # (orders too long to build for this: the check stays necessary, weaker)
    counts = forwards_held(family, P, M, v)
    return held + least_weighted_cut(layer, counts) <= capacity


@lru_cache(maxsize=256)
def forwards_held(family: str, groups: int, micro_batches: int, v: int) -> tuple[int, ...]:
    """Per stage, n_s: the forwards of it its group has run, none freed, when the first backward
    starts (the docstring); 1 each where the orders say otherwise than the argument needs (a
    backward before some group's last forward of m*: orders the validator would refuse)."""
    schedule = build_rank_schedule(family, groups, micro_batches, v)  # (not the search's cache: kept for it)
    S, orders = schedule.num_stages, schedule.encoded_orders
    last = [step for order in orders for step in order if step[0] in (1, 2) and step[1] == S - 1]
    fallback = (1,) * S
    if not last:
        return fallback
    first = last[0][2]  # m*: the micro-batch the last stage backs first
    counts = [0] * S
    for order in orders:
        mine = [k for k, (code, _, m) in enumerate(order) if code == 0 and m == first]
        if not mine:
            continue
        for code, s, _ in order[: mine[-1] + 1]:
            if code != 0:
                return fallback
            counts[s] += 1
    return tuple(max(1, c) for c in counts)


def least_weighted_cut(layer: list[float], counts: tuple[int, ...]) -> float:
    """min over cuts of Σ_s counts[s] Σ_{l in stage s} layer[l]: stages in order, each of one layer
    or more (a programme over (stage, stop), O(S L) with a running least)."""
    L, S = len(layer), len(counts)
    if S > L:
        return math.inf
    prefix = [0.0]
    for x in layer:
        prefix.append(prefix[-1] + x)
    best = [0.0] + [math.inf] * L  # best[z]: layers 0 .. z - 1 on the stages so far
    for s, n in enumerate(counts):
        new, lowest = [math.inf] * (L + 1), math.inf
        for z in range(s + 1, L - (S - s - 1) + 1):
            lowest = min(lowest, best[z - 1] - n * prefix[z - 1])  # (the stage starts at z - 1 or before)
            new[z] = lowest + n * prefix[z]
        best = new
    return best[L]
