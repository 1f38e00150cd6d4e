"""TensorOpt's FT: the frontier of plans trading iteration time against peak memory per device.

Method (epsilon-constraint): the fastest plan under the card's memory is the first point; each next
point is the fastest plan under a cap just below the last point's peak memory, until no plan fits.
Each search is the planner's own (search.plan: layouts, micro-batches, warm-ups, schedules), with
recomputation per stage (recompute=auto: a stage recomputes its fewest first layers that fit the cap),
so every point is a full Plan with its own proven gap.

Exact (step 0): the next cap is the last peak less one part in 10^12: with searches that end proven
optimal, the points are exactly the non-dominated (time, memory) pairs of the space.
Bucketed (step e > 0): the next cap is the last peak × (1 - e), so a frontier spanning memories
m_max..m_min has at most 1 + log(m_max / m_min) / -log(1 - e) points. What that costs, proven: every
exact frontier point (t*, m*) is dominated by a returned point (t, m) with t <= t* and
m < m* / (1 - e) (the last search whose cap was >= m* found t <= t*, and its peak m satisfies
m (1 - e) < m*, else the next cap would still be >= m*). Tests check both against enumeration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .explain import human_bytes, human_seconds, recomputed_per_stage
from .limits import Limits
from .plan import Plan
from .search import NoFeasiblePlan, plan

EXACT = 1e-12  # a cap "just below" a peak, for step 0
LATER_SHARE = 0.25  # of strategy.search_nodes, what each search below the first may score


@dataclass(frozen=True)
class Frontier:
    """Plans to choose from: one device count's time-memory frontier (fastest first), or, with
    strategy.devices=auto, each device count's (fewest devices first); `chosen` indexes `points`."""

    points: tuple[Plan, ...]
    chosen: int | None  # None: no point meets the budget or the deadline
    step: float
    searches: int
    seconds: float
    usable_bytes: float  # the card's memory less headroom: the first cap
    budget_bytes: float | None = None
    deadline_s: float | None = None
    why_none: str = ""  # when chosen is None: what the nearest point needs

    def peak(self, k: int) -> float:
        return max(self.points[k].estimate.peak_memory_bytes)

    @property
    def plan(self) -> Plan:
        if self.chosen is None:
            raise NoPointFits(self.why_none)
        return self.points[self.chosen]


class NoPointFits(ValueError):
    pass


def device_seconds_per_sample(p: Plan) -> float:
    """What a Slurm user pays for: devices held × iteration time, per sample."""
    return p.world_size * p.estimate.iteration_s / p.global_batch_size


def non_dominated(plans: list[Plan]) -> list[Plan]:
    """Fastest first; a plan is dropped when another is no slower and needs no more memory (one strictly)."""
    ordered = sorted(plans, key=lambda p: (p.estimate.iteration_s, max(p.estimate.peak_memory_bytes)))
    out: list[Plan] = []
    for p in ordered:
        m = max(p.estimate.peak_memory_bytes)
        if out and max(out[-1].estimate.peak_memory_bytes) <= m:
            continue  # an earlier (no slower) point needs no more memory
        if out and out[-1].estimate.iteration_s == p.estimate.iteration_s:
            out.pop()  # as fast with less memory: the earlier one is dominated
        out.append(p)
    return out


def frontier(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    step: float = 0.1,
    max_points: int = 64,
) -> tuple[list[Plan], int]:
    """(non-dominated plans fastest first, searches run). Searches use `limits` with recompute=auto
    unless recomputation is switched off (none) or fixed (full / selective)."""
    if not 0 <= step < 1:
        raise ValueError(
            f"strategy.frontier_step={step} must be in [0, 1): the relative memory step between "
            f"frontier searches (0 = exact)"
        )
    keep = 1 - limits.memory_headroom
    cap = topology.device_memory_bytes * keep
    found: list[Plan] = []
    searches = 0
    while len(found) < max_points:
        capped = replace(topology, device_memory_bytes=cap / keep)
        searches += 1
        try:
            # below the card, each search gets a share of the node budget (each point states its own gap)
            # and leaves the baselines out (compared once, on the whole card: they are no point's bound)
            p = plan(
                profile,
                capped,
                global_batch,
                limits if not found else replace(limits, search_nodes=max(1, int(limits.search_nodes * LATER_SHARE))),
                with_baselines=not found,
            )
        except NoFeasiblePlan:
            break
        found.append(replace(p, device_memory_bytes=topology.device_memory_bytes))
        peak = max(p.estimate.peak_memory_bytes)
        nxt = peak * (1 - step) if step > 0 else peak * (1 - EXACT)
        if nxt >= cap:  # (a plan at the cap itself: step below it)
            nxt = cap * (1 - max(step, EXACT))
        cap = nxt
    return non_dominated(found), searches


