"""The planner's pass over device groups holding several stages (interleaved 1F1B, ZB-V, Chimera).

A shape is (family, stages per group v, the groups' replica counts, micro-batch size b); a plan of
that shape also fixes the S = vP - 1 cuts. Every candidate is costed by the simulator of its rank
orders (chunked.evaluate_chunked): there is no closed form to trust.

Bound (valid for every cut of a shape: shape_bound.py): the busiest group's work, at least the
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

import functools
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import busiest_rank_s
from .baselines import balanced_boundaries
from .branch import CELLS_PER_NODE, replica_choices
from .chunked import (
    CHUNKED,
    INTERLEAVED,
    chunked_layout,
    evaluate_chunked,
    group_of,
    keeps_activations,
    rank_orders,
    recomputed_profile,
    recomputes_to_fit,
)
from .cost import Costed
from .group_bound import GroupBound, weight_share_table
from .limits import Limits
from .path_bound import (
    CRITICAL_ACTION_CELLS,
    MASK_STAGE_CELLS,
    ORDER_ACTION_CELLS,
    ORDER_ACTION_CELLS_ELSE,
    SHAPE_CELLS,
    TABLE_CELLS,
    order_actions,
)
from .proposal import Proposal, SearchState
from .shape_bound import _layer_times, num_stages, shape_bounds
from .shape_memory import forced_layers, holds_model, recompute_floor, room_bound, span_masks

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
# and where the other families' bound rose above what those passes aimed at (cut_bounds' raise_to),
# this many times as many again toward it (AmoebaNet-36 on 16 × 1 V100 at G 64: as many again left
# the device groups at the copies' cheaper bound, the proof at 25.1 %; twice, 16.0 %, as aiming at
# the dearer one from the first pass did, without that aim's loss elsewhere)
RAISE_CELLS = 2.0


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
                        if runs_micro_batches(family, groups, b, M) and holds_model(
                            profile, topology, global_batch, limits, family, v, groups, b
                        ):
                            yield family, v, groups, b


def runs_micro_batches(family: str, groups: tuple[int, ...], b: int, M: int) -> bool:
    """M micro-batches of b samples suit the shape: each splits across its group's replicas, and
    (interleaved, Chimera) they come in units of the P groups."""
    return b >= max(groups) and (family == "zbv" or (M % len(groups) == 0 and len(groups) <= M))


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


def _shape_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
    room: tuple[float, float] | None,
    recomputed: bool = False,
    weigh: bool = True,
) -> tuple[float, float]:
    """shape_bounds (the bound, and the plain one the search orders by), each with, where `room`
    (optimizer factor, usable bytes a device), the room memory leaves for micro-batches in flight
    (shape_memory.room_bound: the stages keep their activations, or where `recomputed` their inputs
    alone)."""
    bound, plain = shape_bounds(profile, topology, global_batch, groups, b, memo, family, v, weigh)
    if room is None:
        return bound, plain
    least = _layer_times(profile, topology, max(groups), b, memo)  # (the fewest samples a device runs)
    factor, usable = room
    roomy = room_bound(profile, topology, global_batch, family, v, groups, b, factor, usable, least, memo, recomputed)
    return max(bound, roomy), max(plain, roomy)


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
    todo, again = _bounded_shapes(profile, topology, global_batch, limits, sizes, memo)
    weighing = memo.pop("weighed")  # (per shape, its bound with the groups weighed, when asked: _bounded_shapes)
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


def _bounded_shapes(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    memo: dict,
) -> tuple[list[tuple], tuple[ModelProfile, set] | None]:
    """The shapes (bound, family, v, groups, b) in increasing bound, the plain one (shape_bounds:
    memo["weighed"] holds per shape a call that gives its bound with the groups weighed), and where
    some recompute (strategy.recompute=full: every layer of every candidate; auto: where no cut fits
    keeping the activations, each stage's first layers, chunked.recomputes_to_fit), the profile
    their bounds read (full: each layer's backward runs its forward again, recomputed_profile; auto:
    the profile itself, as a stage may recompute none of its layers) with the set of those shapes
    (family, v, groups, b). Where a shape's stages keep their activations
    (chunked.keeps_activations) the room memory leaves for micro-batches in flight bounds it too;
    under auto, a shape whose candidates may recompute is bound by the room they leave recomputing
    their first layers (room_bound's `first`: no less than keeping them all leaves)."""
    room = (limits.optimizer_factor, topology.device_memory_bytes * (1 - limits.memory_headroom))
    some = limits.recompute == "full" or any(recomputes_to_fit(limits, f) for f in limits.allowed())
    first = limits.recompute == "auto"  # (group_recompute.py: any count of first layers a stage)
    heavier = recomputed_profile(profile) if limits.recompute == "full" else profile
    rmemo = memo.setdefault("recomputed", {}) if heavier is not profile else memo
    rows, whole, weighed = [], set(), memo.setdefault("weighed", {})
    keeps = {}  # per shape, whether its candidates keep their activations (None: either; cut_bounds' masks)
    forced_on = memo.setdefault("forced_on", {})  # per shape: (profile its bounds read, its tables)
    forced_memo: dict = {}  # per set of layers every plan recomputes: (that profile, its tables)
    if limits.recompute != "selective":
        memo["room"] = (*room, keeps, first)

    def bounds_of(f: str, v: int, g: tuple[int, ...], b: int, weigh: bool) -> tuple[float, float]:
        """(bound, plain) of a shape as keeps[shape] says it may run (shape_bounds' `weigh`)."""
        kept = keeps[(f, v, g, b)]
        if kept is True:
            return _shape_bound(
                profile,
                topology,
                global_batch,
                f,
                v,
                g,
                b,
                memo,
                room if keeps_activations(limits, f) else None,
                weigh=weigh,
            )
        if not first:  # (full: every layer of every candidate recomputed)
            return _shape_bound(heavier, topology, global_batch, f, v, g, b, rmemo, room, True, weigh)
        # (kept None or False, under auto: a candidate keeps every activation or recomputes some of
        # each stage's first layers, and the least over every count, none included, bounds either)
        # any count of each stage's first layers: the layers every plan recomputes run their forward
        # again in the backward (forced_layers), the room is the least over the counts, and the
        # forward work run again to fit is at least recompute_floor's (in the bound the shape states
        # only, not the plain one the search orders and prunes by: raising that moved the budget,
        # and fuzz seed 448 then planned 6.5 % slower)
        on, on_memo = forced_of((f, v, g, b))
        bound, plain = shape_bounds(on, topology, global_batch, g, b, on_memo, f, v, weigh)
        times = _layer_times(profile, topology, max(g), b, memo)
        roomy = room_bound(profile, topology, global_batch, f, v, g, b, *room, times, memo, True, True)
        if not weigh:  # (the plain pass over every shape reads only the plain bound: no floor there)
            return max(bound, roomy), max(plain, roomy)
        floor = recompute_floor(profile, topology, global_batch, limits, f, v, g, b, times, memo)
        return max(bound, roomy, floor), max(plain, roomy)

    def forced_of(shape: tuple) -> tuple[ModelProfile, dict]:
        """The profile a shape's bounds read, with the layers every plan of it recomputes
        (shape_memory.forced_layers) run again, and its tables (memo["forced_on"] per shape; one
        profile and one set of tables per set of layers)."""
        if shape not in forced_on:
            layers = forced_layers(profile, topology, global_batch, limits, *shape)
            if not layers:
                forced_on[shape] = (profile, memo)
            else:
                if layers not in forced_memo:
                    forced_memo[layers] = (
                        recomputed_profile(profile, layers),
                        {"built": memo.setdefault("built", set())},
                    )
                forced_on[shape] = forced_memo[layers]
        return forced_on[shape]

    for f, v, g, b in shapes(profile, topology, global_batch, limits, sizes):
        if keeps_activations(limits, f) or not some:  # (selective: the plain bound holds)
            keeps[(f, v, g, b)] = True
        elif limits.recompute == "auto" and holds_model(
            profile, topology, global_batch, limits, f, v, g, b, keeps=True
        ):
            keeps[(f, v, g, b)] = None
        else:
            keeps[(f, v, g, b)] = False
            whole.add((f, v, g, b))
        # the plain bound now, the weighed one only for the shapes the search leaves open that could
        # be their size's least (cut_bounds), a few of the thousands
        plain = bounds_of(f, v, g, b, False)[1]
        rows.append((plain, f, v, g, b))
        weighed[(f, v, g, b)] = functools.partial(bounds_of, f, v, g, b, True)
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))
    if rmemo is not memo:
        rmemo["built"] = memo.setdefault("built", set())  # (the rank orders are the same: built once)
    return rows, ((heavier, whole) if whole else None)


