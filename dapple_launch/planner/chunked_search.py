"""The planner's pass over device groups holding several stages (interleaved 1F1B, ZB-V, Chimera).

A shape is (family, stages per group v, the groups' replica counts, micro-batch size b); a plan of
that shape also fixes the S = vP - 1 cuts. Every candidate is costed by the simulator of its rank
orders (chunked.evaluate_chunked): there is no closed form to trust.

Bounds (chunked_bounds.py; valid for every cut of a shape: shape_bound.py): the busiest group's work, at least the
groups' average, with each layer's tail, the groups' all-reduces and the busiest link. That
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
ones). A shape whose cut sets the budget affords is enumerated whole (exact); otherwise steepest
descent from its balanced cuts (moving one cut at a time) improves it, a move whose busiest group
alone is no faster left unsimulated, and the shape's bound stays in the proven gap. The descents
share the budget one step at a time: the next step goes to the shape whose next step promises the
fastest plan (its time less its last step's gain), so one shape's long tail of small gains does not
starve a shape that gains more per step (GNMT-32 on 8 × 8 A100 at G 64: 5.46 -> 5.23 ms). Once a
shape's bound reaches the best plan found, it is skipped. Replica counts: every composition of the
devices into P groups up to 8 devices; beyond, equal groups and every split into two groups. Groups
take contiguous devices in order.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import busiest_rank_s
from .baselines import balanced_boundaries
from .branch import CELLS_PER_NODE
from .chunked import (
    CHUNKED,
    chunked_layout,
    evaluate_chunked,
    group_of,
    rank_orders,
)
from .chunked_bounds import BOUND_CELLS_PER_NODE, bounded_shapes, cut_bounds
from .cost import Costed
from .limits import Limits
from .proposal import Proposal, SearchState
from .shape_bound import num_stages

SHARE = 1 / 4  # of strategy.search_nodes, what this pass may score (each candidate simulated)
SCREEN = 1 / 2  # of this pass's budget, what the screen (one balanced candidate per shape) may score
# the gain (a share of its time) a shape's first descent step is taken to promise, before it makes one
PRIOR_GAIN = 0.05


@dataclass
class _Descent:
    """One shape's local search: its cut-blind bound, its shape, its cuts and plan so far."""

    bound: float
    family: str
    v: int
    groups: tuple[int, ...]
    b: int
    stops: list[int]
    start: Costed | None
    current: Costed | None = None
    whole: bool = False  # every cut of it scored


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
    first_floor: float | None = None,
) -> tuple[list[Costed], dict[int, float], int]:
    """(candidates found, per micro-batch size the least bound of any shape not searched exactly,
    candidates scored). `incumbent`: the best plan so far (shapes that cannot beat it are cut);
    `floor`: the least bound the other families proved (no shape's bound is raised above it: the
    proven gap would not change); `first_floor`: the least of their cheaper bounds (Proposal.lower),
    which the bounds over cuts aim at first (cut_bounds' `raise_to`)."""
    L = profile.num_layers
    budget = max(1, int(limits.search_nodes * SHARE))
    memo: dict = {}
    todo, again = bounded_shapes(profile, topology, global_batch, limits, sizes, memo)
    weighing = memo.pop("weighed")  # (per shape, its bound with the groups weighed, when asked: bounded_shapes)
    # the shapes whose every candidate recomputes (strategy.recompute=auto: no cut fits keeping)
    forced = again[1] if again is not None and limits.recompute == "auto" else set()
    found: list[Costed] = []
    bounds: dict[int, float] = {}
    best, scored = incumbent, 0
    # the rank orders (family, groups, micro-batches, v) built so far (in memo: cut_bounds counts
    # the building of those it needs that this pass did not build)
    built: set[tuple] = memo.setdefault("built", set())

    def costed(
        family, v, groups, b, stops, cutoff: float = math.inf, micro_batches: int = 0, refit: bool = True
    ) -> Costed | None:
        """The candidate simulated (None: it cannot beat `cutoff`, by its busiest group's compute
        or its simulation), its cost counted. `micro_batches`: fewer than the global batch's, for
        the screen's estimate; `refit`: evaluate_chunked's."""
        nonlocal scored
        S, M = num_stages(family, v, groups), micro_batches or global_batch // b
        key = (family, len(groups), M, v)
        if key not in built:  # a shape's first candidate also builds its rank orders: as dear as a simulation
            built.add(key)
            scored += _cost(S, M)
        layout = chunked_layout(family, list(groups), list(stops), None)
        walked: list = []
        # (a shape no cut of which fits keeping: its candidates recompute, whatever the caller asks)
        refit = refit or (family, v, groups, b) in forced
        c = evaluate_chunked(profile, topology, layout, b, M, limits, family, v, cutoff, walked, refit)
        scored += _unsimulated_cost(S) + _cost(S, M) * len(walked)  # its stage costs, its simulations
        return c

    def full(family, v, groups, b, stops, micro_batches: int = 0, refit: bool = True) -> Costed:
        """costed without a cutoff: always simulated."""
        c = costed(family, v, groups, b, stops, micro_batches=micro_batches, refit=refit)
        assert c is not None  # (None only below a finite cutoff)
        return c

    def balanced(family, v, groups) -> list[int]:
        S, P = num_stages(family, v, groups), len(groups)
        per_stage = [groups[group_of(family, s, P)] for s in range(S)]
        return [*balanced_boundaries(profile, S, per_stage), L]

    def step(d: _Descent, each: int) -> bool:
        """One steepest-descent step of `d` over one cut at a time (False: no faster move, or the
        budget ended the scan). A fitting current is only left for a faster trial: one whose busiest
        group's compute alone is as slow is not simulated (costed: None)."""
        nonlocal scored
        L, S = profile.num_layers, num_stages(d.family, d.v, d.groups)
        current, best_step, best_stops = d.current, None, None
        assert current is not None
        for i in range(S - 1):
            for delta in (-2, -1, 1, 2):
                trial = list(d.stops)
                trial[i] += delta
                if not (0 < trial[i] < L) or (i and trial[i] <= trial[i - 1]) or trial[i] >= trial[i + 1]:
                    continue
                if scored + each > budget:
                    break
                cutoff = (best_step or current).iteration_s * (1 - 1e-12) if current.fits else math.inf
                # (from a plan that fits keeping its activations, a move that fits only recomputing
                # adds the forward again to every backward: seldom faster, and twice the simulation)
                c = costed(
                    d.family, d.v, d.groups, d.b, trial, cutoff, refit=not current.fits or bool(current.recompute)
                )
                if c is None:
                    continue
                if (
                    c.fits
                    and c.iteration_s < (best_step or current).iteration_s * (1 - 1e-12)
                    or (not current.fits and c.fits)
                ):
                    best_step, best_stops = c, trial
        if best_step is None or best_stops is None:
            return False
        d.current, d.stops = best_step, best_stops
        return True

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
            # (a shape that may keep its activations is screened keeping them, and where that does
            # not fit, recomputing the first layers that do: ranked with those that fit, by its
            # estimate. Screened as not fitting, such shapes went after every shape that does not
            # fit at all, and a budget could end first: fuzz seed 1081 then planned 1f1b_rr at 27.1 s
            # against Chimera at 16.5 s)
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
    # Search: one descent step at a time, to the shape whose next step promises the fastest plan —
    # its current time less the gain its last step made (PRIOR_GAIN before its first): a shape
    # whose steps still gain much is followed, one whose steps gain little yields to the next.
    # Shapes that fit come first, then those whose screen did not fit, then the unscreened by bound.
    rank = lambda x: (x[1] is None, not x[2], x[1] if x[1] is not None else x[3], x[3])
    heap: list[tuple] = []
    descents: list[_Descent] = []  # (in that order)
    for i, (start, estimate, fits, bound, family, v, groups, b, stops) in enumerate(sorted(screened, key=rank)):
        descents.append(_Descent(bound, family, v, groups, b, stops, start))
        key = (estimate if estimate is not None else bound) * (1 - PRIOR_GAIN)
        heap.append((estimate is None, not fits, key, i, descents[-1]))
    heapq.heapify(heap)
    while heap:
        _, _, _, i, d = heapq.heappop(heap)
        if d.bound >= best * (1 - 1e-9):  # cannot beat what is found
            continue
        S, M = num_stages(d.family, d.v, d.groups), global_batch // d.b
        each = _unsimulated_cost(S) + _cost(S, M)  # (what costed counts for a simulated candidate)
        orders = 0 if (d.family, len(d.groups), M, d.v) in built else _cost(S, M)  # (and its first, the orders)
        if d.current is None:  # its first turn: every cut of it where affordable, else its start
            if scored + orders + math.comb(L - 1, S - 1) * each <= budget:
                for cut in itertools.combinations(range(1, L), S - 1):
                    c = full(d.family, d.v, d.groups, d.b, (*cut, L), refit=False)  # (one simulation a cut, as counted)
                    if c.fits:
                        found.append(c)
                        best = min(best, c.iteration_s)
                d.whole = True
                continue
            if d.start is None:
                if scored + orders + each > budget:
                    continue
                d.start = full(d.family, d.v, d.groups, d.b, d.stops)
            d.current = d.start
            heapq.heappush(heap, (False, not d.current.fits, d.current.iteration_s * (1 - PRIOR_GAIN), i, d))
            continue
        if scored + each > budget:  # (its descent ends here, the others' below)
            if d.current.fits:
                found.append(d.current)
            break
        before = d.current.iteration_s
        if not step(d, each):  # a local optimum (or the budget ended its scan)
            if d.current.fits:
                found.append(d.current)
            continue
        if d.current.fits:
            best = min(best, d.current.iteration_s)
        gain = max(0.0, 1 - d.current.iteration_s / before) if d.current.fits else PRIOR_GAIN
        heapq.heappush(heap, (False, not d.current.fits, d.current.iteration_s * (1 - gain), i, d))
    found += [d.current for *_, d in heap if d.current is not None and d.current.fits]  # (the budget ended them)
    best = min([best, *(c.iteration_s for c in found)])
    # (bound, family, v, groups, b) of the shapes not searched whole that could beat the best: searched
    # locally at most, their bounds stay open
    open_shapes = [
        (d.bound, d.family, d.v, d.groups, d.b) for d in descents if not d.whole and d.bound < best * (1 - 1e-9)
    ]
    for bound, _, _, _, b in open_shapes:
        bounds[b] = min(bounds.get(b, math.inf), bound)
    cells = limits.search_nodes * BOUND_CELLS_PER_NODE
    first = floor if first_floor is None else min(floor, first_floor)
    raise_to = min(best, floor) if first < floor else None
    weighed = lambda shape: weighing[shape]()[0]
    bounds = cut_bounds(
        profile, topology, global_batch, open_shapes, min(best, first), memo, cells, again, raise_to, weighed
    )
    return found, bounds, scored


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
            min(state.lower.values(), default=math.inf),
        )
        state.stats.nodes += scored
        if best is not None and state.stats.gap_without_chunked is None:  # (the statement's: copies may have set it)
            state.stats.gap_without_chunked = state.gap()
        return Proposal(CHUNKED, [*found, *(c for c in state.prior if c.schedule in CHUNKED)], bounds)
