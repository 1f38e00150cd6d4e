"""The proposer of 1F1B and ZB-H1 plans from the proof tables' own layouts, last of all.

Each micro-batch size's two proof tables (bounds.py: links, 1F1B's and ZB-H1's) are dynamic
programmes over cuts and replica counts, like the least-bottleneck table the per-stage search starts
from; the placement attaining each (bounds.least_link_stages) weighs what that one leaves out: the
fill, the round trips, the drain, the stages' all-reduces and their links' loads. Where the links
are slow it is the nearer start (GNMT-32 on 16 × 1 V100 at 10 Gbps, G 64: 8 single-device stages
under ZB-H1, 86.2 ms, where the proposers before reach 93.5 ms on 16). Each distinct layout is
costed under 1F1B and ZB-H1 at every warm-up depth that fits, sizes in increasing bound until one's
passes every candidate that could still matter (_needed); from the best two, local search
(polish.descend), and from the best of those each stage's own depth (polish.stage_depths), on a
budget of their own (SHARE). Last, so no other proposer's path depends on it: the plan is never slower than
without it. Its plans are of the exact families, whose bounds hold whatever the layout: it returns
no bound of its own."""

from __future__ import annotations

import math
from dataclasses import replace

from ..cluster import Topology
from .bounds import least_link_stages
from .branch import CELLS_PER_NODE, BranchAndBound, replica_choices
from .cost import Costed, StageSpec, evaluate
from .polish import descend, shape_of, stage_depths
from .proposal import Proposal, SearchState
from .shapes import MIN_MICRO_BATCHES
from .warmup import depths

FAMILIES = ("1f1b", "zb_h1")
SHARE = 1 / 8  # of strategy.search_nodes: the descents from the best starts, then the depths
STARTS = 2  # distinct layouts descended from


class TableStarts:
    def wanted(self, state: SearchState) -> bool:
        return bool(state.searches) and not state.for_starts and any(f in state.limits.allowed() for f in FAMILIES)

    def propose(self, state: SearchState) -> Proposal:
        profile, topology, G, limits = state.profile, state.topology, state.global_batch, state.limits
        families = [f for f in FAMILIES if f in limits.allowed()]
        incumbent = state.incumbent()
        costed: list[Costed] = []
        seen = set()
        # Sizes in increasing proof bound (any schedule's table: no layout of that size, this one
        # included, is faster under either family). Only the best STARTS layouts are descended from
        # and only the search's best few plans are kept (state.keep runners-up), so once a size's
        # bound passes both, none of its candidates or those after it could be either: they are not
        # costed (a divisor-rich batch has dozens of sizes, each costed at every warm-up depth).
        allowed = replica_choices(topology, G)
        sized = sorted(state.searches, key=lambda x: (_least(x), -x.b))
        for x, table in ((x, table) for x in sized for table in (0, 1)):
            if _least(x) > _needed(costed, state, topology, allowed) * (1 + 1e-9):
                break
            stages = least_link_stages(x.bounds, table)
            if not stages:
                continue
            layout = tuple(StageSpec(a, z, tuple(range(s, s + r))) for a, z, s, r in stages)
            if (layout, x.b) in seen:
                continue
            seen.add((layout, x.b))
            M = G // x.b
            for family in families:
                if MIN_MICRO_BATCHES[family](len(layout)) > M or (family == "zb_h1" and len(layout) < 2):
                    continue
                for depth, _ in depths(len(layout), M, limits):
                    c = evaluate(
                        profile, topology, layout, x.b, M, replace(limits, schedule=family), warmup_depth=depth
                    )
                    state.stats.nodes += -(-len(layout) * M // CELLS_PER_NODE)
                    if not c.fits:
                        break  # (deeper keeps more)
                    costed.append(c)
        budget = limits.search_nodes * SHARE
        spent, out, tried = 0.0, [], set()
        for c in sorted(costed, key=lambda c: (c.iteration_s, c.summary())):
            if len(tried) == STARTS or spent >= budget:
                break
            if c.layout in tried or not _startable(c, topology, allowed):
                continue
            tried.add(c.layout)
            better, cost = descend(
                c,
                profile,
                topology,
                G,
                replace(limits, schedule=c.schedule),
                allowed,
                state.sizes,
                cost_budget=(budget - spent) / (STARTS - len(tried) + 1),
            )
            spent += cost
            out.append(better)
        best = min(out, key=lambda c: (c.iteration_s, c.summary()), default=None)
        # (past the budget, stage_depths tries the warm-up fitted to the links alone: one simulation)
        if best is not None and best.iteration_s < incumbent:
            deeper, cost = stage_depths(best, profile, topology, G, limits, max(0.0, budget - spent))
            spent += cost
            if deeper is not best:
                out.append(deeper)
        state.stats.nodes += int(spent)
        return Proposal(tuple(families), [c for c in [*costed, *out] if c.fits], {})


def _least(x: BranchAndBound) -> float:
    """No 1F1B or ZB-H1 plan of x's micro-batch size is faster (x.bounds.links: reach_end's holds
    for 1F1B at any warm-up, compute_end's for ZB-H1, which recomputes nothing; at a layout of the
    table itself, so whatever incumbent the tables were cut by)."""
    return float(min(x.bounds.links[0][0, 0], x.bounds.links[1][0, 0])) if x.bounds.links is not None else 0.0


def _needed(costed: list[Costed], state: SearchState, topology: Topology, allowed: list[int]) -> float:
    """The time a candidate must beat to matter: the slower of the STARTS-th best layout that local
    search may start from and the (keep + 1)-th best distinct plan the search returns; inf while
    either has fewer."""
    starts = sorted(
        {
            c.layout: c.iteration_s
            for c in sorted(costed, key=lambda c: -c.iteration_s)
            if _startable(c, topology, allowed)
        }.values()
    )
    plans = sorted({c.summary(): c.iteration_s for c in [*state.found, *costed] if c.fits}.values())
    if len(starts) < STARTS or len(plans) < state.keep + 1:
        return math.inf
    return max(starts[STARTS - 1], plans[state.keep])


def _startable(c: Costed, topology: Topology, allowed: list[int]) -> bool:
    """A layout local search can start from: of the search's own space (its shape places it so, its
    replica counts among `allowed`, replica_choices of the global batch)."""
    return shape_of(c, topology).layout(topology) == c.layout and all(s.replicas in allowed for s in c.layout)
