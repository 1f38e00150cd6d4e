"""Token slices (TeraPipe) in the planner: costing a sliced plan and choosing the slices.

A sliced candidate is costed by the simulator of its schedule (schedule/terapipe.py) with each
stage's costs scaled per slice by the profile's shares (ModelProfile.slice_shares): the one cost
path. Its memory is the simulator's peak saved bytes per stage (every unit of the GPipe-ordered
schedule stays alive until its backward; later slices keep the keys and values of the context
they attend to) plus parameters × optimizer factor.

The slices: TeraPipe's dynamic programme (Li et al., ICML'21) on a token grid. For each bound
t_max on the slowest slice, f[n] = min over the last slice k of f[n - k] + t(k, n - k) among slices
no slower than t_max, where t(l, c) is the bottleneck stage's forward + backward of a slice of l
tokens after c; its estimate M·f[L] + (S - 1)·t_max. The best few slicings it finds are then
costed by the simulator, which decides.
"""

from __future__ import annotations

import math

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import build_schedule, simulate
from ..schedule.simulate import program
from ..schedule.terapipe import slice_scale, unit_scales
from .cost import Costed, Limits, StageSpec, speed_ratio, stage_costs
from .shapes import divisors

SIMULATED_SLICINGS = 2  # of the DP's candidates (one per t_max), how many the simulator costs


def stage_shares(
    profile: ModelProfile, topology: Topology, layout: tuple[StageSpec, ...], costs, micro_batch_size: int
) -> list[dict]:
    """Per stage, what slice_scale needs: the profile's shares, the part of its compute each call
    pays whatever its tokens (the layers' fixed parts), and the latency part of each send."""
    out = []
    for s, (st, c) in enumerate(zip(layout, costs)):
        whole = c.forward_s + c.backward_s
        fixed_f, fixed_b = profile.seconds(st.start, st.stop, 0)  # (no samples: the fixed parts alone)
        fixed = min(1.0, (fixed_f + fixed_b) * speed_ratio(profile, topology) / whole) if whole > 0 else 0.0
        up = down = 0.0
        if s + 1 < len(layout) and c.send_activation_s > 0:
            up = min(1.0, topology.p2p(st.devices, layout[s + 1].devices)[1] / c.send_activation_s)
        if s > 0 and c.send_gradient_s > 0:
            down = min(1.0, topology.p2p(layout[s - 1].devices, st.devices)[1] / c.send_gradient_s)
        compute, kv, att = profile.slice_shares(st.start, st.stop)
        out.append(dict(compute=compute, memory_kv=kv, memory_att=att, fixed=fixed, latency_up=up, latency_down=down))
    return out


def stage_scales(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    costs,
    micro_batch_size: int,
    lengths: tuple[int, ...],
    num_micro_batches: int,
):
    return [
        unit_scales(slice_scale(lengths, **shares), num_micro_batches)
        for shares in stage_shares(profile, topology, layout, costs, micro_batch_size)
    ]


def evaluate_sliced(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    lengths: tuple[int, ...],
    limits: Limits,
    costs=None,
) -> Costed:
    """A layout run with token slices `lengths`, costed by the simulator."""
    if costs is None:
        costs = stage_costs(profile, topology, layout, micro_batch_size)
    schedule = build_schedule("terapipe", len(layout), num_micro_batches, token_slices=tuple(lengths))
    sim = simulate(
        schedule,
        costs,
        record=False,
        steps=program(schedule, validated=True),
        scale=stage_scales(profile, topology, layout, costs, micro_batch_size, tuple(lengths), num_micro_batches),
    )
    memory = [
        profile.span(st.start, st.stop)[3] * limits.optimizer_factor + sim.peak_activation_bytes[s]
        for s, st in enumerate(layout)
    ]
    c = Costed(
        layout,
        micro_batch_size,
        num_micro_batches,
        "terapipe",
        costs,
        sim.iteration_s,
        memory,
        topology.device_memory_bytes * (1 - limits.memory_headroom),
    )
    c.extra["token_slices"] = tuple(lengths)
    c.extra["profile"], c.extra["topology"] = profile, topology  # (for simulate_costed's per-slice scales)
    return c


def slice_time(
    profile: ModelProfile, topology: Topology, costs, layout: tuple[StageSpec, ...], seq_len: int, micro_batch_size: int
):
    """t(l, c): the slowest stage's forward + backward of a slice of l tokens after c, with its
    sends (whole-sequence costs scaled as schedule/terapipe.py states), for the dynamic programme."""
    shares = stage_shares(profile, topology, layout, costs, micro_batch_size)
    whole = [c.forward_s + c.backward_s for c in costs]
    sends = [c.send_activation_s + c.send_gradient_s for c in costs]
    L = seq_len

    def t(length: int, context: int) -> float:
        stop = context + length
        out = 0.0
        for w, x, sh in zip(whole, sends, shares):
            f = sh["fixed"]
            lat = max(sh["latency_up"], sh["latency_down"])
            variable = (1 - sh["compute"]) * length / L + sh["compute"] * length * (2 * stop - length) / L**2
            out = max(out, w * (f + (1 - f) * variable) + x * (lat + (1 - lat) * length / L))
        return out

    return t


