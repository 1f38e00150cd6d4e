"""Device groups that recompute to fit (strategy.recompute=auto on interleaved 1F1B and Chimera)
recompute each stage's fewest first layers, not every layer (planner/group_recompute.py): the
choice is read off each rank's orders without a simulation, and the simulator agrees with it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from dapple_launch.planner import Limits
from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
from dapple_launch.planner.shape_bound import num_stages

from .test_rank_schedules import tight_chain


def recomputing(limits: Limits, family: str) -> Limits:
    """The Limits of a candidate of `family` alone that recomputes every layer (as before this)."""
    return replace(limits, recompute="full", schedule=family, schedules=(family,), auto_token_slices=False)


SHAPES = [  # (family, v, groups): two stages a group on 2 or 4 groups, and Chimera's copies
    ("interleaved_1f1b", 2, (2, 2)),
    ("interleaved_1f1b", 2, (2, 2, 2, 2)),
    ("interleaved_1f1b", 3, (4, 4)),
    ("chimera", 2, (2, 2, 2, 2)),
]


def _candidates():
    """Candidates over memory keeping their activations, which fit with every layer recomputed:
    (profile, topology, layout, b, M, limits, family, v, the every-layer candidate)."""
    for seed, L, saved, usable in itertools.product((1, 2, 3), (10, 12), (5e8, 1.5e9), (3.2e9, 4.8e9)):
        rng, profile, topo = tight_chain(seed, L, saved, usable)
        limits = Limits(schedules=("interleaved_1f1b", "chimera"), recompute="auto")
        for (family, v, groups), b in itertools.product(SHAPES, (1, 2, 4)):
            S, M = num_stages(family, v, groups), 8 // b
            if S > L or M % len(groups):
                continue
            for _ in range(2):
                stops = [*sorted(rng.sample(range(1, L), S - 1)), L]
                layout = chunked_layout(family, list(groups), stops, None)
                keep = evaluate_chunked(profile, topo, layout, b, M, limits, family, v, refit=False)
                if keep is None or keep.fits:
                    continue
                whole = recomputing(limits, family)
                every = evaluate_chunked(profile, topo, layout, b, M, whole, family, v, refit=False)
                if every is not None and every.fits:
                    yield profile, topo, layout, b, M, limits, family, v, every


def test_device_groups_recompute_the_fewest_first_layers_that_fit():
    """On memory-tight random chains, every candidate of interleaved 1F1B and Chimera that does not fit
    keeping its activations and fits with every layer recomputed: the one auto plans fits too, is
    no slower (each backward runs no more again), recomputes a run of each stage's first layers, and
    one layer fewer on any stage would not fit, as the simulator measures it (so what the rank orders
    hold, read without it, is what it counts). And it recomputes fewer layers on most of them. Each
    is simulated once: whether keeping fits is read off the same table."""
    tried = fewer = 0
    for profile, topo, layout, b, M, limits, family, v, every in _candidates():
        walked: list = []  # (one simulation, not one keeping and one recomputing: the table says which)
        c = evaluate_chunked(profile, topo, layout, b, M, limits, family, v, walked=walked)
        assert c is not None and c.fits and len(walked) == 1, (family, v, layout)
        assert c.iteration_s <= every.iteration_s * (1 + 1e-12)
        marks = [st for st in c.recompute] if c.recompute else [()] * len(layout)
        for st, mine in zip(layout, marks):
            assert tuple(mine) == tuple(range(st.start, st.start + len(mine)))
        tried += 1
        fewer += sum(map(len, marks)) < sum(st.stop - st.start for st in layout)
        for s, mine in enumerate(marks):  # one fewer on stage s, costed and simulated in full
            if not mine:
                continue
            less = tuple(i for t, other in enumerate(marks) for i in (other[:-1] if t == s else other))
            alone = replace(
                recomputing(limits, family), recompute="selective" if less else "none", recompute_layers=less
            )
            trial = evaluate_chunked(profile, topo, layout, b, M, alone, family, v, refit=False)
            assert trial is not None and not trial.fits, (family, v, layout, s, marks)
        if tried <= 5:  # on devices with room to spare, it keeps everything, simulated once
            roomy = replace(topo, device_memory_bytes=topo.device_memory_bytes * 100)
            walked = []
            c = evaluate_chunked(profile, roomy, layout, b, M, limits, family, v, walked=walked)
            assert c is not None and c.fits and not c.recompute and len(walked) == 1
    assert tried > 30 and fewer > tried / 2, (tried, fewer)


def test_where_nothing_fits_the_candidate_keeps_its_activations_over_memory():
    """Where even every layer recomputed does not fit (the weights alone nearly fill a device), the
    candidate is costed keeping its activations, over memory, as before: the search drops it."""
    _, profile, topo = tight_chain(1, 8, 1.5e9, 1.0e9)
    limits = Limits(schedules=("interleaved_1f1b",), recompute="auto")
    layout = chunked_layout("interleaved_1f1b", [2, 2], [2, 4, 6, 8], None)
    c = evaluate_chunked(profile, topo, layout, 1, 8, limits, "interleaved_1f1b", 2)
    assert c is not None and not c.fits and not c.recompute
    every = evaluate_chunked(
        profile, topo, layout, 1, 8, recomputing(limits, "interleaved_1f1b"), "interleaved_1f1b", 2
    )
    assert every is not None and not every.fits


def test_the_recomputation_floor_and_forced_layers_hold_for_every_plan_that_fits():
    """shape_recompute.recompute_floor and forced_layers: on memory-tight random chains, every shape of
    interleaved 1F1B and Chimera under auto, its floor (the average group's work and the forwards
    that must run again to fit) is at or below every random cut of it that fits, the cuts evaluated
    as the search evaluates them (recomputing their first layers where they must), and every layer
    forced_layers names is among the layers such a cut recomputes. On some shapes the floor counts
    forwards run again, above the average work alone, and some layers are forced."""
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times
    from dapple_launch.planner.shape_recompute import forced_layers, recompute_floor

    checked = above = forced = 0
    covered = 0  # (fitting cuts of shapes with forced layers)
    for seed, L, saved, usable in itertools.product((1, 2, 3), (10, 12), (5e8, 1.5e9, 2.5e9), (3.2e9, 4.8e9)):
        rng, profile, topo = tight_chain(seed, L, saved, usable)
        limits = Limits(schedules=("interleaved_1f1b", "chimera"), recompute="auto")
        memo: dict = {}
        for family, v, groups, b in shapes(profile, topo, 8, limits, [1, 2, 4]):
            times = _layer_times(profile, topo, max(groups), b, {})
            floor = recompute_floor(profile, topo, 8, limits, family, v, groups, b, times, memo)
            above += floor > 8 // b * float(times.sum()) / len(groups) * (1 + 1e-9)
            must = set(forced_layers(profile, topo, 8, limits, family, v, groups, b))
            forced += bool(must)
            S = num_stages(family, v, groups)
            for _ in range(3):
                stops = [*sorted(rng.sample(range(1, L), S - 1)), L]
                c = evaluate_chunked(
                    profile, topo, chunked_layout(family, list(groups), stops, None), b, 8 // b, limits, family, v
                )
                if c is not None and c.fits:
                    checked += 1
                    assert floor <= c.iteration_s * (1 + 1e-9), (family, v, groups, b, stops, floor, c.iteration_s)
                    marks = {i for st in c.recompute for i in st} if c.recompute else set()
                    assert must <= marks, (family, v, groups, b, stops, sorted(must - marks))
                    covered += bool(must)
    assert checked > 120 and above > 60 and forced > 10 and covered > 10, (checked, above, forced, covered)


def _heads_cases(grid):
    """(profile, topology, limits, rng, its shapes' rows, memo, recomputed) on each memory-tight chain of the grid."""
    from dapple_launch.planner.chunked_bounds import bounded_shapes

    for seed, L, saved, usable in grid:
        rng, profile, topo = tight_chain(seed, L, saved, usable)
        limits = Limits(schedules=("interleaved_1f1b", "chimera"), recompute="auto")
        memo: dict = {}
        rows, again = bounded_shapes(profile, topo, 8, limits, [1, 2, 4], memo)
        yield profile, topo, limits, rng, rows, memo, again


def _fitting_cuts(profile, topo, limits, rng, family, v, groups, b):
    """Three random cuts of the shape, evaluated as the search evaluates them: those that fit."""
    L, S = profile.num_layers, num_stages(family, v, groups)
    for _ in range(3):
        stops = [*sorted(rng.sample(range(1, L), S - 1)), L]
        layout = chunked_layout(family, list(groups), stops, None)
        c = evaluate_chunked(profile, topo, layout, b, 8 // b, limits, family, v)
        if c is not None and c.fits:
            yield layout, c


def test_each_stage_of_a_plan_that_fits_recomputes_at_least_the_head_its_span_needs():
    """shape_recompute.span_heads: on memory-tight random chains, every shape of interleaved 1F1B and
    Chimera under auto and random cuts of it that fit as the search evaluates them, each stage
    [i, z) recomputes at least layers i .. h - 1 of its span's table (h = i: none need be), and no
    fitting cut takes a span the table says fits at no count; on most of them some stage needs a
    head."""
    from dapple_launch.planner.shape_recompute import span_heads

    grid = itertools.product((1, 2, 3), (10, 12), (5e8, 1.5e9, 2.5e9), (3.2e9, 4.8e9))
    checked = needed = 0
    for profile, topo, limits, rng, rows, _, _ in _heads_cases(grid):
        room = (limits.optimizer_factor, topo.device_memory_bytes * (1 - limits.memory_headroom))
        for _, family, v, groups, b in rows:
            made = span_heads(profile, *room, 8, family, v, groups, b, {})
            assert made is not None
            for layout, c in _fitting_cuts(profile, topo, limits, rng, family, v, groups, b):
                checked += 1
                marks = {i for st in c.recompute for i in st} if c.recompute else set()
                for s, st in enumerate(layout):
                    h = int(made[0][s][st.start, st.stop])
                    assert h >= 0, (family, v, groups, b, layout, s)
                    assert set(range(st.start, h)) <= marks, (family, v, groups, b, layout, s, h, sorted(marks))
                    needed += h > st.start
    assert checked > 120 and needed > 40, (checked, needed)


@pytest.mark.slow  # (the bounds over cuts of every shape twice: 8 s)
def test_the_bounds_over_cuts_that_read_the_heads_rise_and_stay_below_every_fitting_cut(monkeypatch):
    """The bounds over a shape's cuts read span_heads' tables (GroupBound.again: each backward runs
    the head's forward again): on the memory-tight chains above, with them some shapes' bounds rise
    (far more than fall: the weights' ascent may take another way), and each stays at or below every
    fitting cut."""
    import math

    from dapple_launch.planner import chunked_bounds
    from dapple_launch.planner.chunked_bounds import cut_bounds

    grid = itertools.product((1, 2, 3), (10, 12), (5e8, 1.5e9, 2.5e9), (3.2e9, 4.8e9))
    checked = raised = lowered = 0
    for profile, topo, limits, rng, rows, memo, again in _heads_cases(grid):
        for bound, family, v, groups, b in rows:
            shape = [(bound, family, v, groups, b)]
            with_heads = cut_bounds(profile, topo, 8, shape, math.inf, dict(memo), 1e9, again)[b]
            monkeypatch.setattr(chunked_bounds, "span_heads", lambda *args: None)  # (the bound as before them)
            without = cut_bounds(profile, topo, 8, shape, math.inf, dict(memo), 1e9, again)[b]
            monkeypatch.undo()
            raised += with_heads > without * (1 + 1e-9)
            lowered += with_heads < without * (1 - 1e-9)
            for _, c in _fitting_cuts(profile, topo, limits, rng, family, v, groups, b):
                checked += 1
                assert with_heads <= c.iteration_s * (1 + 1e-9), (family, v, groups, b, c.layout)
    assert checked > 120 and raised > 5 * max(1, lowered), (checked, raised, lowered)
