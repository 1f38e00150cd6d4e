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

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from ..schedule import build_schedule, simulate
from ..schedule.simulate import program
from ..schedule.terapipe import slice_scale, unit_scales
from .cost import Costed, StageSpec, speed_ratio, stage_costs
from .limits import Limits
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
    scales=None,
) -> Costed:
    """A layout run with token slices `lengths`, costed by the simulator (`scales`: stage_scales', where
    the caller has them)."""
    if costs is None:
        costs = stage_costs(profile, topology, layout, micro_batch_size)
    if scales is None:
        scales = stage_scales(profile, topology, layout, costs, micro_batch_size, tuple(lengths), num_micro_batches)
    schedule = build_schedule("terapipe", len(layout), num_micro_batches, token_slices=tuple(lengths))
    sim = simulate(schedule, costs, record=False, steps=program(schedule, validated=True), scale=scales)
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


def sliced_floor(costs, scales, num_slices: int) -> tuple[float, list[float]]:
    """(no simulation of this sliced schedule is shorter, each stage's peak saved bytes as the
    simulator counts them), from the orders' shape alone. TeraPipe's order is GPipe's over units
    (schedule/terapipe.py): on each stage every forward runs before any backward, so at its first
    backward every unit's bytes are saved (the peak, with the backward's recomputed and workspace
    bytes). A stage runs all its units' forwards and backwards one at a time, no sooner than unit 0
    has crossed the stages before it (their forwards and activation sends); its last backward is of
    unit (M - 1) K (the last micro-batch's first slice), whose gradient then goes back down through
    the stages before it, each running that unit's backward last and then what of its gradient
    all-reduce is left exposed (the simulator's rule). So for every stage s and every s' <= s the
    iteration is at least: unit 0's way to s, s's work, the last unit's way back down to s', and
    the all-reduce s' leaves."""
    units = len(scales[0].compute)
    last = units - num_slices  # (the last micro-batch's first slice)
    floor, fill = 0.0, 0.0
    # back[s]: after stage s's last backward, until stage s - 1's ends (the gradient's send, its B)
    back = [0.0] * len(costs)
    for s in range(1, len(costs)):
        down = scales[s].transfer_down or scales[s].transfer
        below, sc = costs[s - 1], scales[s - 1]
        back[s] = costs[s].send_gradient_s * down[last] + below.backward_s * sc.compute[last] + below.action_s
    peaks = []
    for s, (c, sc) in enumerate(zip(costs, scales)):
        end = fill + (c.forward_s + c.backward_s) * sum(sc.compute) + 2 * units * c.action_s  # s's last B ends
        for below in range(s, -1, -1):  # (stage `below`'s last backward ends no sooner than `end`)
            floor = max(floor, end, costs[below].allreduce_end_s(end, 0.0, False) if costs[below].allreduce_s else end)
            end += back[below]
        fill += (c.forward_s * sc.compute[0] + c.action_s) + c.send_activation_s * sc.transfer[0]
        kept = c.activation_bytes * sum(sc.memory)
        peaks.append(kept + c.workspace_bytes + max(0.0, c.recompute_bytes))
    return floor, peaks


def slice_time(
    profile: ModelProfile, topology: Topology, costs, layout: tuple[StageSpec, ...], seq_len: int, micro_batch_size: int
):
    """t(l, c): the slowest stage's forward + backward of a slice of l tokens after c, with its
    sends (whole-sequence costs scaled as schedule/terapipe.py states), for the dynamic programme."""
    shares = stage_shares(profile, topology, layout, costs, micro_batch_size)
    whole = [c.forward_s + c.backward_s for c in costs]
    sends = [c.send_activation_s + c.send_gradient_s for c in costs]
    L = seq_len

    def t(length, context):  # (ints, or arrays of them: dp_slicings prices every slice at once)
        stop = context + length
        out = 0.0
        for w, x, sh in zip(whole, sends, shares):
            f = sh["fixed"]
            lat = max(sh["latency_up"], sh["latency_down"])
            variable = (1 - sh["compute"]) * length / L + sh["compute"] * length * (2 * stop - length) / L**2
            out = np.maximum(out, w * (f + (1 - f) * variable) + x * (lat + (1 - lat) * length / L))
        return out

    return t


