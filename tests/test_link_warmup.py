"""Each stage's warm-up fitted to its link (link_warmup.py), pure: for stages of copies a valid
warm-up never below DAPPLE's minimum per copy, faster than every common depth where a stage of more
copies comes later; for plain 1F1B and ZB-H1 stages the same rule through cost.evaluate; and what
the planner picks where it is the fastest."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.plan_config import DEFAULT_SCHEDULES, shipped_topology
from dapple_launch.planner.cost import evaluate
from dapple_launch.planner.limits import Limits
from dapple_launch.planner.link_warmup import LINKED, link_warmup
from dapple_launch.planner.round_robin import evaluate_rr, fitted_depths, rr_costs
from dapple_launch.planner.round_robin_search import contiguous
from dapple_launch.planner.search import plan
from dapple_launch.profile import read_profile_file
from dapple_launch.schedule.round_robin import copy_warmup

from .test_rank_schedules import random_profile

ROOT = Path(__file__).resolve().parent.parent


def test_the_warm_up_fitted_to_the_links_is_valid_and_never_below_dapples_minimum():
    """Random profiles and layouts of copies on two nodes, slow networks and fast: the warm-up keeps
    each stage at least one micro-batch ahead of the next (up to all but one forward first), never
    below DAPPLE's minimum per copy, and both families' orders take it (their own check)."""
    checked = 0
    for seed in range(40):
        rng = random.Random(seed)
        L = rng.randint(4, 10)
        profile = random_profile(rng, L)
        topo = Topology("t", 2, 4, 16e9, 10.0, 100e9, rng.choice([0.5e9, 5e9, 50e9]))
        S = rng.randint(2, min(L, 5))
        cuts = sorted(rng.sample(range(1, L), S - 1))
        replicas = [1] * S
        for _ in range(rng.randint(0, 8 - S)):
            replicas[rng.randrange(S)] += 1
        b = rng.choice([1, 2, 4])
        copies = tuple(r // math.gcd(r, b) for r in replicas)
        M = rng.choice([8, 16, 32])  # (at least one micro-batch per copy: round_robin_constraint)
        layout = contiguous((0, *cuts, L), tuple(replicas))
        costs = rr_costs(profile, topo, layout, copies, b)
        warmup = link_warmup(costs, copies, M)
        least = copy_warmup(copies, M)
        assert all(w >= x for w, x in zip(warmup, least)), (warmup, least)
        assert all(warmup[s] > warmup[s + 1] or warmup[s] >= M - 1 for s in range(S - 1)), warmup
        for family in ("1f1b_rr", "zb_h1_rr"):
            c = evaluate_rr(profile, topo, layout, copies, b, M, Limits(), family, LINKED)
            assert c is not None and c.warmup == warmup and c.warmup_depth == LINKED
            assert "warm-up per link" in c.summary()
        checked += 1
    assert checked == 40


def test_a_later_stage_of_more_copies_does_not_tie_its_neighbours_warm_ups():
    """GNMT-32 on 16 × 1 V100 at 10 Gbps, G 256, one sample, copies 1:1:1:1:2:1:2:1:2:1:2:1 (each
    two-copy stage a layer without weights): every cut's sends (1.0-1.4 ms) outlast a stage's
    compute, so each stage wants several micro-batches in flight more than the next. A depth is a
    multiple of c_s (S - s), and a stage keeps at least the next one's in flight: the two-copy stages
    lift the stages before them to their warm-up, so neighbours run in step, waiting on each other's
    link at every micro-batch. Fitted to each link, the warm-up is far faster than every common
    depth and than the depths fitted to each stage's round trip."""
    profile = read_profile_file(
        ROOT / "dapple_launch" / "profiles" / "gnmt-32-pbs-64-simplified.txt", 64, device_tflops=125.0
    )
    topo = shipped_topology("v100-16x1-10g")
    replicas = (1, 1, 1, 1, 2, 1, 2, 1, 2, 1, 2, 1)
    layout = contiguous((0, 9, 21, 33, 41, 42, 49, 50, 57, 58, 63, 64, 67), replicas)
    copies, M, limits = replicas, 256, Limits()
    linked = evaluate_rr(profile, topo, layout, copies, 1, M, limits, "zb_h1_rr", LINKED)
    common = min(
        evaluate_rr(profile, topo, layout, copies, 1, M, limits, family, depth).iteration_s
        for family in ("1f1b_rr", "zb_h1_rr")
        for depth in (1, 2, 3, 4, 6, 8)
    )
    fitted = fitted_depths(rr_costs(profile, topo, layout, copies, 1), copies, M)
    own = evaluate_rr(profile, topo, layout, copies, 1, M, limits, "zb_h1_rr", (*fitted[:-1], 1))
    assert linked.fits and linked.iteration_s < 0.75 * min(common, own.iteration_s)


