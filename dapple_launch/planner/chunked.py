"""Layouts whose device groups hold several stages (interleaved 1F1B, ZB-V, Chimera): costing and
fixed plans.

The model is cut into S = v·P stages over P device groups; stage s runs on group
interleaved (1F1B or zero bubble): s mod P;   ZB-V (v = 2): s for s < P, else 2P - 1 - s (a V: the turn stays on group P - 1);
Chimera (S = P = D, even): on two groups, s (the down pipeline's copy) and D - 1 - s (the up one's),
whose replica counts must match (a stage's two copies split a micro-batch alike); its costs are the
down pipeline's stages' and its all-reduce spans both copies, and each group keeps two weight copies.
Every stage of a group runs on all of the group's devices, so the stages of a group share its
replica count. Costs are the stages' own (stage_costs) with the transfers between two stages of one
group set to zero (a local hand-off); the iteration time and each group's saved activations come
from the simulator of the schedule's rank orders — the one cost path — and a device keeps the
parameters (× optimizer factor) of every stage its group holds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import SPLIT_BACKWARD, build_rank_schedule, busiest_rank_s, simulate_ranks
from ..schedule.chimera import chimera_constraint
from ..schedule.interleaved import interleaved_constraint
from .cost import Costed, StageSpec, recompute_sets, recomputed_costs, stage_allreduce, stage_costs
from .group_recompute import first_layers_to_fit
from .limits import Limits

CHUNKED = ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera")
INTERLEAVED = ("interleaved_1f1b", "interleaved_zb")  # v stages per group, s on group s mod P


def group_of(schedule: str, stage: int, groups: int) -> int:
    """The group running a stage (Chimera: its down pipeline's copy; groups_of gives both)."""
    if schedule == "zbv":
        return stage if stage < groups else 2 * groups - 1 - stage
    if schedule == "chimera":
        return stage
    return stage % groups


def groups_of(schedule: str, stage: int, groups: int) -> tuple[int, ...]:
    if schedule == "chimera":
        return (stage, groups - 1 - stage)
    return (group_of(schedule, stage, groups),)


def recomputes_to_fit(limits: Limits, schedule: str) -> bool:
    """strategy.recompute=auto on a family whose backward is not split (interleaved 1F1B, Chimera): a
    candidate that does not fit keeping its activations recomputes each stage's fewest first layers
    that fit (evaluate_chunked's refit). A split backward's W would run the recomputed forward again: ZB-V and
    interleaved zero bubble keep their activations (Limits refuses full with them)."""
    return limits.recompute == "auto" and schedule not in SPLIT_BACKWARD


def recomputed_profile(profile: ModelProfile, layers: Sequence[int] | None = None) -> ModelProfile:
    """The profile whose every layer's backward (or only `layers`') runs its forward again: a stage
    recomputing all its layers takes these times (cost.recomputed_costs adds each layer's forward,
    its fixed part included), so a bound read on it holds for every candidate that recomputes
    every layer (or those layers)."""
    again = set(range(profile.num_layers)) if layers is None else set(layers)
    out = tuple(
        replace(x, backward_s=x.backward_s + x.forward_s, backward_fixed_s=x.backward_fixed_s + x.forward_fixed_s)
        if l in again
        else x
        for l, x in enumerate(profile.layers)
    )
    return replace(profile, layers=out)


def keeps_activations(limits: Limits, schedule: str) -> bool:
    """Whether every candidate of the family keeps its stages' activations whole (none recomputed):
    the room memory leaves for micro-batches in flight bounds and filters its shapes only then."""
    return limits.recompute not in ("full", "selective") and not recomputes_to_fit(limits, schedule)


def chunks_of(schedule: str, chunks: int) -> int:
    """Stages per device group: ZB-V's V and Chimera's two pipelines hold two; interleaved's v as stated."""
    return 2 if schedule in ("zbv", "chimera") else chunks


def groups_for(schedule: str, num_stages: int, chunks: int) -> int:
    return num_stages if schedule == "chimera" else num_stages // chunks_of(schedule, chunks)


def stages_for(schedule: str, groups: int, chunks: int) -> int:
    """groups_for's inverse: Chimera's D stages on D groups, else chunks_of stages a group."""
    return groups if schedule == "chimera" else groups * chunks_of(schedule, chunks)


@lru_cache(maxsize=64)
def rank_orders(schedule: str, groups: int, num_micro_batches: int, chunks: int):
    return build_rank_schedule(schedule, groups, num_micro_batches, chunks)


def _over_both_copies(
    profile: ModelProfile, topology: Topology, c, down: StageSpec, both: StageSpec, micro_batch_size: int
):
    """A Chimera stage's costs on its down copy with its all-reduce over both copies' devices (what
    a tied weight adds on top of it, c's beyond its own buckets, kept)."""
    n, share = math.ceil(micro_batch_size / down.replicas), profile.weight_share(down.start, down.stop)
    own = stage_allreduce(profile, topology, down, n, share)
    total, after_b, after_w = stage_allreduce(profile, topology, both, n, share)
    extra = c.allreduce_s - own[0]
    return replace(
        c, allreduce_s=total + extra, allreduce_after_b_s=after_b + extra, allreduce_after_w_s=after_w + extra
    )


def evaluate_chunked(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    limits: Limits,
    schedule: str,
    chunks: int,
    cutoff: float = math.inf,
    walked: list | None = None,
    refit: bool = True,
) -> Costed | None:
    """A chunked candidate costed in full (layout: S stages, a group's stages on its devices).
    `cutoff`: a caller that keeps the candidate only if it is faster; None, unsimulated, where its
    busiest group's compute alone (busiest_rank_s, a lower bound) already reaches it, or where the
    simulation passes it (simulate_ranks stops there). `walked`: appended to each time the simulator
    ran (a search's budget counts the simulation whole, however early it stopped: the same
    candidates are searched as without the cutoff). Under strategy.recompute=auto a candidate that
    does not fit is costed again with each stage's fewest first layers recomputed that fit
    (recomputes_to_fit, group_recompute.py), and that is returned where it fits (Llama 3 70B on 256
    A100s: interleaved 1F1B fits only so, and beats 1F1B's per-stage recomputation); `refit=False`
    skips that (a caller that wants only candidates keeping their activations)."""
    S = len(layout)
    P = groups_for(schedule, S, chunks)
    costs, own = _own_costs(profile, topology, layout, micro_batch_size, schedule)
    capacity = topology.device_memory_bytes * (1 - limits.memory_headroom)
    if refit and recomputes_to_fit(limits, schedule):  # (each costed once, through this function)
        args = (micro_batch_size, num_micro_batches, limits, schedule, chunks, costs, own, capacity)
        limits = _fitting(profile, layout, *args)
    sets = recompute_sets(layout, limits)  # (Limits refuses it with a split backward)
    if sets:  # each stage's backward runs its recomputed layers' forward again (one copy's replicas)
        costs = recomputed_costs(profile, topology, own, costs, micro_batch_size, sets)
    for s in range(S - 1):
        if layout[s].devices == layout[s + 1].devices:  # the same group: a local hand-off
            costs[s] = replace(costs[s], send_activation_s=0.0)
            costs[s + 1] = replace(costs[s + 1], send_gradient_s=0.0)
    orders = rank_orders(schedule, P, num_micro_batches, chunks)
    if cutoff < math.inf and busiest_rank_s(orders, costs) >= cutoff:
        return None
    if walked is not None:
        walked.append(True)
    sim = simulate_ranks(orders, costs, record=False, cutoff=cutoff)
    if sim is None:
        return None
    params = _group_weights(profile, layout, schedule, P, limits.optimizer_factor)
    per_group = [params[g] + sim.peak_activation_bytes[g] for g in range(P)]
    memory = [max(per_group[g] for g in groups_of(schedule, s, P)) for s in range(S)]
    return Costed(
        layout,
        micro_batch_size,
        num_micro_batches,
        schedule,
        costs,
        sim.iteration_s,
        memory,
        capacity,
        extra={"chunks": chunks},
        recompute=sets if any(sets) else (),
    )


def _own_costs(
    profile: ModelProfile, topology: Topology, layout: tuple[StageSpec, ...], micro_batch_size: int, schedule: str
) -> tuple[list, tuple[StageSpec, ...]]:
    """(each stage's costs, the stages on the devices whose samples they run): a stage's own, or
    Chimera's on its down copy's devices with its all-reduce over both copies."""
    if schedule != "chimera":
        return stage_costs(profile, topology, layout, micro_batch_size), layout
    down = tuple(StageSpec(st.start, st.stop, st.devices[: len(st.devices) // 2]) for st in layout)
    costs = [
        _over_both_copies(profile, topology, c, d, st, micro_batch_size)
        for c, d, st in zip(stage_costs(profile, topology, down, micro_batch_size), down, layout)
    ]
    return costs, down


def _group_weights(
    profile: ModelProfile, layout: tuple[StageSpec, ...], schedule: str, P: int, factor: float
) -> list[float]:
    """Per group, the weights and optimizer state of the stages it holds (Chimera: a copy on each of a
    stage's two groups)."""
    params = [0.0] * P
    for s, st in enumerate(layout):
        for g in groups_of(schedule, s, P):
            params[g] += profile.span(st.start, st.stop)[3] * factor
    return params


def _fitting(
    profile: ModelProfile,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    limits: Limits,
    schedule: str,
    chunks: int,
    costs: list,
    own: tuple[StageSpec, ...],
    capacity: float,
) -> Limits:
    """The Limits of the candidate of a family that recomputes to fit (recomputes_to_fit): its
    activations kept where they fit, else each stage's fewest first layers recomputed that fit
    every device (group_recompute.first_layers_to_fit: what each rank holds at each step of its
    orders, read without a simulation), else kept (over memory, as it is). One simulation follows,
    whichever it is (before: the candidate kept, then again recomputing every layer where it did
    not fit). `costs`, `own`: the candidate's (_own_costs), before any recomputation; `capacity`:
    a device's usable bytes."""
    S = len(layout)
    P = groups_for(schedule, S, chunks)
    held = _group_weights(profile, layout, schedule, P, limits.optimizer_factor)
    orders = rank_orders(schedule, P, num_micro_batches, chunks)
    workspace = [c.workspace_bytes for c in costs]
    sets = first_layers_to_fit(profile, own, workspace, orders, held, capacity, micro_batch_size)
    marks = tuple(i for st in sets or () for i in st)
    alone = replace(limits, schedule=schedule, schedules=(schedule,), token_slices=(), auto_token_slices=False)
    if not marks:
        return replace(alone, recompute="none")
    return replace(alone, recompute="selective", recompute_layers=marks, recompute_counts=())


def simulate_chunked(c: Costed, record: bool = True):
    P = groups_for(c.schedule, len(c.layout), c.extra["chunks"])
    return simulate_ranks(rank_orders(c.schedule, P, c.num_micro_batches, c.extra["chunks"]), c.costs, record)


def group_devices(group_replicas) -> list[tuple[int, ...]]:
    """Each group's devices by default: contiguous, in group order."""
    first = list(itertools.accumulate(group_replicas, initial=0))
    return [tuple(range(first[g], first[g] + r)) for g, r in enumerate(group_replicas)]


def chunked_layout(
    schedule: str, group_replicas: list[int], stops: list[int], devices: Sequence[Sequence[int]] | None
) -> tuple[StageSpec, ...]:
    """Stages [0, stops[0]), [stops[0], stops[1]), … each on its group's devices (contiguous by default)."""
    P = len(group_replicas)
    if devices is None:
        devices = group_devices(group_replicas)
    starts = [0, *stops[:-1]]
    return tuple(
        StageSpec(a, z, tuple(d for g in groups_of(schedule, s, P) for d in devices[g]))
        for s, (a, z) in enumerate(zip(starts, stops))
    )


def group_replicas(schedule: str, num_stages: int, chunks: int, replicas: list[int]) -> list[int]:
    """strategy.replicas for a chunked layout: one for all, one per group, or one per stage with the
    stages of a group equal; else a ValueError naming the rule and what would do. Chimera: a stage's
    two copies split a micro-batch alike, so groups g and D - 1 - g take the same count."""
    P = groups_for(schedule, num_stages, chunks)
    if len(replicas) == 1:
        return replicas * P
    if schedule == "chimera" and len(replicas) == P:
        bad = [g for g in range(P) if replicas[g] != replicas[P - 1 - g]]
        if bad:
            g = bad[0]
            mirrored = [max(replicas[q], replicas[P - 1 - q]) for q in range(P)]
            raise ValueError(
                f"strategy.replicas={replicas}: under chimera device groups {g} and {P - 1 - g} hold the "
                f"two copies of stages {g} and {P - 1 - g}, so they take the same count, but have "
                f"{replicas[g]} and {replicas[P - 1 - g]}; mirror them, e.g. {mirrored}"
            )
        return list(replicas)
    if len(replicas) == P:
        return list(replicas)
    if len(replicas) == num_stages:
        per_group: dict[int, set] = {}
        for s, r in enumerate(replicas):
            per_group.setdefault(group_of(schedule, s, P), set()).add(r)
        bad = [g for g in range(P) if len(per_group[g]) > 1]
        if bad:
            g = bad[0]
            stages = [s for s in range(num_stages) if group_of(schedule, s, P) == g]
            raise ValueError(
                f"strategy.replicas={replicas}: stages {stages} share device group {g} under {schedule}, "
                f"so they share its replica count, but have {[replicas[s] for s in stages]}; give one "
                f"count per device group ({P} counts), e.g. {[max(replicas[s] for s in range(num_stages) if group_of(schedule, s, P) == q) for q in range(P)]}"
            )
        return [next(iter(per_group[g])) for g in range(P)]
    raise ValueError(
        f"strategy.replicas={replicas}: {schedule} with {num_stages} stages runs on {P} device groups; "
        f"give one count for all, one per device group ({P}), or one per stage ({num_stages})"
    )


def check_chunked(schedule: str, num_stages: int, chunks: int, num_micro_batches: int) -> None:
    """The schedule's own constraints on a stated shape, with the nearest valid values."""
    if schedule == "zbv" and chunks not in (1, 2):
        raise ValueError(
            f"strategy.chunks={chunks}: ZB-V holds exactly 2 stages per device group (a V); leave strategy.chunks=2"
        )
    v = chunks_of(schedule, chunks)
    if schedule in INTERLEAVED and v < 2:
        raise ValueError(
            f"strategy.chunks={v}: interleaved 1F1B holds at least 2 stages per device group; "
            f"1 is plain 1F1B (strategy.schedule=1f1b)"
        )
    if schedule != "chimera" and (num_stages % v or num_stages < v):
        lo, hi = max(v, num_stages // v * v), (num_stages // v + 1) * v
        near = sorted({lo, hi} - {num_stages})
        raise ValueError(
            f"strategy.stages={num_stages} with {v} stages per device group ({schedule}): the stages "
            f"must be a multiple of {v}; use {' or '.join(map(str, near))}"
        )
    if schedule in INTERLEAVED:
        why = interleaved_constraint(num_stages // v, num_micro_batches, v)
        if why:
            raise ValueError(f"{why} (strategy.num_micro_batches)")
    if schedule == "chimera":
        why = chimera_constraint(num_stages, num_micro_batches)
        if why:
            raise ValueError(f"{why} (strategy.stages, strategy.num_micro_batches)")