def cut_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    open_shapes: list[tuple],
    best: float,
    memo: dict,
    cells: float,
    recomputed: tuple[ModelProfile, set] | None = None,
    raise_to: float | None = None,
    weighed: Callable[[tuple], float] | None = None,
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
    Each pass only raises what the one before left. `recomputed`: the profile the shapes every
    candidate of which recomputes read (under full, its backwards run their forward again: memo's
    "recomputed" tables; under auto, the profile itself), and the set of those shapes (family, v,
    groups, b). `raise_to`: where the other
    families' least bound is above `best` (a dearer bound of theirs that the passes above do not aim
    at, so they spend as they would without it: Proposal.lower), one more pass within RAISE_CELLS
    as many cells raises the shapes left below it, in increasing bound, each up to the least so
    far: no shape ends lower than it would without that bound. `weighed`: a shape's bound with the
    groups weighed (shape_bound.busiest_group), which each shape's result is raised to at the end
    (asked only of the shapes that could be their size's least: a few of the open ones): the passes
    run on the plain bounds, as the search orders and prunes by them, so the cells go where they
    went without the weights and no shape ends lower than it would without them."""
    heavier, whole = recomputed if recomputed is not None else (profile, set())

    def group_bound(family, v, groups, b) -> GroupBound:
        on = memo.get("forced_on", {}).get((family, v, groups, b))
        if (family, v, groups, b) in whole and heavier is not profile:
            dual = _group_bound(heavier, topology, global_batch, family, v, groups, b, memo["recomputed"])
        elif on is not None and on[0] is not profile:  # (the layers every plan of it recomputes: _bounded_shapes)
            dual = _group_bound(on[0], topology, global_batch, family, v, groups, b, on[1])
        else:
            dual = _group_bound(profile, topology, global_batch, family, v, groups, b, memo)
        if "room" in memo:  # (the spans memory leaves out: _bounded_shapes says how each shape may run)
            factor, usable, keeps, first = memo["room"]
            key = (family, v, groups, b)
            masks = memo.setdefault("masks", {})
            dual.room, made, compared = span_masks(
                profile, factor, usable, family, v, groups, b, global_batch // b, keeps[key], masks, first
            )
            dual.cells += made * TABLE_CELLS + compared * MASK_STAGE_CELLS
        return dual

    rows: list[list] = []  # [bound, family, v, groups, b, its GroupBound or None]
    least, given, lead = best, cells, {}  # (lead: per family and stage count, the kind of term that binds)
    for bound, family, v, groups, b in sorted(open_shapes, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
        dual = None
        if bound < least and cells > 0:
            dual = group_bound(family, v, groups, b)
            dual.with_paths, dual.lead = False, lead  # (the paths' turn comes below, on the shapes left lowest)
            bound = max(bound, dual.bound(least, cells))
            cells -= dual.cells
        least = min(least, bound)
        rows.append([bound, family, v, groups, b, dual])
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))  # (ties: by shape, never by the objects)
    warm: dict = {}  # (per rank orders, the path weights that did best so far)

    def raise_rows(least: float, cells: float) -> None:
        """The rows below `least` in increasing bound, each raised by the dual again and the paths
        of its rank orders up to the least so far, within `cells`."""
        for row in sorted(rows, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
            if row[0] >= least or cells <= 0:
                break  # (every shape after it is as high: none is below the least any more)
            family, v, groups, b = row[1:5]
            dual = row[5]
            if dual is None:
                dual = group_bound(family, v, groups, b)
            else:
                dual.cells = 0  # (its tables are made: counted in a pass before)
            dual.with_paths, dual.warm, dual.lead = True, warm, lead
            row[0] = max(row[0], dual.bound(least, cells))
            cells -= dual.cells
            least = min(least, row[0])

    # the dual again (above, it stopped at the least bound of the shapes before it, which may be
    # higher now), then the paths; from `best`: what the shapes raised so far are all at or above
    raise_rows(best, given * PATH_CELLS)
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
                dual = group_bound(family, v, groups, b)
            else:
                dual.cells = 0  # (its tables are made: counted in the passes before)
            row[0] = max(row[0], dual.critical(least, critical))
            critical -= dual.cells
        least = min(least, row[0])
    if raise_to is not None and raise_to > best:
        raise_rows(raise_to, given * RAISE_CELLS)
    bounds: dict[int, float] = {}
    for bound, family, v, groups, b, _ in sorted(rows, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
        if b in bounds and bound >= bounds[b]:  # (raised or not, it is no less than its size's least)
            continue
        if weighed is not None:
            bound = max(bound, weighed((family, v, groups, b)))
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
            min(state.lower.values(), default=math.inf),
        )
        state.stats.nodes += scored
        if best is not None and state.stats.gap_without_chunked is None:  # (the statement's: copies may have set it)
            state.stats.gap_without_chunked = state.gap()
        return Proposal(CHUNKED, [*found, *(c for c in state.prior if c.schedule in CHUNKED)], bounds)
