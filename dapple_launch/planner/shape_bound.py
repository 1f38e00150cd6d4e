"""The cut-blind bounds of a shape of device groups (chunked_search.py): valid for every cut.

A shape is (family, stages per group v, the groups' replica counts, micro-batch size b). Group g
runs each of the M micro-batches through every layer it holds, so it is busy at least
M Σ_{l on g} t_l(r_g); the iteration is at least the busiest group's time, hence at least any
weighted average of the groups' times: T >= Σ_g y_g (ends_g + M Σ_{l on g} t_l(r_g)) >= Σ_g y_g
ends_g + M Σ_l min_g y_g t_l(r_g) for every y on the simplex (busiest_group), t_l(r) a layer's
forward and backward on ceil(b / r) samples and ends_g the group's fill and drain (group_ends);
with each layer's tail (tail_bound), the groups' all-reduces (allreduce_bound) and the busiest link
(link_bound). With the plain averages (uniform, by device) these order and prune the shapes; the
best weights raise what the ones left open prove, and group_bound.py raises those over their cuts.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD
from .chunked import group_devices, group_of, groups_of
from .cost import speed_ratio


def num_stages(family: str, v: int, groups: tuple[int, ...]) -> int:
    """Chimera: one stage per group (each on two groups); else v per group."""
    return len(groups) if family == "chimera" else v * len(groups)


def shape_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict | None = None,
    family: str | None = None,
    v: int = 2,
) -> float:
    """T >= the busiest group's time >= any weighted average of the groups' busy times
    (busiest_group): by group (M / P) Σ_l min_g t_l(r_g), by device (M / D) Σ_l min_g r_g t_l(r_g)
    — the compute bound at this micro-batch size, each replica paying a call's fixed cost — and the
    best weights between. With `family`, the average also counts each group's fill and drain
    (group_ends), and T >= the busiest link's time (link_bound; not Chimera, whose routes depend on
    the micro-batch). `memo`: per (replicas, b), each layer's forward and backward, shared by the
    shapes of one search."""
    return shape_bounds(profile, topology, global_batch, groups, b, memo, family, v)[0]


def shape_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict | None = None,
    family: str | None = None,
    v: int = 2,
    weigh: bool = True,
) -> tuple[float, float]:
    """shape_bound, and the same with the plain averages alone (uniform weights with the ends, by
    device without; the all-reduce term's uniform): the search orders, prunes and spends its bounds'
    cells by the plain one, and takes the weighed one where it states what it proved
    (chunked_bounds.cut_bounds' `weighed`): a bound that moved the shapes' order moved where the
    budget went, and left some shapes' proofs lower than before (14 of 1,200 fuzz seeds, 0.6 % ->
    17.6 % on one). Without `weigh`, both are the plain one (the weights cost 0.1-0.2 ms a shape,
    and a search has thousands of shapes, a few of them left open)."""
    memo = {} if memo is None else memo
    M, P, D = global_batch // b, len(groups), sum(groups)
    sizes = sorted(set(groups))
    times = [(r, _layer_times(profile, topology, r, b, memo)) for r in sizes]
    ends = np.zeros(P)
    if family is not None:
        least = np.min([t for _, t in times], axis=0)  # each layer's forward and backward at its fastest
        ends = group_ends(family, v, P, least[:, 0], least[:, 1])
    work = np.array([M * t.sum(axis=1) for _, t in times])
    sized = np.array(sizes, dtype=float)
    plain = max(work.min(axis=0).sum() / P + ends.mean(), (sized[:, None] * work).min(axis=0).sum() / D)
    reduced = None
    if family is not None:
        plain = max(plain, tail_bound(profile, topology, global_batch, family, groups, b, memo))
        reduced = _allreduce_terms(profile, topology, global_batch, family, v, groups, b, memo)
        plain = max(plain, reduced[-1])
    if family is not None and family != "chimera":
        plain = max(plain, link_bound(profile, topology, global_batch, family, v, groups, b))
    if len(sizes) == 1 or not weigh:  # (alike groups: the weights are uniform)
        return float(plain), float(plain)
    members = [[g for g in range(P) if groups[g] == r] for r in sizes]
    counts = np.array([len(m) for m in members], dtype=float)
    bound = max(plain, busiest_group(work, counts, sized, np.array([ends[m].mean() for m in members])))
    if reduced is not None:
        each, per_class, replicas, fills, _ = reduced
        bound = max(bound, busiest_group(each, per_class, replicas, fills))
    return float(bound), float(plain)


def _layer_times(profile: ModelProfile, topology: Topology, replicas: int, b: int, memo: dict):
    """Each layer's (forward, backward) on a replica's share of a micro-batch of b, memoized."""
    if (replicas, b) not in memo:
        speed, n = speed_ratio(profile, topology), math.ceil(b / replicas)
        memo[(replicas, b)] = np.array([profile.seconds(l, l + 1, n) for l in range(profile.num_layers)]) * speed
    return memo[(replicas, b)]


def _layer_weights(profile: ModelProfile, memo: dict) -> np.ndarray:
    """Each layer's parameter bytes, memoized: the tail and all-reduce terms of every shape read them."""
    if "weights" not in memo:
        memo["weights"] = np.array([profile.span(l, l + 1)[3] for l in range(profile.num_layers)])
    return memo["weights"]


def tail_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
) -> float:
    """T >= every layer's least tail: the stage holding layer l sits on some group g, which runs all its
    copy's micro-batches (M; Chimera: M / 2 per pipeline) through the stage before the stage's last
    backward ends, and the stage's gradient all-reduce (over at least l's weights, on g's devices and,
    Chimera, the other copy's) starts after it: T >= min_g (M_g t_l(r_g) + allreduce_g(w_l)). A layer
    too heavy for one device, or too wide to all-reduce across nodes, bounds every cut of the shape."""
    P = len(groups)
    M = global_batch // b // (2 if family == "chimera" else 1)
    own = group_devices(groups)
    weights = _layer_weights(profile, memo)
    least = None
    for g in range(P):
        devices = own[g] + own[P - 1 - g] if family == "chimera" else own[g]
        key = ("allreduce", len(devices), topology.spans_nodes(devices))
        if key not in memo:
            memo[key] = np.array([topology.allreduce_s(devices, w) for w in weights])
        tail = M * _layer_times(profile, topology, groups[g], b, memo).sum(axis=1) + memo[key]
        least = tail if least is None else np.minimum(least, tail)
    return float(least.max()) if least is not None else 0.0


