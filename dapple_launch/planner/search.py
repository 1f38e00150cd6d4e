"""The driver: the fastest plan under the cost model that fits memory, over every allowed family.

The baselines and an even split are the first incumbent. Then each proposer in PROPOSERS, in turn,
from what the ones before found (proposal.py): the per-stage one (stage_search.py: cuts, uneven
replicas, placement, micro-batches, 1F1B warm-ups, by branch and bound), ZB-H1 (zero_bubble_search.py),
stages of round-robin copies (round_robin_search.py), device groups holding several stages
(chunked_search.py), each stage's own warm-up for the best 1F1B and ZB-H1 plans
(stage_warmups.py), and 1F1B and ZB-H1 from the layouts the proof's tables attain (table_starts.py,
last: nothing depends on it). Each hands back its candidates and, per micro-batch size, a bound on what
it did not hand back; the driver keeps one incumbent, one budget (strategy.search_nodes, counted as
candidates scored) and one proven gap: how far the incumbent can be above the least bound any of
them left. A node budget, not a clock: the same inputs give the same plan anywhere. Token slices
(terapipe.py) and the statement come after, on the plan chosen.

Copies come before device groups for the proof: the bounds over the shapes' cuts that device groups
compute are counted in cells and only raise a shape up to the least bound the others left (above it
the gap is the same), so with the copies' bound among those, their cells go further (GNMT-32 on
16 × 1 V100 at 10 Gbps, G 1024: within 45.9 % -> 26.9 %, the same plan). The 64 rows of the planner
benchmark plan the same either way.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import ParamSpec, TypeVar

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule.round_robin import RR_FAMILIES
from . import zero_bubble_search as zero_bubble
from .baselines import all_baselines, balanced_boundaries, balanced_uniform
from .branch import SearchStats, replica_choices
from .build import to_plan
from .chunked import CHUNKED, recomputes_to_fit
from .chunked_search import DeviceGroups, search_chunked
from .cost import Costed, StageSpec, evaluate
from .explain import human_bytes, human_gap
from .limits import Limits
from .link_warmup import LINKED
from .plan import Plan
from .proposal import Proposal, Proposer, SearchState, proven_gap
from .round_robin import RR
from .round_robin_search import START_PLANS, Copies, search_round_robin
from .shapes import micro_batch_sizes
from .stage_search import StageFamilies
from .stage_warmups import StageWarmups
from .table_starts import TableStarts
from .zero_bubble_search import ZeroBubble, search_family

__all__ = ["NoFeasiblePlan", "plan", "replica_choices", "search", "micro_batch_sizes"]


# The proposers, in the order the driver asks them: each starts from what the ones before found.
PROPOSERS: tuple[Proposer, ...] = (
    StageFamilies(),
    ZeroBubble(),
    Copies(),
    DeviceGroups(),
    StageWarmups(),
    TableStarts(),
)  # (order: module doc)


class NoFeasiblePlan(ValueError):
    pass


# the least estimated gain (a share of the iteration) for which strategy.token_slices=auto slices
SLICE_MIN_GAIN = 0.01


# The search allocates millions of short-lived objects (rank orders, simulations, tables) and keeps
# few of them, making almost no reference cycles: at Python's default thresholds (700, 10, 10) the
# collector walks the surviving orders over and over. Measured on four planner rows (VGG-19 and
# GNMT-32 on 64 A100s at G 1024, BERT-48 on 2 x 8 V100, GNMT-32 on 16 x 1 V100 at 10 Gbps): 6.9-7.6 s
# at the defaults, 6.1-6.2 s at these; building GNMT-32's chunked rank orders alone 0.53 -> 0.19 s.
GC_THRESHOLDS = (100_000, 50, 100)
P = ParamSpec("P")
R = TypeVar("R")


def _collecting_less(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run under GC_THRESHOLDS (or the caller's, where higher), restored after it."""

    @functools.wraps(fn)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        before = gc.get_threshold()
        gc.set_threshold(*(max(a, b) for a, b in zip(before, GC_THRESHOLDS)))
        try:
            return fn(*args, **kwargs)
        finally:
            gc.set_threshold(*before)

    return wrapped


