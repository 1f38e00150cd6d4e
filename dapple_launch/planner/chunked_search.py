"""The planner's pass over device groups holding several stages (interleaved 1F1B, ZB-V, Chimera).

A shape is (family, stages per group v, the groups' replica counts, micro-batch size b); a plan of
that shape also fixes the S = vP - 1 cuts. Every candidate is costed by the simulator of its rank
orders (chunked.evaluate_chunked): there is no closed form to trust.

Bound (valid for every cut of a shape): group g runs each of the M micro-batches through every
layer it holds, so it is busy at least M Σ_{l on g} t_l(r_g); the iteration is at least the busiest
group's time, hence at least the average: T >= (M / P) Σ_l min_g t_l(r_g), t_l(r) a layer's forward
and backward on ceil(b / r) samples; also each layer's tail and the busiest link (shape_bound). That
cut-blind bound orders and prunes the shapes; the shapes left open at the end are bounded again over
their cuts (group_bound.py: the busiest group's dual, with its fill, drain and all-reduces; then the
paths of their rank orders, and the critical paths of the cuts those answer with), as far as that
decides the gap (up to the best plan or the other families' least bound) and within a count of the
programmes' cells.
Shapes below the incumbent are first screened, each family's in turn and in increasing bound, by one
candidate each (cuts balanced by compute; a shape of more than 2P micro-batches timed on 2P and
extrapolated at its busiest group's pace, an estimate that only orders the search); then searched in
the order of what their screen estimated, since the bound ignores most bubbles and transfers (with
four families, many shapes share one bound, and bound order alone spent the budget on the hopeless
ones). A shape whose cut sets the budget affords is enumerated whole (exact); otherwise local search
from its balanced cuts (moving one cut at a time) improves it, a move whose busiest group alone is
no faster left unsimulated, and the shape's bound stays in the proven gap. Once a shape's bound
reaches the best plan found, it is skipped. Replica counts: every composition of the devices into P
groups up to 8 devices; beyond, equal groups and every split into two groups. Groups take
contiguous devices in order.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD, busiest_rank_s
from .baselines import balanced_boundaries
from .branch import CELLS_PER_NODE, replica_choices
from .chunked import (
    CHUNKED,
    INTERLEAVED,
    chunked_layout,
    evaluate_chunked,
    group_devices,
    group_of,
    groups_of,
    rank_orders,
)
from .cost import Costed, Limits, speed_ratio
from .group_bound import GroupBound, weight_share_table
from .path_bound import CRITICAL_ACTION_CELLS, ORDER_ACTION_CELLS, ORDER_ACTION_CELLS_ELSE, SHAPE_CELLS, order_actions
from .proposal import Proposal, SearchState

INTERLEAVED_CHUNKS = (2, 3, 4)  # interleaved schedules' stages per group, tried
SHARE = 1 / 4  # of strategy.search_nodes, what this pass may score (each candidate simulated)
SCREEN = 1 / 2  # of this pass's budget, what the screen (one balanced candidate per shape) may score
# the bounds over cuts of the shapes left open (group_bound.py) may walk this many (stage, start,
# stop) cells of their programmes per strategy.search_nodes, each stage's overhead and the path
# games counted in cells too (path_bound.programme_cells: about 2.4 ns each, so about 0.17 s at the
# default)
BOUND_CELLS_PER_NODE = 3500
# and the second pass (the shapes left lowest: the dual again, then the paths of their rank orders,
# path_bound.py, whose programmes weigh five tables a stage and whose games cost as much again)
# this many times as many again: about 0.35 s at the default, spent only where shapes stay low
PATH_CELLS = 2.0
# and the third (the shapes left lowest again: the paths with the critical paths of the cuts they
# answer with, each a simulation of the rank orders) this many times as many again: about 0.15 s
CRITICAL_CELLS = 0.7


def _compositions(total: int, parts: int):
    for cut in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cut), (*cut, total)))


def groupings(topology: Topology, groups: int) -> list[tuple[int, ...]]:
    """Up to 8 devices every composition; beyond, equal groups and every split into two groups whose
    counts the plain search allows a stage (1 .. a node, then whole nodes: branch.replica_choices)."""
    devices = topology.num_devices
    if devices <= 8:
        return list(_compositions(devices, groups))
    out = [(devices // groups,) * groups] if devices % groups == 0 else []
    if groups == 2:
        allowed = set(replica_choices(topology, devices))
        out += [
            (r, devices - r) for r in range(1, devices) if r * 2 != devices and r in allowed and devices - r in allowed
        ]
    return out


def num_stages(family: str, v: int, groups: tuple[int, ...]) -> int:
    """Chimera: one stage per group (each on two groups); else v per group."""
    return len(groups) if family == "chimera" else v * len(groups)


def shapes(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, sizes: list[int]):
    """(family, v, groups, b) for every chunked family the limits allow."""
    L, D = profile.num_layers, topology.num_devices
    families = [f for f in limits.allowed() if f in CHUNKED]
    for family in families:
        for v in INTERLEAVED_CHUNKS if family in INTERLEAVED else (2,):
            most = min(D, L) if family == "chimera" else min(D, L // v)
            for P in range(2, most + 1):  # (one group: a plain stage does as well)
                if family == "chimera" and P % 2:
                    continue
                for groups in groupings(topology, P):
                    if family == "chimera" and groups != groups[::-1]:  # a stage's two copies alike
                        continue
                    for b in sizes:
                        M = global_batch // b
                        if runs_micro_batches(family, groups, b, M):
                            yield family, v, groups, b


def runs_micro_batches(family: str, groups: tuple[int, ...], b: int, M: int) -> bool:
    """M micro-batches of b samples suit the shape: each splits across its group's replicas, and
    (interleaved, Chimera) they come in units of the P groups."""
    return b >= max(groups) and (family == "zbv" or (M % len(groups) == 0 and len(groups) <= M))


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
    """T >= the busiest group's time >= any weighted average of the groups' busy times: by group
    (M / P) Σ_l min_g t_l(r_g), and by device (M / D) Σ_l min_g r_g t_l(r_g) — the compute bound at
    this micro-batch size, each replica paying a call's fixed cost. With `family`, the by-group
    average also counts each group's fill and drain (pipeline_ends), and T >= the busiest link's
    time (link_bound; not Chimera, whose routes depend on the micro-batch). `memo`: per (replicas,
    b), each layer's forward and backward, shared by the shapes of one search."""
    memo = {} if memo is None else memo
    M, P, D = global_batch // b, len(groups), sum(groups)
    times = [(r, _layer_times(profile, topology, r, b, memo)) for r in sorted(set(groups))]
    by_group = np.min([t.sum(axis=1) for _, t in times], axis=0).sum()
    by_device = np.min([r * t.sum(axis=1) for r, t in times], axis=0).sum()
    ends = 0.0
    if family is not None:
        least = np.min([t for _, t in times], axis=0)  # each layer's forward and backward at its fastest
        ends = pipeline_ends(family, v, P, least[:, 0], least[:, 1])
    bound = float(max(M / P * by_group + ends, M / D * by_device))
    if family is not None:
        bound = max(bound, tail_bound(profile, topology, global_batch, family, groups, b, memo))
        bound = max(bound, allreduce_bound(profile, topology, global_batch, family, v, groups, b, memo))
    if family is not None and family != "chimera":
        bound = max(bound, link_bound(profile, topology, global_batch, family, v, groups, b))
    return bound


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
    """T >= the groups' average of fill_g + M Σ_{s on g} F_s + Σ_{s on g} AR_s (group_bound.py's
    ar_g), whatever the cut: no all-reduce of a group starts before its stages have run every
    forward (a stage's all-reduce follows its last gradient action, which follows the last
    micro-batch's forward on every stage), and a group's all-reduces run one after another. Summed
    over the groups, each layer adds its M forwards and its share of a ring all-reduce's bytes
    (latencies left out) on the group that holds it, at least the least over the groups; Chimera's
    stages run M / 2 on each of two alike groups and all-reduce over both (2 r devices), so each
    layer adds M forwards and two all-reduces of its bytes. Where weights are heavy against the
    forwards (GNMT-32 on 16 × 1 V100 at 10 Gbps: a group of 2 all-reduces across nodes), it is what
    a shape's bound is short of without a programme over its cuts."""
    M, P, k = global_batch // b, len(groups), topology.devices_per_node
    both = 2 if family == "chimera" else 1
    weights = _layer_weights(profile, memo)
    least, fastest = None, None
    for r in set(groups):
        forwards = _layer_times(profile, topology, r, b, memo)[:, 0]
        over = r * both  # the all-reduce's devices (at their best placement)
        per_byte = 2 * (over - 1) / over / topology.fastest_allreduce_link(over > k)[0]
        each = M * forwards + both * per_byte * weights
        least = each if least is None else np.minimum(least, each)
        fastest = forwards if fastest is None else np.minimum(fastest, forwards)
    if least is None or fastest is None:
        return 0.0
    # (the fills: pipeline_ends' with no backward)
    return float(least.sum() / P + pipeline_ends(family, v, P, fastest, np.zeros_like(fastest)))


