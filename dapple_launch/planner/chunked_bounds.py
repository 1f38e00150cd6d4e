"""The bounds of device-group shapes (chunked_search.py's): each shape's cut-blind bound under the
run's recomputation (bounded_shapes: shape_bound.py's, with the room memory leaves for micro-batches
in flight, shape_memory.py, and under auto what recomputation must cost, shape_recompute.py), then
the shapes the search leaves open bounded again over their cuts (cut_bounds: group_bound.py's dual,
the paths of their rank orders and the critical paths of the cuts those answer with, path_bound.py),
within a count of the programmes' cells: the same bounds on any machine."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from ..cluster import Topology
from ..profile.model_profile import ModelProfile
from .chunked import keeps_activations, recomputed_profile, recomputes_to_fit
from .group_bound import GroupBound, weight_share_table
from .group_shapes import shapes
from .limits import Limits
from .path_bound import (
    CRITICAL_ACTION_CELLS,
    MASK_STAGE_CELLS,
    ORDER_ACTION_CELLS,
    ORDER_ACTION_CELLS_ELSE,
    SHAPE_CELLS,
    TABLE_CELLS,
    order_actions,
)
from .shape_bound import _layer_times, num_stages, shape_bounds
from .shape_memory import holds_model, room_bound, span_masks
from .shape_recompute import forced_layers, recompute_floor, span_heads

# the bounds over cuts of the shapes left open (group_bound.py) may walk this many (stage, start,
# stop) cells of their programmes per strategy.search_nodes, each stage's overhead and the path
# games counted in cells too (path_bound.programme_cells: about 2.4 ns each, so about 0.17 s at the
# default)
BOUND_CELLS_PER_NODE = 3500
# and the second pass (the shapes left lowest: the dual again, then the paths of their rank orders,
# path_bound.py, whose programmes weigh five tables a stage and whose games cost as much again)
# this many times as many again: about 0.35 s at the default, spent only where shapes stay low
PATH_CELLS = 2.0
# and the third (the shapes left lowest again: the paths with the critical paths of the cuts they
# answer with, each a simulation of the rank orders) this many times as many again: about 0.15 s
CRITICAL_CELLS = 0.7
# and where the other families' bound rose above what those passes aimed at (cut_bounds' raise_to),
# this many times as many again toward it (AmoebaNet-36 on 16 × 1 V100 at G 64: as many again left
# the device groups at the copies' cheaper bound, the proof at 25.1 %; twice, 16.0 %, as aiming at
# the dearer one from the first pass did, without that aim's loss elsewhere)
RAISE_CELLS = 2.0


def room_shape_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
    room: tuple[float, float] | None,
    recomputed: bool = False,
    weigh: bool = True,
) -> tuple[float, float]:
    """shape_bounds (the bound, and the plain one the search orders by), each with, where `room`
    (optimizer factor, usable bytes a device), the room memory leaves for micro-batches in flight
    (shape_memory.room_bound: the stages keep their activations, or where `recomputed` their inputs
    alone)."""
    bound, plain = shape_bounds(profile, topology, global_batch, groups, b, memo, family, v, weigh)
    if room is None:
        return bound, plain
    least = _layer_times(profile, topology, max(groups), b, memo)  # (the fewest samples a device runs)
    factor, usable = room
    roomy = room_bound(profile, topology, global_batch, family, v, groups, b, factor, usable, least, memo, recomputed)
    return max(bound, roomy), max(plain, roomy)


def bounded_shapes(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    limits: Limits,
    sizes: list[int],
    memo: dict,
) -> tuple[list[tuple], tuple[ModelProfile, set] | None]:
    """The shapes (bound, family, v, groups, b) in increasing bound, the plain one (shape_bounds:
    memo["weighed"] holds per shape a call that gives its bound with the groups weighed), and where
    some recompute (strategy.recompute=full: every layer of every candidate; auto: where no cut fits
    keeping the activations, each stage's first layers, chunked.recomputes_to_fit), the profile
    their bounds read (full: each layer's backward runs its forward again, recomputed_profile; auto:
    the profile itself, as a stage may recompute none of its layers) with the set of those shapes
    (family, v, groups, b). Where a shape's stages keep their activations
    (chunked.keeps_activations) the room memory leaves for micro-batches in flight bounds it too;
    under auto, a shape whose candidates may recompute is bound by the room they leave recomputing
    their first layers (room_bound's `first`: no less than keeping them all leaves)."""
    room = (limits.optimizer_factor, topology.device_memory_bytes * (1 - limits.memory_headroom))
    some = limits.recompute == "full" or any(recomputes_to_fit(limits, f) for f in limits.allowed())
    first = limits.recompute == "auto"  # (group_recompute.py: any count of first layers a stage)
    heavier = recomputed_profile(profile) if limits.recompute == "full" else profile
    rmemo = memo.setdefault("recomputed", {}) if heavier is not profile else memo
    rows, whole, weighed = [], set(), memo.setdefault("weighed", {})
    keeps = {}  # per shape, whether its candidates keep their activations (None: either; cut_bounds' masks)
    forced_on = memo.setdefault("forced_on", {})  # per shape: (profile its bounds read, its tables, those layers)
    forced_memo: dict = {}  # per set of layers every plan recomputes: (that profile, its tables, the layers)
    if limits.recompute != "selective":
        memo["room"] = (*room, keeps, first)

    def bounds_of(f: str, v: int, g: tuple[int, ...], b: int, weigh: bool) -> tuple[float, float]:
        """(bound, plain) of a shape as keeps[shape] says it may run (shape_bounds' `weigh`)."""
        kept = keeps[(f, v, g, b)]
        if kept is True:
            return room_shape_bounds(
                profile,
                topology,
                global_batch,
                f,
                v,
                g,
                b,
                memo,
                room if keeps_activations(limits, f) else None,
                weigh=weigh,
            )
        if not first:  # (full: every layer of every candidate recomputed)
            return room_shape_bounds(heavier, topology, global_batch, f, v, g, b, rmemo, room, True, weigh)
        # (kept None or False, under auto: a candidate keeps every activation or recomputes some of
        # each stage's first layers, and the least over every count, none included, bounds either)
        # any count of each stage's first layers: the layers every plan recomputes run their forward
        # again in the backward (forced_layers), the room is the least over the counts, and the
        # forward work run again to fit is at least recompute_floor's (in the bound the shape states
        # only, not the plain one the search orders and prunes by: raising that moved the budget,
        # and fuzz seed 448 then planned 6.5 % slower)
        on, on_memo, _ = forced_of((f, v, g, b))
        bound, plain = shape_bounds(on, topology, global_batch, g, b, on_memo, f, v, weigh)
        times = _layer_times(profile, topology, max(g), b, memo)
        roomy = room_bound(profile, topology, global_batch, f, v, g, b, *room, times, memo, True, True)
        if not weigh:  # (the plain pass over every shape reads only the plain bound: no floor there)
            return max(bound, roomy), max(plain, roomy)
        floor = recompute_floor(profile, topology, global_batch, limits, f, v, g, b, times, memo)
        return max(bound, roomy, floor), max(plain, roomy)

    def forced_of(shape: tuple) -> tuple[ModelProfile, dict, tuple[int, ...]]:
        """The profile a shape's bounds read, with the layers every plan of it recomputes
        (shape_recompute.forced_layers) run again, its tables and those layers (memo["forced_on"] per
        shape; one profile and one set of tables per set of layers)."""
        if shape not in forced_on:
            layers = forced_layers(profile, topology, global_batch, limits, *shape)
            if not layers:
                forced_on[shape] = (profile, memo, layers)
            else:
                if layers not in forced_memo:
                    forced_memo[layers] = (
                        recomputed_profile(profile, layers),
                        {"built": memo.setdefault("built", set())},
                        layers,
                    )
                forced_on[shape] = forced_memo[layers]
        return forced_on[shape]

    for f, v, g, b in shapes(profile, topology, global_batch, limits, sizes):
        if keeps_activations(limits, f) or not some:  # (selective: the plain bound holds)
            keeps[(f, v, g, b)] = True
        elif limits.recompute == "auto" and holds_model(
            profile, topology, global_batch, limits, f, v, g, b, keeps=True
        ):
            keeps[(f, v, g, b)] = None
        else:
            keeps[(f, v, g, b)] = False
            whole.add((f, v, g, b))
        # the plain bound now, the weighed one only for the shapes the search leaves open that could
        # be their size's least (cut_bounds), a few of the thousands
        plain = bounds_of(f, v, g, b, False)[1]
        rows.append((plain, f, v, g, b))
        weighed[(f, v, g, b)] = functools.partial(bounds_of, f, v, g, b, True)
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))
    if rmemo is not memo:
        rmemo["built"] = memo.setdefault("built", set())  # (the rank orders are the same: built once)
    return rows, ((heavier, whole) if whole else None)


