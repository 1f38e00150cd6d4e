"""Pure tier: schedules whose ranks hold several stages (interleaved 1F1B, ZB-V, Chimera) as rank
orders — generators, validator, simulator — and the stage-per-rank schedules in the same format."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import replace

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.planner.limits import Limits
from dapple_launch.planner.search import plan
from dapple_launch.profile import LayerProfile, chain
from dapple_launch.schedule import Kind, ScheduleError, StageCosts, build_rank_schedule, build_schedule, simulate
from dapple_launch.schedule.chimera import chimera
from dapple_launch.schedule.interleaved import interleaved_1f1b
from dapple_launch.schedule.rank_simulate import simulate_ranks
from dapple_launch.schedule.rank_validate import validate_ranks
from dapple_launch.schedule.ranks import RankSchedule, Step, from_stages, steps_from_json
from dapple_launch.schedule.zbv import zbv

from .test_planner import random_profile

P, M = 4, 8


def _unit(x: RankSchedule, chunk_share: float):
    """T_F = 1, T_B = 2 per rank's share (split I = W = 1), a chunk of a rank holding v stages 1/v of it."""
    costs = [StageCosts(chunk_share, 2 * chunk_share, activation_bytes=1.0) for _ in range(x.num_stages)]
    sim = simulate_ranks(x, costs)
    return 1 - x.num_micro_batches * 3 / sim.iteration_s, sim


@pytest.mark.parametrize(
    "name, make, share, bubble, peaks",
    [
        ("gpipe", lambda: from_stages(build_schedule("gpipe", P, M)), 1, 0.273, [8, 8, 8, 8]),
        ("1f1b", lambda: from_stages(build_schedule("1f1b", P, M)), 1, 0.273, [4, 3, 2, 1]),
        ("zb_h1", lambda: from_stages(build_schedule("zb_h1", P, M)), 1, 0.111, [4, 4, 4, 4]),
        # rank 0: (v - 1) P + 2 (P - 1) + 1 = 11 half-stage micro-batches = P + (P - 1) / v stages' worth
        ("interleaved v=2", lambda: interleaved_1f1b(P, M, 2), 0.5, 0.158, [11, 9, 7, 5]),
        # torch's InterleavedZeroBubble (ZB1P): interleaved's order at one warm-up forward per hop, W's filling
        # its waits, rank r holding back r of them: (v - 1) P + (P - 1 - r) + 1 + r = v P on every rank
        (
            "interleaved zero bubble v=2",
            lambda: build_rank_schedule("interleaved_zb", P, M, 2),
            0.5,
            0.059,
            [8, 8, 8, 8],
        ),
        ("zbv", lambda: zbv(P, M), 0.5, 0.059, [8, 8, 8, 8]),  # P half-stage pairs on every rank: balanced
        ("chimera", lambda: chimera(P, M), 1, 0.200, [3, 4, 4, 3]),  # D/2 + 1 … D
    ],
)
def test_unit_time_bubbles_and_memory_match_the_published_table(name, make, share, bubble, peaks):
    """SCHEDULES.md's measured bubble fractions (P = 4, M = 8, T_F = 1, T_I + T_W = 2, no
    communication), reproduced by generator + simulator, with each rank's peak in-flight count."""
    x = make()
    validate_ranks(x)
    got, sim = _unit(x, share)
    assert got == pytest.approx(bubble, abs=5e-4)
    assert sim.peak_in_flight == peaks


def test_one_stage_per_rank_simulates_as_the_stage_simulator():
    """GPipe, 1F1B and ZB-H1 lifted to rank orders: the same times, ends and peaks as simulate.py on
    random costs (one semantics for both formats)."""
    rng = random.Random(3)
    for _ in range(200):
        S, m = rng.randint(1, 6), rng.randint(1, 10)
        sched = build_schedule(rng.choice(["1f1b", "gpipe", "zb_h1"]), S, m)
        costs = [
            StageCosts(
                rng.uniform(0.1, 2),
                rng.uniform(0.1, 4),
                rng.uniform(0, 1),
                rng.uniform(0, 1),
                rng.uniform(0, 3),
                rng.uniform(1, 5),
                recompute_bytes=rng.choice([0.0, 2.0]),
            )
            for _ in range(S)
        ]
        costs = [
            replace(
                c, allreduce_after_b_s=rng.uniform(0, c.allreduce_s), allreduce_after_w_s=rng.uniform(0, c.allreduce_s)
            )
            if rng.random() < 0.5
            else c
            for c in costs
        ]  # buckets overlapping the last B or W
        a, b = simulate(sched, costs), simulate_ranks(from_stages(sched), costs)
        assert b.iteration_s == pytest.approx(a.iteration_s, rel=1e-12)
        assert b.stage_end_s == pytest.approx(a.stage_end_s, rel=1e-12)
        assert b.peak_in_flight == a.peak_in_flight
        assert b.peak_activation_bytes == pytest.approx(a.peak_activation_bytes, rel=1e-12)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_validator_accepts_every_generated_schedule():
    count = 0
    for ranks in range(1, 7):
        for m in range(1, 25):
            for v in (2, 3, 4):
                if m % ranks == 0:
                    validate_ranks(interleaved_1f1b(ranks, m, v))
                    validate_ranks(build_rank_schedule("interleaved_zb", ranks, m, v))
                    count += 2
            validate_ranks(zbv(ranks, m))
            count += 1
            if ranks % 2 == 0 and m % ranks == 0:
                validate_ranks(chimera(ranks, m))
                count += 1
    assert count == 514


def _edit(x: RankSchedule, rank: int, order: list[Step]) -> RankSchedule:
    orders = list(x.orders)
    orders[rank] = tuple(order)
    return replace(x, orders=tuple(orders))


def _swap(x: RankSchedule, rank: int, a: Step, b: Step) -> RankSchedule:
    order = list(x.orders[rank])
    i, j = order.index(a), order.index(b)
    order[i], order[j] = order[j], order[i]
    return _edit(x, rank, order)


