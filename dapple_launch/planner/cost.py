"""DAPPLE's cost model: per-stage costs, a candidate's time by the simulator, and memory per device.

A stage's replicas each run ceil(b / r) samples of a micro-batch of b. Between stages the
activations (and, backward, their gradients) are split and concatenated across the two stages'
replica counts over the slowest link used. Each stage all-reduces its gradients over the slowest
link of its devices, starting when its last backward ends.

Every candidate's time is the simulator's (schedule/simulate.orders_time) over its schedule's
compute orders: one cost path for GPipe, 1F1B at every warm-up, ZB-H1 and (planner/chunked.py) the
rank-order schedules. DAPPLE's closed form for 1F1B, (M - 1) beta plus one pass with beta the
largest window mean of adjacent stages, is not a time: on random layouts with slow links it
overstates the simulator by up to 43 % and understates it by up to 4 % (its windows are not the
schedule's dependency cycles, and its steady phase spans the warm-up). What survives of closed
forms are the lower bounds the branch and bound cuts with (branch.py, warmup.py,
planner/zero_bubble_search.py), each checked below the simulator by the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np

from ..cluster import Topology, ring_allreduce_s
from ..profile.model_profile import ModelProfile
from ..schedule import StageCosts, zero_bubble
from ..schedule.gpipe import compute_orders as gpipe_orders
from ..schedule.one_f_one_b import deeper_warmup, stage_order
from ..schedule.simulate import encode_orders, orders_time
from .allreduce import bucket_layers, exposed
from .limits import Limits
from .link_warmup import LINKED, link_warmup


@dataclass(frozen=True)
class StageSpec:
    start: int
    stop: int
    devices: tuple[int, ...]

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @cached_property
    def device_span(self) -> tuple[int, ...]:
        """(lowest, highest) device, () for none: whether the stage spans nodes, asked for every costing of it."""
        return (min(self.devices), max(self.devices)) if self.devices else ()

    def spans_nodes(self, topology: Topology) -> bool:
        """Topology.spans_nodes(self.devices), without walking a 1024-device stage each time."""
        return topology.spans_nodes(self.device_span)


@dataclass
class Costed:
    layout: tuple[StageSpec, ...]
    micro_batch_size: int
    num_micro_batches: int
    schedule: str
    costs: list[StageCosts]
    iteration_s: float
    memory_bytes: list[float]  # per device of each stage
    capacity_bytes: float
    extra: dict = field(default_factory=dict)
    warmup: tuple[int, ...] = ()  # 1F1B forwards before each stage's first backward; () = DAPPLE's minimum
    # the multiple of DAPPLE's in-flight count that `warmup` keeps (schedule.deeper_warmup); LINKED: fitted
    # to each stage's link (link_warmup.py)
    warmup_depth: int = 1
    recompute: tuple[tuple[int, ...], ...] = ()  # per stage, the layer positions recomputed; () = none

    @property
    def fits(self) -> bool:
        return max(self.memory_bytes) <= self.capacity_bytes

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.memory_bytes)

    def summary(self) -> str:
        cut = ",".join(str(s.stop) for s in self.layout[:-1])
        ratio = ":".join(str(s.replicas) for s in self.layout)
        return (
            f"{len(self.layout)} stage{'s' if len(self.layout) > 1 else ''} {ratio}"
            + (f" cut@{cut}" if cut else "")
            + f", {self.num_micro_batches}×{self.micro_batch_size}"
            + (
                f", warm-up ×{':'.join(map(str, self.extra['depths']))}"
                if "depths" in self.extra
                else f", warm-up ×{self.warmup_depth}"
                if self.warmup_depth > 1
                else ", warm-up per link"
                if self.warmup_depth == LINKED
                else ""
            )
            + (f", {self.schedule}" if self.schedule != "1f1b" else "")
            + (f" copies {':'.join(map(str, self.extra['copies']))}" if "copies" in self.extra else "")
            + (f", recompute {recompute_text(self.layout, self.recompute)}" if any(self.recompute) else "")
            + (f", token slices {list(self.extra['token_slices'])}" if "token_slices" in self.extra else "")
        )


def recompute_text(layout, recompute) -> str:
    """ "full", or the recomputed layers per stage as counts ("2+0+1": prefix counts, "+"-joined)."""
    if all(len(r) == st.stop - st.start for r, st in zip(recompute, layout)):
        return "full"
    return "+".join(str(len(r)) for r in recompute)


def speed_ratio(profile: ModelProfile, topology: Topology) -> float:
    if profile.device_tflops and topology.device_tflops:
        return profile.device_tflops / topology.device_tflops
    return 1.0


def in_flight(schedule: str, stage: int, num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] = ()) -> int:
    if schedule == "gpipe":
        return num_micro_batches
    if schedule == "zb_h1":  # F to W: the warm-up, one in the steady pair, s W's held back
        return zero_bubble.in_flight(stage, num_stages, num_micro_batches, warmup or None)
    if warmup:
        return min(warmup[stage] + 1, num_micro_batches)
    return min(num_stages - stage, num_micro_batches)


def memory_per_device(
    profile: ModelProfile,
    layout: tuple[StageSpec, ...],
    costs: list[StageCosts],
    num_micro_batches: int,
    limits: Limits,
    warmup: tuple[int, ...] = (),
) -> list[float]:
    """Per stage, the bytes one of its devices keeps at its fullest: parameters × optimizer factor,
    the activations of the micro-batches the schedule (and warm-up) keeps in flight, and what one
    backward holds beyond them (a recomputed segment, a layer's workspace)."""
    S = len(layout)
    return [
        profile.span(st.start, st.stop)[3] * limits.optimizer_factor
        + in_flight(limits.schedule, s, S, num_micro_batches, warmup) * c.activation_bytes
        + c.recompute_bytes
        + c.workspace_bytes
        for s, (st, c) in enumerate(zip(layout, costs))
    ]


def recompute_sets(layout: tuple[StageSpec, ...], limits: Limits) -> tuple[tuple[int, ...], ...]:
    """Per stage, the layer positions a "full" or "selective" policy recomputes; () for none/auto."""
    if limits.recompute == "full":
        return tuple(tuple(range(st.start, st.stop)) for st in layout)
    if limits.recompute != "selective":
        return ()
    if limits.recompute_layers:
        marks = set(limits.recompute_layers)
        return tuple(tuple(i for i in range(st.start, st.stop) if i in marks) for st in layout)
    counts = limits.recompute_counts
    if len(counts) == 1:
        # one count for all (ColossalAI's num_ckpt_layers_per_stage): a stage with fewer layers
        # recomputes them all; under strategy=auto the planner, not the user, makes such stages
        return tuple(tuple(range(st.start, min(st.stop, st.start + counts[0]))) for st in layout)
    if len(counts) != len(layout):
        raise ValueError(
            f"strategy.recompute_counts={list(limits.recompute_counts)}: one count per stage "
            f"({len(layout)}) or one for all"
        )
    for s, (k, st) in enumerate(zip(counts, layout)):
        if not 0 <= k <= st.stop - st.start:
            raise ValueError(
                f"strategy.recompute_counts={list(limits.recompute_counts)}: stage {s} has "
                f"{st.stop - st.start} layers, so its count must be in 0..{st.stop - st.start}"
            )
    return tuple(tuple(range(st.start, st.start + k)) for k, st in zip(counts, layout))


def recomputed_costs(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    costs: list[StageCosts],
    micro_batch_size: int,
    sets,
) -> list[StageCosts]:
    """The stages' costs with their recomputed layers: the backward runs their forward again, a
    micro-batch keeps less (ModelProfile.recompute_bytes) and holds one segment's more during its backward."""
    out = list(costs)
    speed = speed_ratio(profile, topology)
    for s, (st, marks) in enumerate(zip(layout, sets)):
        if not marks:
            continue
        n = math.ceil(micro_batch_size / st.replicas)
        kept, extra = profile.recompute_bytes(st.start, st.stop, marks, n)
        again = profile.recompute_seconds(st.start, st.stop, marks, n) * speed
        c = out[s]
        out[s] = replace(c, backward_s=c.backward_s + again, activation_bytes=kept, recompute_bytes=extra)
    return out


def fit_by_recomputation(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    costs: list[StageCosts],
    micro_batch_size: int,
    num_micro_batches: int,
    limits: Limits,
    warmup: tuple[int, ...],
    capacity: float,
):
    """strategy.recompute=auto: each stage over `capacity` recomputes its fewest first layers that make
    it fit (the least forward added to its backward); a stage no count fits takes its least memory.
    (sets, costs, memory)."""
    S = len(layout)
    memory = memory_per_device(profile, layout, costs, num_micro_batches, limits, warmup)
    sets: list[tuple[int, ...]] = [()] * S
    costs = list(costs)
    for s, st in enumerate(layout):
        if memory[s] <= capacity:
            continue
        n = math.ceil(micro_batch_size / st.replicas)
        params = profile.span(st.start, st.stop)[3] * limits.optimizer_factor
        count = in_flight(limits.schedule, s, S, num_micro_batches, warmup)
        received = profile.cut_bytes[st.start - 1] * n / profile.batch_size if st.start > 0 else 0.0
        total = profile.bytes_between(st.start, st.stop, n)
        # memory(k) = params + count (received + tail_k) + max(0, head_k - tail_k) >= params + count
        # received + total / 2 (head_k + tail_k = total): when even that is over, no count fits
        if params + count * received + total / 2 > capacity:
            continue
        layers = st.stop - st.start

        def need(k: int) -> float:
            kept, extra, _ = profile.first_layers_recomputed(st.start, st.stop, k, n)
            return params + count * kept + extra + costs[s].workspace_bytes

        if count >= 2:  # memory(k) never rises with k: the fewest that fit, by bisection
            lo, hi = 1, layers
            if need(hi) > capacity:
                k = min(range(1, layers + 1), key=need)
            else:
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if need(mid) <= capacity else (mid + 1, hi)
                k = lo
        else:  # one micro-batch in flight: max(head, tail) falls, then rises
            fitting = [k for k in range(1, layers + 1) if need(k) <= capacity]
            k = fitting[0] if fitting else min(range(1, layers + 1), key=need)
        kept, extra, again = profile.first_layers_recomputed(st.start, st.stop, k, n)
        best = (
            tuple(range(st.start, st.start + k)),
            (kept, extra, again * speed_ratio(profile, topology)),
            params + count * kept + extra + costs[s].workspace_bytes,  # (memory_per_device's, as need's)
        )
        marks, (kept, extra, again), m = best
        best = (
            marks,
            replace(costs[s], backward_s=costs[s].backward_s + again, activation_bytes=kept, recompute_bytes=extra),
            m,
        )
        if best[2] < memory[s]:
            sets[s], costs[s], memory[s] = best
    return tuple(sets) if any(sets) else (), costs, memory


def bare_costs(c: Costed, profile: ModelProfile, topology: Topology) -> list[StageCosts]:
    """c's stage costs before any recomputation: what evaluate's `costs` takes, since evaluate
    applies the limits' recomputation itself. A candidate's own costs carry its recomputed layers'
    savings, which a family that recomputes none would not have (ZB-H1 from a 1F1B plan that
    recomputed to fit: Llama 3 70B's shape on 1024 A100s was planned ZB-H1 at 58 GB a device with
    none of its layers recomputed, where it keeps 32 micro-batches of 8 GB), and which a 1F1B warm-up
    of its own must fit anew."""
    return list(c.costs) if not c.recompute else stage_costs(profile, topology, c.layout, c.micro_batch_size)


def send_s(profile: ModelProfile, topology: Topology, st: StageSpec, nxt: StageSpec, micro_batch_size: int) -> float:
    """One micro-batch's activation from stage `st` to `nxt` (and its gradient back): the cut's bytes
    split over the smaller replica count, over the slowest link between the two stages."""
    total = profile.cut_bytes[st.stop - 1] * micro_batch_size / profile.batch_size
    bw, lat = topology.p2p(st.device_span, nxt.device_span)  # (the same link: spans are all it reads)
    return lat + max(total / st.replicas, total / nxt.replicas) / bw


def stage_costs(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    memo: dict | None = None,
) -> list[StageCosts]:
    """`memo`: a dict shared by calls costing many layouts of one profile and cluster that differ in
    a few stages (local search): each stage's and link's costs are computed once."""
    speed, S = speed_ratio(profile, topology), len(layout)
    memo = {} if memo is None else memo
    # transfer s -> s+1 over the slowest link used; the gradient of a cut moves back over the same
    # link with the same size, so send_gradient of stage s+1 is send_activation of stage s
    sends = [0.0] * S
    for s in range(S - 1):
        st, nxt = layout[s], layout[s + 1]
        key = ("link", st.stop, st.devices, nxt.devices, micro_batch_size)
        if key not in memo:
            memo[key] = send_s(profile, topology, st, nxt, micro_batch_size)
        sends[s] = memo[key]
    costs = []
    for s, st in enumerate(layout):
        key = (st.start, st.stop, st.devices, micro_batch_size)
        if key not in memo:
            n = math.ceil(micro_batch_size / st.replicas)
            f, b = profile.seconds(st.start, st.stop, n)
            share = profile.weight_share(st.start, st.stop)
            memo[key] = (
                f * speed,
                b * speed,
                stage_allreduce(profile, topology, st, n, share),
                profile.kept_bytes(st.start, st.stop, n),
                share,
                profile.workspace(st.start, st.stop, n),
            )
        f, b, allreduce, activation, share, workspace = memo[key]
        # the first stage's input needs no gradient: its split backward is all W (models/split_backward.py);
        # elsewhere W's measured share of the backward, or the simulator's rule (half) when not measured
        costs.append(
            StageCosts(
                f,
                b,
                sends[s],
                sends[s - 1] if s else 0.0,
                allreduce[0],
                activation,
                weight_grad_s=b if s == 0 else None if share is None else b * share,
                action_s=topology.action_overhead_s,
                allreduce_after_b_s=allreduce[1],
                allreduce_after_w_s=allreduce[2],
                workspace_bytes=workspace,
            )
        )
    for layers, nbytes in profile.tied:
        # A weight several stages hold (a tied embedding): after their own all-reduces, the stages
        # holding a copy sum its gradient among all their devices (runtime/tied.py), each device once:
        # a rank holding two of them (ZB-V's first group holds both ends) keeps one shared Parameter
        holders = [s for s, st in enumerate(layout) if any(st.start <= i < st.stop for i in layers)]
        if len(holders) > 1:
            extra = topology.allreduce_s(tuple(sorted({d for s in holders for d in layout[s].devices})), nbytes)
            for s in holders:  # after the stage's own buckets: it adds to what is left of them
                c = costs[s]
                costs[s] = replace(
                    c,
                    allreduce_s=c.allreduce_s + extra,
                    allreduce_after_b_s=c.exposed_allreduce_s(False) + extra,
                    allreduce_after_w_s=c.exposed_allreduce_s(True) + extra,
                )
    return costs


def stage_allreduce(
    profile: ModelProfile, topology: Topology, st: StageSpec, samples: int, share: float | None
) -> tuple[float, float, float]:
    """(all-reduce in all, left after a last B, left after a last W) of a stage's gradients over its
    devices, in buckets overlapping that action (planner/allreduce.py). Each layer's W is its share of
    the layer's backward: all of it on the first stage (no input gradient), else the stage's
    measured share, else half (StageCosts.weight_s)."""
    if st.replicas <= 1:
        return 0.0, 0.0, 0.0
    # the search costs many placements of one span: what matters of the devices is their count and
    # whether they span nodes (Topology.allreduce_s), so one entry per span serves them all
    memo = profile.__dict__.setdefault("_allreduce_memo", {})  # (a frozen dataclass: as cached_property does)
    key = (topology, st.start, st.stop, st.replicas, st.spans_nodes(topology), samples, share)
    if key not in memo:
        if len(memo) > 200_000:
            memo.clear()
        memo[key] = _stage_allreduce(profile, topology, st, samples, share)
    return memo[key]


def _stage_allreduce(
    profile: ModelProfile, topology: Topology, st: StageSpec, samples: int, share: float | None
) -> tuple[float, float, float]:
    """allreduce.overlapped's account from the profile's prefix sums: O(buckets), not O(layers). The
    buckets' ready times and rings are computed as arrays (elementwise, in the same order of
    operations as one at a time, so the same floats); only the queue of rings runs bucket by bucket."""
    lows, nbytes = _bucket_arrays(profile, st.start, st.stop)
    if not len(lows):
        return 0.0, 0.0, 0.0
    speed, n, z = speed_ratio(profile, topology), samples / profile.batch_size, st.stop
    b, fixed = _prefix_arrays(profile)
    # ModelProfile.seconds(a, z, samples)[1] for each a: the backward from layer a to the stage's end
    part = fixed[z] - fixed[st.start]
    duration = float((part + (b[z] - b[st.start] - part) * n) * speed)
    # a bucket is complete once the action has run the layers from its lowest weighted one up
    parts = fixed[z] - fixed[lows]
    ready_at = (parts + (b[z] - b[lows] - parts) * n) * speed
    link = topology.allreduce_link(st.spans_nodes(topology))  # (Topology.allreduce_s, looked up once)
    costs = ring_allreduce_s(st.replicas, nbytes, link).tolist()
    ready = ready_at.tolist()
    ratio = 1.0 if st.start == 0 else 0.5 if share is None else share
    total, after_b = exposed(ready, costs, duration)
    after_w = exposed([x * ratio for x in ready], costs, duration * ratio)[1]
    return total, after_b, after_w


def bucket_rings_s(profile: ModelProfile, topology: Topology, st: StageSpec) -> float:
    """The stage's buckets' ring all-reduces, one after another: stage_allreduce's total, whatever
    the samples. The rings queue behind one another from their buckets' ready times, all within the
    last backward or W (allreduce.exposed), so what is left after that action is at least this less
    its duration (the baselines' busy floor)."""
    if st.replicas <= 1:
        return 0.0
    memo = profile.__dict__.setdefault("_bucket_rings_memo", {})  # (as stage_allreduce's memo)
    key = (topology, st.start, st.stop, st.replicas, st.spans_nodes(topology))
    if key not in memo:
        nbytes = _bucket_arrays(profile, st.start, st.stop)[1]
        link = topology.allreduce_link(st.spans_nodes(topology))
        memo[key] = float(ring_allreduce_s(st.replicas, nbytes, link).sum()) if len(nbytes) else 0.0
    return memo[key]


def _prefix_arrays(profile: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    """The profile's backward prefix sums (all, and the part each call costs regardless) as arrays."""
    found = profile.__dict__.get("_backward_prefix_arrays")
    if found is None:
        pre = profile._prefix
        found = profile.__dict__["_backward_prefix_arrays"] = (np.asarray(pre["b"]), np.asarray(pre["bf"]))
    return found


def _bucket_arrays(profile: ModelProfile, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """_buckets as arrays: each bucket's lowest weighted layer, and its bytes."""
    memo = profile.__dict__.setdefault("_bucket_array_memo", {})
    key = (start, stop)
    if key not in memo:
        buckets = _buckets(profile, start, stop)
        memo[key] = (np.asarray([low for low, _ in buckets], dtype=int), np.asarray([nb for _, nb in buckets]))
    return memo[key]


def _buckets(profile: ModelProfile, start: int, stop: int) -> list[tuple[int, float]]:
    """Per bucket of layers [start, stop) (allreduce.bucket_layers), its lowest weighted layer and bytes."""
    memo = profile.__dict__.setdefault("_bucket_memo", {})
    key = (start, stop)
    if key not in memo:
        weights = [profile.layers[i].parameter_bytes for i in range(start, stop)]
        memo[key] = [
            (start + min(i for i in b if weights[i] > 0), sum(weights[i] for i in b)) for b in bucket_layers(weights)
        ]
    return memo[key]


def evaluate(
    profile: ModelProfile,
    topology: Topology,
    layout: tuple[StageSpec, ...],
    micro_batch_size: int,
    num_micro_batches: int,
    limits: Limits,
    warmup_depth: int | tuple[int, ...] = 1,
    costs: list[StageCosts] | None = None,
    time_unless_fits: bool = True,
    cutoff: float = math.inf,
) -> Costed:
    """A candidate costed in full: its time by the simulator of the schedule's compute orders (the one
    cost path; the branch and bound's closed forms only bound it from below, branch.py).
    `costs`: the layout's stage_costs when the caller already has them, before any recomputation
    (a candidate's own carry its recomputed layers: bare_costs gives them bare). `time_unless_fits=False`: a
    candidate over memory is not simulated (its iteration_s is inf), for callers that drop it anyway.
    `cutoff`: a caller that keeps the candidate only if it is at most this fast; one proven slower
    part-way through the simulation has iteration_s inf (orders_time). `warmup_depth`: one for every
    stage, or one per stage (schedule.deeper_warmup), or LINKED (link_warmup.py)."""
    if costs is None:
        costs = stage_costs(profile, topology, layout, micro_batch_size)
    S = len(layout)
    warmup = ()
    depths = None if isinstance(warmup_depth, int) else tuple(warmup_depth)
    deepest = warmup_depth if isinstance(warmup_depth, int) else max(warmup_depth)  # (the plan's depth)
    if deepest > 1 or deepest == LINKED:
        if limits.schedule not in WARMUP_FAMILIES:
            raise ValueError(
                f"warm-up depth {deepest} needs a schedule with a warm-up ({sorted(WARMUP_FAMILIES)}), "
                f"not {limits.schedule}"
            )
        if deepest == LINKED:
            warmup = link_warmup(costs, (1,) * S, num_micro_batches)
        else:
            warmup = deeper_warmup(S, num_micro_batches, warmup_depth)
    capacity = topology.device_memory_bytes * (1 - limits.memory_headroom)
    sets = recompute_sets(layout, limits)
    if sets:
        costs = recomputed_costs(profile, topology, layout, costs, micro_batch_size, sets)
    memory = memory_per_device(profile, layout, costs, num_micro_batches, limits, warmup)
    if limits.recompute == "auto" and max(memory) > capacity and limits.schedule != "zb_h1":
        sets, costs, memory = fit_by_recomputation(
            profile, topology, layout, costs, micro_batch_size, num_micro_batches, limits, warmup, capacity
        )
    iteration_s = (
        math.inf
        if not time_unless_fits and max(memory) > capacity
        else orders_time(
            compute_orders_of(limits.schedule, S, num_micro_batches, warmup), costs, num_micro_batches, cutoff
        )
    )
    return Costed(
        layout,
        micro_batch_size,
        num_micro_batches,
        limits.schedule,
        costs,
        iteration_s,
        memory,
        capacity,
        warmup=warmup,
        warmup_depth=deepest,
        recompute=tuple(sets),
        extra={} if depths is None else {"depths": depths},  # (the summary shows each stage's)
    )


WARMUP_FAMILIES = ("1f1b", "zb_h1")  # the schedules with a warm-up depth to search


@lru_cache(maxsize=128)
def compute_orders_of(schedule: str, num_stages: int, num_micro_batches: int, warmup: tuple[int, ...] = ()):
    """Each stage's compute order under `schedule` (() = DAPPLE's minimal warm-up), encoded for
    orders_time and shared by every layout of that shape: what the simulator walks for every
    candidate. The generators' orders are valid by construction (the tests validate them over
    grids); orders_time refuses a deadlock."""
    S, M = num_stages, num_micro_batches
    if schedule == "zb_h1":
        warm = warmup or tuple(min(S - s - 1, M) for s in range(S))
        return tuple(_encoded_stage(schedule, s, M, warm[s]) for s in range(S))
    if schedule == "1f1b":
        warm = warmup or deeper_warmup(S, M, 1)
        return tuple(_encoded_stage(schedule, 0, M, warm[s]) for s in range(S))  # (1F1B's: the same on any stage)
    if schedule == "gpipe":
        return encode_orders(gpipe_orders(S, M))
    raise ValueError(f"no stage-order generator for schedule {schedule!r} (device groups: planner/chunked.py)")


@lru_cache(maxsize=1024)  # (a few hundred a search; each up to M × 3 pairs)
def _encoded_stage(schedule: str, stage: int, num_micro_batches: int, warm: int) -> tuple[tuple[int, int], ...]:
    """One stage's order encoded (compute_orders_of): all it depends on is its warm-up and, under
    ZB-H1, its place (the W's it holds back), so the shapes of a search share most stages' orders."""
    order = (
        zero_bubble.stage_order(stage, num_micro_batches, warm)
        if schedule == "zb_h1"
        else stage_order(num_micro_batches, warm)
    )
    return encode_orders([order])[0]
