"""A stage's gradient all-reduce in buckets, overlapped with its last backward (runtime GradientSync).

The runtime arms a watch on each gradient when a stage starts its last gradient action (B, or W
under a split backward). That action runs the stage's layers last to first; the buckets are whole
layers from the last, each closed once it holds BUCKET_BYTES of gradients (DDP's default size), and
each is all-reduced, in order over the stage's all-reduce link, as soon as its lowest layer is done.
With ready_k the time into the action at which bucket k is complete and ar_k its all-reduce, the
last bucket ends at E = max_k (ready_k + sum_{j >= k} ar_j) after the action starts; what the
simulator charges after the action ends is the exposed part E - duration (0 where the last bucket
is done before the action is). The search's closed forms (bounds.py, branch.py) bound it from below
by one all-reduce of every byte less the action's duration: the buckets start no sooner than the
action and together cost at least that one all-reduce (each pays its own latency).

A weight several stages hold (a tied embedding: the first and last layer of a GPT or a small
Llama) is summed after the stages' own buckets, over every device of the stages holding it
(cost.stage_costs), all of it left after the action. Where no two stages share devices (1F1B, ZB-H1,
copies), a stage that holds some layers of a tied group but not all adds at least a ring of the
weight over its devices and one more (tied_floor_s): the proof's bounds count it (bounds.py's link
tables, copies_bound.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..cluster import ring_allreduce_s

if TYPE_CHECKING:
    from ..cluster import Topology
    from ..profile.model_profile import ModelProfile

BUCKET_BYTES = 25 * 2**20


def bucket_layers(parameter_bytes: Sequence[float], cap: float = BUCKET_BYTES) -> list[list[int]]:
    """Positions (into the stage's layers) of each bucket, the first bucket holding the last layers.
    Layers without parameters join the bucket being filled."""
    out, current, size = [], [], 0.0
    for i in range(len(parameter_bytes) - 1, -1, -1):
        current.append(i)
        size += parameter_bytes[i]
        if size >= cap:
            out.append(current)
            current, size = [], 0.0
    if current:
        out.append(current)
    return [b for b in out if any(parameter_bytes[i] > 0 for i in b)]


def exposed(ready: Sequence[float], costs: Sequence[float], duration: float) -> tuple[float, float]:
    """(all the buckets' all-reduce, what is left of it after the action ends) for buckets complete
    at `ready` (time into the action, in sending order) whose all-reduces take `costs`."""
    end = 0.0
    for r, c in zip(ready, costs):
        end = (end if end > r else r) + c
    total = sum(costs)
    return total, (max(0.0, end - duration) if total > 0 else 0.0)


def overlapped(
    layer_seconds: Sequence[float],
    parameter_bytes: Sequence[float],
    allreduce: Callable[[float], float],
    cap: float = BUCKET_BYTES,
) -> tuple[float, float]:
    """(the buckets' all-reduce in all, the part left after an action of these per-layer seconds ends).
    `layer_seconds`: the action's time in each of the stage's layers, first to last."""
    done_from, elapsed = {}, 0.0  # layer -> time into the action at which it is done (last layer first)
    for i in range(len(layer_seconds) - 1, -1, -1):
        elapsed += layer_seconds[i]
        done_from[i] = elapsed
    ready, costs = [], []
    for bucket in bucket_layers(parameter_bytes, cap):
        # complete once its lowest layer holding weights is done (the last of them the action reaches)
        ready.append(done_from[min(i for i in bucket if parameter_bytes[i] > 0)])
        costs.append(allreduce(sum(parameter_bytes[i] for i in bucket)))
    return exposed(ready, costs, elapsed)


def tied_ring_s(devices: np.ndarray, nbytes: float, topology: Topology) -> np.ndarray:
    """A ring all-reduce of `nbytes` over each of `devices` (device counts) on the fastest
    link a group of that many may get: the network's past a node, else the faster of the two. At
    most what a tied weight's sum over that many devices or more costs (the ring only grows with
    its devices)."""
    (inter_bw, inter_lat), (best_bw, best_lat) = (
        topology.fastest_allreduce_link(True),
        topology.fastest_allreduce_link(False),
    )
    across = devices > topology.devices_per_node
    return ring_allreduce_s(
        devices, nbytes, (np.where(across, inter_bw, best_bw), np.where(across, inter_lat, best_lat))
    )


def tied_floor_s(
    profile: ModelProfile, start: int, stops: np.ndarray, counts: np.ndarray, topology: Topology
) -> np.ndarray:
    """[stop, count]: the least a stage of layers [start, stop) on `count` devices adds after its own
    all-reduce for the tied weights it shares with a layer outside it, where no other stage shares
    its devices: per tied group the span splits, a ring over its devices and one more
    (tied_ring_s)."""
    out = np.zeros((len(stops), len(counts)))
    for layers, nbytes in profile.tied:
        held = np.array(sorted(set(layers)))
        inside = ((held[None, :] >= start) & (held[None, :] < stops[:, None])).sum(axis=1)
        split = (inside > 0) & (inside < len(held))
        if nbytes > 0 and split.any():
            out = out + np.where(split[:, None], tied_ring_s(counts + 1, nbytes, topology)[None, :], 0.0)
    return out
