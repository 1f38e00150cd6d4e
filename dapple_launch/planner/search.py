"""The search: the fastest plan under the cost model that fits memory, found by branch and bound.

Decided jointly: the cuts between stages, each stage's replica count (uneven allowed), where the
replicas sit (contiguous device ranges in pipeline order; each stage either continues on the
next free device — DAPPLE's append-first — or starts on a fresh node, leaving the rest of the
current node idle — fresh-first), the micro-batch size and count, and the 1F1B warm-up depth.
DAPPLE's scatter-first (a stage's replicas spread over nodes) is left out because it is never
better under this cost model: its all-reduce and its transfers both cross the network, while a
contiguous range of the same size is at worst as slow on each.

Exactness: every complete candidate with DAPPLE's minimal warm-up is scored by the closed form of
`cost.evaluate`, and a branch is cut only when a valid lower bound on every completion is no
better than the best plan found (ties keep the first found: deterministic). A first pass cuts
branches that cannot win by more than `optimality_gap`; a second, exact pass closes the gap with
what is left of the node budget. When the budget ends first, the least lower bound of everything
left unexplored says how far from the optimum the answer can be: the plan states that proven gap.
Local search (polish.py) gives the branching a strong incumbent and polishes a budget-cut answer.
Then the best layouts are tried with deeper warm-ups (costed by the simulator), which can only
improve on the minimal-warm-up optimum.

Lower bound of a partial plan (stages placed so far, layers [i, L) left from device d on), with
T = (M - 1) beta + sum_s (t_s + 2 c_s) + X (cost.py): beta is at least the placed stages', links'
and windows' times, the remaining work spread over the remaining devices, and the least
bottleneck of any completion; the sum and the all-reduce tail X of the completion, and each of
its stages' end, are bounded by the tables of bounds.py; each part on its own.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .baselines import all_baselines, balanced_uniform, divisors
from .bounds import BoundInputs, least_bottleneck_stages, stage_starts, suffix_bound
from .build import MIN_MICRO_BATCHES, to_plan
from .cost import Costed, Limits, StageSpec, evaluate, speed_ratio
from .explain import human_bytes
from .plan import Plan
from .polish import descend, shape_of
from ..schedule.one_f_one_b import deeper_warmup


class NoFeasiblePlan(ValueError):
    pass


class _OutOfTime(Exception):
    pass


@dataclass
class SearchStats:
    nodes: int = 0
    leaves: int = 0
    seconds: float = 0.0
    proven_optimal: bool = True  # False when the node budget ended the search first
    proven_gap: float = 0.0  # the result is at most this fraction above the optimum (a proven bound)


def replica_choices(topology: Topology, limit: int) -> list[int]:
    """Replica counts a stage may take. Up to 16 devices: every count. Beyond: 1..devices_per_node
    and whole nodes (a documented restriction that keeps 64- and 512-device searches tractable)."""
    D, k = topology.num_devices, topology.devices_per_node
    if D <= 16:
        return list(range(1, min(D, limit) + 1))
    return sorted({*range(1, min(k, limit) + 1), *range(k, min(D, limit) + 1, k)})


class _Search:
    def __init__(self, profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits,
                 b: int, incumbent: float, node_budget: float = math.inf, gap: float = 0.0):
        self.p, self.t, self.G, self.limits, self.b = profile, topology, global_batch, limits, b
        self.M = global_batch // b
        self.L, self.D = profile.num_layers, topology.num_devices
        self.max_stages = min(self.L, self.D, limits.max_stages or self.L)
        self.pbs, self.speed = profile.batch_size, speed_ratio(profile, topology)
        self.best_t, self.best = incumbent, None
        self.gap = gap  # prune branches that cannot beat the incumbent by more than this fraction
        self.cap = topology.device_memory_bytes * (1 - limits.memory_headroom)
        self.R = replica_choices(topology, b)
        self.fast_bw = max(topology.intra_node_bandwidth, topology.inter_node_bandwidth)
        self.fast_lat = min(topology.intra_node_latency_s, topology.inter_node_latency_s)
        self.stats = SearchStats()
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
        self.bound_inputs = BoundInputs(profile, topology, b, self.M, tuple(self.R), self.speed, self.cap,
                                        limits.optimizer_factor, stage_time_cap=incumbent / self.M)
        self.bounds = suffix_bound(self.bound_inputs)  # tables [next layer, first free device]
        self.suffix = self.bounds.bottleneck

    def rest_work_per_sample(self, i: int) -> float:
        return (self.work[self.L] - self.work[i]) * self.speed / self.pbs

    def stage_time(self, a: int, z: int, r: int) -> tuple[float, float, float, float]:
        _, _, kept, params = self.p.span(a, z)
        n = math.ceil(self.b / r)
        f, bk = self.p.seconds(a, z, n)
        received = self.p.cut_bytes[a - 1] if a > 0 else 0.0
        return f * self.speed, bk * self.speed, (kept + received) * n / self.pbs, params

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
        self._extend(0, 0, None)
        return self.best

    def _seed_incumbent(self) -> None:
        """Cost the least-bottleneck cut (bounds.py) in full first: a strong incumbent prunes early."""
        stages = least_bottleneck_stages(self.bounds)
        if not stages or len(stages) > self.max_stages:
            return
        layout = [StageSpec(a, z, tuple(range(s, s + r))) for a, z, s, r in stages]
        if self.M < MIN_MICRO_BATCHES[self.limits.schedule](len(layout)):
            return
        cand = evaluate(self.p, self.t, tuple(layout), self.b, self.M, self.limits)
        if cand.fits:
            self.seed = cand  # a start for local search even when it does not beat the incumbent
            if cand.iteration_s < self.best_t * (1 - 1e-12):
                self.best_t, self.best = cand.iteration_s, cand

    def _lower_bound(self, i: int, d: int, placed: Prefix | None) -> float:
        """No completion of `placed` (stages so far; layers [i, L) left from device d on) is faster.
        T = (M - 1) beta + sum_s (t_s + 2 c_s) + X (cost.py): each part is bounded on its own."""
        left = self.D - d
        rest, pass_sum, pass_tail, stage_end, out_link = 0.0, 0.0, 0.0, 0.0, 0.0
        if i < self.L:
            if left == 0 or not math.isfinite(self.suffix[i, d]):
                return math.inf  # no device left, or no cut of the remaining layers fits in memory
            rest = self.rest_work_per_sample(i) * self.b / left
            pass_sum = max(float(self.bounds.pass_sum[i, d]), self.one_pass(i, left))
            pass_tail = float(self.bounds.pass_tail[i, d])
            stage_end = float(self.bounds.stage_end[i, d])
            if placed is not None:  # the transfer out of the last placed stage: its share over the fastest link
                total = self.p.cut_bytes[i - 1] * self.b / self.pbs
                out_link = self.fast_lat + total / len(placed.stages[-1][2]) / self.fast_bw
        if placed is None:
            placed = _EMPTY
        steady = (self.M - 1) * max(placed.beta, rest, out_link, float(self.suffix[i, d]) if left else 0.0)
        e0 = steady + placed.total + 2 * out_link + pass_sum
        # every stage still to come ends (its all-reduce included) after the forward path through the
        # placed ones (bounds.py: stage_end)
        ends = placed.forward + out_link + stage_end
        if self.limits.schedule != "1f1b":  # GPipe's stages end paced differently: only the first stage's tail holds
            return max(e0 + placed.ar0, ends)
        # X >= AR_s - (backward and gradient transfers before s), for placed s and, through
        # pass_tail, for the stages still to come (behind them: every placed stage and its link).
        return max(e0 + max(placed.tail, 0.0), ends, steady + placed.total + out_link + pass_tail - placed.back)

    def _extend(self, i: int, d: int, placed: Prefix | None) -> None:
        self.stats.nodes += 1
        if i == self.L:
            self._leaf(placed)
            return
        if placed is not None and (len(placed.stages) == self.max_stages or d >= self.D):
            return
        # Children are explored most promising first (least lower bound): good plans are found
        # early, so later siblings are cut against a better incumbent.
        children = sorted(self._children(i, d, placed), key=lambda c: c[0])
        for n, (lb, z, next_d, chain) in enumerate(children):
            if lb >= self.cutoff:
                break  # the rest are no better
            try:
                self._extend(z, next_d, chain)
            except _OutOfTime:
                # What is left unexplored here is bounded by the next sibling's bound (they are sorted);
                # deeper levels have recorded what is left inside this child.
                if n + 1 < len(children):
                    self.open_bound = min(self.open_bound, children[n + 1][0])
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
                    if params * self.limits.optimizer_factor + act > self.cap:
                        break  # more layers only need more memory
                    if (self.M - 1) * max(beta_placed, f + bk) + f + bk >= self.cutoff:
                        break  # a longer stage is only slower
                    chain = (placed or _EMPTY).then(i, z, devices, f, bk, link_in,
                                                    self.t.allreduce_s(devices, params),
                                                    self.limits.schedule == "1f1b")
                    self.scored += 1  # the budget counts scored candidates: the unit of work
                    if self.scored > self.node_budget:
                        self.open_bound = min(self.open_bound, self._lower_bound(i, d, placed))
                        raise _OutOfTime
                    lb = self._lower_bound(z, start + r, chain)
                    if lb < self.cutoff:
                        yield lb, z, start + r, chain

    def _leaf(self, placed: Prefix) -> None:
        self.stats.leaves += 1
        S = len(placed.stages)
        if self.M < MIN_MICRO_BATCHES[self.limits.schedule](S):
            return
        layout = tuple(StageSpec(a, z, devices) for a, z, devices in placed.stages)
        cand = evaluate(self.p, self.t, layout, self.b, self.M, self.limits)
        if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
            self.best_t, self.best = cand.iteration_s, cand


@dataclass(frozen=True, slots=True)
class Prefix:
    """The stages placed so far and what the bound needs of them, kept as running totals so a
    child's bound costs O(stages) (its windows), not O(stages²). Links are those between placed
    stages; the one out of the last stage is not known until the next stage is."""
    stages: tuple[tuple[int, int, tuple[int, ...]], ...]  # (first layer, stop, devices)
    times: tuple[float, ...]  # t = F + B per stage
    links: tuple[float, ...]  # transfer time between stage j and j + 1
    beta: float  # max of stage times, links and (1F1B) window means: the bottleneck so far
    total: float  # sum of t + 2 × link
    forward: float  # sum of F + link: when the first micro-batch reaches the next stage
    back: float  # sum of B + link: the backward path back down to stage 0
    tail: float  # max over stages of AR_s - (B + link before s): the all-reduce tail X so far
    ar0: float  # the first stage's all-reduce

    def then(self, a: int, z: int, devices: tuple[int, ...], f: float, bk: float, link_in: float, ar: float,
             windows: bool) -> Prefix:
        t = f + bk
        if not self.stages:
            return Prefix(((a, z, devices),), (t,), (), t, t, f, bk, ar, ar)
        beta = max(self.beta, t, link_in)
        if windows:  # 1F1B: the windows ending at the new stage (cost.py)
            window, n = t, 1
            for j in range(len(self.times) - 1, -1, -1):
                window += self.times[j] + 2 * (link_in if j == len(self.times) - 1 else self.links[j])
                n += 1
                beta = max(beta, window / n)
        behind = self.back + link_in
        return Prefix(self.stages + ((a, z, devices),), self.times + (t,), self.links + (link_in,), beta,
                      self.total + 2 * link_in + t, self.forward + link_in + f, behind + bk,
                      max(self.tail, ar - behind), self.ar0)


_EMPTY = Prefix((), (), (), 0.0, 0.0, 0.0, 0.0, -math.inf, 0.0)


def micro_batch_sizes(global_batch: int, limits: Limits) -> list[int]:
    if limits.micro_batch_size:
        if global_batch % limits.micro_batch_size:
            raise ValueError(f"strategy.micro_batch_size={limits.micro_batch_size} does not divide "
                             f"global_batch_size={global_batch}; pick a divisor of {global_batch}")
        return [limits.micro_batch_size]
    return sorted(divisors(global_batch), reverse=True)


def search(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits,
           keep: int = 4) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """(best, runners-up, baselines, stats)."""
    t0 = time.perf_counter()
    baselines = all_baselines(profile, topology, global_batch, limits)
    start = balanced_uniform(profile, topology, global_batch, limits)
    found = [c for c in [*baselines.values(), start] if c is not None]
    stats = SearchStats()
    sizes = micro_batch_sizes(global_batch, limits)
    # One search per micro-batch size, most promising first (by its least bottleneck). Each one's
    # least-bottleneck placement is costed up front, then the best few starts are improved by
    # local search: a strong incumbent before any branching.
    incumbent = min((c.iteration_s for c in found), default=math.inf)  # only stages that could beat it are bounded
    searches = [_Search(profile, topology, global_batch, limits, b, incumbent * (1 + 1e-9), math.inf) for b in sizes]
    searches.sort(key=lambda x: (x.root_bound(), -x.b))
    for x in searches:
        x._seed_incumbent()
        if x.seed is not None:
            found.append(x.seed)
    found += _polished(found, profile, topology, global_batch, limits, sizes, stats)
    incumbent = min((c.iteration_s for c in found), default=math.inf)
    # Pass 1 prunes what cannot beat the incumbent by more than the optimality gap, every size
    # with an equal share of half the budget: fast, and provably within the gap if all finish.
    # Pass 2 closes the gap exactly with what is left (small instances always finish: optimum).
    share = max(1, limits.search_nodes // (2 * max(1, len(searches))))
    per_b, bounds = _sweep(searches, incumbent, limits.optimality_gap, share, limits.search_nodes, stats)
    best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
    if best is not None and _proven_gap(best.iteration_s, bounds) > 0:
        exact, exact_bounds = _sweep(searches, best.iteration_s, 0.0, math.inf, limits.search_nodes, stats)
        per_b += exact
        bounds = {b: max(v, exact_bounds.get(b, v)) for b, v in bounds.items()}  # each is a valid bound
        best = min([*found, *per_b], key=lambda c: c.iteration_s)
        if _proven_gap(best.iteration_s, bounds) > 0:  # the budget ended first: polish what it found
            per_b += _polished([best], profile, topology, global_batch, limits, sizes, stats, top=1)
            best = min([*found, *per_b], key=lambda c: c.iteration_s)
    stats.proven_gap = _proven_gap(best.iteration_s, bounds) if best is not None else 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    deeper = _deeper_warmups(found + per_b, profile, topology, limits)
    candidates = sorted(found + per_b + deeper, key=lambda c: (c.iteration_s, len(c.layout), c.summary()))
    unique, seen = [], set()
    for c in candidates:
        if c.summary() not in seen:
            seen.add(c.summary())
            unique.append(c)
    stats.seconds = time.perf_counter() - t0
    return (unique[0] if unique else None), unique[1:keep + 1], baselines, stats


def _polished(starts: list[Costed], profile: ModelProfile, topology: Topology, global_batch: int,
              limits: Limits, sizes: list[int], stats: SearchStats, top: int = 3) -> list[Costed]:
    """Local search (polish.py) from the `top` best distinct starts in the search's own space."""
    allowed = replica_choices(topology, global_batch)
    out, seen = [], set()
    for c in sorted(starts, key=lambda c: (c.iteration_s, c.summary())):
        if len(seen) == top:
            break
        shape = shape_of(c, topology)
        if shape in seen or shape.layout(topology) != c.layout or any(r not in allowed for r in shape.replicas):
            continue  # not a plan of the search's space (a baseline placed otherwise)
        seen.add(shape)
        better, costed = descend(c, profile, topology, global_batch, limits, allowed, sizes)
        stats.nodes += costed
        if better is not c:
            out.append(better)
    return out