def test_validator_rejects_hand_broken_schedules():
    F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD
    v = zbv(P, M)
    with pytest.raises(ScheduleError, match=r"W\) runs before its input gradient"):
        validate_ranks(_swap(v, 1, Step(I, 6, 0), Step(W, 6, 0)))
    il = interleaved_1f1b(P, M, 2)
    # rank 0 runs chunk 1's forward of micro-batch 0 (stage 4) before chunk 0's (stage 0): it waits on itself
    first = list(il.orders[0])
    first.remove(Step(F, 4, 0))
    with pytest.raises(ScheduleError, match="deadlocks"):
        validate_ranks(_edit(il, 0, [Step(F, 4, 0), *first]))
    with pytest.raises(ScheduleError, match="uses activation 1 from stage 0 .* before activation 0"):
        validate_ranks(_swap(il, 1, Step(F, 1, 0), Step(F, 1, 1)))
    with pytest.raises(ScheduleError, match="stage 1 is not held by rank 0"):
        validate_ranks(_edit(il, 0, [Step(F, 1, 0), *il.orders[0]]))
    with pytest.raises(ScheduleError, match="W\\) never runs"):
        validate_ranks(_edit(v, 2, [a for a in v.orders[2] if a != Step(W, 2, 3)]))
    with pytest.raises(ScheduleError, match="both a whole backward"):
        validate_ranks(_edit(v, 2, [*v.orders[2], Step(B, 2, 3)]))
    ch = chimera(P, M)
    with pytest.raises(ScheduleError, match="forward 0 of stage 0 runs twice"):
        validate_ranks(_edit(ch, 3, [Step(F, 0, 0), Step(B, 0, 0), *ch.orders[3]]))
    with pytest.raises(ScheduleError, match="forward 7 of stage 2 never runs"):
        validate_ranks(_edit(ch, 1, [a for a in ch.orders[1] if (a.stage, a.micro_batch) != (2, 7)]))


def test_constraints_name_the_rule_and_the_nearest_valid_values():
    with pytest.raises(ValueError, match="6 micro-batches is not a multiple of 4; use 4 or 8"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="at least 2 chunks"):
        interleaved_1f1b(4, 8, 1)
    with pytest.raises(ValueError, match="even number of device groups: 3 stages; use 2 or 4"):
        chimera(3, 6)
    with pytest.raises(ValueError, match="10 micro-batches is not a multiple of 4; use 8 or 12"):
        chimera(4, 10)


def test_chimera_all_reduces_a_stage_after_its_last_backward_on_both_ranks():
    """Stage s sits on ranks s and D - 1 - s: its all-reduce waits for both copies' last backward."""
    D = 4
    x = chimera(D, 2 * D)
    assert x.placement == ((0, 3), (1, 2), (2, 1), (3, 0))  # down pipeline's group first
    costs = [StageCosts(1.0, 2.0, 0.1, 0.1, allreduce_s=5.0, activation_bytes=1.0) for _ in range(D)]
    sim = simulate_ranks(x, costs)
    for s in range(D):
        last = max(e.end for e in sim.timeline if e.kind == "backward" and e.label.endswith(f"·s{s}"))
        ars = [e for e in sim.timeline if e.kind == "allreduce" and e.label == f"AR·s{s}"]
        assert sorted(e.stage for e in ars) == sorted(x.placement[s])
        assert all(e.start >= last - 1e-12 for e in ars)
        assert len({(e.start, e.end) for e in ars}) == 1  # one collective over both copies


def test_an_outside_tool_re_simulates_a_plan_from_its_orders():
    """plan.json's `orders` and per-stage costs are enough: rebuilt as rank orders, the simulator
    gives the plan's own simulated time, with no knowledge of the schedule's name: every family,
    device groups holding several stages and Chimera's stages on two groups included."""
    rng = random.Random(5)
    profile = random_profile(rng, 6)
    topo = Topology("t", 1, 4, 32e9, 10, 20e9, 5e9)
    for schedules in (
        ("1f1b",),
        ("zb_h1",),
        ("gpipe",),
        ("interleaved_1f1b",),
        ("interleaved_zb",),
        ("zbv",),
        ("chimera",),
        ("1f1b_rr",),
        ("zb_h1_rr",),
    ):
        p = plan(profile, topo, 16, Limits(schedules=schedules))
        assert p.schedule == schedules[0]
        d = json.loads(json.dumps(p.to_dict()))
        orders = [steps_from_json(o["actions"]) for o in d["orders"]]
        placement = tuple(
            tuple(g for g, o in enumerate(orders) if any(a.stage == s for a in o)) for s in range(len(d["stages"]))
        )
        x = RankSchedule("from plan.json", len(d["stages"]), d["num_micro_batches"], tuple(orders), placement)
        validate_ranks(x)
        costs = [StageCosts(**c) for c in d["estimate"]["stage_costs"]]
        assert simulate_ranks(x, costs).iteration_s == pytest.approx(d["estimate"]["simulated_iteration_s"], rel=1e-9)
    with pytest.raises(ValueError, match=r"action 1 is \['X', 0, 0\]"):
        steps_from_json([["F", 0, 0], ["X", 0, 0]])


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["strategy.stages=5"], "the stages must be a multiple of 2; use 4 or 6"),
        (["strategy.stages=4", "strategy.num_micro_batches=3"], "3 micro-batches is not a multiple of 2; use 2 or 4"),
        (["strategy.stages=4", "strategy.replicas=[2,1,1,2]"], "stages [0, 2] share device group 0"),
        (["strategy.stages=4", "strategy.chunks=1"], "1 is plain 1F1B"),
        (["strategy.stages=4", "strategy.schedule=zbv", "strategy.chunks=3"], "ZB-V holds exactly 2 stages"),
        (["strategy.stages=4", "strategy.replicas=[1,1]"], "use 2 devices but cluster local has 4"),
        (
            ["strategy.stages=4", "strategy.schedule=zbv", "strategy.recompute=full"],
            "with schedule zbv: a split backward's W",
        ),
        (
            [
                "strategy.stages=4",
                "strategy.schedule=interleaved_zb",
                "strategy.recompute=selective",
                "strategy.recompute_counts=[1]",
            ],
            "with schedule interleaved_zb: a split backward's W",
        ),
        (["strategy.stages=4", "strategy.token_slices=[32,32]"], "runs without token slices"),
        # the schedule's rule, not the cluster fill's (4 devices into 3 groups), names what to change
        (
            ["strategy.stages=3", "strategy.schedule=chimera"],
            "over an even number of device groups: 3 stages; use 2 or 4",
        ),
        (["strategy.stages=7"], "the stages must be a multiple of 2; use 6 or 8"),
        (["strategy.stages=2", "strategy.schedule=chimera", "strategy.replicas=[2,1]"], "mirror them, e.g. [2, 2]"),
    ],
)
def test_a_chunked_layout_that_breaks_a_rule_is_refused_with_the_fix(compose_cfg, overrides, needle):
    from dapple_launch.plan_config import plan_from_config

    cfg = compose_cfg(["strategy=fixed", "strategy.schedule=interleaved_1f1b", *overrides])
    with pytest.raises(ValueError, match=re.escape(needle)):
        plan_from_config(cfg)


