"""The per-stage proposer: one stage per device group, under 1F1B (any warm-up depth) or GPipe.

Decided jointly: the cuts between stages, each stage's replica count (uneven allowed), where the
replicas sit (branch.py), the micro-batch size and count, and the 1F1B warm-up depth (warmup.py).

Order of work, each step giving the next a stronger incumbent: each micro-batch size's
least-bottleneck placement (bounds.py); local search (polish.py) from the best starts; branch and
bound per micro-batch size over DAPPLE's minimal warm-up (a first pass cuts branches that cannot
win by more than `optimality_gap`, a second, exact pass closes the gap); the best layouts with
deeper warm-ups, and local search from the best two at their depths; then the exact pass over every
layout with deeper warm-ups (warmup.py), cut by a bound valid for any warm-up. When the budget ends
first, the least lower bound of everything left unexplored is this proposer's bound. A node budget,
not a clock: the same inputs give the same plan anywhere.
"""

from __future__ import annotations

import math

from .branch import BranchAndBound, SearchStats, _OutOfTime, replica_choices
from .cost import Costed
from .polish import descend, shape_of
from .proposal import Proposal, SearchState, proven_gap
from .warmup import deep_sweep, deepen_best_layouts

# Of the node budget, what the local search under a deeper warm-up may spend (its moves are
# simulated), shared by the best few deeper-warm-up layouts it starts from (two: measured on the
# planner benchmark, two distinct starts found better plans on two rows and lost 0.9% on one; three
# lost more than they found).
DEEP_DESCENT_SHARE = 1 / 8
DEEP_DESCENT_STARTS = 2
# what local search from the best starts (before any branching, and after a budget-cut pass) may
# spend of the node budget, shared by its starts: every neighbour is simulated
POLISH_SHARE = 1 / 4