# A deeper warm-up is costed by the simulator (cost.evaluate): bounded work per candidate.
WARMUP_LAYOUTS, WARMUP_MAX_ACTIONS = 3, 8192


def _deeper_warmups(found: list[Costed], profile: ModelProfile, topology: Topology, limits: Limits) -> list[Costed]:
    """The best few layouts again with deeper 1F1B warm-ups (2 .. max_warmup_depth times DAPPLE's
    in-flight count, while memory allows): where a slow link sits on the steady state's dependency
    cycle, running further ahead hides it, as GPipe does, for a bounded multiple of the memory.
    The proof of optimality covers the minimal warm-up; this can only improve on it."""
    if limits.schedule != "1f1b" or limits.max_warmup_depth < 2:
        return []
    out, seen = [], set()
    for c in sorted(found, key=lambda c: (c.iteration_s, c.summary())):
        key = (c.layout, c.micro_batch_size)
        if key in seen or len(c.layout) < 2:
            continue
        seen.add(key)
        if len(seen) > WARMUP_LAYOUTS:
            break
        S, M = len(c.layout), c.num_micro_batches
        if S * M > WARMUP_MAX_ACTIONS or M < S:
            continue
        best, previous = c.iteration_s if c.schedule == "1f1b" else math.inf, deeper_warmup(S, M, 1)
        for depth in range(2, limits.max_warmup_depth + 1):
            warmup = deeper_warmup(S, M, depth)
            if warmup == previous:
                break  # every stage already runs all its forwards first
            previous = warmup
            cand = evaluate(profile, topology, c.layout, c.micro_batch_size, M, limits, warmup_depth=depth)
            if not cand.fits or cand.iteration_s >= best * (1 - 1e-9):
                break  # more depth needs more memory, and has stopped paying
            best = cand.iteration_s
            out.append(cand)
    return out


