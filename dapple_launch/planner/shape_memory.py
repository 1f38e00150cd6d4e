"""Whether a shape of device groups (chunked_search.py) can hold the model at any cut.

Each device of a group holds every stage on the group whole, its weights and optimizer state
(chunked.evaluate_chunked's memory; Chimera's stages sit on two groups each), and the activations
of the micro-batches in flight on those stages. Take the moment the first backward of the iteration
starts (a B, or an I under a split backward). Every backward needs its micro-batch's gradient from
the stage after, so the first runs on the last stage, on the micro-batch m* that stage's order
backs first. No backward has run anywhere yet, so nothing is freed: every stage still holds m*'s
activations, and each group every forward its order puts before its own last forward of m*, all of
which have run. So, at that moment, the groups together hold at least

    the model's weights and optimizer state (twice under Chimera) + Σ_s n_s kept_s,

with n_s the forwards of stage s so held (1 under Chimera, whose micro-batches take either of two
pipelines) and kept_s what one micro-batch leaves on the stage (ModelProfile.layer_bytes of its
layers, the input it received left out), at the samples a device of the largest group runs. The cut is open, so the
bound takes the least of Σ_s n_s kept_s over every cut: a programme over the layers, each stage at
least one. A shape whose groups' capacities sum to less fits no cut: no plan of it is admissible,
so the search neither scores nor bounds it.

Each stage alone, too (stages_hold): the orders fix the most micro-batches a stage keeps at once
(peak_in_flight), whatever the cut, and a device of its group must hold that many of what its
first layer keeps, beside its weights, its workspace and the group's other stages.

Without recomputation only: "full" and "selective" shrink a stage's activations (there the weights
alone count), and so does "auto" where the family's backward is not split (interleaved 1F1B and
Chimera recompute each stage's first layers in a candidate that does not fit otherwise:
chunked.recomputes_to_fit). The orders are read only where the activations could decide it (held
at twice the stage count, the most orders keep, they pass the capacity) and the orders are short
(ORDER_ACTIONS_READ); elsewhere micro-batch m* alone counts, which only weakens the check: small
models on large devices never build them.

And each span alone (span_masks): a span whose stage cannot hold its most micro-batches in flight
(kept whole, or recomputed: their inputs, and the span's saves during a backward) beside its
group's weights is no stage of any plan of the shape; the bounds over cuts (group_bound.py) leave
it out. Recomputed stages bound the time by the same room (room_bound's `recomputed`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile, kept_of
from ..schedule import build_rank_schedule
from .chunked import chunks_of, group_of, keeps_activations, stages_for
from .in_flight import fitting, runs_of_holds
from .limits import Limits

# the most actions a shape's rank orders may have for holds_model to build and read them (about
# 10 µs an action: a fuzzed profile of 60 layers on 32 devices at G 8192 built 160 orders of up to
# 1.5 M actions, 26 s, before this cap, and 95 of up to 30 k, 2.6 s, at that cap); skipping a
# shape's orders only weakens the check (Llama 3 70B's 32 groups on 1024 A100s: 6 k actions)
ORDER_ACTIONS_READ = 8_000
# the most for stages_hold, read only where all M in flight do not fit (memory-bound models): Llama 3
# 70B's Chimera on 64 groups of 4 at 64 micro-batches, 12 k actions, 0.4 s
PEAK_ACTIONS_READ = 16_000


def holds_model(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    keeps: bool | None = None,
) -> bool:
    """Whether the groups' devices together can hold the weights and the activations in flight at
    the first backward (the docstring) at some cut of the shape (family, v, groups, b). `keeps`:
    whether its stages keep their activations (by default chunked.keeps_activations; True asks
    whether a shape that may recompute fits without)."""
    L, P, M = profile.num_layers, len(groups), global_batch // b
    capacity = P * topology.device_memory_bytes * (1 - limits.memory_headroom) * (1 + 1e-12)
    held = profile.span(0, L)[3] * limits.optimizer_factor * (2 if family == "chimera" else 1)
    if not (keeps_activations(limits, family) if keeps is None else keeps):  # (recomputed: their inputs alone)
        return held <= capacity
    samples = math.ceil(b / max(groups))
    layer = [profile.layer_bytes(l, samples) for l in range(L)]  # (each stage's input left out)
    if held + sum(layer) > capacity:  # (micro-batch m* alone on every stage)
        return False
    usable = capacity / P
    if not stages_hold(profile, limits.optimizer_factor, usable, family, v, P, M, samples):
        return False
    S = stages_for(family, P, v)
    if family == "chimera" or held + min(M, 2 * S) * sum(layer) <= capacity:
        return True  # (no count the orders are likely to hold can decide it: not worth reading them)
    if S * M * 3 > ORDER_ACTIONS_READ:
        return True  # (orders too long to build for this: the check stays necessary, weaker)
    counts = forwards_held(family, P, M, v)
    return held + least_weighted_cut(layer, counts) <= capacity


def stages_hold(
    profile: ModelProfile, factor: float, usable: float, family: str, v: int, P: int, M: int, samples: int
) -> bool:
    """Whether every stage can keep, on a device of its group, the most micro-batches the family's
    rank orders put in flight on it at once (peak_in_flight): the simulator's peak (rank_simulate.py)
    counts each forward's saves until its B or W, with a step's workspace beside, and a device holds
    its stages' weights and optimizer state too. Stage s starts at some layer i in s .. L - S + s
    (every stage holds one at least), and a stage from layer i keeps no less than layer i alone
    does (the input it received and the layer's saves) beside no less weight and workspace, while
    the group's other stages weigh at least the lightest layer each (room_bound's count). The orders
    are fixed by the family, not by the cut: a shape whose first stages keep more micro-batches than
    any of their layers leave room for fits no cut (Llama 3 70B on 256 A100s: Chimera's, interleaved
    1F1B's and ZB-V's first stages keep 32 of 4.2 GB a block on 77 GB). Read only where all M in
    flight would not fit and the orders are short (PEAK_ACTIONS_READ); else it holds, weaker."""
    L = profile.num_layers
    S = stages_for(family, P, v)
    if S > L:
        return False
    others = chunks_of(family, v) - 1  # (the group's other stages)
    held, besides = _single_layers(profile, factor, samples)
    room = usable - min(x.parameter_bytes for x in profile.layers) * factor * others - besides
    # stage s starts at a layer in s .. L - S + s: the most micro-batches any of them leaves room for
    window = np.lib.stride_tricks.sliding_window_view(fitting(room, held), L - S + 1).max(axis=1)

    def fits(counts) -> bool:
        return bool(np.all(np.asarray(counts, dtype=float) <= window))

    if fits([M] * S):
        return True  # (all M in flight fit: no order can decide it)
    if S * M * 3 > PEAK_ACTIONS_READ:
        return True  # (orders too long to build for this: the check stays necessary, weaker)
    return fits(peak_in_flight(family, P, M, v))


def _single_layers(profile: ModelProfile, factor: float, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer i, what the span [i, i + 1) keeps per micro-batch (ModelProfile.kept_bytes: its
    saves and the input it received) and holds besides (its weights and optimizer state, its
    workspace) on `samples` samples: the least of any stage that starts at layer i."""
    pre, pbs, L = profile._prefix, profile.batch_size, profile.num_layers
    kept, fixed, params = (np.diff(np.asarray(pre[key], dtype=float)) for key in ("m", "mf", "p"))
    received = np.concatenate(([0.0], np.asarray(profile.cut_bytes[: L - 1], dtype=float)))
    held = kept_of(fixed, kept, received, samples, pbs)
    fixed_ws, slope_ws = (np.asarray(table[0]) for table in profile._workspace_tables)  # (ModelProfile.workspace)
    workspace = fixed_ws + slope_ws * samples
    return held, params * factor + workspace


