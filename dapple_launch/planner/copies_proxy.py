"""The proxy a layout of round-robin copies is ranked by before it is simulated, and the layouts it picks.

A stage's load is its busiest copy's compute (canonical copies: ceil(M / c) micro-batches of b / g
samples) plus its gradient all-reduce over all its devices: what the stage adds to the iteration at
the least. The proxy of a layout is its slowest stage's load. The search over copies
(round_robin_search.py) shares devices over given cuts (share_devices), balances cuts for given
device counts (balance_cuts), chooses both at once per stage count (least_slowest_layouts, where
each stage's busiest link counts too) and ranks its local moves by it; only the picks are simulated.
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
    stage_loads), computed on first use: the cut balancer asks O(S L^2) of them, most again."""

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


def stage_loads(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    stops: tuple[int, ...],
    replicas: tuple[int, ...] | list[int],
    b: int,
    memo: dict,
) -> list[float]:
    """Each stage's load in the layout contiguous((0, *stops), replicas): its busiest copy's compute
    with canonical copies (ceil(M / c) micro-batches of b / g samples) and its gradient all-reduce
    over all its devices, what the stage adds to the iteration at the least. The proxy the layout
    moves are ranked by (each pick is then simulated)."""
    M = global_batch // b
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
    """The layout's slowest stage's load (stage_loads), all-reduce included: what ranks moves."""
    return max(stage_loads(profile, topology, global_batch, stops, replicas, b, memo))


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
            loads = stage_loads(profile, topology, global_batch, stops, replicas, b, memo)
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


def least_slowest(
    loads: np.ndarray, most_stages: int, devices: int
) -> dict[int, tuple[float, tuple[int, ...], tuple[int, ...]]]:
    """Per stage count S = 1 .. most_stages: the least T such that some S contiguous stages over
    the L layers, on at most `devices` devices in all, each keep their load at most T; and that
    layout (stops, its fewest device counts). `loads[r - 1, start, stop]`: a stage [start, stop)
    on r devices. For a trial T each span takes the fewest devices that bring it under T (not
    always the most: a stage's all-reduce grows with r), a programme over the stages finds the
    fewest devices in all for every S at once, and a bisection per S over the loads' values finds
    where they first fit (each trial's programme kept: the bisections share their first steps).
    An S no layout fits is left out."""
    D, L = loads.shape[0], loads.shape[1] - 1
    starts, stops = np.triu_indices(L + 1, 1)  # every span [start, stop)
    values = np.unique(loads[:, starts, stops])
    # the least load with at most r devices: nonincreasing in r, so the fewest that bring a span
    # under T are one more than the counts whose least is above it
    lowest = np.minimum.accumulate(loads[:, starts, stops], axis=0)  # [r - 1, span]
    none = D + devices + 1  # (a span no count brings under T)
    most = min(most_stages, L)
    trials: dict[int, tuple[list[int], np.ndarray, list[np.ndarray]]] = {}

    def programme(at: int) -> tuple[list[int], np.ndarray, list[np.ndarray]]:
        """At T = values[at]: the fewest devices S stages need, per S, each span's fewest and
        each stage's best start per stop."""
        if at not in trials:
            above = lowest > values[at]
            least = np.full((L + 1, L + 1), none)
            least[starts, stops] = np.where(above[-1], none, above.sum(axis=0) + 1)
            total = np.full(L + 1, none)
            total[0] = 0
            needed, chosen = [], []
            for _ in range(most):
                options = total[:, None] + least  # [start, stop]
                best = options.argmin(axis=0)
                total = np.minimum(options[best, np.arange(L + 1)], none)
                needed.append(int(total[L]))
                chosen.append(best)
            trials[at] = needed, least, chosen
        return trials[at]

    out = {}
    for S in range(1, most + 1):
        lo, hi = 0, len(values) - 1
        if hi < 0 or programme(hi)[0][S - 1] > devices:
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if programme(mid)[0][S - 1] <= devices:
                hi = mid
            else:
                lo = mid + 1
        _, least, chosen = programme(hi)
        cuts, replicas, stop = [], [], L
        for s in range(S - 1, -1, -1):
            start = int(chosen[s][stop])
            cuts.append(stop)
            replicas.append(int(least[start, stop]))
            stop = start
        out[S] = (float(values[hi]), tuple(reversed(cuts)), tuple(reversed(replicas)))
    return out