def test_the_planner_plans_a_chunked_family_alone_and_the_plan_runs_its_rank_orders(compose_cfg):
    from dapple_launch.plan_config import plan_from_config

    plan = plan_from_config(compose_cfg(["strategy=auto", "strategy.schedules=[zbv]", "global_batch_size=8"]))
    assert plan.schedule == "zbv" and plan.chunks == 2 and plan.num_stages % 2 == 0
    x = plan.build_schedule()
    validate_ranks(x)
    assert len(plan.orders()) == x.num_ranks and "ZB-V with 2 stages per device group" in plan.planner


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_recomputation_runs_on_the_families_with_a_whole_backward_and_the_planner_chooses_among_them(compose_cfg):
    """strategy.recompute=full or selective: interleaved 1F1B and Chimera recompute (a fixed layout
    lists each stage's positions and costs them: a longer backward, less kept), the planner searches
    1F1B, interleaved 1F1B and Chimera with them (never a split backward), and auto token slicing
    steps aside instead of refusing the run (a causal model under strategy=auto)."""
    from dapple_launch.plan_config import auto_schedules, plan_from_config
    from dapple_launch.planner.plan import Plan

    base = ["strategy=fixed", "strategy.stages=4", "global_batch_size=8"]
    for schedule in ("interleaved_1f1b", "chimera"):
        extra = ["strategy.replicas=[1,1,1,1]"] if schedule == "chimera" else []
        none = plan_from_config(compose_cfg([*base, f"strategy.schedule={schedule}", *extra]))
        full = plan_from_config(
            compose_cfg([*base, f"strategy.schedule={schedule}", *extra, "strategy.recompute=full"])
        )
        first = plan_from_config(
            compose_cfg(
                [
                    *base,
                    f"strategy.schedule={schedule}",
                    *extra,
                    "strategy.recompute=selective",
                    "strategy.recompute_counts=[1]",
                ]
            )
        )
        assert [s.recompute_layers for s in full.stages] == [tuple(range(*s.layers)) for s in full.stages]
        assert [s.recompute_layers for s in first.stages] == [(s.layers[0],) for s in first.stages]
        for c, n in zip(full.estimate.stage_costs, none.estimate.stage_costs):
            assert c["backward_s"] > n["backward_s"] and c["activation_bytes"] < n["activation_bytes"]
        assert Plan.from_json(full.to_json()) == full
    cfg = compose_cfg(["strategy=auto", "strategy.recompute=full", "global_batch_size=8"])
    assert auto_schedules(cfg.strategy) == ("1f1b", "interleaved_1f1b", "chimera", "1f1b_rr")
    chosen = plan_from_config(cfg)
    assert chosen.schedule in ("1f1b", "interleaved_1f1b", "chimera") and not chosen.token_slices
    assert all(s.recompute_layers == tuple(range(*s.layers)) for s in chosen.stages)
    d = json.loads(full.to_json())
    d.pop("orders")
    d["schedule"] = "zbv"
    with pytest.raises(ValueError, match="recompute_layers with schedule zbv"):
        Plan.from_dict(d)


def _exhaustive_chunked(profile, topo, G, limits):
    """Every shape (family, chunks, groups' replicas, micro-batch size) × every cut, simulated."""
    import itertools

    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import num_stages
    from dapple_launch.planner.shapes import divisors

    best = math.inf
    L = profile.num_layers
    for family, v, groups, b in shapes(profile, topo, G, limits, sorted(divisors(G), reverse=True)):
        S = num_stages(family, v, groups)
        for cut in itertools.combinations(range(1, L), S - 1):
            c = evaluate_chunked(
                profile, topo, chunked_layout(family, list(groups), [*cut, L], None), b, G // b, limits, family, v
            )
            if c.fits:
                best = min(best, c.iteration_s)
    return best


def test_the_busiest_group_of_unlike_groups_is_weighed_where_the_layers_balance_them():
    """busiest_group: a group of 1 device and one of 15 at b = 16 (the one runs a layer on 16 samples,
    16 w; the fifteen on 2 each, 2 w). Layers split fractionally so both groups are as busy: x on the
    one, 16 x = 2 (1 - x), x = 1 / 9, each busy 16 / 9 Σ w, and no cut does better. The groups'
    average says Σ w (uniform weights) and the compute bound Σ w too (weights by devices)."""
    import numpy as np

    from dapple_launch.planner.shape_bound import busiest_group

    w = np.array([1.0, 3.0, 2.0, 5.0])
    one = lambda ends: busiest_group(np.array([16 * w, 2 * w]), np.ones(2), np.array([1.0, 15.0]), ends)
    assert one(np.zeros(2)) == pytest.approx(16 / 9 * w.sum())
    # with its ends: each y is a bound, so at least the balancing y's (1/9 of the weight on the one's
    # class... here y = (2, 16) / 18 balances the work, and the ends add y · ends)
    assert one(np.array([0.0, 9.0])) >= 16 / 9 * w.sum() + 16 / 18 * 9.0 - 1e-9
    # three classes, one alike to another: the same optimum as two (the third weighs nothing extra)
    three = busiest_group(np.array([16 * w, 2 * w, 2 * w]), np.ones(3), np.array([1.0, 15.0, 15.0]), np.zeros(3))
    assert three == pytest.approx(
        busiest_group(np.array([16 * w, 2 * w]), np.array([1.0, 2.0]), np.array([1.0, 15.0]), np.zeros(2))
    )
    # one class: the uniform average
    assert busiest_group(np.array([2 * w]), np.array([4.0]), np.array([3.0]), np.array([1.0])) == pytest.approx(
        1.0 + 2 * w.sum() / 4
    )


def test_the_fill_ahead_of_a_group_counts_the_layers_it_must_cross():
    """pipeline_ends: the k stages ahead of a group's earliest stage hold at least layers 0 .. k - 1,
    so the group waits for their forwards (and, with a whole backward, their backwards after it):
    a heavy first layer counts whole, not as the least layer."""
    import numpy as np

    from dapple_launch.planner.shape_bound import pipeline_ends

    f, b = np.array([5.0, 1.0, 1.0, 1.0]), np.array([10.0, 2.0, 2.0, 2.0])
    # two groups, stages 0..3 (group g's earliest is stage g): group 1 waits for layer 0
    assert pipeline_ends("interleaved_1f1b", 2, 2, f, b) == (5.0 + 10.0) / 2
    assert pipeline_ends("zbv", 2, 2, f, b) == 5.0 / 2  # (a split backward: no drain)
    # four groups: group g waits for layers 0 .. g - 1
    assert pipeline_ends("interleaved_1f1b", 2, 4, f, b) == (0 + 15 + 18 + 21) / 4


def _random_cluster_and_profile(rng: random.Random, all_reduce: tuple[float, ...] = (3e9,)):
    """A small cluster of 2-4 nodes with random links (the all-reduce's bandwidth drawn from
    `all_reduce`, where it offers a choice) and a random profile of 6-10 layers."""
    nodes, per_node = rng.choice([(2, 2), (2, 3), (4, 1), (2, 4)])
    topo = Topology(
        "t",
        nodes,
        per_node,
        rng.choice([2e9, 8e9]),
        rng.choice([1e-5, 1e-4]),
        20e9,
        rng.choice([2e8, 1e9]),
        inter_node_allreduce_bandwidth=rng.choice(all_reduce) if len(all_reduce) > 1 else all_reduce[0],
    )
    return topo, random_profile(rng, rng.choice([6, 8, 10]))