def choose(
    points: list[Plan],
    objective: str,
    budget_bytes: float | None = None,
    max_slowdown: float = 0.1,
    deadline_s: float | None = None,
) -> int | None:
    """Among the points within the memory budget: with a deadline, the cheapest (device-seconds per
    sample) that meets it, faster first on ties; else time: the fastest (fewer devices on ties);
    memory: the least memory among those within `max_slowdown` of the fastest; pareto: as time (the
    frontier is the answer, the chosen point is where a run starts)."""
    within = [
        k for k, p in enumerate(points) if budget_bytes is None or max(p.estimate.peak_memory_bytes) <= budget_bytes
    ]
    if deadline_s is not None:
        ok = [k for k in within if points[k].estimate.iteration_s <= deadline_s]
        return min(
            ok, key=lambda k: (device_seconds_per_sample(points[k]), points[k].estimate.iteration_s), default=None
        )
    if not within:
        return None
    fastest = min(within, key=lambda k: (points[k].estimate.iteration_s, points[k].world_size))
    if objective != "memory":
        return fastest
    limit = points[fastest].estimate.iteration_s * (1 + max_slowdown)
    ok = [k for k in within if points[k].estimate.iteration_s <= limit * (1 + 1e-12)]
    return min(ok, key=lambda k: (max(points[k].estimate.peak_memory_bytes), points[k].estimate.iteration_s))


def device_counts(topology: Topology, global_batch: int, max_devices: int | None = None) -> list[int]:
    """1 .. one node's devices, then whole nodes: what a Slurm user can ask for."""
    k, most = topology.devices_per_node, min(topology.num_devices, max_devices or topology.num_devices, global_batch)
    return [n for n in [*range(1, k + 1), *range(2 * k, topology.num_devices + 1, k)] if n <= most]