def pipeline_ends(family: str, v: int, groups: int, forwards: np.ndarray, backwards: np.ndarray) -> float:
    """The groups' average idle time at the ends of any plan of the shape. A group's first compute
    waits for micro-batch 0's forward through the k stages ahead of its earliest stage (k: that
    stage's position in its pipeline). Those k stages hold the layers before it, at least one each
    and from layer 0: at least layers 0 .. k - 1, each at its fastest (`forwards[l]`, on any group's
    replicas): T >= Σ_{l<k_g} F_l + busy_g + ..., on every group. With a whole backward the group's
    last action is a B of its earliest stage (any later one would precede the B's of its own earlier
    stages), after which the last micro-batch's gradient still crosses those layers on other
    groups: + Σ_{l<k_g} B_l. A split backward may end a group on a W, so it counts no drain."""
    S = num_stages(family, v, (1,) * groups)
    first = [S] * groups
    for s in range(S):
        for g in groups_of(family, s, groups):  # (Chimera: both copies of stage s are s-th in their pipeline)
            first[g] = min(first[g], s)
    per_layer = forwards + (backwards if family not in SPLIT_BACKWARD else 0.0)
    ahead = np.concatenate(([0.0], np.cumsum(per_layer)))  # ahead[k]: layers 0 .. k - 1
    return float(sum(ahead[min(k, len(per_layer))] for k in first) / groups)


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


