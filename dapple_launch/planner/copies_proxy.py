"""The proxy a layout of round-robin copies is ranked by before it is simulated, and the layouts it picks.

A stage's load is its busiest copy's compute (canonical copies: ceil(M / c) micro-batches of b / g
samples) plus its gradient all-reduce over all its devices: what the stage adds to the iteration at
the least. The proxy of a layout is its slowest stage's load. The search over copies
(round_robin_search.py) shares devices over given cuts (share_devices), balances cuts for given
device counts (balance_cuts) and ranks its local moves by it; only the picks are simulated.
"""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile
from .cost import speed_ratio
from .round_robin import canonical_copies

SHARE_MOVES_STAGES = 16  # up to this many stages, device moves refine the greedy share


class _Loads(dict):
    """(start, stop) -> the load of a stage of layers [start, stop) on r devices (see
    _contiguous_loads), computed on first use: the cut balancer asks O(S L^2) of them, most again."""

    def __init__(self, profile: ModelProfile, topology: Topology, M: int, b: int, r: int, spans_nodes: bool):
        super().__init__()
        self.profile, self.r = profile, r
        # _copy_compute's and Topology.allreduce_s's factors, fixed for the table (the same floats)
        c = canonical_copies(r, b)
        self.scale, self.samples = math.ceil(M / c) * speed_ratio(profile, topology), math.ceil(b * c / r)
        self.link = topology.allreduce_link(spans_nodes) if r > 1 else None

    def __missing__(self, key: tuple[int, int]) -> float:
        start, stop = key
        load = self.scale * sum(self.profile.seconds(start, stop, self.samples))
        if self.link is not None:
            nbytes = self.profile.span(start, stop)[3]
            if nbytes > 0:
                load += ring_allreduce_s(self.r, nbytes, self.link)
        self[key] = load
        return load


def _run_loads(profile: ModelProfile, topology: Topology, M: int, b: int, first: int, r: int, memo: dict) -> _Loads:
    """The loads of stages on the r devices from `first` on: alike for every run of r devices that
    does, or does not, span nodes (the all-reduce's cost depends on nothing else), so one table
    serves them all, and no device tuple is built (the proxy's local search asks for every stage
    of every move)."""
    k = topology.devices_per_node
    spans = r > 0 and first // k != (first + r - 1) // k
    key = ("load", M, b, r, spans)
    table = memo.get(key)
    if table is None:
        table = memo[key] = _Loads(profile, topology, M, b, r, spans)
    return table


def _contiguous_loads(
    profile: ModelProfile,
    topology: Topology,
    M: int,
    b: int,
    stops: tuple[int, ...],
    replicas: tuple[int, ...] | list[int],
    memo: dict,
) -> list[float]:
    """Each stage's load in the layout contiguous((0, *stops), replicas): its busiest copy's compute
    with canonical copies (ceil(M / c) micro-batches of b / g samples) and its gradient all-reduce
    over all its devices, what the stage adds to the iteration at the least. The proxy the layout
    moves are ranked by (each pick is then simulated)."""
    out, first, start = [], 0, 0
    for stop, r in zip(stops, replicas):
        out.append(_run_loads(profile, topology, M, b, first, r, memo)[start, stop])
        first, start = first + r, stop
    return out


def _copy_compute(profile: ModelProfile, topology: Topology, M: int, b: int, start: int, stop: int, r: int) -> float:
    """A stage's busiest copy's compute with canonical copies: ceil(M / c) micro-batches of b / g samples."""
    c = canonical_copies(r, b)
    return math.ceil(M / c) * speed_ratio(profile, topology) * sum(profile.seconds(start, stop, math.ceil(b * c / r)))


