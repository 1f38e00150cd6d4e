"""Branch and bound over layouts for one micro-batch size: the cuts, replica counts and placement.

Stages are placed in pipeline order as contiguous device ranges: each stage either continues on
the next free device (DAPPLE's append-first) or starts on a fresh node, leaving the rest of the
current node idle (fresh-first). DAPPLE's scatter-first (a stage's replicas spread over nodes)
is left out because it is never better under this cost model: its all-reduce and its transfers
both cross the network, while a contiguous range of the same size is at worst as slow on each.

Every complete candidate is scored in full (`cost.evaluate`), and a branch is cut only when a
valid lower bound on every completion is no better than the best plan found (ties keep the first
found: deterministic). Each step dives from an open node to a leaf along the least-bound child;
the next open node is the deepest dive's best sibling, alternating, when the gap is to be closed,
with the open node of least bound (`_explore`). When the node budget ends, the least bound of
everything left unexplored is kept (`open_bound`): the caller states that gap.

Lower bound of a partial plan (stages placed so far, layers [i, L) left from device d on): for
1F1B the bound of warmup.py's module doc with DAPPLE's S - s micro-batches in flight (the deeper
warm-up pass reuses this tree with more), for GPipe its closed form (the simulator's time exactly),
each part over the placed stages and, through the tables of bounds.py, every completion. Leaves
are costed by the simulator (cost.evaluate): the bounds are what the tests check below it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .bounds import BoundInputs, least_bottleneck_stages, stage_starts, suffix_bound
from .cost import Costed, StageSpec, evaluate, speed_ratio
from .limits import Limits
from .shapes import MIN_MICRO_BATCHES

# A simulated candidate (every leaf: cost.evaluate walks its S M compute actions) counts as
# S M / CELLS_PER_NODE scored candidates of the node budget, about what its time is worth in
# branching (measured: ~0.7 µs per cell simulated, ~12 µs per candidate scored).
CELLS_PER_NODE = 16


class _OutOfTime(Exception):
    pass


@dataclass
class SearchStats:
    nodes: int = 0
    leaves: int = 0
    seconds: float = 0.0
    proven_optimal: bool = True  # False when the node budget ended the search first
    proven_gap: float = 0.0  # the result is at most this fraction above the optimum (a proven bound)
    gap_without_zero_bubble: float | None = None  # the same over 1F1B plans alone, when ZB-H1 was searched too
    gap_without_chunked: float | None = None  # the same leaving interleaved 1F1B, ZB-V and Chimera out, when searched


def replica_choices(topology: Topology, limit: int) -> list[int]:
    """Replica counts a stage may take. Up to 16 devices: every count. Beyond: 1..devices_per_node
    and whole nodes (a documented restriction that keeps 64- and 512-device searches tractable)."""
    D, k = topology.num_devices, topology.devices_per_node
    if D <= 16:
        return list(range(1, min(D, limit) + 1))
    return sorted({*range(1, min(k, limit) + 1), *range(k, min(D, limit) + 1, k)})


class BranchAndBound:
    def __init__(
        self,
        profile: ModelProfile,
        topology: Topology,
        global_batch: int,
        limits: Limits,
        b: int,
        incumbent: float,
        node_budget: float = math.inf,
        gap: float = 0.0,
        read_under_cap: bool = False,
    ):
        """`read_under_cap`: every search of these tables (this one's passes, ZB-H1's over them) runs
        under an incumbent no slower than `incumbent` (bounds.BoundInputs)."""
        self.p, self.t, self.G, self.limits, self.b = profile, topology, global_batch, limits, b
        self.M = global_batch // b
        self.L, self.D = profile.num_layers, topology.num_devices
        # a schedule needs enough micro-batches for its stages (1F1B: M >= S): no branch past the
        # most stages M micro-batches can run has a leaf
        most = min(self.L, self.D, limits.max_stages or self.L)
        self.max_stages = max(
            s for s in range(1, most + 1) if MIN_MICRO_BATCHES[limits.schedule](s) <= self.M or s == 1
        )
        self.pbs, self.speed = profile.batch_size, speed_ratio(profile, topology)
        self.best_t, self.best = incumbent, None
        self.gap = gap  # prune branches that cannot beat the incumbent by more than this fraction
        self.cap = topology.device_memory_bytes * (1 - limits.memory_headroom)
        # with recompute=auto or selective a micro-batch may keep less than its whole activations (a
        # recomputed segment and the rest never live at once): parameters bound memory. Under full it
        # keeps its input and holds every layer's saves again in its backward: no less than its whole.
        shrink = limits.recompute in ("auto", "selective")
        self.keeps_activations = 0.0 if shrink else 1.0
        self.R = replica_choices(topology, b)
        self.fast_bw, self.fast_lat = topology.fastest_p2p_link(False)
        self.stats = SearchStats()
        # the most micro-batches a 1F1B stage s keeps in flight, in units of DAPPLE's S - s (warmup.py)
        self.in_flight_depth = 1
        self.node_budget = node_budget
        self.scored = 0
        self.open_bound = math.inf  # least lower bound of what the budget left unexplored
        self._root_bound = None
        self.seed = None  # the least-bottleneck placement, costed (see _seed_incumbent)
        pre, fixed = [0.0], [0.0]
        for layer in profile.layers:
            call = layer.forward_fixed_s + layer.backward_fixed_s
            pre.append(pre[-1] + layer.forward_s + layer.backward_s - call)
            fixed.append(fixed[-1] + call)
        self.work = pre  # prefix sums of forward+backward per profile batch, the part that scales with samples
        self.fixed = fixed  # and of the part each call costs whatever its batch
        self.bound_inputs = BoundInputs(
            profile,
            topology,
            b,
            self.M,
            tuple(self.R),
            self.speed,
            self.cap,
            limits.optimizer_factor,
            stage_time_cap=incumbent / self.M,
            activations_may_shrink=shrink,
            recompute=limits.recompute,
            stage_limit=self.max_stages,
            read_under_cap=read_under_cap,
        )
        self.bounds = suffix_bound(self.bound_inputs)  # tables [next layer, first free device]
        self.suffix = self.bounds.bottleneck
        self.tables_under = incumbent  # (they leave out stages too slow to beat it)

    def links_bound(self, family: str) -> float:
        """No plan of this size under `family` ("1f1b" at any warm-up, "zb_h1") is faster: the root
        of the tables with each stage's outgoing link (bounds.py: links), for the proof; at most the
        incumbent they were built under (a plan they leave out cannot beat it)."""
        assert self.bounds.links is not None  # (suffix_bound builds them)
        reach, compute = self.bounds.links
        if self.bounds.reach_room is not None:
            reach = self.bounds.reach_room
        return min(float((reach if family == "1f1b" else compute)[0, 0]), self.tables_under)

    def with_links(self, bounds: dict[int, float], family: str) -> None:
        """Raise bounds[this size], where the proposer has one, to links_bound(family)."""
        if self.b in bounds:
            bounds[self.b] = max(bounds[self.b], self.links_bound(family))

    def rest_work_per_sample(self, i: int) -> float:
        return (self.work[self.L] - self.work[i]) * self.speed / self.pbs

    def stage_time(self, a: int, z: int, r: int) -> tuple[float, float, float, float]:
        params = self.p.span(a, z)[3]
        n = math.ceil(self.b / r)
        f, bk = self.p.seconds(a, z, n)
        return f * self.speed, bk * self.speed, self.p.kept_bytes(a, z, n), params

    def restart(self, incumbent: float, node_budget: float, gap: float) -> None:
        self.best_t, self.best, self.node_budget, self.gap = incumbent, None, node_budget, gap
        self.scored, self.stats, self.open_bound = 0, SearchStats(), math.inf

    def one_pass(self, i: int, left: int) -> float:
        """Least time for one micro-batch to pass layers [i, L): every sample crosses every layer,
        and a replica of any stage takes at least ceil(b / most replicas a stage can have) samples."""
        widest = min(self.b, left, max(self.R))
        fixed = (self.fixed[self.L] - self.fixed[i]) * self.speed
        return self.rest_work_per_sample(i) * math.ceil(self.b / widest) + fixed

    def root_bound(self) -> float:
        """No plan with this micro-batch size is faster."""
        if self._root_bound is None:
            self._root_bound = self._lower_bound(0, 0, None)
        return self._root_bound

    @property
    def cutoff(self) -> float:
        """A branch whose lower bound reaches this is cut: exact with gap 0, else every cut branch is
        provably at best (1 - gap) × the incumbent, so the result is within `gap` of the optimum."""
        return self.best_t * (1 - max(self.gap, 1e-12))

    def run(self) -> Costed | None:
        self._seed_incumbent()
        self._explore()
        return self.best

    def _seed_incumbent(self) -> None:
        """Cost the least-bottleneck cut (bounds.py) in full first: a strong incumbent prunes early."""
        stages = least_bottleneck_stages(self.bounds)
        if not stages or len(stages) > self.max_stages:
            return
        layout = [StageSpec(a, z, tuple(range(s, s + r))) for a, z, s, r in stages]
        if MIN_MICRO_BATCHES[self.limits.schedule](len(layout)) > self.M:
            return
        cand = evaluate(self.p, self.t, tuple(layout), self.b, self.M, self.limits)
        if cand.fits:
            self.seed = cand  # a start for local search even when it does not beat the incumbent
            if cand.iteration_s < self.best_t * (1 - 1e-12):
                self.best_t, self.best = cand.iteration_s, cand

    def _lower_bound(self, i: int, d: int, placed: Prefix | None) -> float:
        """No completion of `placed` (stages so far; layers [i, L) left from device d on) is faster."""
        if self.limits.schedule == "1f1b":
            return self._warmup_bound(i, d, placed)
        return self._gpipe_bound(i, d, placed)

    def _gpipe_bound(self, i: int, d: int, placed: Prefix | None) -> float:
        """GPipe's closed form (the simulator's time exactly: tests), each part bounded on its own:
        T = (M - 1) beta + sum_s (t_s + 2 c_s) + the first stage's all-reduce, and every later stage
        ends after the forward path through the placed ones (bounds.py: stage_end)."""
        left = self.D - d
        rest, pass_sum, stage_end, out_link = 0.0, 0.0, 0.0, 0.0
        if i < self.L:
            if left == 0 or not math.isfinite(self.suffix[i, d]):
                return math.inf  # no device left, or no cut of the remaining layers fits in memory
            rest = self.rest_work_per_sample(i) * self.b / left
            pass_sum = max(float(self.bounds.pass_sum[i, d]), self.one_pass(i, left))
            stage_end = float(self.bounds.stage_end[i, d])
            if placed is not None:  # the transfer out of the last placed stage: its share over the fastest link
                total = self.p.cut_bytes[i - 1] * self.b / self.pbs
                out_link = self.fast_lat + total / len(placed.stages[-1][2]) / self.fast_bw
        if placed is None:
            placed = _EMPTY
        steady = (self.M - 1) * max(placed.beta, rest, out_link, float(self.suffix[i, d]) if left else 0.0)
        return max(steady + placed.total + 2 * out_link + pass_sum + placed.ar0, placed.forward + out_link + stage_end)

    def _warmup_bound(self, i: int, d: int, placed: Prefix | None) -> float:
        """1F1B with at most `in_flight_depth` times DAPPLE's micro-batches in flight per stage
        (warmup.py's module doc): the work, links and round trips of the placed stages, the tables
        of bounds.py for the stages still to come, and the steady cycle through the last stage."""
        placed = placed or _EMPTY
        if i == self.L:
            return max(placed.finish, self._cycles(placed, 0.0, len(placed.stages)))
        left = self.D - d
        if left == 0 or not math.isfinite(self.suffix[i, d]):
            return math.inf  # no device left, or no cut of the remaining layers fits in memory
        M, tables = self.M, self.bounds
        out_link, behind = 0.0, 0.0
        if placed.stages:  # the transfer out of the last placed stage: its share over the fastest link
            total = self.p.cut_bytes[i - 1] * self.b / self.pbs
            out_link = self.fast_lat + total / len(placed.stages[-1][2]) / self.fast_bw
            behind = out_link + placed.last_backward + placed.down  # a later stage's gradient path home
        reach = placed.forward + out_link  # when the first micro-batch reaches the next stage
        rest = self.rest_work_per_sample(i) * self.b / left  # some later stage computes at least this
        most_stages = len(placed.stages) + min(left, self.max_stages - len(placed.stages), self.L - i)
        return max(
            placed.finish,
            reach + M * max(rest, float(self.suffix[i, d])),
            reach + float(tables.reach_end[i, d]),
            reach + float(tables.round_end[i, d]) + behind,
            placed.forward + M * out_link + behind if placed.stages else 0.0,
            self._cycles(placed, 2 * out_link + float(tables.pass_sum[i, d]), most_stages),
        )

    def _cycles(self, placed: Prefix, beyond: float, most_stages: int) -> float:
        """The steady-cycle bound (warmup.py's module doc) of each placed stage: its round trip R_s is
        at least the placed stages after it, their links, and `beyond` (the least pass through the
        rest), and it keeps at most min(M, in_flight_depth × (S - s)) micro-batches in flight
        (S <= most_stages)."""
        M, depth, bound = self.M, self.in_flight_depth, 0.0
        trip = beyond
        for s in range(len(placed.stages) - 1, -1, -1):
            reach, f, bk, down = placed.starts[s]
            k = min(M, depth * (most_stages - s))
            cycles = (M - 1) // k + 1
            bound = max(bound, reach + cycles * (f + trip + bk) + (M - 1 - (cycles - 1) * k) * bk + down)
            if s:
                trip += f + bk + 2 * placed.links[s - 1]
        return bound

    def _explore(self) -> None:
        """Dives: from an open node, follow the best child down to a leaf, leaving the other
        children open. Which open node next: the best sibling of the deepest dive (depth first),
        which finds good plans soonest, so later branches are cut against a better incumbent; and,
        with a gap to close (`gap` 0), every other time the open node of least bound (best first),
        which raises the bound on everything left unexplored as fast as the budget allows, so a
        budget-cut search proves the smallest gap it can. Ties go to the node opened first:
        deterministic."""
        best_first = self.gap == 0
        root: tuple = (self.root_bound(), 0, 0, 0, None)  # (bound, opened, layer, devices used, placed prefix)
        deepest: list[tuple] = [root]  # the same open nodes, as a stack and as a heap
        least: list[tuple] = [root]
        taken: set[int] = set()
        opened, pops = 1, 0
        try:
            while True:
                if best_first and pops % 2:
                    while least and least[0][1] in taken:
                        heapq.heappop(least)
                    node = heapq.heappop(least) if least else None
                else:
                    while deepest and deepest[-1][1] in taken:
                        deepest.pop()
                    node = deepest.pop() if deepest else None
                if node is None:
                    return
                pops += 1
                taken.add(node[1])
                lb, _, i, d, placed = node
                while lb < self.cutoff:  # one dive
                    self.stats.nodes += 1
                    if i == self.L:
                        assert placed is not None  # (every layer placed: a prefix holds them)
                        self._leaf(placed)
                        break
                    if placed is not None and (len(placed.stages) == self.max_stages or d >= self.D):
                        break
                    children = sorted(self._children(i, d, placed), key=lambda c: c[0])
                    if not children:
                        break
                    for child_lb, z, next_d, chain in reversed(children[1:]):
                        if child_lb < self.cutoff:
                            entry = (child_lb, opened, z, next_d, chain)
                            deepest.append(entry)
                            if best_first:
                                heapq.heappush(least, entry)
                            opened += 1
                    lb, i, d, placed = children[0]
        except _OutOfTime:
            # the node being expanded recorded its own bound; the open ones are bounded by the least
            left = [n[0] for n in deepest if n[1] not in taken]
            if left:
                self.open_bound = min(self.open_bound, min(left))
            raise

    def _children(self, i: int, d: int, placed: Prefix | None):
        """(lower bound, next layer, next free device, placed stages) of every stage that may come next."""
        k = self.t.devices_per_node
        starts = stage_starts(d, k, self.D)
        count = len(placed.stages) if placed is not None else 0
        for start in starts:
            left = self.D - start
            for r in self.R:
                if r > left:
                    break
                devices = tuple(range(start, start + r))
                link_in = 0.0
                if placed is not None:
                    prev = placed.stages[-1][2]
                    total = self.p.cut_bytes[i - 1] * self.b / self.pbs
                    bw, lat = self.t.p2p(prev, devices)
                    link_in = lat + max(total / len(prev), total / r) / bw
                    if (self.M - 1) * link_in >= self.cutoff:
                        continue
                beta_placed = max(placed.beta, link_in) if placed is not None else 0.0
                for z in range(i + 1, self.L + 1):
                    if z < self.L and (count + 1 == self.max_stages or start + r >= self.D):
                        continue  # no stage or device left for the rest
                    f, bk, act, params = self.stage_time(i, z, r)
                    if params * self.limits.optimizer_factor + act * self.keeps_activations > self.cap:
                        break  # more layers only need more memory
                    if (self.M - 1) * max(beta_placed, f + bk) + f + bk >= self.cutoff:
                        break  # a longer stage is only slower
                    # what is left of the stage's all-reduce after its last B or W, whose buckets overlap
                    # it (planner/allreduce.py): at least one all-reduce of every byte less the backward
                    exposed = max(0.0, self.t.allreduce_s(devices, params) - bk)
                    chain = (placed or _EMPTY).then(i, z, devices, f, bk, link_in, exposed, self.M)
                    self.scored += 1  # the budget counts scored candidates: the unit of work
                    if self.scored > self.node_budget:
                        self.open_bound = min(self.open_bound, self._lower_bound(i, d, placed))
                        raise _OutOfTime
                    lb = self._lower_bound(z, start + r, chain)
                    if lb < self.cutoff:
                        yield lb, z, start + r, chain

    def _spend(self, cost: int, bound: float | Callable[[], float]) -> None:
        """Charge a simulation to the node budget; past it, leave the candidate open with its bound
        (a number, or a function computing it: only a budget running out reads it)."""
        self.scored += cost
        if self.scored > self.node_budget:
            self.open_bound = min(self.open_bound, bound() if callable(bound) else bound)
            raise _OutOfTime

    def _leaf(self, placed: Prefix) -> None:
        self.stats.leaves += 1
        S = len(placed.stages)
        if MIN_MICRO_BATCHES[self.limits.schedule](S) > self.M:
            return
        self._spend(
            math.ceil(S * self.M / CELLS_PER_NODE) - 1,  # (its node counted one already)
            lambda: self._lower_bound(self.L, self.D, placed),
        )
        layout = tuple(StageSpec(a, z, devices) for a, z, devices in placed.stages)
        cand = evaluate(self.p, self.t, layout, self.b, self.M, self.limits, cutoff=self.best_t * (1 - 1e-12))
        if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
            self.best_t, self.best = cand.iteration_s, cand


def exact_sweep(
    passes: list[BranchAndBound], incumbent: float, budget: int, nothing_to_search=lambda x: False
) -> tuple[list[Costed], dict[int, float], int]:
    """An exact pass (gap 0) over each micro-batch size, least root bound first, sharing `budget`:
    (best found per size, a lower bound per size on every plan of the pass, candidates scored). A size
    the budget does not reach keeps its root bound; one with nothing to search bounds nothing (inf)."""
    found, bounds, used = [], {}, 0
    for x in sorted(passes, key=lambda x: (x.root_bound(), -x.b)):
        if nothing_to_search(x):
            bounds[x.b] = math.inf
            continue
        left = budget - used
        if left <= 0:
            bounds[x.b] = x.root_bound()
            continue
        x.restart(incumbent * (1 + 1e-9), left, 0.0)
        if x.root_bound() >= x.cutoff:
            bounds[x.b] = x.root_bound()
            continue
        try:
            best = x.run()
        except _OutOfTime:
            best = x.best
        bounds[x.b] = min(x.open_bound, x.cutoff)
        used += x.scored
        if best is not None:
            found.append(best)
            incumbent = min(incumbent, best.iteration_s)
    return found, bounds, used


class Prefix(NamedTuple):
    """The stages placed so far and what the bounds need of them, kept as running totals so a
    child's bound costs O(stages) (its steady cycles), not O(stages²). A named tuple: the search builds
    one per child, and a tuple is built several times faster than a frozen dataclass. Links are
    those between placed stages; the one out of the last stage is not known until the next stage is."""

    stages: tuple[tuple[int, int, tuple[int, ...]], ...]  # (first layer, stop, devices)
    links: tuple[float, ...]  # transfer time between stage j and j + 1
    beta: float  # max of stage times and links: the bottleneck so far
    total: float  # sum of t + 2 × link
    forward: float  # sum of F + link: when the first micro-batch reaches the next stage
    ar0: float  # the first stage's all-reduce (GPipe's closed form ends with it)
    # For any 1F1B warm-up (warmup.py): stage s starts no earlier than a_s = sum_{j<s}(F_j + link_j),
    # computes M t_s, and after its last backward the gradient still goes down to stage 0 and each
    # stage j <= s all-reduces: down_s = max(AR_s, link + B_{s-1} + down_{s-1}).
    last_backward: float  # B of the last placed stage
    down: float  # down_s of the last placed stage
    finish: float  # max over placed stages (and links) of the least end time that implies
    starts: tuple[tuple[float, float, float, float], ...]  # per stage (a_s, F_s, B_s, down_s)
    # Any schedule, a split backward's included (planner/zero_bubble_search.py): stage s starts no earlier than
    # a_s, computes M t_s and all-reduces after its last weight gradient: max over s of a_s + M t_s + AR_s.
    compute_end: float = 0.0

    def then(
        self, a: int, z: int, devices: tuple[int, ...], f: float, bk: float, link_in: float, ar: float, M: int
    ) -> Prefix:
        t = f + bk
        if not self.stages:
            return Prefix(((a, z, devices),), (), t, t, f, ar, bk, ar, M * t + ar, ((0.0, f, bk, ar),), M * t + ar)
        down = max(ar, link_in + self.last_backward + self.down)
        # the new stage; and the link before it, which carries M activations one way and M gradients
        # the other, after the first micro-batch reached it and before the last one's round trip
        finish = max(
            self.finish,
            self.forward + link_in + M * t + down,
            self.forward + (M + 1) * link_in + t + self.last_backward + self.down,
        )
        return Prefix(
            self.stages + ((a, z, devices),),
            self.links + (link_in,),
            max(self.beta, t, link_in),
            self.total + 2 * link_in + t,
            self.forward + link_in + f,
            self.ar0,
            bk,
            down,
            finish,
            self.starts + ((self.forward + link_in, f, bk, down),),
            max(self.compute_end, self.forward + link_in + M * t + ar),
        )


_EMPTY = Prefix((), (), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ())