def _by_family(todo: list[tuple]) -> list[tuple]:
    """The shapes (bound, family, ...) taken from each family in turn, each family's in increasing
    bound: the bounds ignore most of what sets the families apart (bubbles, transfers, Chimera's
    all-reduce over both copies), so bound order alone could spend the whole screen on one family."""
    queues: dict[str, list[tuple]] = {}
    for x in todo:
        queues.setdefault(x[1], []).append(x)
    out, depth = [], 0
    while len(out) < len(todo):
        out += [q[depth] for q in queues.values() if depth < len(q)]
        depth += 1
    return out


def _cost(S: int, M: int) -> int:
    return -(-S * M // CELLS_PER_NODE)


# Every candidate costs its stage costs, measured about 5 simulated cells' time per stage (0.09 ms
# for 16 stages against 1.2 ms to simulate 16 × 64 cells): all of what one the busiest-group bound
# drops unsimulated costs, and what weighs on the screen's short simulations.
CELLS_PER_STAGE_COSTED = 5


def _unsimulated_cost(S: int) -> int:
    return -(-S * CELLS_PER_STAGE_COSTED // CELLS_PER_NODE)


def search_chunked(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    incumbent: float,
    floor: float = math.inf,
) -> tuple[list[Costed], dict[int, float], int]:
    """(candidates found, per micro-batch size the least bound of any shape not searched exactly,
    candidates scored). `incumbent`: the best plan so far (shapes that cannot beat it are cut);
    `floor`: the least bound the other families proved (no shape's bound is raised above it: the
    proven gap would not change)."""
    L = profile.num_layers
    budget = max(1, int(limits.search_nodes * SHARE))
    memo: dict = {}
    todo = sorted(
        (
            (shape_bound(profile, topology, global_batch, g, b, memo, f, v), f, v, g, b)
            for f, v, g, b in shapes(profile, topology, global_batch, limits, sizes)
        ),
        key=lambda x: (x[0], x[1], x[2], x[3], x[4]),
    )
    found: list[Costed] = []
    bounds: dict[int, float] = {}
    best, scored = incumbent, 0
    # the rank orders (family, groups, micro-batches, v) built so far (in memo: cut_bounds counts
    # the building of those it needs that this pass did not build)
    built: set[tuple] = memo.setdefault("built", set())

    def costed(family, v, groups, b, stops, cutoff: float = math.inf, micro_batches: int = 0) -> Costed | None:
        """The candidate simulated (None: it cannot beat `cutoff`, by its busiest group's compute
        or its simulation), its cost counted. `micro_batches`: fewer than the global batch's, for the screen's estimate."""
        nonlocal scored
        S, M = num_stages(family, v, groups), micro_batches or global_batch // b
        key = (family, len(groups), M, v)
        if key not in built:  # a shape's first candidate also builds its rank orders: as dear as a simulation
            built.add(key)
            scored += _cost(S, M)
        layout = chunked_layout(family, list(groups), list(stops), None)
        walked: list = []
        c = evaluate_chunked(profile, topology, layout, b, M, limits, family, v, cutoff, walked)
        scored += _unsimulated_cost(S) + (_cost(S, M) if walked else 0)  # its stage costs, its simulation
        return c

    def full(family, v, groups, b, stops, micro_batches: int = 0) -> Costed:
        """costed without a cutoff: always simulated."""
        c = costed(family, v, groups, b, stops, micro_batches=micro_batches)
        assert c is not None  # (None only below a finite cutoff)
        return c

    def balanced(family, v, groups) -> list[int]:
        S, P = num_stages(family, v, groups), len(groups)
        per_stage = [groups[group_of(family, s, P)] for s in range(S)]
        return [*balanced_boundaries(profile, S, per_stage), L]

    # Screen: each shape that could beat the incumbent, its balanced cuts, each family's in turn.
    # A shape of many micro-batches is screened on 2P of them, its time extrapolated at the busiest
    # group's pace (the steady state once the pipeline is full): an estimate that only orders the
    # shapes, at a fraction of the cost; the search below simulates every candidate it keeps in full.
    screened: list[tuple] = []  # (start or None, estimate or None, fits, bound, family, v, groups, b, cuts)
    cuts: dict[tuple, list[int]] = {}  # per (family, v, groups): cuts balanced by compute
    for bound, family, v, groups, b in _by_family(todo):
        if bound >= best * (1 - 1e-9):  # cannot win
            continue
        start, estimate, fits = None, None, False
        S, M, P = num_stages(family, v, groups), global_batch // b, len(groups)
        few = M if M <= 2 * P else 2 * P  # (a multiple of P: valid for every family)
        if (family, v, groups) not in cuts:
            cuts[(family, v, groups)] = balanced(family, v, groups)
        stops = cuts[(family, v, groups)]
        if scored + _unsimulated_cost(S) + _cost(S, few) <= budget * SCREEN:
            probe = full(family, v, groups, b, stops, micro_batches=few)
            fits, estimate = probe.fits, probe.iteration_s
            if few == M:
                start = probe
                if fits:
                    found.append(start)
                    best = min(best, start.iteration_s)
            else:
                estimate += busiest_rank_s(rank_orders(family, P, few, v), probe.costs) * (M / few - 1)
        screened.append((start, estimate, fits, bound, family, v, groups, b, stops))
    open_shapes: list[tuple] = []  # (bound, family, v, groups, b) of the shapes not searched whole
    # Search: the shapes whose screen estimated fastest first (then the unscreened, by bound).
    rank = lambda x: (x[1] is None, not x[2], x[1] if x[1] is not None else x[3], x[3])
    for start, _, _, bound, family, v, groups, b, stops in sorted(screened, key=rank):
        if bound >= best * (1 - 1e-9):  # cannot beat what is found
            continue
        S, M = num_stages(family, v, groups), global_batch // b
        each = _unsimulated_cost(S) + _cost(S, M)  # (what costed counts for a simulated candidate)
        if scored + math.comb(L - 1, S - 1) * each <= budget:  # every cut of this shape
            for cut in itertools.combinations(range(1, L), S - 1):
                c = full(family, v, groups, b, (*cut, L))
                if c.fits:
                    found.append(c)
                    best = min(best, c.iteration_s)
            continue
        bounds[b] = min(bounds.get(b, math.inf), bound)  # searched locally at most: its bound stays open
        open_shapes.append((bound, family, v, groups, b))
        if start is None:
            if scored + each > budget:
                continue
            start = full(family, v, groups, b, stops)
        current: Costed = start
        moved = True
        while moved and scored + each <= budget:  # steepest descent over one cut at a time
            moved, step = False, None
            for i in range(S - 1):
                for d in (-2, -1, 1, 2):
                    trial = list(stops)
                    trial[i] += d
                    if not (0 < trial[i] < L) or (i and trial[i] <= trial[i - 1]) or trial[i] >= trial[i + 1]:
                        continue
                    if scored + each > budget:
                        break
                    # a fitting current is only left for a faster trial: one whose busiest group's
                    # compute alone is as slow is not simulated (costed: None)
                    c = costed(
                        family,
                        v,
                        groups,
                        b,
                        trial,
                        (step or current).iteration_s * (1 - 1e-12) if current.fits else math.inf,
                    )
                    if c is None:
                        continue
                    if (
                        c.fits
                        and c.iteration_s < (step or current).iteration_s * (1 - 1e-12)
                        or not current.fits
                        and c.fits
                    ):
                        step, step_stops = c, trial
            if step is not None:
                current, stops, moved = step, step_stops, True
        if current.fits:
            found.append(current)
            best = min(best, current.iteration_s)
    cells = limits.search_nodes * BOUND_CELLS_PER_NODE
    return found, cut_bounds(profile, topology, global_batch, open_shapes, min(best, floor), memo, cells), scored


def cut_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    open_shapes: list[tuple],
    best: float,
    memo: dict,
    cells: float,
) -> dict[int, float]:
    """Per micro-batch size, the least bound of the shapes left open, each raised by the bound over
    its cuts (group_bound.py) as far as it decides the gap: in increasing shape bound, each only up
    to the least so far (or `best`: the best plan, or the least bound of the other families where
    lower), above which it changes nothing; within `cells` of the bounds' programmes (a count, not
    a clock: the same bounds on any machine), the rest as they are. Then, within PATH_CELLS of as
    many cells again, the shapes left lowest once more in increasing bound, each up to the least so
    far: the dual again (it stopped at the least bound of the shapes before it, which may have
    risen since) and the paths of the rank orders (path_bound.py). Then, within CRITICAL_CELLS as
    many, the paths with the critical paths of the cuts they answer with (GroupBound.critical).
    Each pass only raises what the one before left."""
    rows: list[list] = []  # [bound, family, v, groups, b, its GroupBound or None]
    least, given, lead = best, cells, {}  # (lead: per family and stage count, the kind of term that binds)
    for bound, family, v, groups, b in sorted(open_shapes, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
        dual = None
        if bound < least and cells > 0:
            dual = _group_bound(profile, topology, global_batch, family, v, groups, b, memo)
            dual.with_paths, dual.lead = False, lead  # (the paths' turn comes below, on the shapes left lowest)
            bound = max(bound, dual.bound(least, cells))
            cells -= dual.cells
        least = min(least, bound)
        rows.append([bound, family, v, groups, b, dual])
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))  # (ties: by shape, never by the objects)
    paths, warm = given * PATH_CELLS, {}  # (warm: per rank orders, the path weights that did best so far)
    least = best  # what the shapes raised so far are all at or above
    for row in rows:
        if row[0] >= least or paths <= 0:
            break  # (every shape after it is as high: none is below the least any more)
        # the dual again (above, it stopped at the least bound of the shapes before it, which may
        # be higher now), then the paths
        family, v, groups, b = row[1:5]
        dual = row[5]
        if dual is None:
            dual = _group_bound(profile, topology, global_batch, family, v, groups, b, memo)
        else:
            dual.cells = 0  # (its tables are made: counted in the first pass)
        dual.with_paths, dual.warm, dual.lead = True, warm, lead
        row[0] = max(row[0], dual.bound(least, paths))
        paths -= dual.cells
        least = min(least, row[0])
    # and, within CRITICAL_CELLS of as many again, the paths once more with the critical paths of
    # the cuts they answer with (path_bound.py): where transfers chain the groups' steps. A shape
    # whose rank orders and one critical path the cells left cannot pay for is left as it is
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))
    critical, least = given * CRITICAL_CELLS, best
    for row in rows:
        if row[0] >= least or critical <= 0:
            break
        family, v, groups, b = row[1:5]
        actions = order_actions(family, num_stages(family, v, groups), global_batch // b)
        if actions * (ORDER_ACTION_CELLS.get(family, ORDER_ACTION_CELLS_ELSE) + CRITICAL_ACTION_CELLS) < critical:
            dual = row[5]
            if dual is None:
                dual = _group_bound(profile, topology, global_batch, family, v, groups, b, memo)
            else:
                dual.cells = 0  # (its tables are made: counted in the passes before)
            row[0] = max(row[0], dual.critical(least, critical))
            critical -= dual.cells
        least = min(least, row[0])
    bounds: dict[int, float] = {}
    for bound, _, _, _, b, _ in rows:
        bounds[b] = min(bounds.get(b, math.inf), bound)
    return bounds


def _group_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
) -> GroupBound:
    times = lambda r, b=b: _layer_times(profile, topology, r, b, memo)
    bound = GroupBound(profile, topology, global_batch, family, v, groups, b, times, memo.setdefault("tables", {}))
    if "share" not in memo:  # (the profile's: one table for every shape)
        memo["share"] = weight_share_table(profile)
    bound.share, bound.built = memo["share"], memo.setdefault("built", set())
    bound.cells += SHAPE_CELLS  # (its set-up; the tables it made are counted already)
    return bound


class DeviceGroups:
    """The proposer of device groups holding several stages (interleaved 1F1B and zero bubble, ZB-V,
    Chimera): their shapes searched from the incumbent down (search_chunked)."""

    def wanted(self, state: SearchState) -> bool:
        return any(f in CHUNKED for f in state.limits.allowed())

    def propose(self, state: SearchState) -> Proposal:
        best = state.best()
        found, bounds, scored = search_chunked(
            state.profile,
            state.topology,
            state.global_batch,
            state.limits,
            state.sizes,
            best.iteration_s if best is not None else math.inf,
            min(state.bounds.values(), default=math.inf),
        )
        state.stats.nodes += scored
        if best is not None:  # what holds without these families, for the statement
            state.stats.gap_without_chunked = state.gap()
        return Proposal(CHUNKED, [*found, *(c for c in state.prior if c.schedule in CHUNKED)], bounds)