def tight_chain(seed: int, L: int, saved: float, usable: float):
    """(its rng, a memory-heavy random chain, 8 devices): like weights (200 MB a layer) and saves
    of `saved` a sample, on devices with `usable` bytes after the default headroom."""
    rng = random.Random(seed)
    layers = [replace(x, parameter_bytes=2e8, saved_bytes=saved) for x in random_profile(rng, L).layers]
    return rng, chain("tight", layers, batch_size=4), Topology("t", 2, 4, usable / 0.9, 1e-5, 20e9, 1e9)


def _small_chunked_shapes(rng: random.Random, rounds: int = 4):
    """On `rounds` random clusters (their all-reduce fast, slow or very slow), each shape of the
    chunked families whose cuts are few enough to enumerate (at most 20): (profile, topology, G,
    limits, family, v, groups, b, GroupBound's layer_times, every cut's stops)."""
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times, num_stages

    for _ in range(rounds):
        topo, profile = _random_cluster_and_profile(rng, all_reduce=(3e9, 1e8, 3e7))
        G, L = rng.choice([8, 16]), profile.num_layers
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        memo: dict = {}
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4, 8]):
            S = num_stages(family, v, groups)
            if math.comb(L - 1, S - 1) > 20:
                continue
            times = lambda r, b=b, profile=profile, topo=topo, memo=memo: _layer_times(profile, topo, r, b, memo)
            cuts = [[*cut, L] for cut in itertools.combinations(range(1, L), S - 1)]
            yield profile, topo, G, limits, family, v, groups, b, times, cuts


def _best_cut_s(profile, topo, G: int, limits: Limits, family: str, v: int, groups, b: int, cuts) -> float:
    """The shape's best plan: every cut simulated (the cuts of _small_chunked_shapes)."""
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked

    layouts = (chunked_layout(family, list(groups), stops, None) for stops in cuts)
    return min(evaluate_chunked(profile, topo, x, b, G // b, limits, family, v).iteration_s for x in layouts)


def _random_cuts_at_or_above(rng, bound, profile, topo, G, limits, family, v, groups, b, cuts: int) -> int:
    """Simulates `cuts` random cuts of the shape and asserts each at or above `bound`; their count."""
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.shape_bound import num_stages

    L, S = profile.num_layers, num_stages(family, v, groups)
    for _ in range(cuts):
        stops = [*sorted(rng.sample(range(1, L), S - 1)), L]
        c = evaluate_chunked(
            profile, topo, chunked_layout(family, list(groups), stops, None), b, G // b, limits, family, v
        )
        assert c.iteration_s >= bound * (1 - 1e-9), (family, v, groups, b, stops, c.iteration_s, bound)
    return cuts


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_chunked_shapes_bound_is_below_the_simulated_time_of_every_cut():
    """shape_bound.shape_bound (the busiest group's work, the busiest link's transfers, each
    layer's tail: its group's micro-batches then its all-reduce, and the groups' average of their
    forwards and all-reduces) is a lower bound on every plan of the shape, as the simulator of its
    rank orders times it; the link, tail and all-reduce terms decide the bound on some shapes (on
    clusters whose all-reduce is fast, slow or very slow), so they are tested, not idle."""
    import numpy as np

    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import (
        _layer_times,
        allreduce_bound,
        link_bound,
        num_stages,
        pipeline_ends,
        shape_bound,
        tail_bound,
    )

    rng = random.Random(7)
    checked = link_decides = tail_decides = allreduce_decides = weighed = 0
    for _ in range(12):
        topo, profile = _random_cluster_and_profile(rng, all_reduce=(3e9, 1e8, 3e7))
        if rng.random() < 0.5:  # every layer's output alike (a transformer's): the least cut is a real one
            out = rng.choice([1e6, 4e7, 2e8])
            profile = replace(profile, layers=tuple(replace(x, activation_bytes=out) for x in profile.layers))
        G = rng.choice([8, 16])
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4, 8]):
            bound = shape_bound(profile, topo, G, groups, b, None, family, v)
            if family != "chimera" and link_bound(profile, topo, G, family, v, groups, b) == bound:
                link_decides += 1
            tail_decides += tail_bound(profile, topo, G, family, groups, b, {}) == bound
            allreduce_decides += allreduce_bound(profile, topo, G, family, v, groups, b, {}) == bound
            # the two averages the weights start from (by group with the ends, by device): the best
            # weights between decide some shapes of unlike groups
            M, P, D = G // b, len(groups), sum(groups)
            times = [(r, _layer_times(profile, topo, r, b, {})) for r in set(groups)]
            least = np.min([t for _, t in times], axis=0)
            averages = max(
                M / P * np.min([t.sum(axis=1) for _, t in times], axis=0).sum()
                + pipeline_ends(family, v, P, least[:, 0], least[:, 1]),
                M / D * np.min([r * t.sum(axis=1) for r, t in times], axis=0).sum(),
            )
            assert bound >= averages * (1 - 1e-12)
            weighed += bound > averages * (1 + 1e-6) and bound > max(
                tail_bound(profile, topo, G, family, groups, b, {}),
                allreduce_bound(profile, topo, G, family, v, groups, b, {}),
                link_bound(profile, topo, G, family, v, groups, b) if family != "chimera" else 0.0,
            )
            checked += _random_cuts_at_or_above(rng, bound, profile, topo, G, limits, family, v, groups, b, 3)
    assert checked > 500 and min(link_decides, tail_decides, allreduce_decides, weighed) > 20, (
        checked,
        link_decides,
        tail_decides,
        allreduce_decides,
        weighed,
    )
    # the fill and drain term where it is tightest: alike layers, one per stage, free transfers
    for family in ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"):
        for P in (2, 3, 4):
            if family == "chimera" and P % 2:
                continue
            S = num_stages(family, 2, (1,) * P)
            alike = chain("u", [LayerProfile(f"l{i}", 1.0, 2.0, 1.0, 0.0) for i in range(S)], batch_size=1)
            free = Topology("t", 1, P, 1e12, 10, 1e15, 1e15)
            for M in (P, 2 * P, 4 * P):
                c = evaluate_chunked(
                    alike,
                    free,
                    chunked_layout(family, [1] * P, list(range(1, S + 1)), None),
                    1,
                    M,
                    Limits(schedules=(family,)),
                    family,
                    2,
                )
                bound = shape_bound(alike, free, M, (1,) * P, 1, None, family, 2)
                assert bound <= c.iteration_s, (family, P, M)
                # (Chimera on two groups: each group's earliest stage is first in one pipeline, no fill)
                assert (shape_bound(alike, free, M, (1,) * P, 1) < bound) == (family != "chimera" or P > 2)