@lru_cache(maxsize=16)
def _orders(family: str, groups: int, micro_batches: int, v: int):
    """(stages, encoded rank orders) of a shape's family, for the counts below: built once for both,
    apart from the search's cache (chunked.rank_orders), whose entries they would push out."""
    schedule = build_rank_schedule(family, groups, micro_batches, v)
    return schedule.num_stages, schedule.encoded_orders


@lru_cache(maxsize=256)
def peak_in_flight(family: str, groups: int, micro_batches: int, v: int) -> tuple[int, ...]:
    """Per stage, the most of its micro-batches in flight at once on one group that holds it, in the
    family's rank orders: a forward adds one, its B or W frees it (rank_simulate.py's rule)."""
    S, orders = _orders(family, groups, micro_batches, v)
    most = [0] * S
    for order in orders:
        now = [0] * S
        for code, s, _ in order:
            if code == 0:
                now[s] += 1
                most[s] = max(most[s], now[s])
            elif code in (1, 3):  # (B, or W: an I frees only what its input gradient alone reads, none here)
                now[s] -= 1
    return tuple(most)


@lru_cache(maxsize=256)
def forwards_held(family: str, groups: int, micro_batches: int, v: int) -> tuple[int, ...]:
    """Per stage, n_s: the forwards of it its group has run, none freed, when the first backward
    starts (the docstring); 1 each where the orders say otherwise than the argument needs (a
    backward before some group's last forward of m*: orders the validator would refuse)."""
    S, orders = _orders(family, groups, micro_batches, v)
    last = [step for order in orders for step in order if step[0] in (1, 2) and step[1] == S - 1]
    fallback = (1,) * S
    if not last:
        return fallback
    first = last[0][2]  # m*: the micro-batch the last stage backs first
    counts = [0] * S
    for order in orders:
        mine = [k for k, (code, _, m) in enumerate(order) if code == 0 and m == first]
        if not mine:
            continue
        for code, s, _ in order[: mine[-1] + 1]:
            if code != 0:
                return fallback
            counts[s] += 1
    return tuple(max(1, c) for c in counts)


