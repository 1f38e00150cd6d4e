"""The schedule family, searched with the layout: 1F1B (and its warm-ups) and zero bubble (ZB-H1).

ZB-H1 (schedule/zero_bubble.py) splits the backward: its bubble is smaller, but it keeps s more
micro-batches on stage s than 1F1B, and with a split backward the 1F1B bounds (bounds.py,
warmup.py) do not hold: a stage's last input gradient can leave long before its last weight
gradient, so its backward round trips are shorter. Its own pass, after the 1F1B passes:

1. starts: every layout the 1F1B search found good, costed under ZB-H1 by the simulator at every
   warm-up depth that fits, then local search under ZB-H1 from the best few (a strong incumbent);
2. an exact branch and bound over the same tree (ZeroBubbleSearch), cut by a bound valid for any
   schedule: stage s cannot start before the first micro-batch reaches it (a_s), computes M t_s
   and all-reduces after its last weight gradient, so T >= max_s a_s + M t_s + AR_s, for the stages
   placed and, through a table of the least such end over every completion (bounds.py:
   compute_end), for the stages still to come. Each leaf is simulated at
   every warm-up depth that fits.

The proven gap is then over both families: the least lower bound of anything either pass left.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .branch import _EMPTY, CELLS_PER_NODE, BranchAndBound, Prefix, exact_sweep, replica_choices
from .cost import Costed, StageSpec, bare_costs, evaluate, memory_per_device, stage_costs
from .limits import Limits
from .polish import descend, shape_of
from .proposal import Proposal, SearchState, proven_gap
from .shapes import MIN_MICRO_BATCHES, micro_batch_sizes
from .warmup import DeepWarmupSearch, depths

if TYPE_CHECKING:
    import numpy as np

FAMILY = "zb_h1"
# of the node budget, what local search under ZB-H1 may spend (each neighbour is simulated), and what
# its exact pass may score on top of the 1F1B passes' budget
DESCENT_SHARE = 1 / 8
SWEEP_SHARE = 1 / 4
# layouts the per-stage proposer found good that zero bubble is costed on before its own exact pass
START_LAYOUTS = 6


def search_family(limits: Limits) -> str:
    """The schedule the layout search runs under: 1F1B whenever ZB-H1 or 1F1B is allowed."""
    return "gpipe" if set(limits.allowed()) == {"gpipe"} else "1f1b"


def least_stages(limits: Limits) -> int:
    """On one stage ZB-H1 runs each micro-batch's I and W back to back: 1F1B's time and memory, so
    where 1F1B is allowed too its one-stage plans are left to it."""
    return 2 if "1f1b" in limits.allowed() else 1


def starts(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, kept: list[Costed], top: int = 3
) -> list[Costed]:
    """ZB-H1 on the layouts found so far, at every depth that fits, and local search from the best few
    distinct layouts."""
    fam = replace(limits, schedule=FAMILY)
    seen, costed = set(), []
    least = least_stages(limits)
    for c in sorted(kept, key=lambda c: c.iteration_s):
        key = (c.layout, c.micro_batch_size)
        if key in seen or len(c.layout) < least or c.num_micro_batches < MIN_MICRO_BATCHES[FAMILY](len(c.layout)):
            continue
        seen.add(key)
        bare = bare_costs(c, profile, topology)
        for depth, _ in depths(len(c.layout), c.num_micro_batches, limits):
            z = evaluate(
                profile,
                topology,
                c.layout,
                c.micro_batch_size,
                c.num_micro_batches,
                fam,
                warmup_depth=depth,
                costs=bare,
            )
            if not z.fits:
                break  # deeper keeps more
            if c.schedule != FAMILY:
                z.extra["over"] = c  # the layout's plan under the family it was found with, for the plan's note
            costed.append(z)
    allowed_replicas = replica_choices(topology, global_batch)
    sizes = micro_batch_sizes(global_batch, limits)
    out, tried = list(costed), set()
    for z in sorted(costed, key=lambda c: c.iteration_s):
        if len(tried) == top:
            break
        if (z.layout, z.micro_batch_size) in tried:  # the same layout at another depth: descent tries depths itself
            continue
        tried.add((z.layout, z.micro_batch_size))
        if (
            any(s.replicas not in allowed_replicas for s in z.layout)
            or shape_of(z, topology).layout(topology) != z.layout
        ):
            continue
        better, _ = descend(
            z,
            profile,
            topology,
            global_batch,
            fam,
            allowed_replicas,
            sizes,
            cost_budget=limits.search_nodes * DESCENT_SHARE / top,
        )
        if better is not z:
            out.append(better)
    return out


class ZeroBubbleSearch(DeepWarmupSearch):
    """The branch and bound of one micro-batch size over layouts under ZB-H1 (module doc): the deeper
    warm-up pass's tree and tables, its own bound and leaves."""

    family: Limits  # the base's limits under this family
    compute_end: np.ndarray  # the bound tables' (bounds.py: compute_end)

    @classmethod
    def over(cls, base: BranchAndBound) -> ZeroBubbleSearch:
        x = cast(ZeroBubbleSearch, super().over(base))
        x.family = replace(base.limits, schedule=FAMILY)
        compute_end = base.bounds.compute_end
        assert compute_end is not None  # (the tables are built with it: bounds.suffix_bound)
        x.compute_end = compute_end
        x.max_stages = max(s for s in range(1, x.max_stages + 1) if MIN_MICRO_BATCHES[FAMILY](s) <= x.M or s == 1)
        return x

    def _lower_bound(self, i: int, d: int, placed: Prefix | None) -> float:
        placed = placed or _EMPTY
        if i == self.L:
            return placed.compute_end
        left = self.D - d
        if left == 0 or not math.isfinite(self.suffix[i, d]):
            return math.inf  # no device left, or no cut of the remaining layers fits in memory
        out_link = 0.0
        if placed.stages:  # the transfer out of the last placed stage: its share over the fastest link
            total = self.p.cut_bytes[i - 1] * self.b / self.pbs
            out_link = self.fast_lat + total / len(placed.stages[-1][2]) / self.fast_bw
        reach = placed.forward + out_link  # when the first micro-batch reaches the next stage
        rest = self.rest_work_per_sample(i) * self.b / left  # some later stage computes at least this per micro-batch
        # some later stage (or link) takes at least the least bottleneck per micro-batch, M times, after the
        # reach; and each later stage starts after the first micro-batch reached it, computes M times its
        # stage time and all-reduces (bounds.py: compute_end)
        return max(
            placed.compute_end,
            reach + self.M * max(rest, float(self.suffix[i, d])),
            reach + float(self.compute_end[i, d]),
        )

    def _leaf(self, placed: Prefix) -> None:
        self.stats.leaves += 1
        S, M = len(placed.stages), self.M
        if MIN_MICRO_BATCHES[FAMILY](S) > M or least_stages(self.limits) > S:
            return
        layout = tuple(StageSpec(a, z, devices) for a, z, devices in placed.stages)
        costs = stage_costs(self.p, self.t, layout, self.b)
        for depth, warmup in depths(S, M, self.limits):
            if max(memory_per_device(self.p, layout, costs, M, self.family, warmup)) > self.cap:
                return  # a deeper warm-up keeps more micro-batches: it does not fit either
            self._spend(math.ceil(S * M / CELLS_PER_NODE), placed.compute_end)
            cand = evaluate(
                self.p,
                self.t,
                layout,
                self.b,
                M,
                self.family,
                warmup_depth=depth,
                costs=costs,
                cutoff=self.best_t * (1 - 1e-12),
            )
            if cand.fits and cand.iteration_s < self.best_t * (1 - 1e-12):
                self.best_t, self.best = cand.iteration_s, cand


