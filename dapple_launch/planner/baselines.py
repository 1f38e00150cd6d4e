"""Baselines planned under the same cost model, for comparison and for `speedup_over_data_parallel`."""
from __future__ import annotations

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .cost import Costed, Limits, StageSpec, evaluate


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_over_micro_batches(profile: ModelProfile, topology: Topology, layout: tuple[StageSpec, ...],
                            global_batch: int, limits: Limits, min_micro_batches: int = 1) -> Costed | None:
    """The fastest micro-batch count for a fixed layout that fits memory (None if none does)."""
    widest = max(s.replicas for s in layout)
    best = None
    for m in divisors(global_batch):
        b = global_batch // m
        if m < min_micro_batches or b < widest:
            continue
        if limits.micro_batch_size and b != limits.micro_batch_size:
            continue
        c = evaluate(profile, topology, layout, b, m, limits)
        if c.fits and (best is None or c.iteration_s < best.iteration_s):
            best = c
    return best


def data_parallel(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """Every device holds the whole model; gradient accumulation (micro-batches) when memory needs it."""
    devices = tuple(range(min(topology.num_devices, global_batch)))
    layout = (StageSpec(0, profile.num_layers, devices),)
    return best_over_micro_batches(profile, topology, layout, global_batch, limits)


def balanced_boundaries(profile: ModelProfile, num_stages: int, weights: list[int] | None = None) -> list[int]:
    """Cut positions (stop of each stage but the last) minimising the slowest stage's compute,
    each stage's time divided by its replica count `weights[s]` (1 each if not given)."""
    L = profile.num_layers
    if num_stages > L:
        raise ValueError(f"{num_stages} stages but the model has only {L} layers; use at most {L} stages")
    weights = weights or [1] * num_stages

    def t(a: int, b: int, s: int) -> float:
        f, bk, _, _ = profile.span(a, b)
        return (f + bk) / weights[s]

    inf = float("inf")
    # best[s][i]: minimal max-stage time for the first i layers in s+1 stages
    best = [[inf] * (L + 1) for _ in range(num_stages)]
    arg = [[0] * (L + 1) for _ in range(num_stages)]
    for i in range(1, L + 1):
        best[0][i] = t(0, i, 0)
    for s in range(1, num_stages):
        for i in range(s + 1, L + 1):
            for j in range(s, i):
                v = max(best[s - 1][j], t(j, i, s))
                # ties: prefer the more even layer count, so zero-cost layers spread out
                if v < best[s][i] - 1e-15 or (abs(v - best[s][i]) <= 1e-15 and abs(i - 2 * j) < abs(i - 2 * arg[s][i])):
                    best[s][i], arg[s][i] = v, j
    cuts, i = [], L
    for s in range(num_stages - 1, 0, -1):
        i = arg[s][i]
        cuts.append(i)
    return sorted(cuts)