def least_weighted_cut(layer: list[float], counts: tuple[int, ...]) -> float:
    """min over cuts of Σ_s counts[s] Σ_{l in stage s} layer[l]: stages in order, each of one layer
    or more (a programme over (stage, stop), O(S L) with a running least)."""
    L, S = len(layer), len(counts)
    if S > L:
        return math.inf
    prefix = [0.0]
    for x in layer:
        prefix.append(prefix[-1] + x)
    best = [0.0] + [math.inf] * L  # best[z]: layers 0 .. z - 1 on the stages so far
    for s, n in enumerate(counts):
        new, lowest = [math.inf] * (L + 1), math.inf
        for z in range(s + 1, L - (S - s - 1) + 1):
            lowest = min(lowest, best[z - 1] - n * prefix[z - 1])  # (the stage starts at z - 1 or before)
            new[z] = lowest + n * prefix[z]
        best = new
    return best[L]


def room_bound(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    optimizer_factor: float,
    capacity: float,
    times: np.ndarray,
    memo: dict,
    recomputed: bool = False,
    first: bool = False,
) -> float:
    """T >= what the room to keep micro-batches leaves any plan of the shape, at every cut (where
    its stages keep their activations: chunked.keeps_activations, or where `recomputed`, every
    layer of every stage recomputed: the runtime's "full").

    A stage [i, z) keeps each of its micro-batches (M, or M / 2 on each of Chimera's two copies)
    from its forward's end to its input gradient's end, at least the round trip R'(z) through the
    layers after it and back (each at its fastest, a split backward's input share) and its own input
    gradient. Its devices hold, besides, its weights and optimizer state and those of the group's
    other stages (v - 1 of them, two stages a group under ZB-V and Chimera, each at least the
    lightest layer's) and a step's workspace, so at most K = room / kept micro-batches at once (the
    simulator's peak, rank_simulate.py). Holds of which at most K overlap split into K runs of
    disjoint ones (an interval graph's colouring): one run holds ceil(M / K), the first after micro-
    batch 0 reached the stage and ran its forward, so T >= fill(i) + F(i, z) + ceil(M / K) hold.
    Whatever the cut, some stage holds layer l: T >= min over spans holding l of that, for every l.
    `times`: each layer's (forward, backward) at the fewest samples a device of the shape runs.

    Recomputed (cost.recomputed_costs, ModelProfile.recompute_bytes), a micro-batch keeps only the
    input the stage received, and its backward holds the stage's saves beside (one segment, the
    whole stage) with the workspace. The stage's count is at its most K just before one of its
    backwards (a forward more would pass it), which runs with all K still kept: so K received +
    the stage's saves + its workspace fit beside the weights, the same runs follow, with `times`
    those of the recomputed backward (chunked.recomputed_profile). A first stage keeps nothing.

    `first` (with `recomputed`): each stage may recompute any number k of its first layers, none to
    all (strategy.recompute=auto: group_recompute.py), on `times` without recomputation: a stage
    [i, z) recomputing its first k keeps received + tail_k a micro-batch, holds max(0, head_k -
    tail_k) more during a backward (head_k + tail_k: the span's saves), and its backward runs the
    head's forward again. Its term is the least over k (_first_layers_term): k = 0 is the kept one,
    k = z - i the one above."""
    L = profile.num_layers
    M = global_batch // b
    turns = M // 2 if family == "chimera" else M
    others = chunks_of(family, v) - 1  # (the group's other stages)
    n = math.ceil(b / max(groups))  # (the fewest samples a device runs: the least it keeps)
    key = ("room", turns, others, n, recomputed, first)
    if key in memo:
        return memo[key]
    if turns < 1:  # (a copy that runs no micro-batch holds none)
        memo[key] = 0.0
        return 0.0
    pre, pbs = profile._prefix, profile.batch_size
    forward, backward = times[:, 0], times[:, 1] * profile.least_input_share()
    fill = np.concatenate(([0.0], np.cumsum(forward)))
    input_ = np.concatenate(([0.0], np.cumsum(backward)))
    trip = (fill[L] - fill) + (input_[L] - input_)  # trip[z]: layers z .. L - 1 on and back
    weights = np.asarray(pre["p"]) * optimizer_factor
    lightest = min(x.parameter_bytes for x in profile.layers) * optimizer_factor * others
    kept, kept_fixed = np.asarray(pre["m"]), np.asarray(pre["mf"])
    received = np.concatenate(([0.0], np.asarray(profile.cut_bytes[: L - 1], dtype=float)))
    # every span at once, [i, z - 1] for the stage [i, z) (the same operations as one row at a time)
    i, z = np.arange(L)[:, None], np.arange(1, L + 1)[None, :]
    after = z > i  # (the rest is no span)
    ws_fixed_most, ws_slope_most = (table[:L, 1:] for table in span_workspace(profile))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        held = kept_of(
            kept_fixed[z] - kept_fixed[i], kept[z] - kept[i], received[i], n, pbs
        )  # (ModelProfile.kept_bytes)
        workspace = ws_fixed_most + ws_slope_most * n
        if recomputed and not first:  # (the input alone kept; the saves, received aside, beside during a backward)
            workspace, held = (
                workspace + held - received[i] * n / pbs,
                np.broadcast_to(received[i] * n / pbs, held.shape),
            )
        room = capacity - (weights[z] - weights[i]) - lightest - workspace
        runs = runs_of_holds(room, held, turns)
        hold = trip[z] + input_[z] - input_[i]
        term = np.where(after & np.isfinite(runs), fill[z] + runs * hold, np.inf)  # (inf where none fits)
        if recomputed and first:
            term = _first_layers_term(profile, n, turns, room, received[i] * n / pbs, fill, hold, term, after)
    # least over the spans [i, z) holding layer l (i <= l < z): a running least over z from the
    # right, then over i from the top
    right = np.minimum.accumulate(term[:, ::-1], axis=1)[:, ::-1]  # [i, l]: least over stops > l
    starts = np.arange(L)
    cover = np.where(starts[:, None] <= starts[None, :], right, np.inf).min(axis=0)  # [l]: over starts <= l
    memo[key] = out = float(cover.max()) if L else 0.0
    return out


