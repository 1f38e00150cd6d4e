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


def fresh_node_start(d, devices_per_node: int, devices: int):
    """The next node's first device, where a stage may start fresh instead of at free device d
    (d itself when d already starts a node or lies in the last node). Ints or numpy arrays."""
    k = devices_per_node
    return np.where((d % k != 0) & (d // k != (devices - 1) // k), (d // k + 1) * k, d)


def stage_starts(d: int, devices_per_node: int, devices: int) -> list[int]:
    """Where the next stage may start when device d is the first free one (append or fresh node)."""
    fresh = int(fresh_node_start(d, devices_per_node, devices))
    return [d] if fresh == d else [d, fresh]


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


def suffix_bound(x: BoundInputs) -> tuple[np.ndarray, np.ndarray]:
    """(bound, choice): bound[i, d] for i in 0..L, d in 0..D (inf where nothing fits), and
    choice[i, d] = (stop, first device, replicas) of a first stage that attains it."""
    p, D = x.profile, x.topology.num_devices
    L, pbs, k = p.num_layers, p.batch_size, x.topology.devices_per_node
    pre = p._prefix
    work = np.asarray(pre["f"]) + np.asarray(pre["b"])
    params, kept = np.asarray(pre["p"]), np.asarray(pre["m"])
    cut = np.asarray((0.0, *p.cut_bytes))  # cut[i]: bytes crossing into a stage that starts at layer i
    links = {r: _links(x, r) for r in x.replica_choices}
    bound = np.full((L + 1, D + 1), np.inf)
    bound[L, :] = 0.0
    choice = np.zeros((L + 1, D + 1, 3), dtype=int)
    for i in range(L - 1, -1, -1):
        z = np.arange(i + 1, L + 1)
        stage_work = (work[z] - work[i]) * x.speed / pbs
        stage_params = (params[z] - params[i]) * x.optimizer_factor
        stage_kept = (kept[z] - kept[i] + cut[i]) / pbs
        sent = np.where(z < L, cut[np.minimum(z, L - 1)] * x.micro_batch / pbs, 0.0)
        # the best completion whose first stage (holding layer i) starts exactly at device s
        starts_at = np.full(D + 1, np.inf)
        stop_at, replicas_at = np.zeros(D + 1, dtype=int), np.zeros(D + 1, dtype=int)
        for r in x.replica_choices:
            if r > D:
                break
            n = math.ceil(x.micro_batch / r)
            t = np.where(stage_params + stage_kept * n > x.capacity_bytes, np.inf, stage_work * n)
            lat, bw = links[r]
            starts = D - r + 1  # a stage of r devices can start at 0 .. D - r
            link = np.where((z < L)[:, None], lat[None, :starts] + (sent / r)[:, None] / bw[None, :starts], 0.0)
            rest = bound[z][:, r:r + starts]  # the completion from device s + r on
            value = np.maximum(np.maximum(t[:, None], link), rest)
            best_z = value.argmin(axis=0)
            cand = value[best_z, np.arange(starts)]
            better = np.flatnonzero(cand < starts_at[:starts])
            starts_at[better], stop_at[better], replicas_at[better] = cand[better], z[best_z[better]], r
        d = np.arange(D)
        fresh = fresh_node_start(d, k, D)
        s = np.where(starts_at[fresh] < starts_at[d], fresh, d)  # ties: continue on the same node
        bound[i, :D] = starts_at[s]
        choice[i, :D] = np.stack([stop_at[s], s, replicas_at[s]], axis=1)
    return bound, choice


def least_bottleneck_stages(bound: np.ndarray, choice: np.ndarray) -> list[tuple[int, int, int, int]] | None:
    """The placement attaining bound[0, 0]: [(first layer, stop, first device, replicas)], or None.
    A strong first incumbent for the search (it is then costed in full)."""
    if not math.isfinite(bound[0, 0]):
        return None
    L = bound.shape[0] - 1
    stages, i, d = [], 0, 0
    while i < L:
        stop, s, r = (int(v) for v in choice[i, d])
        stages.append((i, stop, s, r))
        i, d = stop, s + r
    return stages
