"""The search: the fastest plan under the cost model that fits memory.

Decided jointly: the cuts between stages, each stage's replica count (uneven allowed), where the
replicas sit (branch.py), the micro-batch size and count, and the 1F1B warm-up depth (warmup.py).

Order of work, each step giving the next a stronger incumbent: the baselines and an even split;
each micro-batch size's least-bottleneck placement (bounds.py); local search (polish.py) from the
best starts; branch and bound per micro-batch size over DAPPLE's minimal warm-up (a first pass
cuts branches that cannot win by more than `optimality_gap`, a second, exact pass closes the gap);
the best layouts with deeper warm-ups, and local search from the best two at their depths; then
the exact pass over every layout with deeper warm-ups (warmup.py), cut by a bound valid for any
warm-up. When a node budget ends first, the least lower bound of everything left unexplored says
how far from the optimum the answer can be: the plan states that proven gap. A node budget, not a
clock: the same inputs give the same plan anywhere.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule.round_robin import RR_FAMILIES
from . import schedules
from .baselines import all_baselines, balanced_boundaries, balanced_uniform
from .branch import BranchAndBound, SearchStats, _OutOfTime, replica_choices
from .build import to_plan
from .chunked import CHUNKED
from .chunked_search import search_chunked
from .cost import Costed, Limits, StageSpec, evaluate
from .explain import human_bytes, human_gap
from .plan import Plan
from .polish import descend, shape_of
from .round_robin import RR, START_PLANS, search_round_robin
from .schedules import search_family
from .shapes import micro_batch_sizes
from .warmup import deep_sweep, deepen_best_layouts

__all__ = ["NoFeasiblePlan", "plan", "replica_choices", "search", "micro_batch_sizes"]


# Of the node budget, what the local search under a deeper warm-up may spend (its moves are
# simulated), shared by the best few deeper-warm-up layouts it starts from (two: measured on the
# planner benchmark, two distinct starts found better plans on two rows and lost 0.9% on one; three
# lost more than they found).
DEEP_DESCENT_SHARE = 1 / 8
DEEP_DESCENT_STARTS = 2
# what local search from the best starts (before any branching, and after a budget-cut pass) may
# spend of the node budget, shared by its starts: every neighbour is simulated
POLISH_SHARE = 1 / 4
# layouts found good under 1F1B that zero bubble is costed on before its own exact pass
ZB_START_LAYOUTS = 6


class NoFeasiblePlan(ValueError):
    pass


# the least estimated gain (a share of the iteration) for which strategy.token_slices=auto slices
SLICE_MIN_GAIN = 0.01


def search(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    keep: int = 4,
    with_baselines: bool = True,
) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """(best, runners-up, baselines, stats). `with_baselines=False`: the search's own space only (a
    frontier's searches below the first: the baselines were compared once, on the whole card)."""
    t0 = time.perf_counter()
    if not [f for f in schedules.allowed(limits) if f not in (*CHUNKED, *RR)] and any(
        f in RR for f in schedules.allowed(limits)
    ):
        return _copies_only(profile, topology, global_batch, limits, keep, t0)
    if not [f for f in schedules.allowed(limits) if f not in CHUNKED]:  # chunked families alone
        return _chunked_only(profile, topology, global_batch, limits, keep, t0)
    baselines = all_baselines(profile, topology, global_batch, limits) if with_baselines else {}
    start = balanced_uniform(profile, topology, global_batch, limits)
    stats = SearchStats()
    prior = _default_budget_plans(profile, topology, global_batch, limits, keep, stats)
    found = [c for c in [*baselines.values(), start, *prior] if c is not None and c.schedule not in CHUNKED]
    sizes = micro_batch_sizes(global_batch, limits)
    # One search per micro-batch size, most promising first (by its least bottleneck). Each one's
    # least-bottleneck placement is costed up front, then the best few starts are improved by
    # local search: a strong incumbent before any branching.
    incumbent = min((c.iteration_s for c in found), default=math.inf)  # only stages that could beat it are bounded
    searches = [
        BranchAndBound(profile, topology, global_batch, limits, b, incumbent * (1 + 1e-9), math.inf) for b in sizes
    ]
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
    # The budget is shared: the minimal-warm-up passes may score up to three quarters of it, the
    # deeper-warm-up pass gets the rest (at least a quarter).
    deep = limits.schedule == "1f1b" and limits.max_warmup_depth > 1
    minimal_budget = limits.search_nodes * 3 // 4 if deep else limits.search_nodes
    share = max(1, minimal_budget // (2 * max(1, len(searches))))
    per_b, bounds = _sweep(searches, incumbent, limits.optimality_gap, share, minimal_budget, stats)
    best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
    if best is not None and _proven_gap(best.iteration_s, bounds) > 0:
        exact, exact_bounds = _sweep(searches, best.iteration_s, 0.0, math.inf, minimal_budget, stats)
        per_b += exact
        bounds = {b: max(v, exact_bounds.get(b, v)) for b, v in bounds.items()}  # each is a valid bound
        best = min([*found, *per_b], key=lambda c: c.iteration_s)
        if _proven_gap(best.iteration_s, bounds) > 0:  # the budget ended first: polish what it found
            per_b += _polished([best], profile, topology, global_batch, limits, sizes, stats, top=1)
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
        best = min([*found, *per_b], key=lambda c: c.iteration_s)
    if best is not None and schedules.FAMILY in schedules.allowed(limits):
        # zero bubble: starts from the layouts found good, then its own exact pass (planner/schedules.py)
        good = sorted(found + per_b, key=lambda c: c.iteration_s)[:ZB_START_LAYOUTS]
        per_b += schedules.starts(profile, topology, global_batch, limits, good)
        admitted = [c for c in found + per_b if c.schedule in schedules.allowed(limits)]
        incumbent = min((c.iteration_s for c in admitted), default=math.inf)
        zb_found, zb_bounds, scored = schedules.sweep(
            searches, incumbent, int(limits.search_nodes * schedules.SWEEP_SHARE)
        )
        per_b += zb_found
        stats.nodes += scored
        if "1f1b" in schedules.allowed(limits):
            best_1f1b = min((c.iteration_s for c in found + per_b if c.schedule != schedules.FAMILY), default=math.inf)
            stats.gap_without_zero_bubble = _proven_gap(best_1f1b, bounds) if math.isfinite(best_1f1b) else None
            bounds = {b: min(v, zb_bounds.get(b, math.inf)) for b, v in bounds.items()}
        else:
            bounds, found = zb_bounds, [c for c in found if c.schedule == schedules.FAMILY]
            per_b = [c for c in per_b if c.schedule == schedules.FAMILY]
        best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
    if any(f in CHUNKED for f in schedules.allowed(limits)):
        # device groups holding several stages (planner/chunked_search.py): the simulator costs each
        chunked, chunked_bounds, scored = search_chunked(
            profile, topology, global_batch, limits, sizes, best.iteration_s if best is not None else math.inf
        )
        per_b += chunked
        stats.nodes += scored
        if best is not None:
            stats.gap_without_chunked = _proven_gap(best.iteration_s, bounds)
        per_b += [c for c in prior if c.schedule in CHUNKED]
        bounds = {b: min(bounds.get(b, math.inf), chunked_bounds.get(b, math.inf)) for b in {*bounds, *chunked_bounds}}
        best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
    rr = [f for f in RR if f in schedules.allowed(limits)]
    if rr and best is not None:
        # stages of round-robin copies (planner/round_robin.py), from the layouts the passes above found best
        starts = [c for c in found + per_b if c.schedule in ("1f1b", "zb_h1")]
        copied, rr_bounds, scored = search_round_robin(
            profile, topology, global_batch, limits, sizes, starts, rr, best.iteration_s
        )
        per_b += copied
        stats.nodes += scored
        if stats.gap_without_chunked is None:
            stats.gap_without_chunked = _proven_gap(best.iteration_s, bounds)
        bounds = {b: min(bounds.get(b, math.inf), rr_bounds.get(b, math.inf)) for b in {*bounds, *rr_bounds}}
        best = min([*found, *per_b], key=lambda c: c.iteration_s, default=None)
    stats.proven_gap = _proven_gap(best.iteration_s, bounds) if best is not None else 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    # equal times (a link-bound pipeline is as fast under several warm-ups and both families): the
    # least memory per device, then 1F1B's simpler schedule, then fewer stages
    candidates = sorted(
        found + per_b,
        key=lambda c: (c.iteration_s, c.peak_memory_bytes, c.schedule != "1f1b", len(c.layout), c.summary()),
    )
    unique, seen = [], set()
    for c in candidates:
        if c.summary() not in seen:
            seen.add(c.summary())
            unique.append(c)
    stats.seconds = time.perf_counter() - t0
    return (unique[0] if unique else None), unique[1 : keep + 1], baselines, stats


LABELS = {
    "1f1b": "1F1B",
    "zb_h1": "ZB-H1",
    "interleaved_1f1b": "interleaved 1F1B",
    "interleaved_zb": "interleaved zero bubble",
    "zbv": "ZB-V",
    "chimera": "Chimera",
    "1f1b_rr": "1F1B of round-robin copies",
    "zb_h1_rr": "ZB-H1 of round-robin copies",
}


def _statement(best: Costed, stats: SearchStats, limits: Limits, allowed: tuple[str, ...], deep: bool) -> str:
    """What the search proved, in the plan's words. Interleaved 1F1B and ZB-V are searched by shape
    (chunked_search.py) with a weaker bound, so where the plan is of another family the exact claim
    over that family comes first and theirs follows."""
    exact = [LABELS[n] for n in ("1f1b", schedules.FAMILY) if n in allowed]
    chunked = [LABELS[n] for n in (*CHUNKED, *RR) if n in allowed]  # (searched with the weaker bounds)
    warm = f" with warm-ups ×1-×{limits.max_warmup_depth}" if deep else ""
    split = bool(exact) and stats.gap_without_chunked is not None and best.schedule not in (*CHUNKED, *RR)
    if not exact:
        space = f" over {' and '.join(chunked)} layouts and micro-batches"
    elif exact == ["1F1B"] and not chunked:
        space = f" over layouts, micro-batches and 1F1B warm-ups ×1-×{limits.max_warmup_depth}" if deep else ""
    else:
        space = f" over layouts, micro-batches, {' and '.join(exact if split else exact + chunked)}{warm}"
    gap = (stats.gap_without_chunked if split else stats.proven_gap) or 0.0  # (split: the first is set)
    if gap == 0:
        how = f"auto: optimal under the cost model{space} ({stats.nodes} candidates scored)"
    else:
        how = (
            f"auto: within {human_gap(gap)} of the optimum under the cost model{space}, proven; the "
            f"budget of {limits.search_nodes} scored candidates ended the search first "
            f"(strategy.search_nodes raises it)"
        )
        if stats.gap_without_zero_bubble is not None and best.schedule != schedules.FAMILY:
            # the ZB-H1 pass's bound is weaker than 1F1B's: say what holds over 1F1B plans alone
            alone = stats.gap_without_zero_bubble
            how += (
                "; over 1F1B plans alone: optimal"
                if alone == 0
                else f"; over 1F1B plans alone: within {human_gap(alone)}"
            )
    if split:
        how += (
            f"; {' and '.join(chunked)} (device groups holding several stages or stages of copies, searched "
            f"whole where the budget affords, else locally): none faster"
            + (
                ""
                if stats.proven_gap == 0
                else f", and their bound (the busiest group's work) leaves this plan within {human_gap(stats.proven_gap)} "
                f"of the optimum over all {len(exact) + len(chunked)} families"
            )
        )
    if best.schedule in CHUNKED:
        how += (
            f"; {LABELS[best.schedule]} with {best.extra['chunks']} stages per device group (costed by the "
            f"simulator of its rank orders)"
        )
    if best.schedule in RR:
        how += (
            f"; {LABELS[best.schedule]}, copies {':'.join(map(str, best.extra['copies']))} (each runs whole "
            f"micro-batches in turn; costed by the simulator of their rank orders)"
        )
    return how


def _chunked_only(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, keep: int, t0: float
) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """strategy.schedules naming only interleaved_1f1b / zbv: their own pass, nothing else."""
    stats = SearchStats()
    found, bounds, stats.nodes = search_chunked(
        profile, topology, global_batch, limits, micro_batch_sizes(global_batch, limits), math.inf
    )
    found.sort(key=lambda c: (c.iteration_s, c.peak_memory_bytes, c.summary()))
    best = found[0] if found else None
    stats.proven_gap = _proven_gap(best.iteration_s, bounds) if best is not None else 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    stats.seconds = time.perf_counter() - t0
    return best, found[1 : keep + 1], {}, stats


def _copies_only(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, keep: int, t0: float
) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """strategy.schedules naming only stages of copies (and chunked families): the copies' pass from
    the layouts 1F1B and ZB-H1 find best (those plans themselves not chosen), then the chunked pass."""
    allowed = schedules.allowed(limits)
    rr = [f for f in RR if f in allowed]
    plain = tuple(RR_FAMILIES[f] for f in rr)
    start, runners_up, _, stats = search(
        profile, topology, global_batch, replace(limits, schedules=plain), START_PLANS, with_baselines=False
    )
    sizes = micro_batch_sizes(global_batch, limits)
    starts = [c for c in [start, *runners_up] if c is not None]
    found, bounds, scored = search_round_robin(profile, topology, global_batch, limits, sizes, starts, rr, math.inf)
    stats.nodes += scored
    if any(f in CHUNKED for f in allowed):
        chunked, chunked_bounds, scored = search_chunked(
            profile, topology, global_batch, limits, sizes, min((c.iteration_s for c in found), default=math.inf)
        )
        found += chunked
        stats.nodes += scored
        bounds = {b: min(bounds.get(b, math.inf), chunked_bounds.get(b, math.inf)) for b in {*bounds, *chunked_bounds}}
    found.sort(key=lambda c: (c.iteration_s, c.peak_memory_bytes, c.summary()))
    best = found[0] if found else None
    stats.gap_without_chunked = stats.gap_without_zero_bubble = None
    stats.proven_gap = _proven_gap(best.iteration_s, bounds) if best is not None else 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    stats.seconds = time.perf_counter() - t0
    return best, found[1 : keep + 1], {}, stats


def _default_budget_plans(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, keep: int, stats: SearchStats
) -> list[Costed]:
    """Under a budget above the default: the default budget's best plans, which the larger search
    starts from. The passes share the budget in proportion to it, so a larger one walks other paths
    (local search from other starts, another ZB-H1 pool) and could end on a slower plan than the
    default found (vgg-19 on a100x64: +5.4 % at twice the budget). Starting from them, raising
    strategy.search_nodes never returns a slower plan than the default budget's."""
    default = Limits.__dataclass_fields__["search_nodes"].default
    if limits.search_nodes <= default:
        return []
    best, runners_up, _, small = search(
        profile, topology, global_batch, replace(limits, search_nodes=default), keep, with_baselines=False
    )
    stats.nodes += small.nodes
    return [c for c in [best, *runners_up] if c is not None]


def _polished(
    starts: list[Costed],
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    stats: SearchStats,
    top: int = 3,
) -> list[Costed]:
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
        better, costed = descend(
            c,
            profile,
            topology,
            global_batch,
            limits,
            allowed,
            sizes,
            cost_budget=limits.search_nodes * POLISH_SHARE / top,
        )
        stats.nodes += costed
        if better is not c:
            out.append(better)
    return out


def _proven_gap(best: float, bounds: dict[int, float]) -> float:
    """How far above the optimum `best` can be: 1 - (least lower bound of anything not yet ruled
    out, over every micro-batch size) / best."""
    lowest = min(bounds.values(), default=math.inf)
    return 0.0 if lowest >= best * (1 - 1e-9) else 1 - lowest / best


def _sweep(
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


def smallest_memory_need(profile: ModelProfile, topology: Topology, limits: Limits) -> tuple[float, str]:
    """Per device, the least memory any layout needs (fully pipelined, one sample per micro-batch)."""
    L, D = profile.num_layers, topology.num_devices
    S = min(L, D)
    cuts = balanced_boundaries(profile, S)
    layout = tuple(StageSpec(a, z, (s,)) for s, (a, z) in enumerate(zip([0, *cuts], [*cuts, L])))
    c = evaluate(profile, topology, layout, 1, max(S, 1), limits)
    return c.peak_memory_bytes, c.summary()


def plan(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, with_baselines: bool = True
) -> Plan:
    requested = limits
    started = time.perf_counter()
    if global_batch < topology.num_devices:
        raise ValueError(
            f"global_batch_size={global_batch} is smaller than the {topology.num_devices} devices of {topology.name} "
            f"that must share it (each needs at least one sample per iteration); raise global_batch_size to "
            f">= {topology.num_devices} or use a smaller cluster"
        )
    limits = replace(limits, schedule=search_family(limits))
    best, runners_up, baselines, stats = search(profile, topology, global_batch, limits, with_baselines=with_baselines)
    if best is None and "1f1b" not in schedules.allowed(requested) and schedules.FAMILY in schedules.allowed(requested):
        other, *_ = search(profile, topology, global_batch, replace(limits, schedules=("1f1b",)))
        if other is not None:
            raise NoFeasiblePlan(
                f"no plan fits under strategy.schedules={list(requested.schedules)}: {schedules.FAMILY} keeps s more "
                f"micro-batches on stage s than 1F1B; under 1f1b {other.summary()} fits "
                f"({human_bytes(other.peak_memory_bytes)} per device); allow 1f1b (strategy.schedules=[1f1b,zb_h1]) "
                f"or add devices"
            )
    if best is None:
        need, layout = smallest_memory_need(profile, topology, limits)
        raise NoFeasiblePlan(
            f"no plan fits: even fully pipelined ({layout}) a device needs {human_bytes(need)} but "
            f"{human_bytes(topology.device_memory_bytes * (1 - limits.memory_headroom))} is usable on "
            f"{topology.name} ({human_bytes(topology.device_memory_bytes)} less {limits.memory_headroom:.0%} headroom). "
            f"To fit: more devices (cluster.nodes > {topology.nodes}), a smaller micro-batch "
            f"(strategy.micro_batch_size=1), "
            + (
                f"or a lower optimizer_factor (now {limits.optimizer_factor}: e.g. SGD); activation recomputation "
                f"was tried (recompute=auto)"
                if limits.recompute == "auto"
                else f"a lower optimizer_factor (now {limits.optimizer_factor}: e.g. SGD), or activation recomputation "
                f"(strategy.recompute=auto)"
            )
        )
    for name, c in baselines.items():
        if c is not None:
            c.extra["note"] = name
    dp = baselines.get("data parallel")
    deep = limits.schedule == "1f1b" and limits.max_warmup_depth > 1
    how = _statement(best, stats, limits, schedules.allowed(requested), deep)
    over = best.extra.get("over")
    if best.schedule == schedules.FAMILY and over is not None:
        how += f"; {best.schedule} is {over.iteration_s / best.iteration_s - 1:.1%} faster than {over.schedule} on this layout"
    if best.warmup_depth > 1:
        how += (
            f"; its ×{best.warmup_depth} warm-up (costed by the simulator) hides transfers that DAPPLE's "
            f"minimal warm-up waits on"
        )
    plain = [c for c in [best, *runners_up] if c.schedule not in CHUNKED]  # (token slices run stage per group)
    if limits.auto_token_slices and plain and [f for f in schedules.allowed(requested) if f not in CHUNKED]:
        # TeraPipe on the best layouts found (planner/terapipe.py)
        from .terapipe import improve_with_slices

        sliced = improve_with_slices(plain, profile, topology, global_batch, limits)
        # a gain within the cost model's error is not worth slicing for: every slice is more actions, more
        # transfers and a key/value cache the estimate prices only roughly
        if sliced is not None and sliced.iteration_s < best.iteration_s * (1 - SLICE_MIN_GAIN):
            how += (
                f"; token slices {list(sliced.extra['token_slices'])} (TeraPipe's dynamic programme on the best "
                f"layouts, costed by the simulator) make it {best.iteration_s / sliced.iteration_s:.2f}× faster "
                f"than its best unsliced plan"
            )
            runners_up, best = [best, *runners_up][: len(runners_up) or 1], sliced
    proof = {
        "gap": stats.proven_gap,
        "families": list(schedules.allowed(requested)),
        "candidates": stats.nodes,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return to_plan(
        best,
        profile,
        topology,
        global_batch,
        how,
        runners_up,
        data_parallel_s=dp.iteration_s if dp else None,
        proof=proof,
    )