def sweep(searches: list[BranchAndBound], incumbent: float, budget: int) -> tuple[list[Costed], dict[int, float], int]:
    """The exact ZB-H1 pass over every micro-batch size, least root bound first: (best found per size,
    a lower bound per size on every ZB-H1 plan, candidates scored)."""
    return exact_sweep([ZeroBubbleSearch.over(s) for s in searches], incumbent, budget)


class ZeroBubble:
    """The ZB-H1 proposer: from the layouts found good so far (starts), then its exact pass over the
    per-stage proposer's trees. Where 1F1B is not allowed, what that proposer found were starts only."""

    def wanted(self, state: SearchState) -> bool:
        return state.best() is not None and FAMILY in state.limits.allowed()

    def propose(self, state: SearchState) -> Proposal:
        limits = state.limits
        good = sorted(state.found, key=lambda c: c.iteration_s)[:START_LAYOUTS]
        started = starts(state.profile, state.topology, state.global_batch, limits, good)
        admitted = [c for c in [*state.found, *started] if c.schedule in state.limits.allowed()]
        incumbent = min((c.iteration_s for c in admitted), default=math.inf)
        found, bounds, scored = sweep(state.searches, incumbent, int(limits.search_nodes * SWEEP_SHARE))
        state.stats.nodes += scored
        for x in state.searches:  # the proof's bound with each stage's outgoing link (bounds.py: links)
            x.with_links(bounds, FAMILY)
        if "1f1b" not in state.limits.allowed():
            return Proposal((FAMILY,), [*started, *found], bounds, supersedes=True)
        # the ZB-H1 pass's bound is weaker than 1F1B's: what holds over 1F1B plans alone, for the statement
        best_1f1b = min(
            (c.iteration_s for c in [*state.found, *started, *found] if c.schedule != FAMILY), default=math.inf
        )
        state.stats.gap_without_zero_bubble = proven_gap(best_1f1b, state.bounds) if math.isfinite(best_1f1b) else None
        return Proposal((FAMILY,), [*started, *found], bounds)