def _proven_gap(best: float, bounds: dict[int, float]) -> float:
    """How far above the optimum `best` can be: 1 - (least lower bound of anything not yet ruled
    out, over every micro-batch size) / best."""
    lowest = min(bounds.values(), default=math.inf)
    return 0.0 if lowest >= best * (1 - 1e-9) else 1 - lowest / best


def _sweep(searches: list[_Search], incumbent: float, gap: float, per_search: float, budget: int,
           stats: SearchStats) -> tuple[list[Costed], dict[int, float]]:
    """Branch and bound over each micro-batch size in turn; (best per size, bound per size started):
    no plan of that size left unexplored or pruned is faster than the bound. A finished search
    pruned only what its final cutoff (the incumbent less the gap) rules out; one the budget ended
    also left its open branches. A size never started keeps its root bound.
    A node budget, not a clock: the same inputs give the same plan on any machine."""
    per_b, bounds = [], {}
    for s in searches:
        left = budget - stats.nodes
        if left <= 0:
            bounds[s.b] = s.root_bound()
            continue
        s.restart(incumbent * (1 + 1e-9), min(left, per_search), gap)
        if s.root_bound() >= s.cutoff:
            bounds[s.b] = s.root_bound()
            continue
        try:
            best = s.run()
            bounds[s.b] = s.cutoff
        except _OutOfTime:
            best, bounds[s.b] = s.best, min(s.open_bound, s.cutoff)
        stats.nodes += s.scored
        stats.leaves += s.stats.leaves
        if best is not None:
            per_b.append(best)
            incumbent = min(incumbent, best.iteration_s)
    return per_b, bounds