def _first_layers_term(
    profile: ModelProfile,
    n: int,
    turns: int,
    room: np.ndarray,
    inputs: np.ndarray,
    fill: np.ndarray,
    hold: np.ndarray,
    kept_term: np.ndarray,
    after: np.ndarray,
) -> np.ndarray:
    """room_bound's term per span [i, z) (rows i, columns z - 1) where a stage may recompute any
    number k of its first layers: the least over k of fill + ceil(M / K_k) (hold + the head's
    forward again, at the input share), K_k the micro-batches that fit keeping the input and the
    tail's saves each, with max(0, head - tail) beside during a backward (ModelProfile.
    first_layers_recomputed). k = 0 is `kept_term` (every activation kept); only the spans whose
    kept holds run in more than one go (runs > 1) can gain, so the others are not walked."""
    L = profile.num_layers
    pre, pbs = profile._prefix, profile.batch_size
    kept, kept_fixed = np.asarray(pre["m"]), np.asarray(pre["mf"])
    share = profile.least_input_share()
    z = np.arange(1, L + 1)[None, :]
    # (the least a term can be is one run, fill + hold: spans kept at that cannot gain)
    need = after & (kept_term > (fill[z] + hold) * (1 + 1e-12))
    rows = np.nonzero(need.any(axis=1))[0]
    if not len(rows):
        return kept_term
    i, need = rows[:, None], need[rows]
    room, inputs, hold, term = room[rows], np.broadcast_to(inputs, kept_term.shape)[rows], hold[rows], kept_term[rows]
    for d in range(1, int(np.where(need, z - i, 0).max()) + 1):  # (k = d first layers, where the span has them)
        h = np.minimum(i + d, L)
        ok = need & (i + d <= z)
        head = kept_of(kept_fixed[h] - kept_fixed[i], kept[h] - kept[i], 0.0, n, pbs)
        tail = kept_of(kept_fixed[z] - kept_fixed[h], kept[z] - kept[h], 0.0, n, pbs)
        runs = runs_of_holds(room - np.maximum(0.0, head - tail), inputs + tail, turns)
        again = (fill[h] - fill[i]) * share
        term = np.minimum(term, np.where(ok & np.isfinite(runs), fill[z] + runs * (hold + again), np.inf))
    out = kept_term.copy()
    out[rows] = term
    return out