@pytest.mark.slow  # (a few seconds: every cut of small shapes simulated)
def test_a_chunked_shapes_room_for_micro_batches_bounds_every_cut_that_fits():
    """shape_memory.room_bound: device groups recompute no layer under strategy.recompute=auto, so
    each stage keeps a micro-batch over its round trip, and memory (its group's weights, the others'
    stages at least the lightest layer's) leaves room for few at once. On memory-heavy random chains
    (like weights, saves of a few hundred MB a sample) on 8 devices with room for a few layers and
    micro-batches, random cuts of every shape (interleaved, ZB-V, Chimera) that fit are at or above
    it, and it is above the shape's other bounds on many shapes."""
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times, num_stages, shape_bound
    from dapple_launch.planner.shape_memory import room_bound

    checked = raised = 0
    for seed, L, saved, usable in itertools.product((1, 2), (8, 12), (5e8, 1e9), (3.2e9, 4.8e9)):
        rng, profile, topo = tight_chain(seed, L, saved, usable)
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        G, memo = 8, {}
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4]):
            least = _layer_times(profile, topo, max(groups), b, memo)
            room = room_bound(profile, topo, G, family, v, groups, b, limits.optimizer_factor, usable, least, memo)
            above = room > shape_bound(profile, topo, G, groups, b, None, family, v) * 1.01
            S = num_stages(family, v, groups)
            for _ in range(3):
                cut = sorted(rng.sample(range(1, L), S - 1))
                layout = chunked_layout(family, list(groups), [*cut, L], None)
                c = evaluate_chunked(profile, topo, layout, b, G // b, limits, family, v)
                if c.fits:
                    checked += 1
                    raised += above
                    assert room <= c.iteration_s * (1 + 1e-9), (seed, family, v, groups, b, cut, room, c.iteration_s)
    assert checked > 200 and raised > 50, (checked, raised)
    # and it is the docstring's argument, span by span from the profile's own accounts (kept_bytes,
    # workspace, span), on a profile with fixed saves and workspace
    rng = random.Random(9)
    base = random_profile(rng, 6)
    layers = [
        replace(
            x,
            parameter_bytes=2e8,
            saved_bytes=4e9,
            saved_fixed_bytes=4e8,
            workspace_bytes=2e8,
            workspace_fixed_bytes=5e7,
        )
        for x in base.layers
    ]
    profile, topo = chain("tight", layers, batch_size=4), Topology("t", 2, 4, 4e9, 1e-5, 20e9, 1e9)
    for family, v, groups, b, G in (
        ("zbv", 2, (2, 2), 2, 32),
        ("interleaved_1f1b", 2, (4, 4), 4, 32),
        ("chimera", 2, (2, 2), 2, 32),
    ):
        least = _layer_times(profile, topo, max(groups), b, {})
        got = room_bound(profile, topo, G, family, v, groups, b, 4.0, 4.4e9, least, {})
        n, M, L = math.ceil(b / max(groups)), G // b, profile.num_layers
        turns, others = (M // 2 if family == "chimera" else M), (1 if family in ("zbv", "chimera") else v - 1)
        fwd, inp = least[:, 0], least[:, 1] * profile.least_input_share()
        lightest = min(x.parameter_bytes for x in profile.layers) * 4.0 * others

        def term(i, z):
            room = 4.4e9 - profile.span(i, z)[3] * 4.0 - lightest - profile.workspace(i, z, n)
            most = math.floor(room / profile.kept_bytes(i, z, n) * (1 + 1e-9)) if room >= 0 else 0
            hold = fwd[z:].sum() + inp[i:].sum()
            return fwd[:z].sum() + math.ceil(turns / most) * hold if most >= 1 else math.inf

        want = max(min(term(i, z) for i in range(l + 1) for z in range(l + 1, L + 1)) for l in range(L))
        assert got == pytest.approx(want, rel=1e-9), (family, got, want)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_the_bound_over_a_shapes_cuts_stays_below_the_simulator_and_above_the_shape_bound():
    """group_bound.GroupBound (the dual of the busiest group over the shape's cuts: each group's
    fill, its stages' work and drain, or its forwards and all-reduces, weighted and minimised by a
    programme over cuts) is below the simulated time of every cut of the shape, for every chunked
    family, and decides more than the cut-blind shape bound on a good share of the shapes."""
    from dapple_launch.planner.group_bound import GroupBound
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times, shape_bound

    rng = random.Random(3)
    checked = higher = total = 0
    for _ in range(5):
        topo, profile = _random_cluster_and_profile(rng, all_reduce=(3e9, 1e8))
        G = rng.choice([8, 16])
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        memo: dict = {}
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4, 8]):
            times = lambda r, b=b: _layer_times(profile, topo, r, b, memo)
            bound = GroupBound(profile, topo, G, family, v, groups, b, times).bound()
            total += 1
            higher += bound > shape_bound(profile, topo, G, groups, b, None, family, v) * 1.001
            checked += _random_cuts_at_or_above(rng, bound, profile, topo, G, limits, family, v, groups, b, 2)
    assert checked > 500 and higher > total / 6, (checked, higher, total)


def test_a_tied_weight_is_summed_over_each_device_holding_it_once():
    """The first and last stages sum a tied weight over their devices after their own all-reduces
    (runtime/tied.py): under ZB-V both ends sit on the first group, whose ranks hold one shared
    Parameter, so the sum runs over that group's devices once; under interleaved 1F1B the ends sit
    on the first and last groups, and it runs over both."""
    from dapple_launch.planner.chunked import chunked_layout
    from dapple_launch.planner.cost import stage_costs

    layers = [LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 4e6) for i in range(8)]
    untied = chain("t", layers, batch_size=2)
    tied = replace(untied, tied=(((0, 7), 4e6),))
    topo = Topology("t", 2, 4, 16e9, 10, 20e9, 2e9)
    for family, stops, holders in (
        ("zbv", [1, 2, 3, 4, 5, 6, 7, 8], (0, 1)),
        ("interleaved_1f1b", [1, 2, 3, 4, 5, 6, 7, 8], (0, 1, 6, 7)),
    ):
        layout = chunked_layout(family, [2, 2, 2, 2], stops, None)
        assert len(layout) == 8 and sorted(set(layout[0].devices) | set(layout[-1].devices)) == list(holders)
        with_tie, without = stage_costs(tied, topo, layout, 2), stage_costs(untied, topo, layout, 2)
        sum_s = topo.allreduce_s(holders, 4e6)
        for s in (0, 7):
            assert with_tie[s].allreduce_s - without[s].allreduce_s == pytest.approx(sum_s, rel=1e-12), (family, s)
        assert all(with_tie[s].allreduce_s == without[s].allreduce_s for s in range(1, 7))


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_shapes_bound_counts_a_tied_weight_s_sum_after_the_first_and_last_stages():
    """A weight layer 0 shares with the last layer (a tied embedding) is summed over both stages'
    devices after their own all-reduces: the bound over a shape's cuts counts it after the tail of
    a group whose last step is on the first or the last stage, and in the all-reduce queue of the
    groups holding them, and stays below the simulated time of every cut tried, for every chunked
    family (it fails with the queue's share doubled); it is higher than without the tie on some."""
    from dapple_launch.planner.group_bound import GroupBound
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times

    rng = random.Random(5)
    checked = raised = 0
    for _ in range(4):
        topo, untied = _random_cluster_and_profile(rng, all_reduce=(3e9, 1e8))
        profile = replace(untied, tied=(((0, untied.num_layers - 1), rng.choice([1e7, 1e8])),))
        G = rng.choice([8, 16])
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        memo: dict = {}
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4, 8]):
            times = lambda r, b=b: _layer_times(profile, topo, r, b, memo)
            bound = GroupBound(profile, topo, G, family, v, groups, b, times).bound()
            raised += bound > GroupBound(untied, topo, G, family, v, groups, b, times).bound() * 1.001
            checked += _random_cuts_at_or_above(rng, bound, profile, topo, G, limits, family, v, groups, b, 2)
    assert checked > 300 and raised > 10, (checked, raised)