def compute_floor(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    stops: tuple[int, ...],
    replicas: tuple[int, ...],
    b: int,
) -> float:
    """The busiest copy's compute: no plan of these stages and copies is faster."""
    return max(
        _copy_compute(profile, topology, global_batch // b, b, start, stop, r)
        for start, stop, r in zip((0, *stops), stops, replicas)
    )


def proxy(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    stops: tuple[int, ...],
    replicas: tuple[int, ...],
    b: int,
    memo: dict,
) -> float:
    """The layout's slowest stage's load (_contiguous_loads), all-reduce included: what ranks moves."""
    return max(_contiguous_loads(profile, topology, global_batch // b, b, stops, replicas, memo))


def share_devices(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    stops: tuple[int, ...],
    b: int,
    memo: dict,
    start: tuple[int, ...] | None = None,
) -> tuple[int, ...] | None:
    """Replica counts for copies at micro-batch size b: from `start` (default: one device each, then
    each next device to the slowest stage), moves of 1 to 3 devices between two stages while the
    proxy (the slowest stage's load, all-reduce included) falls."""
    S, D = len(stops), topology.num_devices
    if S > D:
        return None
    if start is None or sum(start) != D or len(start) != S:
        replicas = [1] * S
        for _ in range(D - S):
            loads = _contiguous_loads(profile, topology, global_batch // b, b, stops, replicas, memo)
            replicas[max(range(S), key=lambda k: (loads[k], -k))] += 1
    else:
        replicas = list(start)
    here = proxy(profile, topology, global_batch, stops, tuple(replicas), b, memo)
    improved = S <= SHARE_MOVES_STAGES  # (S^2 moves a round: beyond, the greedy share alone)
    while improved:
        improved = False
        for i in range(S):
            for j in range(S):
                for k in (1, 2, 3):
                    if i == j or replicas[j] <= k:
                        continue
                    r = list(replicas)
                    r[i], r[j] = r[i] + k, r[j] - k
                    v = proxy(profile, topology, global_batch, stops, tuple(r), b, memo)
                    if v < here * (1 - 1e-9):
                        replicas, here, improved = r, v, True
    return tuple(replicas)


def balance_cuts(
    profile: ModelProfile, topology: Topology, global_batch: int, replicas: tuple[int, ...], b: int, memo: dict
) -> tuple[int, ...]:
    """Cuts minimising the proxy for these replica counts (a dynamic program over layers: O(S L^2)),
    once per (replica counts, micro-batch size): the starts' passes and the local search ask again
    for the same ones (gnmt-32 on 64 A100s at G=1024: 48 asks, 14 distinct)."""
    key = ("cuts", tuple(replicas), b)
    if key not in memo:
        memo[key] = _balance_cuts(profile, topology, global_batch, tuple(replicas), b, memo)
    return memo[key]


def _load_table(profile: ModelProfile, topology: Topology, M: int, b: int, r: int, spans: bool) -> np.ndarray:
    """_Loads over every span at once, [start, stop] (start < stop), the same floats: each entry is
    _Loads.__missing__'s sums in its order, elementwise (what the cut balancer's programme reads).
    Two forms of one formula on purpose: the proxy asks a few spans of many device counts (the
    greedy share tries every count), where a lazy entry is cheaper than a table of every span;
    the balancer reads every span. The tests hold the two equal entry by entry."""
    L, c = profile.num_layers, canonical_copies(r, b)
    scale, samples = math.ceil(M / c) * speed_ratio(profile, topology), math.ceil(b * c / r)
    n = samples / profile.batch_size
    pre = profile._prefix
    i, z = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    ff, bf, f, bb = (np.asarray(pre[key])[z] - np.asarray(pre[key])[i] for key in ("ff", "bf", "f", "b"))
    load = scale * ((ff + (f - ff) * n) + (bf + (bb - bf) * n))  # (ModelProfile.seconds)
    if r > 1:
        nbytes = np.asarray(pre["p"])[z] - np.asarray(pre["p"])[i]
        load = np.where(nbytes > 0, load + ring_allreduce_s(r, nbytes, topology.allreduce_link(spans)), load)
    return load


def _balance_cuts(
    profile: ModelProfile, topology: Topology, global_batch: int, replicas: tuple[int, ...], b: int, memo: dict
) -> tuple[int, ...]:
    """best[s][stop]: the least slowest stage of stages 1..s over layers [0, stop), stage s on its
    run of devices; one vectorised step per stage over every (start, stop). Ties go to the latest
    start (the stage's least layers)."""
    L, S, M, k = profile.num_layers, len(replicas), global_batch // b, topology.devices_per_node
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    starts = np.arange(L + 1)[:, None]
    later = starts < np.arange(L + 1)[None, :]  # [start, stop]: a stage of at least one layer
    back = []
    first = 0  # the stage's first device (contiguous, in stage order)
    for s in range(1, S + 1):
        r = replicas[s - 1]
        spans = first // k != (first + r - 1) // k
        key = ("load table", M, b, r, spans)
        if key not in memo:
            memo[key] = _load_table(profile, topology, M, b, r, spans)
        value = np.where(later, np.maximum(best[:, None], memo[key]), np.inf)
        at = L - value[::-1].argmin(axis=0)  # (the latest start of the least)
        best = value[at, np.arange(L + 1)]
        best[:s] = np.inf
        best[L - (S - s) + 1 :] = np.inf  # (room for the stages after it)
        back.append(at)
        first += r
    stops, stop = [], L
    for s in range(S, 0, -1):
        stops.append(stop)
        stop = int(back[s - 1][stop])
    return tuple(reversed(stops))