def sub_cluster(topology: Topology, devices: int) -> Topology:
    """The first `devices` devices of the cluster: part of one node, or whole nodes."""
    k = topology.devices_per_node
    if devices < k:
        return replace(topology, nodes=1, devices_per_node=devices)
    return replace(topology, nodes=devices // k)


def plan_choice(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    objective: str = "time",
    budget_bytes: float | None = None,
    max_slowdown: float = 0.1,
    step: float = 0.1,
    devices: str = "all",
    deadline_s: float | None = None,
    max_devices: int | None = None,
) -> Frontier:
    """The plans an objective chooses among, and its choice (see choose)."""
    t0 = time.perf_counter()
    usable = topology.device_memory_bytes * (1 - limits.memory_headroom)
    if budget_bytes is not None and budget_bytes > usable:
        raise ValueError(
            f"strategy.memory_budget_gib={budget_bytes / 2**30:g} is more than the "
            f"{human_bytes(usable)} usable on {topology.name} ({human_bytes(topology.device_memory_bytes)} "
            f"less {limits.memory_headroom:.0%} headroom); give a budget below it"
        )
    counts = device_counts(topology, global_batch, max_devices) if devices == "auto" else [topology.num_devices]
    points: list[Plan] = []
    searches = 0
    last: Exception | None = None  # the newest search's refusal
    for n in counts:
        topo = sub_cluster(topology, n) if n != topology.num_devices else topology
        if objective in ("pareto", "memory"):
            found, k = frontier(profile, topo, global_batch, limits, step)
            searches += k
            if objective == "memory":  # the least memory within the slowdown, per device count
                pick = choose(found, "memory", budget_bytes, max_slowdown)
                found = [found[pick]] if pick is not None else []
        else:  # the fastest within the budget: one search under it
            cap = budget_bytes if budget_bytes is not None else usable
            capped = replace(topo, device_memory_bytes=cap / (1 - limits.memory_headroom))
            found = []
            searches += 1
            try:
                found = [plan(profile, capped, global_batch, limits)]
            except NoFeasiblePlan as exc:
                last = exc
            if not found and len(counts) == 1 and budget_bytes is None:
                assert last is not None  # (nothing found: the search said why)
                raise last  # its message says what would fit
        points += [
            replace(p, device_memory_bytes=topology.device_memory_bytes, devices_per_node=topology.devices_per_node)
            for p in found
        ]
    if not points and budget_bytes is not None and objective == "time":
        # nothing within the budget: the frontier under the card says what the least memory is
        for n in counts:
            found, k = frontier(
                profile, sub_cluster(topology, n) if n != topology.num_devices else topology, global_batch, limits, step
            )
            searches += k
            points += [
                replace(p, device_memory_bytes=topology.device_memory_bytes, devices_per_node=topology.devices_per_node)
                for p in found
            ]
    # one order for the table, pareto.json and strategy.plan_index: fastest first
    points.sort(key=lambda p: (p.estimate.iteration_s, p.world_size, max(p.estimate.peak_memory_bytes)))
    chosen = choose(points, objective, budget_bytes, max_slowdown, deadline_s) if points else None
    why = ""
    if chosen is None:
        if not points:
            why = (
                f"no plan fits on {'any of ' if len(counts) > 1 else ''}{counts} devices of {topology.name}"
                + (f" within strategy.memory_budget_gib={budget_bytes / 2**30:g}" if budget_bytes else "")
                + "; add devices, lower the global batch's micro-batch size or the optimizer_factor"
            )
        elif deadline_s is not None:
            fastest = min(points, key=lambda p: p.estimate.iteration_s)
            why = (
                f"no device count meets strategy.deadline_s_per_iteration={deadline_s:g}: the fastest plan, on "
                f"{fastest.world_size} devices, takes {human_seconds(fastest.estimate.iteration_s)}; raise the "
                f"deadline or strategy.max_devices, or use a larger cluster"
            )
        else:
            assert budget_bytes is not None  # (the one choice left that can find none: the memory budget)
            least = min(points, key=lambda p: max(p.estimate.peak_memory_bytes))
            why = (
                f"no plan fits strategy.memory_budget_gib={budget_bytes / 2**30:g} ({human_bytes(budget_bytes)}): "
                f"the least memory is {human_bytes(max(least.estimate.peak_memory_bytes))} per device "
                f"({least.num_stages} stages {least.layout()}, {least.num_micro_batches}×{least.micro_batch_size}, "
                f"{human_seconds(least.estimate.iteration_s)}); raise the budget or add devices"
            )
    return Frontier(
        tuple(points), chosen, step, searches, time.perf_counter() - t0, usable, budget_bytes, deadline_s, why
    )


def describe(f: Frontier) -> str:
    """The frontier as a table, the chosen point marked."""
    if not f.points:
        return "frontier: no plan fits"
    rows = [
        (
            "",
            "#",
            "iteration",
            "memory/device",
            "devices",
            "samples/s",
            "device·s/sample",
            "layout",
            "recompute",
            "schedule",
        )
    ]
    for k, p in enumerate(f.points):
        e = p.estimate
        rec = recomputed_per_stage(p)
        even = len({s.replicas for s in p.stages}) == 1
        layout = (
            f"{p.num_stages} stage{'s' if p.num_stages > 1 else ''} × {p.stages[0].replicas}"
            if even
            else f"{p.num_stages} stages {p.layout()}"
        )
        rows.append(
            (
                "→" if k == f.chosen else "",
                str(k),
                human_seconds(e.iteration_s),
                human_bytes(max(e.peak_memory_bytes)),
                str(p.world_size),
                f"{e.samples_per_s:.1f}",
                f"{device_seconds_per_sample(p):.4g}",
                f"{layout}, {p.num_micro_batches}×{p.micro_batch_size}",
                rec,
                p.schedule + (" (deeper warm-up)" if p.warmup else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    how = (
        "exact"
        if f.step == 0
        else f"memory steps of {f.step:.0%}: each exact point is matched by one no slower within ×{1 / (1 - f.step):.3f} its memory"
    )
    lines = [
        f"frontier: {len(f.points)} plans (time against memory per device; {f.searches} searches, "
        f"{f.seconds:.2f} s; {how}); → marks the chosen plan; pareto.json lists them in this order "
        f"(strategy=file strategy.plan_file=pareto.json strategy.plan_index=#)"
    ]
    for j, r in enumerate(rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    if f.chosen is None:
        lines.append(f.why_none)
    return "\n".join(lines)


def frontier_to_json(f: Frontier) -> str:
    import json

    return json.dumps([p.to_dict() for p in f.points], indent=2)
