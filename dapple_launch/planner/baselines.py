"""Baselines planned under the same cost model, for comparison and for `speedup_over_data_parallel`."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule.one_f_one_b import deeper_warmup
from .branch import replica_choices
from .cost import Costed, StageSpec, bucket_rings_s, evaluate, send_s, speed_ratio, stage_costs
from .limits import Limits
from .shapes import divisors
from .warmup import warmup_bound


def best_over_micro_batches(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    global_batch: int,
    limits: Limits,
    min_micro_batches: int = 1,
) -> Costed | None:
    """The fastest micro-batch count for a fixed layout that fits memory (None if none does)."""
    return fastest(profile, topology, [(layout, min_micro_batches)], global_batch, limits)


def fastest(
    profile: ModelProfile,
    topology: Topology,
    layouts: list[tuple[tuple[StageSpec, ...], int]],
    global_batch: int,
    limits: Limits,
) -> Costed | None:
    """The fastest (layout, micro-batch count) that fits memory over `layouts`, each with its least
    micro-batch count; ties (within rounding) go to the earlier layout, then the fewer micro-batches.
    The candidates are taken in increasing compute_floor (one layout under 1F1B: the greater of it
    and the warm-up bound) and the rest skipped once that floor passes the best found; one whose
    busy_floor or link_floor passes it is not costed, and under 1F1B one whose warmup.py bound
    (valid at any warm-up; recomputation only adds time) passes it is not simulated: the full
    sweep's answer at a fraction of its stage costs and simulations."""
    todo = []
    speed = speed_ratio(profile, topology)
    for index, (layout, min_micro_batches) in enumerate(layouts):
        widest = max(s.replicas for s in layout)
        for m in divisors(global_batch):
            b = global_batch // m
            if m < min_micro_batches or b < widest:
                continue
            if limits.micro_batch_size and b != limits.micro_batch_size:
                continue
            todo.append((compute_floor(profile, layout, b, m, speed), index, m, layout, None))
    if len(layouts) == 1 and limits.schedule == "1f1b":
        # One layout (data parallel, DAPPLE straight): its few sizes' stage costs are cheap, and the
        # pipeline's fill, which the compute floor leaves out, tells them apart: 64 one-device
        # stages run 1,024 micro-batches fastest, the last size by the compute floor, so each
        # size was simulated (GNMT-32 on 64 A100s: five simulations of up to 131k steps where
        # one is needed). Taken in increasing warm-up bound instead, the first is the fastest.
        keyed = []
        for floor, index, m, layout, _ in todo:
            costs = stage_costs(profile, topology, layout, global_batch // m)
            keyed.append(
                (max(floor, warmup_bound(costs, m, deeper_warmup(len(layout), m, 1))), index, m, layout, costs)
            )
        todo = keyed
    best: Costed | None = None
    best_key: tuple[int, int] = (0, 0)  # (set with best)
    # by the busiest stage's compute first: a layout's stage costs (links, all-reduces) are costed
    # only while that floor can still beat the best found (the P:Q family's ~1000 layouts × sizes),
    # and only where the floors of its links and all-reduces can too (cheaper than its stage costs)
    for floor, index, m, layout, costs in sorted(todo, key=lambda x: x[:3]):
        if best is not None and floor > best.iteration_s * (1 + TIE):
            break  # none left can be faster (ties within rounding are still simulated)
        b = global_batch // m
        if best is not None and max(
            busy_floor(profile, topology, layout, b, m, speed), link_floor(profile, topology, layout, b, m)
        ) > best.iteration_s * (1 + TIE):
            continue
        if costs is None:
            costs = stage_costs(profile, topology, layout, b)
        if (
            best is not None
            and limits.schedule == "1f1b"
            and warmup_bound(costs, m, deeper_warmup(len(layout), m, 1)) > best.iteration_s * (1 + TIE)
        ):
            continue
        c = evaluate(
            profile,
            topology,
            layout,
            b,
            m,
            limits,
            costs=costs,
            time_unless_fits=False,
            cutoff=best.iteration_s * (1 + TIE) if best is not None else math.inf,
        )
        if c.fits and (
            best is None
            or c.iteration_s < best.iteration_s * (1 - TIE)
            or (c.iteration_s <= best.iteration_s * (1 + TIE) and (index, m) < best_key)
        ):
            best, best_key = c, (index, m)
    return best


def compute_floor(profile: ModelProfile, layout: tuple[StageSpec, ...], b: int, m: int, speed: float) -> float:
    """No schedule runs the layout faster: every stage's device runs m forwards and m backwards of its
    layers on its share of b samples, one after another (stage_costs' compute, without the links)."""
    return m * speed * max(sum(profile.seconds(s.start, s.stop, math.ceil(b / s.replicas))) for s in layout)


def busy_floor(
    profile: ModelProfile, topology: Topology, layout: tuple[StageSpec, ...], b: int, m: int, speed: float
) -> float:
    """No schedule runs the layout faster: every stage's device runs m forwards and m backwards of its
    layers on its share of b samples, one after another, and then what its gradient all-reduce leaves
    after the last of them: its buckets' rings one after another, less that backward (allreduce.py)."""
    most = 0.0
    for st in layout:
        forward, backward = profile.seconds(st.start, st.stop, math.ceil(b / st.replicas))
        left = bucket_rings_s(profile, topology, st) - backward * speed
        most = max(most, m * speed * (forward + backward) + max(0.0, left))
    return most


def link_floor(profile: ModelProfile, topology: Topology, layout: tuple[StageSpec, ...], b: int, m: int) -> float:
    """No schedule runs the layout faster: the m activations leaving a stage cross its one link to
    the next one after another (the simulator's links are serial), each at stage_costs' send time."""
    return m * max((send_s(profile, topology, st, nxt, b) for st, nxt in zip(layout, layout[1:])), default=0.0)


TIE = 1e-12  # two times this close are one time summed in two orders


def data_parallel(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """Every device holds the whole model; gradient accumulation (micro-batches) when memory needs it."""
    devices = tuple(range(min(topology.num_devices, global_batch)))
    layout = (StageSpec(0, profile.num_layers, devices),)
    return best_over_micro_batches(profile, topology, layout, global_batch, limits)


def balanced_boundaries(profile: ModelProfile, num_stages: int, weights: list[int] | None = None) -> list[int]:
    """Cut positions (stop of each stage but the last) minimising the slowest stage's compute,
    each stage's time divided by its replica count `weights[s]` (1 each if not given)."""
    L = profile.num_layers
    if num_stages > L:
        raise ValueError(f"{num_stages} stages but the model has only {L} layers; use at most {L} stages")
    weights = weights or [1] * num_stages

    pre = profile._prefix
    work = np.asarray(pre["f"]) + np.asarray(pre["b"])
    j, i = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    span = np.where(j < i, work[i] - work[j], np.inf)  # span[j, i]: compute of layers [j, i)
    # best[s, i]: minimal max-stage time for the first i layers in s+1 stages; arg: where stage s starts
    best = np.full((num_stages, L + 1), np.inf)
    arg = np.zeros((num_stages, L + 1), dtype=int)
    best[0, 1:] = span[0, 1:] / weights[0]
    for s in range(1, num_stages):
        value = np.maximum(best[s - 1][:, None], span / weights[s])  # [j, i]: stages up to s-1 end at j
        least = value.min(axis=0)
        # ties: prefer the more even layer count, so zero-cost layers spread out
        evenness = np.where(value <= least[None, :] + 1e-15, np.abs(i - 2 * j), np.iinfo(np.int64).max)
        arg[s] = evenness.argmin(axis=0)
        best[s] = least
    cuts, at = [], L
    for s in range(num_stages - 1, 0, -1):
        at = int(arg[s][at])
        cuts.append(at)
    return sorted(cuts)


def _min_micro(limits: Limits, stages: int) -> int:
    return stages if limits.schedule == "1f1b" else 1


def gpipe_even(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """GPipe: layers split evenly by count into S stages, D/S replicas each, the GPipe schedule."""
    from dataclasses import replace

    L, D = profile.num_layers, topology.num_devices
    layouts = [(even_uniform(L, D, S), 1) for S in divisors(D) if 1 < S <= L]
    return fastest(profile, topology, layouts, global_batch, replace(limits, schedule="gpipe"))


def even_stops(num_layers: int, num_stages: int) -> list[int]:
    """Stage stops splitting the layers evenly by count (GPipe's and torchtitan's default split)."""
    return [round(num_layers * (k + 1) / num_stages) for k in range(num_stages)]


def even_uniform(num_layers: int, num_devices: int, num_stages: int) -> tuple[StageSpec, ...]:
    """`num_stages` stages split evenly by layer count, num_devices // num_stages contiguous replicas each."""
    r, stops = num_devices // num_stages, even_stops(num_layers, num_stages)
    return tuple(StageSpec(a, z, tuple(range(s * r, (s + 1) * r))) for s, (a, z) in enumerate(zip([0, *stops], stops)))


def pipedream(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """PipeDream's planner: contiguous stages, replicated stages allowed, minimising the slowest
    of (stage compute / replicas, activation transfer); its layout then runs synchronously (1F1B)."""
    L, D = profile.num_layers, topology.num_devices
    pbs = profile.batch_size
    work = [0.0]
    for layer in profile.layers:
        work.append(work[-1] + layer.forward_s + layer.backward_s)
    comm = [2 * b / pbs / topology.inter_node_bandwidth for b in profile.cut_bytes]  # per sample, both ways
    R = replica_choices(topology, D)
    # A[j, m]: best bottleneck (per sample) for layers [0, j) on m devices; choice for back-tracking.
    # Vectorised over the previous cut i and the device count m (512-device clusters).
    A = np.full((L + 1, D + 1), np.inf)
    choice_i = np.zeros((L + 1, D + 1), dtype=int)
    choice_r = np.zeros((L + 1, D + 1), dtype=int)
    for j in range(1, L + 1):
        for m in R:
            A[j, m], choice_r[j, m] = work[j] / m, m
    w, c = np.asarray(work), np.asarray(comm)
    for j in range(2, L + 1):
        i = np.arange(1, j)
        for r in R:
            if r >= D:
                break
            # the last stage holds layers [i, j) on r devices; m - r devices hold [0, i)
            v = np.maximum(np.maximum(A[1:j, 1 : D + 1 - r], c[i - 1][:, None]), ((w[j] - w[i]) / r)[:, None])
            best_i = v.argmin(axis=0)
            best_v = v[best_i, np.arange(v.shape[1])]
            m = np.arange(r + 1, D + 1)
            better = best_v < A[j, m] - 1e-15
            A[j, m[better]] = best_v[better]
            choice_i[j, m[better]] = best_i[better] + 1
            choice_r[j, m[better]] = r
    m = min(range(1, D + 1), key=lambda k: (A[L, k], -k))
    stages, j = [], L
    while j > 0:
        i, r = int(choice_i[j, m]), int(choice_r[j, m])
        stages.append((i, j, r))
        j, m = i, m - r
    stages.reverse()
    out, d = [], 0
    for i, j, r in stages:
        out.append(StageSpec(i, j, tuple(range(d, d + r))))
        d += r
    return best_over_micro_batches(profile, topology, tuple(out), global_batch, limits, _min_micro(limits, len(out)))


def dapple_two_stage(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """The published DAPPLE planner's P:Q family: two stages on P and D - P devices, best cut.
    Beyond 16 devices P takes the search's replica counts (1..devices per node, whole nodes)."""
    L, D = profile.num_layers, topology.num_devices
    # (each split's two device tuples built once and shared by its cuts: at 1024 devices, 135 splits)
    splits = [(tuple(range(P)), tuple(range(P, D))) for P in replica_choices(topology, D) if P < D]
    layouts = [
        ((StageSpec(0, cut, first), StageSpec(cut, L, second)), _min_micro(limits, 2))
        for first, second in splits
        for cut in range(1, L)
    ]
    return fastest(profile, topology, layouts, global_batch, limits)


def dapple_straight(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """The published DAPPLE planner's straight family: one device per stage, D stages, balanced cut."""
    L, D = profile.num_layers, topology.num_devices
    if D > L or D < 2:
        return None
    cuts = balanced_boundaries(profile, D)
    layout = tuple(StageSpec(a, z, (s,)) for s, (a, z) in enumerate(zip([0, *cuts], [*cuts, L])))
    return best_over_micro_batches(profile, topology, layout, global_batch, limits, _min_micro(limits, D))


BASELINES = {
    "data parallel": data_parallel,
    "GPipe even split": gpipe_even,
    "PipeDream planner": pipedream,
    "DAPPLE P:Q two-stage": dapple_two_stage,
    "DAPPLE straight": dapple_straight,
}


def all_baselines(
    profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, skip: tuple[str, ...] = ()
) -> dict[str, Costed | None]:
    return {name: fn(profile, topology, global_batch, limits) for name, fn in BASELINES.items() if name not in skip}


def balanced_uniform(profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits) -> Costed | None:
    """Every stage count S, D // S replicas each, cuts balanced by compute: cheap, and feasible
    wherever a deeper pipeline fits memory; the search starts from the best of these."""
    L, D = profile.num_layers, topology.num_devices
    layouts = []
    counts = range(1, min(L, D, limits.max_stages or L) + 1)
    for S in counts if D <= 16 else [s for s in counts if D % s == 0]:  # beyond 16: even splits only
        r = D // S
        cuts = balanced_boundaries(profile, S)
        layouts.append(
            (
                tuple(
                    StageSpec(a, z, tuple(range(s * r, (s + 1) * r)))
                    for s, (a, z) in enumerate(zip([0, *cuts], [*cuts, L]))
                ),
                _min_micro(limits, S),
            )
        )
    return fastest(profile, topology, layouts, global_batch, limits)