@pytest.mark.slow  # (several seconds: out of the fast tier)
def test_the_all_reduce_and_path_terms_of_a_shapes_bound_stay_below_its_best_cut():
    """group_bound's all-reduce terms: a group's last step leaves its stage's all-reduce to finish
    (at least the bucket of its first weighted layer, or every byte less the step), and a group's
    all-reduces queue one after another from the first of its stages' last gradient steps; and
    path_bound's terms: a group's run between two of its steps with micro-batch m's forward before
    and its gradient after, transfers included (Chimera's too), and each link's load. Against the best of every
    cut of the shape (simulated, exhaustively, on random clusters whose all-reduce is fast or slow)
    the bound stays at or below, and each kind of term raises it on a good share."""
    from dapple_launch.planner.group_bound import GroupBound

    rng = random.Random(11)
    checked = raised = by_paths = chimera_by_paths = 0
    for profile, topo, G, limits, family, v, groups, b, times, cuts in _small_chunked_shapes(rng):
        bound = GroupBound(profile, topo, G, family, v, groups, b, times).bound()
        dual = GroupBound(profile, topo, G, family, v, groups, b, times)
        dual.with_paths = False
        without = GroupBound(profile, topo, G, family, v, groups, b, times)
        without.tail, without.with_paths = {}, False  # (the busy and fill-and-drain terms alone)
        raised += dual.bound() > without.bound() * 1.001
        by_paths += bound > dual.bound() * 1.001
        chimera_by_paths += family == "chimera" and bound > dual.bound() * 1.001
        best = _best_cut_s(profile, topo, G, limits, family, v, groups, b, cuts)
        assert bound <= best * (1 + 1e-9), (family, v, groups, b, bound, best)
        checked += 1
    assert checked > 150 and raised > checked / 4 and by_paths > checked / 4, (checked, raised, by_paths)
    assert chimera_by_paths > 0, chimera_by_paths  # (Chimera's group runs too, each stage on either copy)


def test_the_banded_programme_finds_the_least_cut_of_every_small_case():
    """path_bound.least_cut asks each stage only for the band of spans a cut can give it (stage s
    starts in [s, L - S + s]): on random tables it finds the least over every cut, enumerated, and
    returns that cut's spans."""
    import numpy as np

    from dapple_launch.planner.path_bound import least_cut

    rng = np.random.default_rng(5)
    for _ in range(60):
        L = int(rng.integers(1, 9))
        S = int(rng.integers(1, L + 1))
        tables = rng.random((S, L + 1, L + 1))
        empty = np.where(np.arange(L + 1)[None, :] > np.arange(L + 1)[:, None], 0.0, np.inf)
        value, spans = least_cut(S, L, lambda s, starts, stops: tables[s][starts, stops] + empty[starts, stops])
        best = min(
            sum(tables[s][i, z] for s, (i, z) in enumerate(zip((0, *cut), (*cut, L))))
            for cut in itertools.combinations(range(1, L), S - 1)
        )
        assert value == pytest.approx(best, rel=1e-12)
        assert [i for i, _ in spans][0] == 0 and spans[-1][1] == L
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(spans, spans[1:]))
        assert sum(tables[s][i, z] for s, (i, z) in enumerate(spans)) == pytest.approx(value, rel=1e-12)


@pytest.mark.slow  # (a few seconds: out of the fast tier)
def test_the_dual_over_a_shapes_cuts_is_the_same_whichever_kind_of_term_leads():
    """GroupBound._dual lets its kinds of term take turns, the one that last reached a cap first
    (lead): without a cap or a count every kind climbs its own steps whatever the turns, so the
    bound is the same for every lead; with a cap below it, the bound stops at or above the cap."""
    from dapple_launch.planner.group_bound import GroupBound
    from dapple_launch.planner.group_shapes import shapes
    from dapple_launch.planner.shape_bound import _layer_times

    rng = random.Random(17)
    compared = 0
    for _ in range(3):
        topo, profile = _random_cluster_and_profile(rng, all_reduce=(3e9, 1e8, 3e7))
        G = rng.choice([8, 16])
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
        memo: dict = {}
        for family, v, groups, b in shapes(profile, topo, G, limits, [1, 2, 4]):
            times = lambda r, b=b: _layer_times(profile, topo, r, b, memo)
            make = lambda: GroupBound(profile, topo, G, family, v, groups, b, times)
            plain = make()
            plain.with_paths = False
            value = plain.bound()
            kinds = list(plain._modes())
            for kind in kinds:
                led = make()
                led.with_paths, led.lead = False, {led._lead_key(): kind}
                assert led.bound() == value, (family, v, groups, b, kind)
            if 0 < value < math.inf:
                capped = make()
                capped.with_paths = False
                assert value * 0.5 <= capped.bound(cap=value * 0.5) <= value
            compared += len(kinds) > 1
    assert compared > 20, compared


def test_a_chimera_groups_bound_counts_the_drain_after_its_last_backward():
    """Chimera's backward is whole: a group's last step is a B, after which the last gradient still
    crosses the layers ahead of the group's earliest stage, so its bound counts that drain as it
    does under interleaved 1F1B. Four alike layers on four groups (one cut): group 1 runs 2 × 2
    micro-batches through stages 1 and 2 (12), waits for layer 0's forward (1) and leaves its
    backward (2): the bound reaches those 15, past the 13 of the fill alone, and stays under the
    simulator (the paths' game, solved exactly, adds the steps' small fixed costs too)."""
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.group_bound import GroupBound
    from dapple_launch.planner.shape_bound import _layer_times

    alike = chain("u", [LayerProfile(f"l{i}", 1.0, 2.0, 1.0, 0.0) for i in range(4)], batch_size=1)
    free = Topology("t", 1, 4, 1e12, 10, 1e15, 1e15)
    memo: dict = {}
    times = lambda r: _layer_times(alike, free, r, 1, memo)
    bound = GroupBound(alike, free, 4, "chimera", 2, (1, 1, 1, 1), 1, times).bound()
    layout = chunked_layout("chimera", [1] * 4, [1, 2, 3, 4], None)
    simulated = evaluate_chunked(alike, free, layout, 1, 4, Limits(schedules=("chimera",)), "chimera", 2).iteration_s
    assert 15.0 - 1e-9 <= bound <= simulated, (bound, simulated)