def dp_slicings(
    t, seq_len: int, num_stages: int, num_micro_batches: int, grid: int = 1, max_candidates: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """TeraPipe's dynamic programme: for each bound t_max (the distinct slice times on the grid, or
    `max_candidates` of them evenly by rank), the least M·Σ t + (S - 1)·t_max slicing whose slices
    take at most t_max; (estimate, lengths) per bound, best first. Slice edges lie on multiples of
    `grid` (and at the sequence's end)."""
    points = sorted({*range(0, seq_len, grid), seq_len})
    n = len(points)
    times = {(i, j): t(points[j] - points[i], points[i]) for j in range(1, n) for i in range(j)}
    bounds_ = sorted(set(times.values()))
    if max_candidates and len(bounds_) > max_candidates:
        step = (len(bounds_) - 1) / (max_candidates - 1)
        bounds_ = sorted({bounds_[round(k * step)] for k in range(max_candidates)})
    out = []
    for t_max in bounds_:
        best = [math.inf] * n
        back = [-1] * n
        best[0] = 0.0
        for j in range(1, n):
            for i in range(j):
                cost = times[(i, j)]
                if cost <= t_max and best[i] + cost < best[j]:
                    best[j], back[j] = best[i] + cost, i
        if not math.isfinite(best[-1]):
            continue
        lengths, j = [], n - 1
        while j > 0:
            lengths.append(points[j] - points[back[j]])
            j = back[j]
        out.append((num_micro_batches * best[-1] + (num_stages - 1) * t_max, tuple(reversed(lengths))))
    out.sort()
    return out


def dp_objective(t, lengths: tuple[int, ...], num_stages: int, num_micro_batches: int) -> float:
    """The programme's estimate of one slicing: M·Σ t + (S - 1)·max t."""
    times, at = [], 0
    for n in lengths:
        times.append(t(n, at))
        at += n
    return num_micro_batches * sum(times) + (num_stages - 1) * max(times)


def grid_for(seq_len: int) -> int:
    """TeraPipe's 8-token grid, coarser for long sequences (at most 64 grid steps)."""
    return max(1, min(8, seq_len), -(-seq_len // 64))


def best_slicing(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    seq_len: int,
    limits: Limits,
) -> Costed | None:
    """The DP's best few slicings of this layout (and no slicing: one slice), costed by the simulator;
    the fastest that fits memory."""
    costs = stage_costs(profile, topology, layout, micro_batch_size)
    t = slice_time(profile, topology, costs, layout, seq_len, micro_batch_size)
    grid = grid_for(seq_len)
    candidates = [
        lengths for _, lengths in dp_slicings(t, seq_len, len(layout), num_micro_batches, grid, max_candidates=48)
    ]
    seen, out = set(), None
    for lengths in [*candidates[:SIMULATED_SLICINGS], (seq_len,)]:
        if lengths in seen:
            continue
        seen.add(lengths)
        c = evaluate_sliced(profile, topology, layout, micro_batch_size, num_micro_batches, lengths, limits, costs)
        if c.fits and (out is None or c.iteration_s < out.iteration_s):
            out = c
    return out


def improve_with_slices(
    found: list[Costed], profile: ModelProfile, topology: Topology, global_batch: int, limits: Limits, layouts: int = 3
) -> Costed | None:
    """strategy.token_slices=auto: the best few layouts found, at every micro-batch count up to twice
    their stages (beyond that the pipeline's fill is small and slicing has little to gain), with the
    DP's slices; the fastest sliced plan that fits, or None."""
    if not (limits.seq_len and profile.slices_tokens):
        return None
    seen, best = [], None
    for c in sorted(found, key=lambda c: c.iteration_s):
        if c.layout in seen:
            continue
        seen.append(c.layout)
        if len(seen) > layouts:
            break
        widest = max(st.replicas for st in c.layout)
        for M in divisors(global_batch):
            b = global_batch // M
            if 2 * len(c.layout) < M or b < widest or (limits.micro_batch_size and b != limits.micro_batch_size):
                continue
            s = best_slicing(profile, topology, c.layout, b, M, limits.seq_len, limits)
            if (
                s is not None
                and len(s.extra["token_slices"]) > 1
                and (best is None or s.iteration_s < best.iteration_s)
            ):
                best = s
    return best