@_collecting_less
def search(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    keep: int = 4,
    with_baselines: bool = True,
    for_starts: bool = False,
) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """(best, runners-up, baselines, stats). `with_baselines=False`: the search's own space only (a
    frontier's searches below the first: the baselines were compared once, on the whole card).
    `for_starts`: its plans are another search's starts (SearchState.for_starts)."""
    t0 = time.perf_counter()
    if not [f for f in limits.allowed() if f not in (*CHUNKED, *RR)] and any(f in RR for f in limits.allowed()):
        return _copies_only(profile, topology, global_batch, limits, keep, t0)
    if not [f for f in limits.allowed() if f not in CHUNKED]:  # chunked families alone
        return _chunked_only(profile, topology, global_batch, limits, keep, t0)
    state, baselines = initial_state(profile, topology, global_batch, limits, keep, with_baselines)
    state.for_starts = for_starts
    drive(state)
    stats = state.stats
    stats.proven_gap = state.gap()
    stats.proven_optimal = stats.proven_gap == 0.0
    # equal times (a link-bound pipeline is as fast under several warm-ups and both families): the
    # least memory per device, then 1F1B's simpler schedule, then fewer stages
    candidates = sorted(
        state.found,
        key=lambda c: (c.iteration_s, c.peak_memory_bytes, c.schedule != "1f1b", len(c.layout), c.summary()),
    )
    unique, seen = [], set()
    for c in candidates:
        if c.summary() not in seen:
            seen.add(c.summary())
            unique.append(c)
    stats.seconds = time.perf_counter() - t0
    return (unique[0] if unique else None), unique[1 : keep + 1], baselines, stats


def initial_state(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, keep: int, with_baselines: bool
) -> tuple[SearchState, dict[str, Costed | None]]:
    """The driver's state before any proposer: the baselines and an even split as the first
    candidates (and, under a budget above the default, the default budget's plans); the baselines."""
    state = SearchState(profile, topology, global_batch, limits, micro_batch_sizes(global_batch, limits), keep=keep)
    baselines = all_baselines(profile, topology, global_batch, limits) if with_baselines else {}
    start = balanced_uniform(profile, topology, global_batch, limits)
    state.prior = _default_budget_plans(profile, topology, global_batch, limits, keep, state.stats)
    state.found = [c for c in [*baselines.values(), start, *state.prior] if c is not None and c.schedule not in CHUNKED]
    return state, baselines


def drive(state: SearchState) -> list[tuple[Proposer, Proposal]]:
    """One driver: each proposer in turn, from what the others found; one incumbent, one budget
    (state.stats.nodes), one proven gap over the least bound any of them left. (proposer, proposal)
    of each that ran, for the tests of their bounds."""
    ran = []
    for proposer in PROPOSERS:
        if proposer.wanted(state):
            proposal = proposer.propose(state)
            state.take(proposal)
            ran.append((proposer, proposal))
    return ran


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
    exact = [LABELS[n] for n in ("1f1b", zero_bubble.FAMILY) if n in allowed]
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
        if stats.gap_without_zero_bubble is not None and best.schedule != zero_bubble.FAMILY:
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
                else ", and their bounds (the busiest group over its cuts, the slowest stage of copies over every cut"
                + (
                    ""
                    if limits.recompute in ("full", "selective")  # (their stages recompute: no room counted)
                    else ", with the room memory leaves for micro-batches in flight where they keep their activations"
                )
                + ") "
                f"leave this plan within {human_gap(stats.proven_gap)} "
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
    stats.proven_gap = proven_gap(best.iteration_s, bounds) if best is not None else 0.0
    stats.proven_optimal = stats.proven_gap == 0.0
    stats.seconds = time.perf_counter() - t0
    return best, found[1 : keep + 1], {}, stats