def test_the_busiest_rank_bounds_every_simulation_and_a_cutoff_drops_only_candidates_no_faster():
    """busiest_rank_s (each rank's steps at their costs, summed) is below the simulated time of every
    family's orders under random costs, and equals it where one rank never waits; evaluate_chunked
    with a cutoff leaves a candidate unsimulated (None) only when the full simulation is at least as
    slow, so the local search that passes its incumbent as the cutoff moves exactly as before."""
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.shape_bound import num_stages
    from dapple_launch.schedule import busiest_rank_s

    rng = random.Random(11)
    for family, v in [
        ("interleaved_1f1b", 2),
        ("interleaved_1f1b", 3),
        ("interleaved_zb", 2),
        ("zbv", 2),
        ("chimera", 2),
        ("1f1b", 1),
        ("zb_h1", 1),
    ]:
        for R in (2, 4):
            x = (
                build_rank_schedule(family, R, 2 * R, v)
                if family not in ("1f1b", "zb_h1")
                else from_stages(build_schedule(family, R, 2 * R))
            )
            for _ in range(20):
                costs = [
                    StageCosts(
                        rng.uniform(0.1, 2),
                        rng.uniform(0.2, 4),
                        rng.uniform(0, 1),
                        rng.uniform(0, 1),
                        rng.uniform(0, 3),
                        weight_grad_s=None,
                        action_s=rng.uniform(0, 0.1),
                    )
                    for _ in range(x.num_stages)
                ]
                costs = [replace(c, send_gradient_s=0.0) if s == 0 else c for s, c in enumerate(costs)]
                assert busiest_rank_s(x, costs) <= simulate_ranks(x, costs, record=False).iteration_s * (1 + 1e-12)
    one = from_stages(build_schedule("1f1b", 1, 5))  # a single rank never waits: the bound is its time
    c1 = [StageCosts(1.0, 2.0)]
    assert busiest_rank_s(one, c1) == pytest.approx(simulate_ranks(one, c1, record=False).iteration_s)
    dropped = kept = 0
    for _ in range(6):
        topo = Topology("t", 2, 2, 8e9, 1e-5, 20e9, 1e9, inter_node_allreduce_bandwidth=3e9)
        profile = random_profile(rng, 10)
        for family, groups, b in [("interleaved_1f1b", (2, 2), 2), ("zbv", (1, 1, 1, 1), 1), ("chimera", (2, 2), 2)]:
            S = num_stages(family, 2, groups)
            stops = [*sorted(rng.sample(range(1, 10), S - 1)), 10]
            layout = chunked_layout(family, list(groups), stops, None)
            full = evaluate_chunked(profile, topo, layout, b, 8 // b, Limits(), family, 2)
            for cutoff in (full.iteration_s * 0.5, full.iteration_s * 0.99, full.iteration_s * 1.01, math.inf):
                c = evaluate_chunked(profile, topo, layout, b, 8 // b, Limits(), family, 2, cutoff)
                if c is None:
                    assert full.iteration_s >= cutoff
                    dropped += 1
                else:
                    assert c.iteration_s == full.iteration_s
                    kept += 1
    assert dropped > 5 and kept > 30, (dropped, kept)


def test_a_simulation_stopped_at_its_cutoff_only_drops_slower_ones():
    """simulate_ranks(cutoff=x) returns None only where the full simulation is slower than x, and
    otherwise the full simulation's figures; on random costs it stops walks that the busiest rank's
    compute alone could not (a waiting rank passes the cutoff first)."""
    from dapple_launch.schedule import busiest_rank_s
    from dapple_launch.schedule.round_robin import round_robin

    rng = random.Random(5)
    stopped = kept = 0
    for family, v in [
        ("interleaved_1f1b", 2),
        ("interleaved_zb", 2),
        ("zbv", 2),
        ("chimera", 2),
        ("1f1b", 1),
        ("1f1b_rr", 1),
        ("zb_h1_rr", 1),
    ]:
        for R in (2, 4):
            if family.endswith("_rr"):
                x = round_robin(family, (R - 1, 1), 3 * R, None)
            elif family == "1f1b":
                x = from_stages(build_schedule(family, R, 2 * R))
            else:
                x = build_rank_schedule(family, R, 2 * R, v)
            for _ in range(15):
                costs = [
                    StageCosts(
                        rng.uniform(0.1, 2),
                        rng.uniform(0.2, 4),
                        rng.uniform(0, 1),
                        rng.uniform(0, 1),
                        rng.uniform(0, 3),
                        action_s=rng.uniform(0, 0.1),
                    )
                    for _ in range(x.num_stages)
                ]
                full = simulate_ranks(x, costs, record=False)
                floor = busiest_rank_s(x, costs)
                for cutoff in (
                    floor * 1.001,
                    (floor + full.iteration_s) / 2,
                    full.iteration_s * 0.999,
                    full.iteration_s,
                    full.iteration_s * 1.5,
                ):
                    got = simulate_ranks(x, costs, record=False, cutoff=cutoff)
                    if got is None:
                        assert full.iteration_s > cutoff
                        stopped += floor < cutoff
                    else:
                        assert (
                            got.iteration_s == full.iteration_s
                            and got.peak_activation_bytes == full.peak_activation_bytes
                            and got.stage_end_s == full.stage_end_s
                        )
                        kept += 1
    assert stopped > 50 and kept > 200, (stopped, kept)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_the_chunked_pass_keeps_to_its_share_of_the_budget():
    """search_chunked scores at most its share of strategy.search_nodes, counting every candidate's
    stage costs and simulation (and a shape's first, its rank orders): past it by at most one
    candidate, whose last check may not count the orders it builds. An exhaustive pass over a shape's
    cuts once ran to twice the budget when its check left the stage costs out."""
    from dapple_launch.planner.chunked_search import SHARE, _cost, _unsimulated_cost, search_chunked

    rng = random.Random(5)
    for _ in range(6):
        topo = Topology("t", 2, 4, 8e9, 1e-5, 20e9, 1e9, inter_node_allreduce_bandwidth=3e9)
        profile = random_profile(rng, rng.choice([12, 16, 20]))
        budget = rng.choice([400, 2000, 8000])
        limits = Limits(schedules=("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"), search_nodes=budget)
        found, _, scored = search_chunked(profile, topo, 32, limits, [1, 2, 4, 8], math.inf)
        most = max(2 * _cost(16, 32) + _unsimulated_cost(16), 1)
        assert found and scored <= int(budget * SHARE) + most, (budget, scored)
    # Chimera on 2 devices, 30 layers, 2 micro-batches: 29 cuts at 2 units each (stage costs 1,
    # simulation 1) after a 3-unit screen do not fit a share of 40, so the pass descends instead
    profile = chain("u", [LayerProfile(f"l{i}", 1.0, 2.0, 1.0, 0.0) for i in range(30)], batch_size=1)
    pair = Topology("t", 1, 2, 1e12, 1e-6, 1e12, 1e12)
    assert (_cost(2, 2), _unsimulated_cost(2)) == (1, 1)
    _, _, scored = search_chunked(
        profile, pair, 4, Limits(schedules=("chimera",), search_nodes=int(40 / SHARE)), [2], math.inf
    )
    assert scored <= 40 + 3, scored


@pytest.mark.parametrize("seed", range(4))
def test_torch_style_baselines_are_uniform_even_splits_and_the_planner_is_never_slower(seed):
    """planner/torch_style.py: what a torchtitan user would configure for each torch schedule — a
    pipeline degree P dividing the devices, D / P replicas per stage, layers split evenly by count
    (v per rank for interleaved, two for ZB-V) — and the planner, which searches those layouts among
    others, never plans slower on small instances (where it is exact)."""
    from dapple_launch.planner.baselines import even_stops
    from dapple_launch.planner.chunked import group_of
    from dapple_launch.planner.search import search
    from dapple_launch.planner.torch_style import TORCH_STYLE, torch_style_baselines

    rng = random.Random(90 + seed)
    nodes, per_node = rng.choice([(1, 4), (2, 2), (1, 2)])
    topo = Topology(
        "t",
        nodes,
        per_node,
        rng.choice([2e9, 8e9]),
        10,
        20e9,
        rng.choice([1e9, 5e9]),
        inter_node_allreduce_bandwidth=3e9,
    )
    profile = random_profile(rng, rng.choice([4, 6, 8]))
    G, L, D = 8, profile.num_layers, topo.num_devices
    limits = Limits(schedules=("1f1b", "zb_h1", "interleaved_1f1b", "interleaved_zb", "zbv", "chimera"))
    baselines = torch_style_baselines(profile, topo, G, limits)
    assert set(baselines) == set(TORCH_STYLE)
    best, _, _, _ = search(profile, topo, G, limits)
    assert sum(c is not None for c in baselines.values()) >= 3, baselines
    for name, c in baselines.items():
        if c is None:
            continue
        S = len(c.layout)
        v = c.extra.get("chunks", 1)
        P = S // v
        assert (
            c.schedule
            == {
                "torch 1F1B": "1f1b",
                "torch interleaved 1F1B": "interleaved_1f1b",
                "torch interleaved ZB": "interleaved_zb",
                "torch ZB-V": "zbv",
            }[name]
        )
        assert [st.stop for st in c.layout] == even_stops(L, S)
        assert {st.replicas for st in c.layout} == {D // P} and P * (D // P) == D
        assert all(c.layout[s].devices == c.layout[group_of(c.schedule, s, P)].devices for s in range(S))
        assert best.iteration_s <= c.iteration_s * (1 + 1e-12), (name, best.summary(), c.summary())


@pytest.mark.slow
def test_planning_every_family_together_finds_what_each_chunked_family_finds_alone():
    """BERT-48 on 64 A100s: with four chunked families many shapes share one bound (the busiest
    group's work ignores bubbles), and taking them in bound order spent the pass's budget on
    hopeless ones: all six families together planned 165.2 ms, interleaved zero bubble alone
    156.8 ms. Shapes are now screened and searched in the order of what their screen scored."""
    from dapple_launch.plan_config import DEFAULT_SCHEDULES, shipped_topology
    from dapple_launch.planner.search import search
    from dapple_launch.profile import read_profile_file

    from .test_planner import PROFILES

    p = read_profile_file(PROFILES / "bert-48-pbs-2.txt", 2, device_tflops=125)
    topo = shipped_topology("a100x64")
    together, _, _, _ = search(p, topo, 128, Limits(schedules=DEFAULT_SCHEDULES))
    for family in ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera"):
        alone, _, _, _ = search(p, topo, 128, Limits(schedules=(family,)))
        assert together.iteration_s <= alone.iteration_s * (1 + 1e-12), (family, together.summary(), alone.summary())


@pytest.mark.parametrize("seed", range(10))
def test_the_planner_equals_exhaustive_enumeration_over_layouts_and_all_six_families(seed, monkeypatch):
    """Small instances: the search over layouts × {1F1B, ZB-H1, interleaved 1F1B and zero bubble, ZB-V,
    Chimera} finds the
    exhaustive optimum (every plain layout at every warm-up, every chunked shape at every cut) and
    proves it."""
    from dapple_launch.planner.search import search

    from .test_zero_bubble import brute_force_both

    rng = random.Random(40 + seed)
    nodes, per_node = rng.choice([(1, 2), (1, 4), (2, 2), (1, 3)])
    topo = Topology(
        "t",
        nodes,
        per_node,
        rng.choice([2e9, 8e9]),
        10,
        20e9,
        rng.choice([1e9, 5e9]),
        inter_node_allreduce_bandwidth=3e9,
    )
    profile = random_profile(rng, rng.choice([4, 5, 6]))
    G = rng.choice([4, 8])
    limits = Limits(
        schedules=("1f1b", "zb_h1", "interleaved_1f1b", "interleaved_zb", "zbv", "chimera"),
        max_warmup_depth=rng.choice([1, 2]),
    )
    # the enumerated space keeps one warm-up depth for every stage: the driver without the proposer of
    # each stage's own depth, which may only beat it (checked after)
    from dapple_launch.planner import search as driver
    from dapple_launch.planner.stage_warmups import StageWarmups

    everything = search(profile, topo, G, limits)[0]
    common = tuple(p for p in driver.PROPOSERS if not isinstance(p, StageWarmups))
    monkeypatch.setattr(driver, "PROPOSERS", common)
    best, _, _, stats = search(profile, topo, G, limits)
    assert (everything is None) == (best is None)
    if best is not None:
        assert everything is not None and everything.iteration_s <= best.iteration_s
    exhaustive = min(brute_force_both(profile, topo, G, limits), _exhaustive_chunked(profile, topo, G, limits))
    if best is None:
        assert exhaustive == math.inf
        return
    if best.schedule in ("gpipe",):  # a baseline of another family beat every searched one
        assert best.iteration_s <= exhaustive
        return
    assert stats.proven_optimal, (seed, stats.proven_gap)
    assert best.iteration_s == pytest.approx(exhaustive, rel=1e-12)
