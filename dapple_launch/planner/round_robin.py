"""Stages of round-robin copies (schedule/round_robin.py: 1f1b_rr, zb_h1_rr): their costing.

A stage of r replicas splits each micro-batch of b samples r ways, so when r does not divide b its
replicas run ceil(b / r) samples and some of them idle; at the small micro-batches a deep pipeline
wants, r > b leaves r - b replicas idle outright. VGG-19 on 16 V100s is the case: its convolutions
are 69 % of the compute, which wants 11 of the 16 devices, but 11 replicas of a micro-batch of 8
do the work of 8. Copies cut the granularity at micro-batches instead: the stage's r devices form
c = r / g copies of g devices each, micro-batch m running whole on copy m mod c.

The canonical copies of a stage are the fewest whose copies split b evenly: g = gcd(r, b), c = r / g
(c = 1 when r divides b, the plain stage). Costs: a copy's forward and backward on b / g samples;
a transfer between copies of two stages moves the micro-batch's cut over the slower of the two
stages' links, split over the smaller copy; the gradient all-reduce spans all the stage's devices.
The simulator of the rank orders (each copy a rank) times the candidate, the one cost path.

The search pass over copies is round_robin_search.py."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import simulate_ranks
from ..schedule.round_robin import RR_FAMILIES, copy_warmup, round_robin, round_robin_constraint
from .cost import Costed, StageSpec, recompute_sets, recomputed_costs, stage_allreduce, stage_costs
from .limits import Limits
from .link_warmup import LINKED, link_warmup

RR = tuple(RR_FAMILIES)


@lru_cache(maxsize=64)
def rank_orders(family: str, copies: tuple[int, ...], num_micro_batches: int, warmup: tuple[int, ...]):
    """round_robin's rank orders, kept: a search's local moves keep most candidates' copies, micro-batch
    count and warm-up (VGG-19 on 64 A100s: 24 distinct of 42), and building the orders and their
    tables the simulator reads costs as much as simulating them."""
    return round_robin(family, copies, num_micro_batches, warmup)


def canonical_copies(replicas: int, micro_batch_size: int) -> int:
    """The fewest copies whose g = replicas / copies devices split a micro-batch evenly: r / gcd(r, b)."""
    return replicas // math.gcd(replicas, micro_batch_size)


def copy_specs(layout: tuple[StageSpec, ...], copies: tuple[int, ...]) -> tuple[StageSpec, ...]:
    """Each stage as one of its copies (its first g devices): what a copy's costs are computed on."""
    return tuple(StageSpec(st.start, st.stop, st.devices[: st.replicas // c]) for st, c in zip(layout, copies))


def check_copies(layout: tuple[StageSpec, ...], copies: tuple[int, ...], num_micro_batches: int) -> str:
    """'' when the copies suit the layout; else the rule, the numbers and the fix."""
    if len(copies) != len(layout):
        return f"strategy.copies={list(copies)} must give one count per stage ({len(layout)} stages)"
    for s, (st, c) in enumerate(zip(layout, copies)):
        if c < 1 or st.replicas % c:
            ok = [d for d in range(1, st.replicas + 1) if st.replicas % d == 0]
            return (
                f"stage {s} has {st.replicas} replicas, which {c} copies cannot share evenly (a copy runs "
                f"whole micro-batches on its devices); use one of {ok}"
            )
    return round_robin_constraint(tuple(copies), num_micro_batches)


def fitted_depths(costs: list, copies: tuple[int, ...], num_micro_batches: int) -> tuple[int, ...]:
    """Per-stage warm-up depths (copy_warmup) that keep each copy busy through its round trip: the
    pipeline takes a micro-batch every tau = max_s (F_s + B_s) / c_s (its busiest stage per copy), so
    a copy of stage s gets one every c_s tau, and the first it starts returns after its round trip
    R_s = F_s + (its activation's way on, the later stages' round trip, its gradient's way back) + B_s;
    it keeps ceil(R_s / (c_s tau)) in flight, depth ceil(that / (S - s)). A starting point for the
    descent over depths, not a plan: the simulator costs it."""
    S = len(costs)
    busy = [c.forward_s + c.backward_s + (c.input_s + c.weight_s if c.backward_s == 0 else 0.0) for c in costs]
    tau = max(x / c for x, c in zip(busy, copies))
    depths, trip = [1] * S, 0.0
    for s in range(S - 1, -1, -1):
        trip = busy[s] + (costs[s].send_activation_s + trip + costs[s + 1].send_gradient_s if s < S - 1 else 0.0)
        if tau > 0:
            flight = min(num_micro_batches, math.ceil(trip / (copies[s] * tau)))
            depths[s] = max(1, math.ceil(flight / (S - s)))
    return tuple(depths)


def rr_costs(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    copies: tuple[int, ...],
    b: int,
    memo: dict | None = None,
) -> list:
    """Per stage, one copy's step costs; transfers over the slower link of the two stages' devices;
    the all-reduce (and a tied weight's) over every device of the stage."""
    one = copy_specs(layout, copies)
    costs = stage_costs(profile, topology, one, b, memo)
    for s in range(len(layout) - 1):
        total = profile.cut_bytes[layout[s].stop - 1] * b / profile.batch_size
        bw, lat = topology.p2p(layout[s].devices, layout[s + 1].devices)
        t = lat + max(total / one[s].replicas, total / one[s + 1].replicas) / bw
        costs[s] = replace(costs[s], send_activation_s=t)
        costs[s + 1] = replace(costs[s + 1], send_gradient_s=t)
    tied = [0.0] * len(layout)
    for layers, nbytes in profile.tied:
        holders = [s for s, st in enumerate(layout) if any(st.start <= i < st.stop for i in layers)]
        if len(holders) > 1:
            extra = topology.allreduce_s(tuple(d for s in holders for d in layout[s].devices), nbytes)
            for s in holders:
                tied[s] += extra
    for s, (st, c1) in enumerate(zip(layout, one)):
        n = math.ceil(b / c1.replicas)
        total, after_b, after_w = stage_allreduce(profile, topology, st, n, profile.weight_share(st.start, st.stop))
        costs[s] = replace(
            costs[s],
            allreduce_s=total + tied[s],
            allreduce_after_b_s=after_b + tied[s],
            allreduce_after_w_s=after_w + tied[s],
        )
    return costs


def evaluate_rr(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    copies: tuple[int, ...],
    b: int,
    num_micro_batches: int,
    limits: Limits,
    family: str,
    depth: int | tuple[int, ...] = 1,
    cutoff: float = math.inf,
    memo: dict | None = None,
) -> Costed | None:
    """A candidate of copies costed in full by the simulator of its rank orders; None where it is
    slower than `cutoff`: unsimulated where its busiest copy's compute alone passes it, else as
    soon as the simulation does (simulate_ranks). `depth`: the warm-up depth of every stage, or one
    per stage (copy_warmup), or LINKED (link_warmup)."""
    costs = rr_costs(profile, topology, layout, copies, b, memo)
    sets = recompute_sets(layout, limits) if family == "1f1b_rr" else ()
    if sets:  # (Limits refuses recomputation with a split backward)
        costs = recomputed_costs(profile, topology, copy_specs(layout, copies), costs, b, sets)
    if depth == LINKED:
        warmup = link_warmup(costs, copies, num_micro_batches)
    else:
        warmup = copy_warmup(copies, num_micro_batches, depth)
    orders = rank_orders(family, copies, num_micro_batches, warmup)
    sim = simulate_ranks(orders, costs, record=False, cutoff=cutoff)
    if sim is None:
        return None
    first = 0
    memory = []
    for st, c in zip(layout, copies):
        peak = max(sim.peak_activation_bytes[first : first + c])
        first += c
        memory.append(profile.span(st.start, st.stop)[3] * limits.optimizer_factor + peak)
    capacity = topology.device_memory_bytes * (1 - limits.memory_headroom)
    return Costed(
        layout,
        b,
        num_micro_batches,
        family,
        costs,
        sim.iteration_s,
        memory,
        capacity,
        extra={"copies": tuple(copies), **({} if isinstance(depth, int) else {"depths": tuple(depth)})},
        warmup=warmup,
        warmup_depth=depth if isinstance(depth, int) else max(depth),
        recompute=sets if any(sets) else (),
    )


def simulate_rr(c: Costed, record: bool = True):
    return simulate_ranks(rank_orders(c.schedule, c.extra["copies"], c.num_micro_batches, c.warmup), c.costs, record)