def dp_slicings(
    t, seq_len: int, num_stages: int, num_micro_batches: int, grid: int = 1, max_candidates: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """TeraPipe's dynamic programme: for each bound t_max (the distinct slice times on the grid, or
    `max_candidates` of them evenly by rank), the least M·Σ t + (S - 1)·t_max slicing whose slices
    take at most t_max; (estimate, lengths) per bound, best first. Slice edges lie on multiples of
    `grid` (and at the sequence's end)."""
    points = np.array(sorted({*range(0, seq_len, grid), seq_len}))
    n = len(points)
    first, then = np.triu_indices(n, 1)  # every slice [points[i], points[j]), i < j
    times = np.full((n, n), math.inf)  # [i, j]: the slice's time (t takes arrays: one call for all)
    times[first, then] = t(points[then] - points[first], points[first])
    bounds_ = np.unique(times[first, then]).tolist()
    if max_candidates and len(bounds_) > max_candidates:
        step = (len(bounds_) - 1) / (max_candidates - 1)
        bounds_ = sorted({bounds_[round(k * step)] for k in range(max_candidates)})
    out = []
    for t_max in bounds_:
        allowed = np.where(times <= t_max, times, math.inf)
        best = np.full(n, math.inf)
        back = [-1] * n
        best[0] = 0.0
        for j in range(1, n):
            through = best[:j] + allowed[:j, j]
            i = int(through.argmin())  # (the first of the least, as a scan with a strict < keeps)
            if through[i] < best[j]:
                best[j], back[j] = through[i], i
        if not math.isfinite(best[-1]):
            continue
        lengths, j = [], n - 1
        while j > 0:
            lengths.append(int(points[j] - points[back[j]]))
            j = back[j]
        out.append((num_micro_batches * float(best[-1]) + (num_stages - 1) * t_max, tuple(reversed(lengths))))
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


def _slicings(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    seq_len: int,
    limits: Limits,
    cutoff: float,
    unsliced: bool,
) -> list[tuple[float, tuple[int, ...], list, list]]:
    """The DP's best few slicings of this layout (and, with `unsliced`, one slice) whose memory fits
    (exact from the order: sliced_floor's peaks): (floor, lengths, costs, scales) each, those with a
    floor under `cutoff` only."""
    costs = stage_costs(profile, topology, layout, micro_batch_size)
    M, capacity = num_micro_batches, topology.device_memory_bytes * (1 - limits.memory_headroom)
    # slices only add work (each pays the per-call share; the rest sums to the whole sequence's), so
    # where the busiest stage's unsliced compute (and its exposed all-reduce) reaches the cutoff, no
    # slicing of it is wanted, and the programme need not run
    if max(c.allreduce_end_s(M * (c.forward_s + c.backward_s + 2 * c.action_s), 0.0, False) for c in costs) >= cutoff:
        return []
    t = slice_time(profile, topology, costs, layout, seq_len, micro_batch_size)
    candidates = [lengths for _, lengths in dp_slicings(t, seq_len, len(layout), M, grid_for(seq_len), 48)]
    weights = [profile.span(st.start, st.stop)[3] * limits.optimizer_factor for st in layout]
    out, seen = [], set()
    for lengths in [*candidates[:SIMULATED_SLICINGS], *([(seq_len,)] if unsliced else [])]:
        if lengths in seen:
            continue
        seen.add(lengths)
        scales = stage_scales(profile, topology, layout, costs, micro_batch_size, tuple(lengths), M)
        floor, peaks = sliced_floor(costs, scales, len(lengths))
        # (a hair of slack on the memory: the simulator's running sums may round the other way)
        if floor < cutoff and max(w + p for w, p in zip(weights, peaks)) <= capacity * (1 + 1e-9):
            out.append((floor, lengths, costs, scales))
    return out


def _fastest(candidates: list[tuple], cutoff: float, limits: Limits) -> Costed | None:
    """Of candidates (floor, profile, topology, layout, b, M, lengths, costs, scales), in their
    order, the fastest that fits and beats `cutoff` (the first of equals), simulating them in
    increasing floor and none whose floor cannot beat the fastest so far."""
    best, best_at = None, -1
    for at in sorted(range(len(candidates)), key=lambda k: (candidates[k][0], k)):
        floor, profile, topology, layout, b, M, lengths, costs, scales = candidates[at]
        if best is not None and (floor > best.iteration_s or (floor == best.iteration_s and at > best_at)):
            break  # (the rest are no faster: their floors are higher)
        c = evaluate_sliced(profile, topology, layout, b, M, lengths, limits, costs, scales)
        if not (c.fits and c.iteration_s < cutoff):
            continue
        if best is None or (c.iteration_s, at) < (best.iteration_s, best_at):
            best, best_at = c, at
    return best


def best_slicing(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    seq_len: int,
    limits: Limits,
) -> Costed | None:
    """The DP's best few slicings of this layout and no slicing (one slice), costed by the simulator;
    the fastest that fits memory, or None."""
    found = _slicings(
        profile, topology, layout, micro_batch_size, num_micro_batches, seq_len, limits, math.inf, unsliced=True
    )
    return _fastest(
        [(f, profile, topology, layout, micro_batch_size, num_micro_batches, *rest) for f, *rest in found],
        math.inf,
        limits,
    )


def improve_with_slices(
    found: list[Costed],
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    layouts: int = 3,
    cutoff: float = math.inf,
) -> Costed | None:
    """strategy.token_slices=auto: the best few layouts found, at every micro-batch count up to twice
    their stages (beyond that the pipeline's fill is small and slicing has little to gain), with the
    DP's slices; the fastest sliced plan that fits and is faster than `cutoff`, or None. A sliced
    candidate is simulated only where its floor (sliced_floor) is under the cutoff and the best so
    far, in increasing floor (GPT large on 16 × 1 V100 at 10 Gbps, G 64: 51 simulations and 4.3 s
    before, none of them a plan kept; now none)."""
    if not (limits.seq_len and profile.slices_tokens):
        return None
    seen, candidates = [], []
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
            for floor, *rest in _slicings(profile, topology, c.layout, b, M, limits.seq_len, limits, cutoff, False):
                candidates.append((floor, profile, topology, c.layout, b, M, *rest))
    return _fastest(candidates, cutoff, limits)