def allreduce_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
) -> float:
    """T >= any weighted average over the groups of fill_g + M Σ_{s on g} F_s + Σ_{s on g} AR_s
    (group_bound.py's ar_g; busiest_group finds the weights), whatever the cut: no all-reduce of a
    group starts before its stages have run every forward (a stage's all-reduce follows its last
    gradient action, which follows the last micro-batch's forward on every stage), and a group's
    all-reduces run one after another. Summed over the groups with weights y, each layer adds its M
    forwards and its share of a ring all-reduce's bytes (latencies left out) on the group that
    holds it, times that group's weight: at least the least over the groups; Chimera's stages run
    M / 2 on each of two alike groups and all-reduce over both (2 r devices), so each layer adds M
    forwards and two all-reduces of its bytes. Where weights are heavy against the
    forwards (GNMT-32 on 16 × 1 V100 at 10 Gbps: a group of 2 all-reduces across nodes), it is what
    a shape's bound is short of without a programme over its cuts."""
    each, counts, sizes, fills, uniform = _allreduce_terms(profile, topology, global_batch, family, v, groups, b, memo)
    return max(uniform, busiest_group(each, counts, sizes, fills))


def _allreduce_terms(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """allreduce_bound's busiest_group arguments (each layer's term per class, the classes' counts,
    replica counts and mean fills), and its value with uniform weights (shape_bounds' plain)."""
    M, P, k = global_batch // b, len(groups), topology.devices_per_node
    both = 2 if family == "chimera" else 1
    weights = _layer_weights(profile, memo)
    sizes = sorted(set(groups))
    work, fastest = [], None
    for r in sizes:
        forwards = _layer_times(profile, topology, r, b, memo)[:, 0]
        over = r * both  # the all-reduce's devices (at their best placement)
        per_byte = 2 * (over - 1) / over / topology.fastest_allreduce_link(over > k)[0]
        work.append(M * forwards + both * per_byte * weights)
        fastest = forwards if fastest is None else np.minimum(fastest, forwards)
    assert fastest is not None  # (a shape has a group)
    # (the fills: group_ends' with no backward), and the groups weighed as busiest_group weighs them
    fills = group_ends(family, v, P, fastest, np.zeros_like(fastest))
    members = [[g for g in range(P) if groups[g] == r] for r in sizes]
    counts = np.array([len(m) for m in members], dtype=float)
    each = np.array(work)
    means = np.array([fills[m].mean() for m in members])
    return each, counts, np.array(sizes, dtype=float), means, float(each.min(axis=0).sum() / P + fills.mean())


def busiest_group(
    work: np.ndarray, counts: np.ndarray, replicas: np.ndarray, ends: np.ndarray, sweeps: int = 0
) -> float:
    """max over y on the simplex of Σ_g y_g ends_g + Σ_l min_g y_g w_l(r_g), the groups in classes
    of one replica count (work[c, l]: what layer l costs a group of the class, M t_l(r) for the
    busy term, counts[c] such groups of replicas[c] devices, ends[c] their average fill and drain),
    each class's groups weighed alike (y_g = u_c / n_c, u on the simplex: the function is concave
    and symmetric within a class, so these reach its most). Uniform weights are the by-group
    average, weights by devices (for the busy term) the compute bound; where the classes differ (a
    group of 1 and one of 15 at b = 16: the one device runs its layers on 16 samples, the fifteen
    on 2 each) the best y between is up to 1.8 times either: the busiest group's time where the layers, split fractionally,
    balance the two. Found by exact line searches over each pair of classes (on a line the
    function is piecewise linear: its breakpoints are the candidates), from the best of the two
    averages and the speeds' weights (the optimum where the classes' times are proportional, as a
    profile's are but for each call's fixed part); every y tried is a bound. Two classes are one
    line, searched whole; more take `sweeps` over their pairs (on random three-class instances of
    unproportional times the starts alone are within 3.2 % of the optimum, one sweep 0.9 %, two
    0.6 %; the search takes none: a sweep is 0.1-0.3 ms a shape, and a search thousands of shapes)."""
    k = len(counts)
    if k == 1:  # (one class: uniform weights, the groups' average)
        return float(ends[0] + work[0].sum() / counts[0])
    per = work / counts[:, None]  # [c, l]: a layer's time on the class's groups, over their number

    def value(u: np.ndarray) -> np.ndarray:  # u: [..., k] -> [...]
        return u @ ends + np.min(u[..., :, None] * per, axis=-2).sum(axis=-1)

    # by group, by device, and by speed: each group weighed as the inverse of its whole model's
    # time (u_c ∝ n_c / Σ_l w_c[l]), the optimum where the classes' times are proportional (the
    # layers then balance the groups exactly, every layer's terms alike across them)
    starts = [counts / counts.sum(), counts * replicas / (counts * replicas).sum()]
    if (work.sum(axis=1) > 0).all():  # (no micro-batch, no work: the averages alone)
        speed = counts / work.sum(axis=1)
        starts.append(speed / speed.sum())
    starts = np.stack(starts)
    values = value(starts)
    u, best = starts[int(np.argmax(values))], float(values.max())
    for _ in range(0 if k == 1 else 1 if k == 2 else sweeps):  # (two classes: one line, searched whole)
        for a, c in itertools.combinations(range(k), 2):
            s = u[a] + u[c]
            others = [o for o in range(k) if o not in (a, c)]
            rest = np.min(u[others, None] * per[others], axis=0) if others else np.full(per.shape[1], np.inf)
            with np.errstate(divide="ignore", invalid="ignore"):  # (a layer of no time: no breakpoint)
                x = np.concatenate((s * per[c] / (per[a] + per[c]), rest / per[a], s - rest / per[c], [0.0, s]))
            x = np.unique(np.clip(x[np.isfinite(x)], 0.0, s))
            trial = np.repeat(u[None, :], len(x), axis=0)
            trial[:, a], trial[:, c] = x, s - x
            values = value(trial)
            if values.max() > best:
                u, best = trial[int(np.argmax(values))], float(values.max())
    return best


def group_ends(family: str, v: int, groups: int, forwards: np.ndarray, backwards: np.ndarray) -> np.ndarray:
    """Each group's idle time at the ends of any plan of the shape. A group's first compute waits
    for micro-batch 0's forward through the k stages ahead of its earliest stage (k: that stage's
    position in its pipeline). Those k stages hold the layers before it, at least one each and from
    layer 0: at least layers 0 .. k - 1, each at its fastest (`forwards[l]`, on any group's
    replicas): T >= Σ_{l<k_g} F_l + busy_g + ..., on every group. With a whole backward the group's
    last action is a B of its earliest stage (any later one would precede the B's of its own
    earlier stages), after which the last micro-batch's gradient still crosses those layers on
    other groups: + Σ_{l<k_g} B_l. A split backward may end a group on a W, so it counts no drain."""
    per_layer = forwards + (backwards if family not in SPLIT_BACKWARD else 0.0)
    ahead = np.concatenate(([0.0], np.cumsum(per_layer)))  # ahead[k]: layers 0 .. k - 1
    return ahead[np.minimum(np.array(_earliest_stages(family, v, groups)), len(per_layer))]


@functools.cache
def _earliest_stages(family: str, v: int, groups: int) -> tuple[int, ...]:
    """Each group's earliest stage (its position in its pipeline)."""
    S = num_stages(family, v, (1,) * groups)
    first = [S] * groups
    for s in range(S):
        for g in groups_of(family, s, groups):  # (Chimera: both copies of stage s are s-th in their pipeline)
            first[g] = min(first[g], s)
    return tuple(first)


def pipeline_ends(family: str, v: int, groups: int, forwards: np.ndarray, backwards: np.ndarray) -> float:
    """The groups' average idle time at the ends of any plan of the shape (group_ends)."""
    return float(group_ends(family, v, groups, forwards, backwards).mean())


def link_bound(
    profile: ModelProfile, topology: Topology, global_batch: int, family: str, v: int, groups: tuple[int, ...], b: int
) -> float:
    """T >= the busiest directed link's time. The simulator (rank_simulate.py) sends one transfer at a
    time over the link from one group to another; every micro-batch crosses each boundary between two
    stages on different groups, its activation one way and its gradient back, and every boundary's
    transfer takes at least the least any cut of the model could cost over that link (stage_costs'
    rule: latency + the cut's bytes over the smaller replica count, at the link's bandwidth); the n
    boundaries crossing one link are n distinct cuts, so together at least the n least cuts' bytes."""
    M, P, L = global_batch // b, len(groups), profile.num_layers
    S = num_stages(family, v, groups)
    if L < 2 or S < 2:
        return 0.0
    devices = group_devices(groups)
    cuts = sorted(profile.cut_bytes[: L - 1])
    least_cuts = [0.0, *itertools.accumulate(x * b / profile.batch_size for x in cuts)]  # the n least, summed
    crossings: dict[tuple[int, int], int] = {}
    for s in range(S - 1):
        g, h = group_of(family, s, P), group_of(family, s + 1, P)
        if g != h:  # the activation g -> h, the gradient h -> g
            crossings[(g, h)] = crossings.get((g, h), 0) + 1
            crossings[(h, g)] = crossings.get((h, g), 0) + 1
    busiest, fastest, least_lat = 0.0, 0.0, math.inf
    for (g, h), n in crossings.items():
        bw, lat = topology.p2p(devices[g], devices[h])
        busiest = max(busiest, M * (n * lat + least_cuts[min(n, len(cuts))] / min(groups[g], groups[h]) / bw))
        fastest, least_lat = max(fastest, bw * min(groups[g], groups[h])), min(least_lat, lat)
    # and at least the links' average: the k boundaries that cross groups are k distinct cuts, each
    # sent both ways per micro-batch, at best over the fastest link used (a model whose early cuts
    # are small and late ones large: the few least cuts per link alone say little)
    k = sum(crossings.values()) // 2
    if k:
        total = 2 * M * (k * least_lat + least_cuts[min(k, len(cuts))] / fastest)
        busiest = max(busiest, total / len(crossings))
    return busiest
