"""Pure tier: the time-memory frontier (TensorOpt's FT) equals exhaustive enumeration on small
instances, exactly and within its stated bound when bucketed; every point is a valid plan; the
objectives and the budget choose as documented; devices=auto picks the cheapest allocation."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.planner import Limits, Plan
from dapple_launch.planner.cost import evaluate
from dapple_launch.planner.frontier import (
    NoPointFits,
    choose,
    describe,
    device_counts,
    device_seconds_per_sample,
    frontier,
    frontier_to_json,
    non_dominated,
    plan_choice,
    sub_cluster,
)
from dapple_launch.planner.frontier_svg import frontier_svg
from dapple_launch.planner.shapes import MIN_MICRO_BATCHES, divisors
from dapple_launch.schedule import build_schedule, validate

from .test_planner import all_layouts, random_profile


def _limits(**kw):
    return Limits(schedules=("1f1b",), max_warmup_depth=1, recompute="auto", **kw)


def exhaustive_points(profile, topology, G, usable):
    """(time, memory) of every plan of the space: each layout of the planner's, each micro-batch size,
    each count of first layers recomputed per stage, that fits `usable` bytes per device."""
    out = []
    max_stages = min(profile.num_layers, topology.num_devices)
    for b in divisors(G):
        M = G // b
        for layout in all_layouts(profile, topology, b, max_stages):
            if MIN_MICRO_BATCHES["1f1b"](len(layout)) > M:
                continue
            for counts in itertools.product(*[range(st.stop - st.start + 1) for st in layout]):
                marks = tuple(i for k, st in zip(counts, layout) for i in range(st.start, st.start + k))
                limits = Limits(recompute="selective", recompute_layers=marks) if marks else Limits()
                c = evaluate(profile, topology, layout, b, M, limits)
                if c.peak_memory_bytes <= usable:
                    out.append((c.iteration_s, c.peak_memory_bytes))
    return out


def pareto(points):
    best, out = math.inf, []
    for t, m in sorted(points, key=lambda x: (x[0], x[1])):
        if m < best * (1 - 1e-12):
            out.append((t, m))
            best = m
    return out


def _instance(seed):
    rng = random.Random(seed)
    profile = random_profile(rng, rng.choice([3, 4, 5]))
    nodes, per_node = rng.choice([(1, 2), (1, 3), (2, 2), (1, 4)])
    # a card about as large as the roomiest plans: caps bite, recomputation matters
    topo = Topology("t", nodes, per_node, 1.0, 10, 20e9, rng.choice([1e9, 5e9]), inter_node_allreduce_bandwidth=3e9)
    G = rng.choice([4, 8])
    roomy = exhaustive_points(profile, topo, G, math.inf)
    memory = sorted(m for _, m in roomy)[len(roomy) * 3 // 4]
    topo = Topology(
        "t", nodes, per_node, memory / 0.9, 10, 20e9, topo.inter_node_bandwidth, inter_node_allreduce_bandwidth=3e9
    )
    return profile, topo, G


@pytest.mark.parametrize("seed", range(8))
def test_the_exact_frontier_equals_exhaustive_enumeration(seed):
    """step 0: the frontier's (time, memory) points are exactly the non-dominated points of every
    layout × micro-batch size × recomputed first layers per stage (plus the baselines the search
    always considers, fixed-procedure plans of their own)."""
    profile, topo, G = _instance(seed)
    usable = topo.device_memory_bytes * 0.9
    points, searches = frontier(profile, topo, G, _limits(), step=0.0)
    got = [(p.estimate.iteration_s, max(p.estimate.peak_memory_bytes)) for p in points]
    space = exhaustive_points(profile, topo, G, usable)
    expected = pareto(space + got)  # a baseline outside the layouts' space may sit on the frontier too
    assert len(got) == len(expected), (got, expected)
    for (t, m), (te, me) in zip(got, expected):
        assert t == pytest.approx(te, rel=1e-9) and m == pytest.approx(me, rel=1e-9)
    assert searches == len(points) + 1 or searches >= len(points)


@pytest.mark.parametrize("seed", range(8))
def test_a_bucketed_frontier_is_within_its_stated_bound(seed):
    """step e: every exact point (t*, m*) is dominated by a returned point no slower with memory below
    m* / (1 - e); the returned points are real plans of the space, never fewer than one."""
    profile, topo, G = _instance(seed)
    exact = [
        (p.estimate.iteration_s, max(p.estimate.peak_memory_bytes))
        for p in frontier(profile, topo, G, _limits(), step=0.0)[0]
    ]
    for step in (0.1, 0.3):
        got = [
            (p.estimate.iteration_s, max(p.estimate.peak_memory_bytes))
            for p in frontier(profile, topo, G, _limits(), step=step)[0]
        ]
        assert 1 <= len(got) <= len(exact)
        for t, m in exact:
            assert any(tg <= t * (1 + 1e-9) and mg < m / (1 - step) for tg, mg in got), (step, (t, m), got)


def test_every_point_is_a_valid_plan_and_none_dominates_another():
    profile, topo, G = _instance(3)
    points, _ = frontier(profile, topo, G, _limits(), step=0.0)
    assert len(points) >= 2
    for p in points:
        assert max(p.estimate.peak_memory_bytes) <= topo.device_memory_bytes * 0.9
        validate(build_schedule(p.schedule, p.num_stages, p.num_micro_batches, p.warmup))
        assert Plan.from_json(p.to_json()) == p
    for a, b in itertools.permutations(points, 2):
        ta, ma = a.estimate.iteration_s, max(a.estimate.peak_memory_bytes)
        tb, mb = b.estimate.iteration_s, max(b.estimate.peak_memory_bytes)
        assert not (ta <= tb and ma <= mb), "a point dominates another"
    times = [p.estimate.iteration_s for p in points]
    assert times == sorted(times)


def test_non_dominated_keeps_the_lower_left_staircase():
    def plan(t, m):
        class E:
            iteration_s, peak_memory_bytes = t, (m,)

        class P:
            estimate = E

        return P

    pts = [plan(1, 5), plan(2, 3), plan(2, 4), plan(3, 3), plan(1, 6), plan(4, 1)]
    got = [(p.estimate.iteration_s, p.estimate.peak_memory_bytes[0]) for p in non_dominated(pts)]
    assert got == [(1, 5), (2, 3), (4, 1)]


def test_objectives_and_the_budget_choose_as_documented():
    profile, topo, G = _instance(5)
    f = plan_choice(profile, topo, G, _limits(), objective="pareto", step=0.0)
    pts = f.points
    assert f.chosen == 0  # pareto without a budget starts from the fastest
    mems = [max(p.estimate.peak_memory_bytes) for p in pts]
    times = [p.estimate.iteration_s for p in pts]
    if len(pts) > 1:
        budget = (mems[0] + mems[1]) / 2  # only points 1.. fit
        k = choose(list(pts), "time", budget)
        assert k == 1 and mems[k] <= budget
        assert min((t for t, m in zip(times, mems) if m <= budget)) == times[k]
    least = len(pts) - 1
    k = choose(list(pts), "memory", max_slowdown=10.0)
    assert k == least
    k = choose(list(pts), "memory", max_slowdown=0.0)
    assert times[k] == times[0]
    # a budget below every point: nothing chosen, and the refusal names the least-memory point's numbers
    g = plan_choice(profile, topo, G, _limits(), objective="pareto", step=0.0, budget_bytes=mems[-1] * 0.5)
    assert g.chosen is None
    with pytest.raises(NoPointFits, match="the least memory is .* per device"):
        _ = g.plan
    with pytest.raises(ValueError, match="is more than the"):
        plan_choice(profile, topo, G, _limits(), budget_bytes=topo.device_memory_bytes * 2)
    # objective=time under a budget equals the frontier's fastest point within it
    if len(pts) > 1:
        t = plan_choice(profile, topo, G, _limits(), objective="time", budget_bytes=(mems[0] + mems[1]) / 2).plan
        assert t.estimate.iteration_s == pytest.approx(times[1], rel=1e-9)


def test_the_table_json_and_picture_name_every_point():
    profile, topo, G = _instance(2)
    f = plan_choice(profile, topo, G, _limits(), objective="pareto", step=0.0)
    text = describe(f)
    assert "→" in text and f"frontier: {len(f.points)} plans" in text and "device·s/sample" in text
    data = json.loads(frontier_to_json(f))
    assert [Plan.from_dict(d) for d in data] == list(f.points)
    svg = frontier_svg(f)
    assert svg.startswith("<svg") and svg.count("<circle") == len(f.points) + 1  # and the chosen ring
    assert "device memory (usable)" in svg and "chosen #0" in svg


def test_devices_auto_picks_the_cheapest_allocation_that_meets_the_deadline():
    """Device counts 1 .. a node, then whole nodes; with a deadline the least device-seconds per
    sample among those that meet it; without, the fastest; the plan sits on the cluster's first
    devices with its devices_per_node, so the launcher submits exactly those nodes and tasks."""
    rng = random.Random(4)
    profile = random_profile(rng, 6)
    topo = Topology("t", 3, 2, 64e9, 10, 20e9, 5e9, inter_node_allreduce_bandwidth=3e9)
    assert device_counts(topo, 12) == [1, 2, 4, 6]
    assert device_counts(topo, 12, max_devices=4) == [1, 2, 4]
    assert sub_cluster(topo, 1).num_devices == 1 and sub_cluster(topo, 4).nodes == 2
    f = plan_choice(profile, topo, 12, _limits(), devices="auto")
    assert sorted(p.world_size for p in f.points) == [1, 2, 4, 6]
    fastest = min(f.points, key=lambda p: p.estimate.iteration_s)
    assert f.plan.estimate.iteration_s == fastest.estimate.iteration_s
    deadline = sorted(p.estimate.iteration_s for p in f.points)[-2] * 1.0001  # the slowest misses it
    g = plan_choice(profile, topo, 12, _limits(), devices="auto", deadline_s=deadline)
    ok = [p for p in g.points if p.estimate.iteration_s <= deadline]
    assert g.plan.estimate.iteration_s <= deadline
    assert device_seconds_per_sample(g.plan) == min(device_seconds_per_sample(p) for p in ok)
    assert all(p.devices_per_node == 2 for p in g.points)
    used = sorted(d for s in g.plan.stages for d in s.devices)
    assert used == list(range(g.plan.world_size))
    with pytest.raises(NoPointFits, match="no device count meets strategy.deadline_s_per_iteration"):
        _ = plan_choice(profile, topo, 12, _limits(), devices="auto", deadline_s=fastest.estimate.iteration_s / 2).plan