def _most_first_layers(saves: np.ndarray, room: np.ndarray, inputs: np.ndarray, kept_k: np.ndarray) -> np.ndarray:
    """span_masks' count per span [i, z) ((L + 1, L + 1) tables: `saves` of every span, `room` beside
    its weights and workspace, `inputs` received) where the stage may recompute any number k of its
    first layers: the most over k of the micro-batches that fit keeping the input and the tail's
    saves each with max(0, head - tail) beside (ModelProfile.first_layers_recomputed). k = 0 is
    `kept_k`."""
    L1 = saves.shape[0]
    i, z = np.arange(L1)[:, None], np.arange(L1)[None, :]
    most = kept_k
    for d in range(1, L1):
        h = np.minimum(i + d, L1 - 1)
        ok = i + d <= z
        if not ok.any():
            break
        head, tail = saves[i, h], saves[h, z]
        most = np.where(ok, np.maximum(most, fitting(room - np.maximum(0.0, head - tail), inputs + tail)), most)
    return most


def span_workspace(profile: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    """Over every span [i, z) (an (L + 1, L + 1) table, -inf where z <= i): the most fixed
    workspace and the most per sample of the profile's batch one layer of it holds
    (ModelProfile.workspace's two range maxima), a running most along each row from layer i."""
    L = profile.num_layers
    fixed = np.asarray([min(x.workspace_fixed_bytes, x.workspace_bytes) for x in profile.layers])
    slope = (np.asarray([x.workspace_bytes for x in profile.layers]) - fixed) / profile.batch_size
    i, z = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    last = np.broadcast_to(np.maximum(z - 1, 0), (L + 1, L + 1))  # (the span's last layer)
    most = (np.maximum.accumulate(np.where(z > i, row[last], -np.inf), axis=1) for row in (fixed, slope))
    return next(most), next(most)


def span_besides(profile: ModelProfile, optimizer_factor: float, others: int, whole_model: bool) -> tuple:
    """Over every span [i, z) (an (L + 1, L + 1) table), what a device of a stage on it holds
    whatever its samples: (valid: z > i; its weights and optimizer state and the group's `others`
    stages', the lightest layer's each, or every layer's where `whole_model`; its workspace's most
    fixed part and most per sample, span_workspace; its saves' fixed part and the rest per sample
    of the profile's batch; the input a stage from layer i receives, a column)."""
    L, pre = profile.num_layers, profile._prefix
    kept, kept_fixed, params = (np.asarray(pre[key], dtype=float) for key in ("m", "mf", "p"))
    lightest = min(x.parameter_bytes for x in profile.layers) * others
    i, z = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    besides = (params[z] - params[i] + lightest) * optimizer_factor
    if whole_model:
        besides = np.full((L + 1, L + 1), params[L] * optimizer_factor)
    span_fixed = kept_fixed[z] - kept_fixed[i]
    received = np.concatenate(([0.0], np.asarray(profile.cut_bytes[: L - 1], dtype=float), [0.0]))[:, None]
    ws_fixed, ws_slope = span_workspace(profile)
    return z > i, besides, ws_fixed, ws_slope, span_fixed, kept[z] - kept[i] - span_fixed, received


def span_masks(
    profile: ModelProfile,
    optimizer_factor: float,
    capacity: float,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    micro_batches: int,
    keeps: bool | None,
    tables: dict,
    first: bool = False,
) -> tuple[list[np.ndarray] | None, int, int]:
    """Per stage s, over every span [i, z) (an (L + 1, L + 1) table, as group_bound's): +inf where
    stage s cannot take that span in any plan of the shape for want of memory on a device of its
    group, 0 elsewhere (+inf on no span, z <= i). At its most micro-batches in flight K_s
    (peak_in_flight where the orders are short, PEAK_ACTIONS_READ, else 1) a device holds, besides
    its stage's weights and optimizer state, the group's other stages' (at least the lightest
    layer's each) and a step's workspace (rank_simulate.py's peak):
      kept (`keeps` True): K_s micro-batches of what the span keeps (ModelProfile.kept_bytes), at
        the end of a forward;
      recomputed (False: every layer, the runtime's "full"): K_s received inputs and, during the
        backward that follows the K_s-th forward (a forward more would pass K_s), the span's saves
        (ModelProfile.recompute_bytes' extra);
      either (None: recompute=auto, a candidate keeps its activations or recomputes).
    `first`: a stage that recomputes may recompute any number of its first layers (recompute=auto:
    group_recompute.py): the most micro-batches over every count (_most_first_layers).
    A span over capacity every way it may run is no stage of any admissible plan: group_bound's
    programmes leave it out, as they leave out spans at or over their cap. None where no span is
    left out, on a check of the largest any may need (O(L)). `tables`: the search's, shared by its
    shapes (a group's table depends on its samples and the shape's kind, not on the shape); the
    counts returned are of the tables over every span made here and of the masks made here (one
    comparison each), for the search's count of its bounds' work."""
    L, P = profile.num_layers, len(groups)
    S = stages_for(family, P, v)
    counts = [1] * S
    if S * micro_batches * 3 <= PEAK_ACTIONS_READ:
        counts = list(peak_in_flight(family, P, micro_batches, v))
    pre, pbs = profile._prefix, profile.batch_size
    kept, kept_fixed, params = (np.asarray(pre[key], dtype=float) for key in ("m", "mf", "p"))
    # at most: the weights and saves of the heaviest span a stage may take (L - S + 1 layers: every
    # other stage holds one), the group's others' weights, and the largest input and workspace, at
    # the most samples a device runs; where that fits, no span is left out (the tables unmade)
    n, others, w = math.ceil(b / min(groups)), chunks_of(family, v) - 1, max(1, L - S + 1)
    whole_model = chunks_of(family, v) == S  # (one group's stages are all of them: Chimera on two groups)
    lightest = min(x.parameter_bytes for x in profile.layers) * others
    heaviest = lambda prefix: float(np.max(prefix[w:] - prefix[: L + 1 - w]))  # (over windows of w layers)
    weights = params[L] if whole_model else heaviest(params) + lightest
    saves = heaviest(kept_fixed) + heaviest(kept - kept_fixed) * n / pbs
    most = weights * optimizer_factor + profile.workspace(0, L, n)
    most += max(counts) * (saves + max(profile.cut_bytes[: L - 1], default=0.0) * n / pbs)
    if most <= capacity:
        return None, 0, 0
    made = compared = 0
    kind = ("spans", others, whole_model)
    if kind not in tables:
        tables[kind] = span_besides(profile, optimizer_factor, others, whole_model)
        made += 1
    valid, besides, ws_fixed, ws_slope, span_fixed, per_sample, received = tables[kind]
    out = []
    for s in range(S):
        n = math.ceil(b / groups[group_of(family, s, P)])
        room_key = (*kind, n, capacity, keeps, first)
        if room_key not in tables:  # the most micro-batches in flight a span leaves room for
            with np.errstate(invalid="ignore", divide="ignore"):
                saves_n = span_fixed + per_sample * n / pbs
                room = capacity * (1 + 1e-9) - besides - ws_fixed - ws_slope * n
                inputs = np.broadcast_to(received * n / pbs, room.shape)
                kept_k = fitting(room, saves_n + inputs)  # (kept_bytes: its saves, its input)
                again = fitting(room - saves_n, inputs)
                if first and not keeps:  # (any count of first layers: the most over them)
                    again = _most_first_layers(saves_n, room, inputs, kept_k)
            k = kept_k if keeps else again if keeps is False else np.maximum(kept_k, again)
            tables[room_key] = np.where(valid, k, -1.0)
            made += 1
        mask_key = (*room_key, counts[s])
        if mask_key not in tables:
            tables[mask_key] = np.where(tables[room_key] >= counts[s], 0.0, np.inf)
            compared += 1
        out.append(tables[mask_key])
    return out, made, compared
