"""What recomputation must cost a shape of device groups whose stages may recompute any number of
their first layers (strategy.recompute=auto: group_recompute.py chooses them per candidate), for
the shape's bounds (chunked_bounds.py): the layers every plan of the shape that fits recomputes
(forced_layers), whose backwards the bounds then read with their forward run again, and the
forward work run again that every such plan runs at least (recompute_floor)."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile, kept_of
from .chunked import chunks_of, group_of, stages_for
from .limits import Limits
from .shape_memory import (
    ORDER_ACTIONS_READ,
    PEAK_ACTIONS_READ,
    forwards_held,
    least_weighted_cut,
    peak_in_flight,
    span_besides,
)


def recompute_floor(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    times: np.ndarray,
    memo: dict,
) -> float:
    """T >= (M Σ_l (f_l + b_l) + W) / P for a shape of device groups whose stages may recompute any
    number of their first layers (recompute=auto): the busiest group is at least as busy as the
    average, every micro-batch runs every layer's forward and backward, and W is forward work run
    again that every plan of the shape that fits runs, the more of two counts:

    - each stage alone: at its most micro-batches in flight K_s (peak_in_flight; 1 where the orders
      are not read) a device of its group holds K_s times what the stage keeps and, during the
      backward after, what it holds beside (rank_simulate.py's peak), with its weights, the group's
      other stages' (the lightest layer's each) and its workspace. A stage of one layer holds no
      more of any of these than one of more layers from the same first layer recomputing as many
      first layers or fewer, so where a stage from layer i fits, the one-layer stage [i, i + 1) fits
      too, keeping its layer or recomputing it: the least such stage s may start at (layers s .. L -
      S + s) runs none again where one keeps, else that layer's forward, for each of the M
      micro-batches;
    - all stages at once: at the first backward (the module's docstring) the groups together hold
      the weights and, kept, at least the least weighted cut of the layers' saves (m* alone where
      the orders are not read); a recomputed layer sheds at most its saves times the most any stage
      holds then, so the excess over the groups' memory takes at least a fractional knapsack of
      forwards (layers by saves per second).

    `times`: each layer's (forward, backward) at the fewest samples a device of the shape runs, so
    each term is at or below what any plan of the shape runs; inf where some stage fits nowhere.
    `memo`: the search's (the one-layer stages' tables, per group size, shared by its shapes)."""
    L, P, M = profile.num_layers, len(groups), global_batch // b
    S = stages_for(family, P, v)
    usable = topology.device_memory_bytes * (1 - limits.memory_headroom)
    factor, forward = limits.optimizer_factor, times[:, 0]
    work = M * float(times.sum()) / P
    if S > L:
        return math.inf
    # each stage alone: per group size, every one-layer stage's room, input, saves (numpy, O(L))
    counts = peak_in_flight(family, P, M, v) if S * M * 3 <= PEAK_ACTIONS_READ else (1,) * S
    others = chunks_of(family, v) - 1
    lightest = min(x.parameter_bytes for x in profile.layers) * others
    whole_model = chunks_of(family, v) == S  # (Chimera on two groups: each holds every layer)
    tables = memo.setdefault(("one-layer stages", others, whole_model, usable, factor), {})
    alone = 0.0
    for s in range(S):
        n = math.ceil(b / groups[group_of(family, s, P)])
        if n not in tables:
            weights = np.array(
                [profile.span(0, L)[3] if whole_model else profile.span(i, i + 1)[3] + lightest for i in range(L)]
            )
            ws = np.array([profile.workspace(i, i + 1, n) for i in range(L)])
            saves = np.array([profile.bytes_between(i, i + 1, n) for i in range(L)])
            received = np.array([profile.kept_bytes(i, i + 1, n) for i in range(L)]) - saves
            tables[n] = (usable * (1 + 1e-9) - weights * factor - ws, received, saves)
        room, received, saves = (x[s : L - S + s + 1] for x in tables[n])
        if np.any(counts[s] * (received + saves) <= room):
            continue  # (some one-layer stage keeps its layer: no forward run again need be)
        again = np.where(counts[s] * received + saves <= room, forward[s : L - S + s + 1], np.inf)
        alone += float(again.min())
    # all stages at once (only where the excess can be positive: M in flight on every stage)
    held = profile.span(0, L)[3] * factor * (2 if family == "chimera" else 1)
    samples = math.ceil(b / max(groups))
    layer = [profile.layer_bytes(l, samples) for l in range(L)]
    excess, most = held + sum(layer) - P * usable, M  # (m* alone on every stage)
    if held + M * sum(layer) > P * usable and S * M * 3 <= ORDER_ACTIONS_READ:
        counted = forwards_held(family, P, M, v)
        excess, most = max(excess, held + least_weighted_cut(layer, counted) - P * usable), max(counted)
    shed = 0.0
    for l in sorted(range(L), key=lambda l: (-layer[l] / forward[l] if forward[l] > 0 else -math.inf, l)):
        can = most * layer[l]
        if not excess > 0:
            break
        if can <= 0:
            continue
        if can >= excess:
            shed += forward[l] * excess / can
            break
        shed, excess = shed + forward[l], excess - can
    return work + M * max(alone, shed) / P


def forced_layers(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
) -> tuple[int, ...]:
    """The layers every plan of the shape that fits recomputes, where its stages may recompute any
    number of their first layers (recompute=auto). A stage s [i, z) that keeps layer l (l in its
    tail: the layers after its recomputed head, l .. z - 1 among them) holds, at its most
    micro-batches in flight K_s (peak_in_flight), K_s times its input and l's saves at least, beside
    l's workspace and its weights (at least the lightest layer's, and the group's other stages' as
    many). Where that passes a device's memory for every stage that may hold l (layers s .. L - S +
    s) and every start i <= l it may take, no plan keeps l: its backward runs its forward again
    (recomputed_profile), and the shape's bounds may read that. None where the orders are not read
    (PEAK_ACTIONS_READ)."""
    L, P, M = profile.num_layers, len(groups), global_batch // b
    S = stages_for(family, P, v)
    if S > L or S * M * 3 > PEAK_ACTIONS_READ:
        return ()
    counts = peak_in_flight(family, P, M, v)
    usable = topology.device_memory_bytes * (1 - limits.memory_headroom) * (1 + 1e-9)
    lightest = min(x.parameter_bytes for x in profile.layers)
    whole_model = chunks_of(family, v) == S
    weights = (profile.span(0, L)[3] if whole_model else lightest * chunks_of(family, v)) * limits.optimizer_factor
    pbs, width = profile.batch_size, L - S + 1  # (stage s's window: layers s .. s + width - 1)
    s_, l_ = np.arange(S)[:, None], np.arange(L)[None, :]
    may = (l_ >= s_) & (l_ < s_ + width)  # (stage s may hold layer l)
    cut = np.asarray([0.0, *profile.cut_bytes[: L - 1]], dtype=float)  # (what a stage from layer i receives)
    received = np.minimum.accumulate(np.where(l_ >= s_, cut[None, :], np.inf), axis=1)  # [s, l]: least from s .. l
    n = np.array([math.ceil(b / groups[group_of(family, s, P)]) for s in range(S)], dtype=float)[:, None]
    pre = profile._prefix
    fixed, saved = np.diff(np.asarray(pre["mf"], dtype=float)), np.diff(np.asarray(pre["m"], dtype=float))
    ws_fixed = np.asarray([min(x.workspace_fixed_bytes, x.workspace_bytes) for x in profile.layers])
    ws_slope = (np.asarray([x.workspace_bytes for x in profile.layers]) - ws_fixed) / pbs
    with np.errstate(invalid="ignore"):
        held = (
            np.asarray(counts, dtype=float)[:, None] * kept_of(fixed[None, :], saved[None, :], received, n, pbs)
            + ws_fixed[None, :]
            + ws_slope[None, :] * n
        )
    kept = np.any(may & (held + weights <= usable), axis=0)
    return tuple(l for l in range(L) if not kept[l])


def span_heads(
    profile: ModelProfile,
    factor: float,
    usable: float,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    made: dict,
) -> tuple[list[np.ndarray], int, int] | None:
    """Per stage s, over every span [i, z) (an (L + 1, L + 1) table): the least h such that a stage
    s on [i, z) that recomputes its first layers i .. h - 1 may fit a device of its group, -1 where
    none does (not even h = z). At its most micro-batches in flight K_s (peak_in_flight; 1 where
    the orders are not read) the stage keeps, per micro-batch, the input it received and the saves
    of layers h .. z - 1 (group_recompute.py), and a device holds K_s of them after the K_s-th
    forward, with its workspace (ModelProfile.workspace of the span), its weights and optimizer
    state and the group's other stages' (the lightest layer's each; Chimera on two groups: the
    whole model). The backward's extra (the head's saves over the tail's) is left out, so every
    plan of the shape that fits recomputes at least layers i .. h - 1 of such a stage
    (recompute=auto: a run of first layers), and its backwards run their forward again: the bound
    over the shape's cuts reads these (group_bound.GroupBound.heads). `factor`: the optimizer's
    (Limits.optimizer_factor); `usable`: a device's bytes less the headroom; `made`: the search's
    tables, shared by its shapes (one per micro-batches in flight, samples and the group's stages).
    With the counts of tables made here (none found in `made`): the room a span leaves (_room, per
    samples and group), and the heads (per micro-batches in flight too); None where no stage fits
    (S > L)."""
    L, P, M = profile.num_layers, len(groups), global_batch // b
    S = stages_for(family, P, v)
    if S > L:
        return None
    counts = peak_in_flight(family, P, M, v) if S * M * 3 <= PEAK_ACTIONS_READ else (1,) * S
    chunks = chunks_of(family, v)
    whole = chunks == S  # (each group holds every stage)
    out, bases, derived = [], 0, 0
    for s in range(S):
        n = math.ceil(b / groups[group_of(family, s, P)])
        base = (n, chunks, whole, factor, usable)
        if base not in made:
            made[base] = _room(profile, *base)
            bases += 1
        key = (*base, counts[s])
        if key not in made:
            made[key] = _heads(profile, made[base], n, counts[s])
            derived += 1
        out.append(made[key])
    return out, bases, derived


def _room(profile: ModelProfile, n: int, chunks: int, whole: bool, factor: float, usable: float) -> tuple:
    """Over every span [i, z), what a device of a stage on it has for its micro-batches in flight
    beside its weights and optimizer state, the group's other stages' (`chunks` stages a group;
    `whole`: every layer) and the span's workspace on n samples (span_besides, span_masks' room);
    with kept_of's prefix at n samples (never decreasing: a layer keeps no less than nothing; what
    layers h .. z - 1 keep is kept[z] - kept[h]) and the input a stage from each layer receives,
    per micro-batch."""
    pre, pbs = profile._prefix, profile.batch_size
    _, besides, ws_fixed, ws_slope, _, _, received = span_besides(profile, factor, chunks - 1, whole)
    room = usable * (1 + 1e-9) - besides - ws_fixed - ws_slope * n  # (+inf where z <= i: _heads masks it)
    kept = np.maximum.accumulate(
        kept_of(np.asarray(pre["mf"], dtype=float), np.asarray(pre["m"], dtype=float), 0.0, n, pbs)
    )
    return room, kept, received[:, 0] * n / pbs


def _heads(profile: ModelProfile, room: tuple, n: int, K: int) -> np.ndarray:
    """span_heads' table of a stage on n samples with K micro-batches in flight (_room's `room`)."""
    L = profile.num_layers
    i, z = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    beside, kept, received = room
    need = kept[z] + received[i] - beside / K  # (the least kept[h] that fits)
    h = np.maximum(np.searchsorted(kept, need, side="left"), i)
    return np.where((z > i) & (h <= z), h, -1)