def _link_loads(profile: ModelProfile, topology: Topology, M: int, b: int) -> np.ndarray:
    """[r - 1, start, stop]: the busier of a stage's two cuts' links, each carrying its busiest
    copy's ceil(M / c) activations (or gradients) in turn, its b / g samples a device on the
    fastest link it may get (the network's where its r devices fill a node or more)."""
    L, D, k = profile.num_layers, topology.num_devices, topology.devices_per_node
    inner = np.asarray(profile.cut_bytes[: L - 1], dtype=float) * b / profile.batch_size
    cut = np.concatenate(([0.0], inner, [0.0]))  # cut[i]: the bytes into layer i (none at 0 and L)
    every = np.arange(1, D + 1)
    g = np.gcd(every, b)
    turns = -(-M // (every // g))
    (across_bw, across_lat), (best_bw, best_lat) = topology.fastest_p2p_link(True), topology.fastest_p2p_link(False)
    bw, lat = np.where(every >= k, across_bw, best_bw), np.where(every >= k, across_lat, best_lat)
    link = np.where(cut[None, :] > 0, lat[:, None] + cut[None, :] / (g * bw)[:, None], 0.0) * turns[:, None]
    return np.maximum(link[:, :, None], link[:, None, :])


def least_slowest_layouts(
    profile: ModelProfile, topology: Topology, global_batch: int, b: int, most_stages: int, memo: dict
) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per stage count S = 2 .. most_stages, the layout (stops, replica counts over all D devices)
    whose slowest stage's load is least over every cut and device count at once (least_slowest),
    the devices it leaves over given one by one where the slowest stage then ends least. Sharing
    devices for given cuts and cutting for given devices in turn (share_devices, balance_cuts)
    stalls where neither alone lowers the slowest stage (VGG-19 on 64 A100s, G 64: from even
    starts, (56, 7, 1) on three stages; at their joint least, five stages of (24, 16, 8, 8, 8)
    simulate 6 % faster than the search's plan before). A stage's all-reduce is priced as within a
    node where it fits one (its place is not known before the counts before it are)."""
    key = ("least slowest", b, most_stages)
    if key in memo:
        return memo[key]
    D, k, M = topology.num_devices, topology.devices_per_node, global_batch // b
    tables = []
    for r in range(1, D + 1):
        at = ("load table", M, b, r, r > k)
        if at not in memo:
            memo[at] = _load_table(profile, topology, M, b, r, r > k)
        tables.append(memo[at])
    loads = np.stack(tables)  # [r - 1, start, stop]
    # a copy's links carry its micro-batches one after another (rank_simulate.py), so a stage is
    # no faster than its busiest link either: at a slow network, a cut's traffic decides the layout
    # (VGG-19 on 16 × 1 V100 at 10 Gbps, G 64: with it, four stages of (8, 5, 2, 1) simulate at
    # 57.8 ms; by compute and all-reduce alone the best start was 88.8 ms)
    loads = np.maximum(loads, _link_loads(profile, topology, M, b))
    out = {}
    for S, (_, stops, fewest) in least_slowest(loads, min(most_stages, D), D).items():
        if S < 2:
            continue
        replicas = list(fewest)
        for _ in range(D - sum(replicas)):  # the devices left over, one by one
            # each where the slowest stage then ends least, and of those where its own stage gains
            # most (each to the slowest stage piles them where its all-reduce only grows)
            options = []
            now = stage_loads(profile, topology, global_batch, stops, replicas, b, memo)
            for s in range(S):
                more = list(replicas)
                more[s] += 1
                stage = stage_loads(profile, topology, global_batch, stops, more, b, memo)
                options.append((max(stage), stage[s] - now[s], s))
            replicas[min(options)[2]] += 1
        out[S] = (stops, tuple(replicas))
    memo[key] = out
    return out
