"""A plan whose peak is exactly a device's memory stays a plan: the score's fit test admits it (a
peak at the capacity fits), and no bound's memory test prunes it on the way. (The bounds compute
what a micro-batch keeps by the simulator's own formula and order of operations, profile.kept_of.)"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.plan_config import DEFAULT_SCHEDULES
from dapple_launch.planner.limits import Limits
from dapple_launch.planner.search import search

from .test_planner import random_profile


def _instance(seed: int):
    rng = random.Random(seed)
    nodes, per_node = rng.choice([(1, 4), (2, 2), (2, 3), (1, 8), (2, 4)])
    topo = Topology("t", nodes, per_node, 64e9, 10, 20e9, rng.choice([1e9, 5e9]), inter_node_allreduce_bandwidth=3e9)
    return random_profile(rng, rng.choice([3, 4, 5, 6, 8])), topo, rng.choice([8, 16, 32])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("families", ["exact", "all"])
def test_a_plan_at_exactly_its_own_peak_still_fits(seed, families):
    """Plan with room to spare (no headroom), then again on devices of exactly the chosen plan's
    peak: that plan is still admissible, so the search still finds a plan, and its proven lower
    bound stays at or below the first plan's time; where both searches prove optimality (1F1B and
    ZB-H1 on these sizes always do), the time is the same."""
    profile, topo, G = _instance(seed)
    limits = Limits(schedules=("1f1b", "zb_h1") if families == "exact" else DEFAULT_SCHEDULES, memory_headroom=0.0)
    roomy, _, _, roomy_stats = search(profile, topo, G, limits, with_baselines=False)
    assert roomy is not None
    tight = replace(topo, device_memory_bytes=roomy.peak_memory_bytes)
    found, _, _, stats = search(profile, tight, G, limits, with_baselines=False)
    assert found is not None, (roomy.summary(), roomy.peak_memory_bytes)
    assert found.peak_memory_bytes <= roomy.peak_memory_bytes
    assert found.iteration_s * (1 - stats.proven_gap) <= roomy.iteration_s * (1 + 1e-12), (
        roomy.summary(),
        found.summary(),
    )
    if families == "exact":
        assert roomy_stats.proven_gap == 0.0 and stats.proven_gap == 0.0
        assert found.iteration_s == roomy.iteration_s
