"""Local search over plans: a strong incumbent for the branch and bound, and the answer's polish
when the search's budget ends before it proves optimality.

A plan here is the search's own kind (branch.py): contiguous stages, each on a contiguous range of
devices that either continues at the next free device or starts on a fresh node, an allowed
replica count, a micro-batch size dividing the global batch. Steepest descent over the moves a
person would try by hand — shift a cut by one or two layers, hand a device to the neighbouring
stage, start a stage on a fresh node or not, merge two stages, split one, halve or double the
micro-batch — each neighbour costed by the same simulator as everything else. Deterministic:
neighbours are tried in a fixed order and only a strictly better one is taken.

Why it matters: the least-bottleneck seed ignores the transfers that the steady state's windows
of adjacent stages pay (GNMT on 16 devices) and every stage's all-reduce tail (AmoebaNet 8:8);
a few descent steps recover most of that before any branching, so the search prunes from a
near-optimal incumbent and a budget-limited search still answers well. Under a deeper warm-up the
same moves (and a step deeper or shallower) are simulated: a plan that hides its links behind a
deeper warm-up wants different cuts than DAPPLE's minimal warm-up rewards (GNMT on 10 Gbps: 18%).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule.one_f_one_b import deeper_warmup
from .bounds import fresh_node_start
from .branch import CELLS_PER_NODE
from .cost import Costed, StageSpec, evaluate, stage_costs
from .limits import Limits
from .link_warmup import LINKED
from .shapes import MIN_MICRO_BATCHES
from .warmup import WARMUP_MAX_ACTIONS, worth_simulating


@dataclass(frozen=True)
class Shape:
    """A plan in the search's space: stage stops, replica counts, fresh-node flags, micro-batch size."""

    stops: tuple[int, ...]  # stop of each stage (the last is the layer count)
    replicas: tuple[int, ...]
    fresh: tuple[bool, ...]  # the stage starts on the next node's first device, not the next free one
    micro_batch: int

    def layout(self, topology: Topology) -> tuple[StageSpec, ...] | None:
        """Contiguous placement in pipeline order; None when it does not fit the cluster."""
        D, k = topology.num_devices, topology.devices_per_node
        d, start, stages = 0, 0, []
        for stop, r, fresh in zip(self.stops, self.replicas, self.fresh):
            first = int(fresh_node_start(d, k, D)) if fresh else d
            if first + r > D or stop <= start:
                return None
            stages.append(StageSpec(start, stop, tuple(range(first, first + r))))
            d, start = first + r, stop
        return tuple(stages)


def shape_of(c: Costed, topology: Topology) -> Shape:
    """The Shape of a candidate whose stages are contiguous and in device order, or one re-placed so."""
    k, D = topology.devices_per_node, topology.num_devices
    d, fresh = 0, []
    for s in c.layout:
        first = s.devices[0]
        fresh.append(first != d and first == int(fresh_node_start(d, k, D)))
        d = first + s.replicas
    return Shape(tuple(s.stop for s in c.layout), tuple(s.replicas for s in c.layout), tuple(fresh), c.micro_batch_size)