class StageFamilies:
    """1F1B and GPipe, a stage per device group. Where only ZB-H1 of the two is allowed it still runs
    (under 1F1B): its layouts are ZB-H1's starts and its tables ZB-H1's tree (zero_bubble_search.py)."""

    def wanted(self, state: SearchState) -> bool:
        return True

    def propose(self, state: SearchState) -> Proposal:
        profile, topology, global_batch, limits = state.profile, state.topology, state.global_batch, state.limits
        sizes, stats = state.sizes, state.stats
        found = list(state.found)  # what came before, then this proposer's own (returned)
        # One search per micro-batch size, most promising first (by its least bottleneck). Each one's
        # least-bottleneck placement is costed up front, then the best few starts are improved by
        # local search: a strong incumbent before any branching.
        incumbent = state.incumbent()  # only stages that could beat it are bounded
        # every later pass over these tables (ZB-H1's too) searches under the best plan of an allowed
        # family found by then: where that is the incumbent already, none reads what they leave out
        allowed = limits.allowed()
        under = min((c.iteration_s for c in state.found if c.schedule in allowed), default=math.inf) <= incumbent
        searches = [
            BranchAndBound(profile, topology, global_batch, limits, b, incumbent * (1 + 1e-9), read_under_cap=under)
            for b in sizes
        ]
        searches.sort(key=lambda x: (x.root_bound(), -x.b))
        state.searches = searches
        for x in searches:
            x._seed_incumbent()
            if x.seed is not None:
                found.append(x.seed)
        found += polished(found, state)
        # The sweep's incumbent is the search's own best (and a smaller budget's plans), not the
        # baselines' (which still compete for the plan): a baseline's incumbent pruned every layout
        # that loses under DAPPLE's minimal warm-up, so the deeper warm-ups' pass found none of the
        # layouts that win once deepened (VGG-19 on 8 x 8 A100 at G 1024: 37.69 ms, against 33.22)
        own = [*found[len(state.found) :], *state.prior]
        incumbent = min((c.iteration_s for c in own), default=math.inf)
        # Pass 1 prunes what cannot beat the incumbent by more than the optimality gap, every size
        # with an equal share of half the budget: fast, and provably within the gap if all finish.
        # Pass 2 closes the gap exactly with what is left (small instances always finish: optimum).
        # The budget is shared: the minimal-warm-up passes may score up to three quarters of it, the
        # deeper-warm-up pass gets the rest (at least a quarter).
        deep = limits.schedule == "1f1b" and limits.max_warmup_depth > 1
        minimal_budget = limits.search_nodes * 3 // 4 if deep else limits.search_nodes
        share = max(1, minimal_budget // (2 * max(1, len(searches))))
        per_b, bounds = sweep(searches, incumbent, limits.optimality_gap, share, minimal_budget, stats)
        best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
        if best is not None and proven_gap(best.iteration_s, bounds) > 0:
            exact, exact_bounds = sweep(searches, best.iteration_s, 0.0, math.inf, minimal_budget, stats)
            per_b += exact
            bounds = {b: max(v, exact_bounds.get(b, v)) for b, v in bounds.items()}  # each is a valid bound
            best = min([*found, *per_b], key=lambda c: c.iteration_s)
            if proven_gap(best.iteration_s, bounds) > 0:  # the budget ended first: polish what it found
                per_b += polished([best], state, top=1)
                best = min([*found, *per_b], key=lambda c: c.iteration_s)
        # Deeper warm-ups: the best layouts first (a few simulations), then every layout whose bound
        # under any warm-up could still win (warmup.py). Optimal means optimal over both spaces.
        per_b += deepen_best_layouts(found + per_b, profile, topology, limits)
        descent_cost = 0
        deep_starts = []
        for c in sorted(per_b, key=lambda c: (c.iteration_s, c.summary())):
            if c.warmup_depth > 1 and all(c.layout != d.layout for d in deep_starts):
                deep_starts.append(c)
        allowed = replica_choices(topology, global_batch)
        for start in deep_starts[:DEEP_DESCENT_STARTS]:  # local search at that depth (simulated moves)
            better, cost = descend(
                start,
                profile,
                topology,
                global_batch,
                limits,
                allowed,
                sizes,
                cost_budget=limits.search_nodes * DEEP_DESCENT_SHARE / DEEP_DESCENT_STARTS,
            )
            stats.nodes += cost
            descent_cost += cost
            if better is not start:
                per_b.append(better)
        best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
        if best is not None:
            budget = max(limits.search_nodes // 4 - descent_cost, limits.search_nodes - stats.nodes)
            deeper, deep_bounds, scored = deep_sweep(searches, best.iteration_s, limits, budget)
            per_b += deeper
            stats.nodes += scored
            bounds = {b: min(v, deep_bounds.get(b, math.inf)) for b, v in bounds.items()}
        # the proof's bound per size also counts each stage's outgoing link (any warm-up; the
        # search above walked the tables without it: bounds.py, links)
        if limits.schedule == "1f1b":
            for x in searches:
                x.with_links(bounds, "1f1b")
        return Proposal((limits.schedule,), found[len(state.found) :] + per_b, bounds)


def polished(starts: list[Costed], state: SearchState, top: int = 3) -> list[Costed]:
    """Local search (polish.py) from the `top` best distinct starts in the search's own space."""
    topology = state.topology
    allowed = replica_choices(topology, state.global_batch)
    out, seen = [], set()
    for c in sorted(starts, key=lambda c: (c.iteration_s, c.summary())):
        if len(seen) == top:
            break
        shape = shape_of(c, topology)
        if shape in seen or shape.layout(topology) != c.layout or any(r not in allowed for r in shape.replicas):
            continue  # not a plan of the search's space (a baseline placed otherwise)
        seen.add(shape)
        better, costed = descend(
            c,
            state.profile,
            topology,
            state.global_batch,
            state.limits,
            allowed,
            state.sizes,
            cost_budget=state.limits.search_nodes * POLISH_SHARE / top,
        )
        state.stats.nodes += costed
        if better is not c:
            out.append(better)
    return out


def sweep(
    searches: list[BranchAndBound], incumbent: float, gap: float, per_search: float, budget: int, stats: SearchStats
) -> tuple[list[Costed], dict[int, float]]:
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