def smallest_memory_need(profile: ModelProfile, topology: Topology, limits: Limits) -> tuple[float, str]:
    """Per device, the least memory any layout needs (fully pipelined, one sample per micro-batch)."""
    L, D = profile.num_layers, topology.num_devices
    S = min(L, D)
    from .baselines import balanced_boundaries
    cuts = balanced_boundaries(profile, S)
    layout = tuple(StageSpec(a, z, (s,)) for s, (a, z) in enumerate(zip([0, *cuts], [*cuts, L])))
    c = evaluate(profile, topology, layout, 1, max(S, 1), limits)
    return c.peak_memory_bytes, c.summary()


def plan(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Plan:
    if global_batch < topology.num_devices:
        raise ValueError(
            f"global_batch_size={global_batch} is smaller than the {topology.num_devices} devices of {topology.name} "
            f"that must share it (each needs at least one sample per iteration); raise global_batch_size to "
            f">= {topology.num_devices} or use a smaller cluster")
    best, runners_up, baselines, stats = search(profile, topology, global_batch, limits)
    if best is None:
        need, layout = smallest_memory_need(profile, topology, limits)
        raise NoFeasiblePlan(
            f"no plan fits: even fully pipelined ({layout}) a device needs {human_bytes(need)} but "
            f"{human_bytes(topology.device_memory_bytes * (1 - limits.memory_headroom))} is usable on "
            f"{topology.name} ({human_bytes(topology.device_memory_bytes)} less {limits.memory_headroom:.0%} headroom). "
            f"To fit: more devices (cluster.nodes > {topology.nodes}), a smaller micro-batch "
            f"(strategy.micro_batch_size=1), a lower optimizer_factor (now {limits.optimizer_factor}: e.g. SGD), or "
            f"activation recomputation")
    for name, c in baselines.items():
        if c is not None:
            c.extra["note"] = name
    dp = baselines.get("data parallel")
    if stats.proven_optimal:
        how = f"optimal under the cost model ({stats.nodes} candidates scored)"
    else:
        how = (f"within {stats.proven_gap:.1%} of the optimum under the cost model, proven; the budget of "
               f"{limits.search_nodes} scored candidates ended the search first (strategy.search_nodes raises it)")
    if best.warmup_depth > 1:  # the proof is over DAPPLE's minimal warm-up; a deeper one beat its answer
        how = (f"auto: a ×{best.warmup_depth} 1F1B warm-up (costed by the simulator) beats the best plan with "
               f"DAPPLE's minimal warm-up, which is {how}")
    else:
        how = "auto: " + how
    return to_plan(best, profile, topology, global_batch, how, runners_up,
                   data_parallel_s=dp.iteration_s if dp else None)
