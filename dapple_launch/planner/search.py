"""The search: the fastest plan under the cost model that fits memory, found by branch and bound.

Decided jointly: the cuts between stages, each stage's replica count (uneven allowed), where the
replicas sit (contiguous device ranges in pipeline order; each stage either continues on the
next free device — DAPPLE's append-first — or starts on a fresh node, leaving the rest of the
current node idle — fresh-first), and the micro-batch size and count. The schedule's warm-up
depth is the early-backward minimum (S - s - 1): in this cost model sends never block, so a
deeper warm-up only costs memory.

Exactness: every complete candidate is scored by the same closed form as `cost.evaluate`, and a
branch is cut only when a valid lower bound on every completion is no better than the best plan
found, so the result is the optimum over the space (ties keep the first found: deterministic).
A first pass cuts branches that cannot win by more than `optimality_gap` (its result is provably
within that gap); a second, exact pass closes the gap in what is left of the node budget. The plan
says which was proven: optimal, within the gap, or neither (budget exhausted).
Lower bound of a partial plan (stages 0..k placed, layers [i, L) and devices [d, D) left):
  bottleneck >= the placed stages' and links' times, the remaining compute spread perfectly
  over the remaining devices, and the least bottleneck of any cut of the remaining layers onto
  the remaining devices (bounds.py, a dynamic programme per micro-batch size); E_0 >= placed sum + remaining compute / remaining devices;
  T >= E_0 + (M - 1) * bottleneck, and T >= that - C_s + AR_s for each placed stage s.
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


class NoFeasiblePlan(ValueError):
    pass


class _OutOfTime(Exception):
    pass


@dataclass
class SearchStats:
    nodes: int = 0
    leaves: int = 0
    seconds: float = 0.0
    proven_optimal: bool = True  # False when the time budget ended the search first
    proven_gap: float | None = 0.0  # the result is within this fraction of the optimum (None: unknown)


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
        pre = [0.0]
        for layer in profile.layers:
            pre.append(pre[-1] + layer.forward_s + layer.backward_s)
        self.work = pre  # per profile batch, prefix sums of forward+backward
        self.bound_inputs = BoundInputs(profile, topology, b, tuple(self.R), self.speed, self.cap,
                                        limits.optimizer_factor)
        self.suffix, self.suffix_choice = suffix_bound(self.bound_inputs)  # [next layer, first free device]

    def rest_work_per_sample(self, i: int) -> float:
        return (self.work[self.L] - self.work[i]) * self.speed / self.pbs

    def stage_time(self, a: int, z: int, r: int) -> tuple[float, float, float, float]:
        f, bk, kept, params = self.p.span(a, z)
        n = math.ceil(self.b / r)
        s = n / self.pbs * self.speed
        received = self.p.cut_bytes[a - 1] if a > 0 else 0.0
        return f * s, bk * s, (kept + received) * n / self.pbs, params

    def restart(self, incumbent: float, node_budget: float, gap: float) -> None:
        self.best_t, self.best, self.node_budget, self.gap = incumbent, None, node_budget, gap
        self.scored, self.stats = 0, SearchStats()

    def one_pass(self, i: int, left: int) -> float:
        """Least time for one micro-batch to pass layers [i, L): every sample crosses every layer,
        and a replica of any stage takes at least ceil(b / most replicas a stage can have) samples."""
        widest = min(self.b, left, max(self.R))
        return self.rest_work_per_sample(i) * math.ceil(self.b / widest)

    def root_bound(self) -> float:
        """No plan with this micro-batch size is faster: M - 1 bottlenecks plus one pass of the work."""
        beta = float(self.suffix[0, 0])
        if not math.isfinite(beta):
            return math.inf
        return (self.M - 1) * beta + self.one_pass(0, self.D)

    @property
    def cutoff(self) -> float:
        """A branch whose lower bound reaches this is cut: exact with gap 0, else every cut branch is
        provably at best (1 - gap) × the incumbent, so the result is within `gap` of the optimum."""
        return self.best_t * (1 - max(self.gap, 1e-12))

    def run(self) -> Costed | None:
        self._seed_incumbent()
        self._extend(0, 0, [])
        return self.best

    def _seed_incumbent(self) -> None:
        """Cost the least-bottleneck cut (bounds.py) in full first: a strong incumbent prunes early."""
        stages = least_bottleneck_stages(self.suffix, self.suffix_choice)
        if not stages or len(stages) > self.max_stages:
            return
        layout = [StageSpec(a, z, tuple(range(s, s + r))) for a, z, s, r in stages]
        if self.M < MIN_MICRO_BATCHES[self.limits.schedule](len(layout)):
            return
        cand = evaluate(self.p, self.t, tuple(layout), self.b, self.M, self.limits)
        if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
            self.best_t, self.best = cand.iteration_s, cand

    def _lower_bound(self, i: int, d: int, placed: list) -> float:
        M = self.M
        left = self.D - d
        rest, one_pass, out_link = 0.0, 0.0, 0.0
        if i < self.L and (left == 0 or not math.isfinite(self.suffix[i, d])):
            return math.inf  # no device left, or no cut of the remaining layers fits in memory
        if i < self.L:
            rest = self.rest_work_per_sample(i) * self.b / left
            one_pass = self.one_pass(i, left)
            # the transfer out of the last placed stage takes at least its share over the fastest link
            last = placed[-1]
            total = self.p.cut_bytes[i - 1] * self.b / self.pbs
            out_link = self.fast_lat + total / len(last["devices"]) / self.fast_bw
        beta = max([c["t"] for c in placed] + [c["link"] for c in placed] + [rest, out_link,
                                                                          float(self.suffix[i, d]) if left else 0.0])
        if self.limits.schedule == "1f1b":
            # windows of adjacent placed stages are windows of every completion (see cost.py)
            for s in range(len(placed)):
                window = placed[s]["t"]
                for e in range(s + 1, len(placed)):
                    window += placed[e]["t"] + 2 * placed[e - 1]["link"]
                    beta = max(beta, window / (e - s + 1))
        e0 = sum(c["t"] + 2 * c["link_sum"] for c in placed) + one_pass + 2 * out_link + (M - 1) * beta
        lb, behind = e0, 0.0
        for c in placed:
            lb = max(lb, e0 - behind + c["ar"])
            behind += c["bk"] + c["link_grad"]
        return lb

    def _extend(self, i: int, d: int, placed: list) -> None:
        self.stats.nodes += 1
        if i == self.L:
            self._leaf(placed)
            return
        if len(placed) == self.max_stages or d >= self.D:
            return
        k = self.t.devices_per_node
        starts = stage_starts(d, k, self.D)
        beta_placed = max([c["t"] for c in placed] + [c["link"] for c in placed], default=0.0)
        for start in starts:
            left = self.D - start
            for r in self.R:
                if r > left:
                    break
                devices = tuple(range(start, start + r))
                link_in = 0.0
                if placed:
                    prev = placed[-1]
                    total = self.p.cut_bytes[i - 1] * self.b / self.pbs
                    bw, lat = self.t.p2p(prev["devices"], devices)
                    link_in = lat + max(total / len(prev["devices"]), total / r) / bw
                    if (self.M - 1) * link_in >= self.cutoff:
                        continue
                for z in range(i + 1, self.L + 1):
                    if z < self.L and (len(placed) + 1 == self.max_stages or start + r >= self.D):
                        continue  # no stage or device left for the rest
                    f, bk, act, params = self.stage_time(i, z, r)
                    if params * self.limits.optimizer_factor + act > self.cap:
                        break  # more layers only need more memory
                    if (self.M - 1) * max(beta_placed, f + bk) + f + bk >= self.cutoff:
                        break  # a longer stage is only slower
                    entry = {"start": i, "stop": z, "devices": devices, "t": f + bk, "bk": bk, "link": 0.0,
                             "link_sum": 0.0, "link_grad": 0.0,
                             "ar": self.t.allreduce_s(devices, params), "act": act, "params": params}
                    if placed:
                        prev2 = dict(placed[-1], link=link_in, link_sum=link_in, link_grad=link_in)
                        chain = [*placed[:-1], prev2, entry]
                    else:
                        chain = [entry]
                    self.scored += 1  # the budget counts scored candidates: the unit of work
                    if self.scored > self.node_budget:
                        raise _OutOfTime
                    if self._lower_bound(z, start + r, chain) >= self.cutoff:
                        continue
                    self._extend(z, start + r, chain)

    def _leaf(self, placed: list) -> None:
        self.stats.leaves += 1
        S = len(placed)
        if self.M < MIN_MICRO_BATCHES[self.limits.schedule](S):
            return
        layout = tuple(StageSpec(c["start"], c["stop"], c["devices"]) for c in placed)
        cand = evaluate(self.p, self.t, layout, self.b, self.M, self.limits)
        if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
            self.best_t, self.best = cand.iteration_s, cand


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
    incumbent = min((c.iteration_s for c in found), default=math.inf)
    stats = SearchStats()
    # One search per micro-batch size, most promising first (by its least bottleneck). Each one's
    # least-bottleneck placement is costed up front: a strong incumbent before any branching.
    searches = [_Search(profile, topology, global_batch, limits, b, math.inf, math.inf)
                for b in micro_batch_sizes(global_batch, limits)]
    searches.sort(key=lambda x: (x.root_bound(), -x.b))
    for x in searches:
        x._seed_incumbent()
        if x.best is not None:
            found.append(x.best)
    incumbent = min((c.iteration_s for c in found), default=math.inf)
    # Pass 1 prunes what cannot beat the incumbent by more than the optimality gap, every size
    # with an equal share of half the budget: fast, and provably within the gap if all finish.
    # Pass 2 closes the gap exactly with what is left (small instances always finish: optimum).
    share = max(1, limits.search_nodes // (2 * max(1, len(searches))))
    per_b, done = _sweep(searches, incumbent, limits.optimality_gap, share, limits.search_nodes, stats)
    stats.proven_gap = limits.optimality_gap if done else None
    if not done or limits.optimality_gap > 0:
        incumbent = min([incumbent, *(c.iteration_s for c in per_b)])
        exact, exact_done = _sweep(searches, incumbent, 0.0, math.inf, limits.search_nodes, stats)
        per_b += exact
        if exact_done:
            stats.proven_gap = 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    candidates = sorted(found + per_b, key=lambda c: (c.iteration_s, len(c.layout), c.summary()))
    unique, seen = [], set()
    for c in candidates:
        if c.summary() not in seen:
            seen.add(c.summary())
            unique.append(c)
    stats.seconds = time.perf_counter() - t0
    return (unique[0] if unique else None), unique[1:keep + 1], baselines, stats


def _sweep(searches: list[_Search], incumbent: float, gap: float, per_search: float, budget: int,
           stats: SearchStats) -> tuple[list[Costed], bool]:
    """Branch and bound over each micro-batch size in turn; (best per size, whether all finished).
    A node budget, not a clock: the same inputs give the same plan on any machine."""
    per_b, finished = [], True
    for s in searches:
        left = budget - stats.nodes
        if left <= 0:
            return per_b, False
        s.restart(incumbent * (1 + 1e-9), min(left, per_search), gap)
        if s.root_bound() >= s.cutoff:
            continue
        try:
            best = s.run()
        except _OutOfTime:
            best, finished = s.best, False
        stats.nodes += s.scored
        stats.leaves += s.stats.leaves
        if best is not None:
            per_b.append(best)
            incumbent = min(incumbent, best.iteration_s)
    return per_b, finished


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
        how = f"auto: optimal under the cost model ({stats.nodes} candidates scored)"
    elif stats.proven_gap is not None:
        how = (f"auto: within {stats.proven_gap:.1%} of the optimum under the cost model, proven ({stats.nodes} "
               f"candidates scored; strategy.search_nodes or a smaller strategy.optimality_gap closes it)")
    else:
        how = (f"auto: best found within the budget of {limits.search_nodes} scored candidates, optimality not "
               f"proven (strategy.search_nodes raises it)")
    return to_plan(best, profile, topology, global_batch, how, runners_up,
                   data_parallel_s=dp.iteration_s if dp else None)
