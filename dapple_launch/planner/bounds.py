"""A lower bound the search prunes with: the least bottleneck any completion can reach.

bound[i, d] = the smallest possible max over the remaining stages of (stage time, outgoing
transfer) when layers [i, L) are cut into contiguous stages placed from device d on, exactly as
the search places them (each stage starts at the next free device or at the next node's first
device, and takes an allowed replica count), each within memory (parameters × optimizer factor
plus one micro-batch of activations: the least any schedule keeps). A transfer counts at its
least: this stage's share of the activation over the fastest link the placement allows (the
network when the stage spans nodes or the next stage must start on another node, else NVLink).
The warm-up, the other side's replica count, all-reduces and the stage limit are left out, so the
bound never exceeds the bottleneck of a real completion. One dynamic programme per micro-batch
size, vectorised over cut points and device positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile


@dataclass(frozen=True)
class BoundInputs:
    profile: ModelProfile
    topology: Topology
    micro_batch: int
    replica_choices: tuple[int, ...]
    speed: float
    capacity_bytes: float
    optimizer_factor: float


def stage_starts(d: int, devices_per_node: int, devices: int) -> list[int]:
    """Where the next stage may start when device d is the first free one (append or fresh node)."""
    k = devices_per_node
    if d % k == 0 or d // k == (devices - 1) // k:
        return [d]
    return [d, (d // k + 1) * k]


def _links(x: BoundInputs, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Per start device s: (latency, bandwidth) of the fastest link out of a stage on [s, s + r)."""
    t, D, k = x.topology, x.topology.num_devices, x.topology.devices_per_node
    s = np.arange(D)
    spans = (s // k) != ((s + r - 1) // k)
    next_elsewhere = ((s + r) % k) == 0  # the next free device is on another node
    slow = spans | next_elsewhere
    fast_bw = max(t.intra_node_bandwidth, t.inter_node_bandwidth)
    fast_lat = min(t.intra_node_latency_s, t.inter_node_latency_s)
    return (np.where(slow, t.inter_node_latency_s, fast_lat), np.where(slow, t.inter_node_bandwidth, fast_bw))


def suffix_bound(x: BoundInputs) -> np.ndarray:
    """bound[i, d] for i in 0..L, d in 0..D (float array; inf where nothing fits)."""
    p, D = x.profile, x.topology.num_devices
    L, pbs, k = p.num_layers, p.batch_size, x.topology.devices_per_node
    pre = p._prefix
    work = np.asarray(pre["f"]) + np.asarray(pre["b"])
    params, kept = np.asarray(pre["p"]), np.asarray(pre["m"])
    cut = np.asarray((0.0, *p.cut_bytes))  # cut[i]: bytes crossing into a stage that starts at layer i
    links = {r: _links(x, r) for r in x.replica_choices}
    bound = np.full((L + 1, D + 1), np.inf)
    bound[L, :] = 0.0
    # starts_at[i, s]: best completion whose first stage (holding layer i) starts exactly at device s
    for i in range(L - 1, -1, -1):
        z = np.arange(i + 1, L + 1)
        stage_work = (work[z] - work[i]) * x.speed / pbs
        stage_params = (params[z] - params[i]) * x.optimizer_factor
        stage_kept = (kept[z] - kept[i] + cut[i]) / pbs
        sent = np.where(z < L, cut[np.minimum(z, L - 1)] * x.micro_batch / pbs, 0.0)
        starts_at = np.full(D + 1, np.inf)
        for r in x.replica_choices:
            if r > D:
                break
            n = math.ceil(x.micro_batch / r)
            t = np.where(stage_params + stage_kept * n > x.capacity_bytes, np.inf, stage_work * n)
            lat, bw = links[r]
            starts = D - r + 1  # a stage of r devices can start at 0 .. D - r
            link = np.where((z < L)[:, None], lat[None, :starts] + (sent / r)[:, None] / bw[None, :starts], 0.0)
            rest = bound[z][:, r:r + starts]  # the completion from device s + r on
            cand = np.maximum(np.maximum(t[:, None], link), rest).min(axis=0)
            np.minimum(starts_at[:starts], cand, out=starts_at[:starts])
        for d in range(D):
            bound[i, d] = min(starts_at[s] for s in stage_starts(d, k, D))
    return bound


def least_bottleneck_stages(x: BoundInputs, bound: np.ndarray) -> list[tuple[int, int, int, int]] | None:
    """One placement attaining bound[0, 0]: [(first layer, stop, first device, replicas)], or None.
    A strong first incumbent for the search (it is then costed in full)."""
    p, D = x.profile, x.topology.num_devices
    L, pbs, k = p.num_layers, p.batch_size, x.topology.devices_per_node
    if not math.isfinite(bound[0, 0]):
        return None
    pre = p._prefix
    cut = (0.0, *p.cut_bytes)
    stages, i, d = [], 0, 0
    while i < L:
        target = bound[i, d] * (1 + 1e-12)
        found = None
        for s in stage_starts(d, k, D):
            for r in x.replica_choices:
                if s + r > D or found:
                    break
                n = math.ceil(x.micro_batch / r)
                lat, bw = (a[s] for a in _links(x, r))
                for z in range(i + 1, L + 1):
                    t = (pre["f"][z] + pre["b"][z] - pre["f"][i] - pre["b"][i]) * x.speed / pbs * n
                    mem = (pre["p"][z] - pre["p"][i]) * x.optimizer_factor + (pre["m"][z] - pre["m"][i] + cut[i]) / pbs * n
                    link = lat + cut[z] * x.micro_batch / pbs / r / bw if z < L else 0.0
                    if mem <= x.capacity_bytes and max(t, link, bound[z, s + r]) <= target:
                        found = (i, z, s, r)
                        break
        if found is None:
            return None
        stages.append(found)
        i, d = found[1], found[2] + found[3]
    return stages