def _neighbours(x: Shape, allowed_replicas: frozenset[int], sizes: list[int]):
    S, stops, reps, fresh = len(x.stops), list(x.stops), list(x.replicas), list(x.fresh)
    starts = [0, *stops[:-1]]
    for s in range(S - 1):  # shift the cut after stage s
        for delta in (-2, -1, 1, 2):
            cut = stops[s] + delta
            if starts[s] < cut < stops[s + 1]:
                yield Shape(tuple(stops[:s] + [cut] + stops[s + 1 :]), x.replicas, x.fresh, x.micro_batch)
    for s in range(S - 1):  # hand one device to the neighbouring stage
        for give, take in ((s, s + 1), (s + 1, s)):
            if reps[give] > 1 and reps[take] + 1 in allowed_replicas:
                r = list(reps)
                r[give] -= 1
                r[take] += 1
                yield Shape(x.stops, tuple(r), x.fresh, x.micro_batch)
    for s in range(S):  # one more or one fewer device for a stage
        for delta in (-1, 1):
            if reps[s] + delta in allowed_replicas:
                r = list(reps)
                r[s] += delta
                yield Shape(x.stops, tuple(r), x.fresh, x.micro_batch)
    for s in range(1, S):  # start on a fresh node or continue on this one
        f = list(fresh)
        f[s] = not f[s]
        yield Shape(x.stops, x.replicas, tuple(f), x.micro_batch)
    for s in range(S - 1):  # merge stages s and s+1
        r = reps[s] + reps[s + 1]
        if r in allowed_replicas:
            yield Shape(
                tuple(stops[:s] + stops[s + 1 :]),
                tuple(reps[:s] + [r] + reps[s + 2 :]),
                tuple(fresh[: s + 1] + fresh[s + 2 :]),
                x.micro_batch,
            )
    for s in range(S):  # split stage s in the middle of its layers, its devices shared out
        if stops[s] - starts[s] >= 2:
            mid = (starts[s] + stops[s]) // 2
            r1 = max(1, reps[s] // 2)
            r2 = reps[s] - r1 if reps[s] > 1 else 1
            if r1 in allowed_replicas and r2 in allowed_replicas:
                yield Shape(
                    tuple(stops[:s] + [mid] + stops[s:]),
                    tuple(reps[:s] + [r1, r2] + reps[s + 1 :]),
                    tuple(fresh[: s + 1] + [False] + fresh[s + 1 :]),
                    x.micro_batch,
                )
    i = sizes.index(x.micro_batch)  # the next smaller and larger micro-batch size
    for j in (i - 1, i + 1):
        if 0 <= j < len(sizes):
            yield Shape(x.stops, x.replicas, x.fresh, sizes[j])


def descend(
    start: Costed,
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    allowed_replicas: list[int],
    sizes: list[int],
    max_steps: int = 200,
    cost_budget: float = float("inf"),
) -> tuple[Costed, int]:
    """Steepest descent from `start`; (the local optimum, the cost of the neighbours costed).

    A start with a deeper 1F1B warm-up descends at that depth, one step deeper or shallower being
    two more moves. Each neighbour simulated costs S M / CELLS_PER_NODE (branch.py) of `cost_budget`,
    which ends the descent when spent; one screened out by its bound or memory costs 1."""
    allowed = frozenset(allowed_replicas)
    sizes = sorted(sizes)
    best, shape, depth = start, shape_of(start, topology), start.warmup_depth
    costed, seen = 0, {(shape, depth)}
    capacity = topology.device_memory_bytes * (1 - limits.memory_headroom)
    memo: dict = {}  # neighbours share most stages and links: each is costed once
    for _ in range(max_steps):
        step = None
        moves = [(n, depth) for n in _neighbours(shape, allowed, sizes)]
        if depth > 1:
            moves += [(shape, d) for d in (depth - 1, depth + 1) if 1 <= d <= limits.max_warmup_depth]
        for n, d in moves:
            if (n, d) in seen:
                continue
            seen.add((n, d))
            layout = n.layout(topology)
            M = global_batch // n.micro_batch
            if (
                layout is None
                or MIN_MICRO_BATCHES[limits.schedule](len(layout)) > M
                or n.micro_batch < max(n.replicas)
                or (d != 1 and len(layout) * M > WARMUP_MAX_ACTIONS)
            ):
                continue
            costs = stage_costs(profile, topology, layout, n.micro_batch, memo)
            beat = (step or best).iteration_s * (1 - 1e-12)
            if not worth_simulating(profile, layout, costs, M, d, limits, capacity, beat):
                costed += 1  # screened out by memory or by its bound (O(S)): no simulation (O(S M))
                continue
            cand = evaluate(
                profile, topology, layout, n.micro_batch, M, limits, warmup_depth=d, costs=costs, cutoff=beat
            )
            costed += -(-len(layout) * M // CELLS_PER_NODE)  # a simulated candidate costs its schedule's size
            if cand.fits and cand.iteration_s < (step or best).iteration_s * (1 - 1e-12):
                step, step_shape, step_depth = cand, n, d
            if costed >= cost_budget:
                break
        if step is None:
            break
        best, shape, depth = step, step_shape, step_depth
        if costed >= cost_budget:
            break
    return best, costed


# a stage's own warm-up depths the descents step along (and the depth that runs every forward first)
DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def depth_steps(at: int, top: int) -> tuple[list[int], list[int]]:
    """(the depths below `at`, those above it) along DEPTHS up to `top`, the depth at which a stage
    runs every forward first (deeper changes nothing): a descent steps to the nearest of each."""
    ladder = sorted({d for d in DEPTHS if d < top} | {top})
    return [d for d in ladder if d < at], [d for d in ladder if d > at]


def stage_depths(
    start: Costed,
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    cost_budget: float,
) -> tuple[Costed, int]:
    """_own_depths from `start`, then its layout with each stage's warm-up fitted to its link
    (link_warmup.py), where that is faster still (GNMT-32 on 16 × 1 V100 at 10 Gbps, G 256, 8 stages
    under ZB-H1: 290.1 ms at ×3, 289.1 ms fitted; no depth descends there: each is a multiple of
    DAPPLE's S - s, and these are not)."""
    S, M = len(start.layout), start.num_micro_batches
    if S < 2 or S * M > WARMUP_MAX_ACTIONS:
        return start, 0
    best, costed = _own_depths(start, profile, topology, global_batch, limits, cost_budget)
    beat = best.iteration_s * (1 - 1e-12)
    family = replace(limits, schedule=start.schedule)
    linked = evaluate(profile, topology, start.layout, start.micro_batch_size, M, family, LINKED, cutoff=beat)
    costed += -(-S * M // CELLS_PER_NODE)
    return (linked if linked.fits and linked.iteration_s < beat else best), costed


def _own_depths(
    start: Costed,
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    cost_budget: float,
) -> tuple[Costed, int]:
    """A descent over the stages' own warm-up depths (schedule.deeper_warmup) from `start`, a 1F1B or
    ZB-H1 plan, its layout and micro-batches kept; (the best, the cost of the candidates costed, as
    descend counts them). One depth for every stage deepens the stages that need none with the one
    before a slow link (GNMT-32 on 2 × 8 V100, G 64: 42.2 ms at ×2, 41.5 ms with the eighth stage at
    ×8 and the fifteenth at ×1). A move takes one stage's depth a step along DEPTHS, or to where it
    runs every forward first; the stages whose links take longest first (a deeper warm-up hides a
    link), deeper before shallower, and the first move that is faster is taken: a budget that ends
    mid-scan has spent it on the likeliest moves."""
    S, M = len(start.layout), start.num_micro_batches  # (stage_depths checked their size)
    if start.warmup_depth == LINKED and "depths" not in start.extra:
        return start, 0  # (a warm-up fitted to the links is no depth to descend from)
    family = replace(limits, schedule=start.schedule)
    costs = stage_costs(profile, topology, start.layout, start.micro_batch_size)
    links = [costs[s].send_activation_s + costs[s + 1].send_gradient_s for s in range(S - 1)]
    order = sorted(range(S - 1), key=lambda s: (-links[s], s))
    depths = (*start.extra.get("depths", (start.warmup_depth,) * S)[:-1], 1)  # (the last's is never read)
    tried = {deeper_warmup(S, M, depths)}
    best, costed = start, 0

    def moves():
        for s in order:
            top = max(1, -(-M // (S - s)))
            lower, higher = depth_steps(depths[s], top)
            for d in (*higher[:1], top, *lower[-1:]):
                if d != depths[s]:
                    yield (*depths[:s], d, *depths[s + 1 :])

    while costed < cost_budget:
        for new in moves():
            warmup = deeper_warmup(S, M, new)
            if warmup in tried:
                continue
            tried.add(warmup)
            beat = best.iteration_s * (1 - 1e-12)
            if not worth_simulating(profile, start.layout, costs, M, new, family, start.capacity_bytes, beat):
                costed += 1  # screened out by memory or by its bound (O(S)): no simulation (O(S M))
                continue
            cand = evaluate(profile, topology, start.layout, start.micro_batch_size, M, family, new, costs, cutoff=beat)
            costed += -(-S * M // CELLS_PER_NODE)
            if cand.fits and cand.iteration_s < beat:
                best, depths = cand, new
                break
            if costed >= cost_budget:
                return best, costed
        else:
            break  # (no move is faster)
    return best, costed