def _copies_only(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, keep: int, t0: float
) -> tuple[Costed | None, list[Costed], dict[str, Costed | None], SearchStats]:
    """strategy.schedules naming only stages of copies (and chunked families): the copies' pass from
    the layouts 1F1B and ZB-H1 find best (those plans themselves not chosen), then the chunked pass."""
    allowed = limits.allowed()
    rr = [f for f in RR if f in allowed]
    plain = tuple(RR_FAMILIES[f] for f in rr)
    start, runners_up, _, stats = search(
        profile, topology, global_batch, replace(limits, schedules=plain), START_PLANS, False, for_starts=True
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
    stats.proven_gap = proven_gap(best.iteration_s, bounds) if best is not None else 0.0
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
    if best is None and "1f1b" not in requested.allowed():
        # the families asked for fit nowhere: where 1F1B does, say so (the fully pipelined layout
        # below would fit and could not say why none did)
        other, *_ = search(profile, topology, global_batch, replace(limits, schedules=("1f1b",)))
        if other is not None:
            asked = list(requested.allowed())
            why = (
                [f"{zero_bubble.FAMILY} keeps s more micro-batches on stage s than 1F1B"]
                if zero_bubble.FAMILY in asked
                else []
            )
            # (recompute=auto fits 1F1B, GPipe, interleaved 1F1B and Chimera by recomputing; the others
            # keep every activation)
            keep_all = [
                f
                for f in asked
                if f not in ("1f1b", "gpipe", zero_bubble.FAMILY)
                and not (f in CHUNKED and recomputes_to_fit(limits, f))
            ]
            if other.recompute and keep_all and limits.recompute == "auto":
                why.append(f"{', '.join(keep_all)} recompute no layers under strategy.recompute=auto (1f1b does)")
            raise NoFeasiblePlan(
                f"no plan fits under strategy.schedules={asked}"
                + (f": {'; '.join(why)}" if why else "")
                + f"; under 1f1b {other.summary()} fits ({human_bytes(other.peak_memory_bytes)} per device); "
                f"allow 1f1b (strategy.schedules=[1f1b,{','.join(asked)}]) or add devices"
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
    how = _statement(best, stats, limits, requested.allowed(), deep)
    over = best.extra.get("over")
    if best.schedule == zero_bubble.FAMILY and over is not None:
        how += f"; {best.schedule} is {over.iteration_s / best.iteration_s - 1:.1%} faster than {over.schedule} on this layout"
    if best.warmup_depth == LINKED:  # (link_warmup.py)
        how += (
            f"; each stage's warm-up ({':'.join(map(str, best.warmup))} forwards) keeps it ahead of the next by their "
            f"round trip over the link between them (costed by the simulator)"
        )
    if best.warmup_depth > 1:
        depths = best.extra.get("depths")
        how += (
            f"; its ×{best.warmup_depth} warm-up (costed by the simulator) hides transfers that DAPPLE's "
            f"minimal warm-up waits on"
            if depths is None
            else f"; each stage's own warm-up depth (×{':'.join(map(str, depths))}, costed by the simulator) "
            f"hides the transfers that one depth for all stages waits on or pays for in memory"
        )
    searched = best
    plain = [c for c in [best, *runners_up] if c.schedule not in CHUNKED]  # (token slices run stage per group)
    if limits.auto_token_slices and plain and [f for f in requested.allowed() if f not in CHUNKED]:
        # TeraPipe on the best layouts found (planner/terapipe.py)
        from .terapipe import improve_with_slices

        sliced = improve_with_slices(
            plain, profile, topology, global_batch, limits, cutoff=best.iteration_s * (1 - SLICE_MIN_GAIN)
        )
        # a gain within the cost model's error is not worth slicing for: every slice is more actions, more
        # transfers and a key/value cache the estimate prices only roughly
        if sliced is not None and sliced.iteration_s < best.iteration_s * (1 - SLICE_MIN_GAIN):
            how += (
                f"; token slices {list(sliced.extra['token_slices'])} (TeraPipe's dynamic programme on the best "
                f"layouts, costed by the simulator) make it {best.iteration_s / sliced.iteration_s:.2f}× faster "
                f"than its best unsliced plan"
            )
            runners_up, best = [best, *runners_up][: len(runners_up) or 1], sliced
    gap = stats.proven_gap
    if best.schedule == "terapipe" and searched is not best:
        # the bounds cover the families searched, not token slices: how far the sliced plan is above
        # the least any of them can do (it beat their best, so it is nearer than that plan was)
        gap = max(0.0, 1 - searched.iteration_s * (1 - stats.proven_gap) / best.iteration_s)
    proof = {
        "gap": gap,
        "families": list(requested.allowed()),
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
