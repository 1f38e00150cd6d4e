"""A lower bound the search prunes with: the least bottleneck any completion can reach.

suffix[i, k] = the smallest possible max stage time (forward + backward of one micro-batch slice)
over every way to cut layers [i, L) into contiguous stages that use at most k devices in all,
each stage with an allowed replica count and within memory (parameters × optimizer factor plus
one micro-batch of activations: the least any schedule keeps). A stage's outgoing transfer counts
too (the bottleneck includes links), at its least: this stage's share over the fastest link. The
warm-up, placement, the other side's replica count and the stage limit are left out, so it never exceeds the bottleneck of a real completion: a valid
bound. Computed once per micro-batch size by dynamic programming, vectorised over the cut point
and the device count.
"""
from __future__ import annotations

import math

import numpy as np

from ..profile.model_profile import ModelProfile


def suffix_bottleneck(profile: ModelProfile, micro_batch: int, replica_choices: list[int], devices: int,
                      speed: float, capacity_bytes: float, optimizer_factor: float,
                      link_bandwidth: float = math.inf, link_latency_s: float = 0.0) -> np.ndarray:
    L, pbs = profile.num_layers, profile.batch_size
    pre = profile._prefix
    work = np.asarray(pre["f"]) + np.asarray(pre["b"])
    params, kept = np.asarray(pre["p"]), np.asarray(pre["m"])
    cut = np.asarray((0.0, *profile.cut_bytes))  # cut[i]: bytes received by a stage starting at layer i
    best = np.full((L + 1, devices + 1), np.inf)
    best[L, :] = 0.0
    for i in range(L - 1, -1, -1):
        z = np.arange(i + 1, L + 1)
        stage_work = (work[z] - work[i]) * speed / pbs
        stage_params = (params[z] - params[i]) * optimizer_factor
        stage_kept = (kept[z] - kept[i] + cut[i]) / pbs
        sent = np.where(z < L, cut[np.minimum(z, L - 1)] * micro_batch / pbs, 0.0)  # this stage's output
        rest = best[z]  # (stops, devices + 1)
        for r in replica_choices:
            if r > devices:
                break
            n = math.ceil(micro_batch / r)
            t = np.maximum(stage_work * n, np.where(z < L, link_latency_s + sent / r / link_bandwidth, 0.0))
            t = np.where(stage_params + stage_kept * n > capacity_bytes, np.inf, t)
            # for k = r .. devices: min over stops of max(this stage, the best of the rest on k - r)
            cand = np.maximum(t[:, None], rest[:, : devices + 1 - r]).min(axis=0)
            np.minimum(best[i, r:], cand, out=best[i, r:])
    return best


def min_bottleneck_stages(profile: ModelProfile, micro_batch: int, replica_choices: list[int], devices: int,
                          speed: float, capacity_bytes: float, optimizer_factor: float,
                          best: np.ndarray, link_bandwidth: float = math.inf,
                          link_latency_s: float = 0.0) -> list[tuple[int, int, int]] | None:
    """One cut that attains suffix[0, devices]: [(start, stop, replicas)], or None if nothing fits.
    A strong first incumbent for the search (it is then costed in full, links and all)."""
    L, pbs = profile.num_layers, profile.batch_size
    if not np.isfinite(best[0, devices]):
        return None
    pre = profile._prefix
    cut = (0.0, *profile.cut_bytes)
    stages, i, k = [], 0, devices
    while i < L:
        target = best[i, k]
        found = None
        for r in replica_choices:
            if r > k or found:
                break
            n = math.ceil(micro_batch / r)
            for z in range(i + 1, L + 1):
                work = (pre["f"][z] + pre["b"][z] - pre["f"][i] - pre["b"][i]) * speed / pbs * n
                if z < L:
                    work = max(work, link_latency_s + cut[z] * micro_batch / pbs / r / link_bandwidth)
                mem = (pre["p"][z] - pre["p"][i]) * optimizer_factor + (pre["m"][z] - pre["m"][i] + cut[i]) / pbs * n
                if mem <= capacity_bytes and max(work, best[z, k - r]) <= target * (1 + 1e-12):
                    found = (i, z, r)
                    break
        if found is None:
            return None
        stages.append(found)
        i, k = found[1], k - found[2]
    return stages