def test_plain_stages_take_the_warm_up_fitted_to_their_links():
    """1F1B and ZB-H1 on random profiles, layouts and networks: cost.evaluate at LINKED runs the rule
    with one copy a stage, a warm-up both families' orders take, never below DAPPLE's S - s - 1, and
    costed by the simulator as any other. GNMT-32 on 16 × 1 V100 at 10 Gbps, G 256, its 8 stages
    under ZB-H1: faster than every depth for all stages (×3 is the planner's best of them), as each
    stage keeps the next one's round trip over their link in flight and no multiple of S - s does."""
    for seed in range(20):
        rng = random.Random(seed)
        L = rng.randint(3, 10)
        profile = random_profile(rng, L)
        topo = Topology("t", 2, 4, 16e9, 10.0, 100e9, rng.choice([0.5e9, 5e9, 50e9]))
        S = rng.randint(2, min(L, 6))
        layout = contiguous((0, *sorted(rng.sample(range(1, L), S - 1)), L), (1,) * S)
        M = rng.choice([2, 8, 32])
        for family in ("1f1b", "zb_h1"):
            c = evaluate(profile, topo, layout, 1, M, Limits(schedule=family), LINKED)
            assert c.warmup == link_warmup(c.costs, (1,) * S, M) and c.warmup_depth == LINKED
            assert all(w >= min(S - s - 1, M) for s, w in enumerate(c.warmup))
            assert math.isfinite(c.iteration_s) and "warm-up per link" in c.summary()
    profile = read_profile_file(
        ROOT / "dapple_launch" / "profiles" / "gnmt-32-pbs-64-simplified.txt", 64, device_tflops=125.0
    )
    topo = shipped_topology("v100-16x1-10g")
    layout, limits = contiguous((0, 9, 21, 33, 42, 50, 60, 65, 67), (1,) * 8), Limits(schedule="zb_h1")
    linked = evaluate(profile, topo, layout, 1, 256, limits, LINKED)
    common = min(evaluate(profile, topo, layout, 1, 256, limits, depth).iteration_s for depth in range(1, 9))
    assert linked.fits and linked.iteration_s < 0.998 * common, (linked.iteration_s, common)


@pytest.mark.slow  # (a search of a few seconds: out of the fast tier)
def test_the_planner_fits_the_copies_warm_ups_to_their_links_where_that_is_faster():
    """VGG-19 on 8 × 8 A100, G 128: the copies 26:16:6:8:7:1 at one sample run 5.748 ms at their
    best depths per stage, 5.699 ms with each stage's warm-up fitted to its link; the planner's
    last tier of copies finds it, and its statement says what the warm-up is."""
    profile = read_profile_file(ROOT / "dapple_launch" / "profiles" / "vgg-19-pbs-32.txt", 32, device_tflops=125.0)
    # (as benchmarks/planner.py reads it: its weights in MiB)
    profile = replace(
        profile, layers=tuple(replace(x, parameter_bytes=x.parameter_bytes * 1.048576) for x in profile.layers)
    )
    chosen = plan(profile, shipped_topology("a100x64"), 128, Limits(schedules=DEFAULT_SCHEDULES))
    assert chosen.estimate.iteration_s < 5.72e-3, chosen.planner
    assert "round trip over the link" in chosen.planner


@pytest.mark.slow  # (a search of a few seconds: out of the fast tier)
def test_the_planner_fits_a_plain_plan_s_warm_ups_to_their_links_where_that_is_faster():
    """GNMT-32 on 16 × 1 V100 at 10 Gbps, G 256: the 8 single-device stages under ZB-H1 the proof
    tables start from run 290.1 ms at ×3 for every stage, 289.1 ms with each stage's warm-up fitted
    to its link (polish.stage_depths tries it after its descent, also once the budget is spent)."""
    profile = read_profile_file(
        ROOT / "dapple_launch" / "profiles" / "gnmt-32-pbs-64-simplified.txt", 64, device_tflops=125.0
    )
    chosen = plan(profile, shipped_topology("v100-16x1-10g"), 256, Limits(schedules=DEFAULT_SCHEDULES))
    assert chosen.schedule == "zb_h1" and chosen.estimate.iteration_s < 289.5e-3, chosen.planner
    assert chosen.warmup == (24, 21, 18, 15, 11, 7, 3, 0)