def cut_bounds(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    open_shapes: list[tuple],
    best: float,
    memo: dict,
    cells: float,
    recomputed: tuple[ModelProfile, set] | None = None,
    raise_to: float | None = None,
    weighed: Callable[[tuple], float] | None = None,
) -> dict[int, float]:
    """Per micro-batch size, the least bound of the shapes left open, each raised by the bound over
    its cuts (group_bound.py) as far as it decides the gap: in increasing shape bound, each only up
    to the least so far (or `best`: the best plan, or the least bound of the other families where
    lower), above which it changes nothing; within `cells` of the bounds' programmes (a count, not
    a clock: the same bounds on any machine), the rest as they are. Then, within PATH_CELLS of as
    many cells again, the shapes left lowest once more in increasing bound, each up to the least so
    far: the dual again (it stopped at the least bound of the shapes before it, which may have
    risen since) and the paths of the rank orders (path_bound.py). Then, within CRITICAL_CELLS as
    many, the paths with the critical paths of the cuts they answer with (GroupBound.critical).
    Each pass only raises what the one before left. `recomputed`: the profile the shapes every
    candidate of which recomputes read (under full, its backwards run their forward again: memo's
    "recomputed" tables; under auto, the profile itself), and the set of those shapes (family, v,
    groups, b). `raise_to`: where the other
    families' least bound is above `best` (a dearer bound of theirs that the passes above do not aim
    at, so they spend as they would without it: Proposal.lower), one more pass within RAISE_CELLS
    as many cells raises the shapes left below it, in increasing bound, each up to the least so
    far: no shape ends lower than it would without that bound. `weighed`: a shape's bound with the
    groups weighed (shape_bound.busiest_group), which each shape's result is raised to at the end
    (asked only of the shapes that could be their size's least: a few of the open ones): the passes
    run on the plain bounds, as the search orders and prunes by them, so the cells go where they
    went without the weights and no shape ends lower than it would without them."""
    heavier, whole = recomputed if recomputed is not None else (profile, set())
    heads = memo.setdefault("heads", {})  # (shape_recompute.span_heads' tables, shared by the shapes)

    def group_bound(family, v, groups, b) -> GroupBound:
        on = memo.get("forced_on", {}).get((family, v, groups, b))
        if (family, v, groups, b) in whole and heavier is not profile:
            dual = group_bound_of(heavier, topology, global_batch, family, v, groups, b, memo["recomputed"])
        elif on is not None and on[0] is not profile:  # (the layers every plan of it recomputes: bounded_shapes)
            dual = group_bound_of(on[0], topology, global_batch, family, v, groups, b, on[1])
        else:
            dual = group_bound_of(profile, topology, global_batch, family, v, groups, b, memo)
        if "room" in memo:  # (the spans memory leaves out: bounded_shapes says how each shape may run)
            factor, usable, keeps, first = memo["room"]
            key = (family, v, groups, b)
            masks = memo.setdefault("masks", {})
            dual.room, made, compared = span_masks(
                profile, factor, usable, family, v, groups, b, global_batch // b, keeps[key], masks, first
            )
            dual.cells += made * TABLE_CELLS + compared * MASK_STAGE_CELLS
            if first and keeps[key] is not True:
                # (auto, a shape whose stages may recompute their first layers: each span's least
                # forward run again to fit, beside the layers every plan recomputes, which the
                # profile `on` holds)
                made = span_heads(profile, factor, usable, global_batch, family, v, groups, b, heads)
                if made is not None:
                    dual.set_heads(made[0], on[2] if on is not None else ())  # (() where none is forced)
                    dual.cells += made[1] * TABLE_CELLS + made[2] * MASK_STAGE_CELLS
        return dual

    rows: list[list] = []  # [bound, family, v, groups, b, its GroupBound or None]
    least, given, lead = best, cells, {}  # (lead: per family and stage count, the kind of term that binds)
    for bound, family, v, groups, b in sorted(open_shapes, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
        dual = None
        if bound < least and cells > 0:
            dual = group_bound(family, v, groups, b)
            dual.with_paths, dual.lead = False, lead  # (the paths' turn comes below, on the shapes left lowest)
            bound = max(bound, dual.bound(least, cells))
            cells -= dual.cells
        least = min(least, bound)
        rows.append([bound, family, v, groups, b, dual])
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))  # (ties: by shape, never by the objects)
    warm: dict = {}  # (per rank orders, the path weights that did best so far)

    def raise_rows(least: float, cells: float) -> None:
        """The rows below `least` in increasing bound, each raised by the dual again and the paths
        of its rank orders up to the least so far, within `cells`."""
        for row in sorted(rows, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
            if row[0] >= least or cells <= 0:
                break  # (every shape after it is as high: none is below the least any more)
            family, v, groups, b = row[1:5]
            dual = row[5]
            if dual is None:
                dual = group_bound(family, v, groups, b)
            else:
                dual.cells = 0  # (its tables are made: counted in a pass before)
            dual.with_paths, dual.warm, dual.lead = True, warm, lead
            row[0] = max(row[0], dual.bound(least, cells))
            cells -= dual.cells
            least = min(least, row[0])

    # the dual again (above, it stopped at the least bound of the shapes before it, which may be
    # higher now), then the paths; from `best`: what the shapes raised so far are all at or above
    raise_rows(best, given * PATH_CELLS)
    # and, within CRITICAL_CELLS of as many again, the paths once more with the critical paths of
    # the cuts they answer with (path_bound.py): where transfers chain the groups' steps. A shape
    # whose rank orders and one critical path the cells left cannot pay for is left as it is
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))
    critical, least = given * CRITICAL_CELLS, best
    for row in rows:
        if row[0] >= least or critical <= 0:
            break
        family, v, groups, b = row[1:5]
        actions = order_actions(family, num_stages(family, v, groups), global_batch // b)
        if actions * (ORDER_ACTION_CELLS.get(family, ORDER_ACTION_CELLS_ELSE) + CRITICAL_ACTION_CELLS) < critical:
            dual = row[5]
            if dual is None:
                dual = group_bound(family, v, groups, b)
            else:
                dual.cells = 0  # (its tables are made: counted in the passes before)
            row[0] = max(row[0], dual.critical(least, critical))
            critical -= dual.cells
        least = min(least, row[0])
    if raise_to is not None and raise_to > best:
        raise_rows(raise_to, given * RAISE_CELLS)
    bounds: dict[int, float] = {}
    for bound, family, v, groups, b, _ in sorted(rows, key=lambda x: (x[0], x[1], x[2], x[3], x[4])):
        if b in bounds and bound >= bounds[b]:  # (raised or not, it is no less than its size's least)
            continue
        if weighed is not None:
            bound = max(bound, weighed((family, v, groups, b)))
        bounds[b] = min(bounds.get(b, math.inf), bound)
    return bounds


def group_bound_of(
    profile: ModelProfile,
    topology: Topology,
    global_batch: int,
    family: str,
    v: int,
    groups: tuple[int, ...],
    b: int,
    memo: dict,
) -> GroupBound:
    times = lambda r, b=b: _layer_times(profile, topology, r, b, memo)
    bound = GroupBound(profile, topology, global_batch, family, v, groups, b, times, memo.setdefault("tables", {}))
    if "share" not in memo:  # (the profile's: one table for every shape)
        memo["share"] = weight_share_table(profile)
    bound.share, bound.built = memo["share"], memo.setdefault("built", set())
    bound.cells += SHAPE_CELLS  # (its set-up; the tables it made are counted already)
    return bound
