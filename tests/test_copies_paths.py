"""The stages' paths in the bound on plans of round-robin copies (planner/copies_paths.py), pure: each
stage's term on a layout stays at or below what the simulator times that layout at, for both
families and several warm-ups, and the bound with them stays below every layout's time while it
says more than the bound without them on many draws."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.planner.copies_bound import CopiesBound
from dapple_launch.planner.cost import speed_ratio
from dapple_launch.planner.limits import Limits
from dapple_launch.planner.round_robin import canonical_copies, evaluate_rr
from dapple_launch.planner.round_robin_search import contiguous
from dapple_launch.schedule.round_robin import round_robin_constraint

from .test_rank_schedules import random_profile
from .test_round_robin import two_node_cluster


def _draw(seed: int):
    """A random profile on a random two-node cluster whose network may be much slower than its nodes."""
    rng = random.Random(seed)
    profile = random_profile(rng, rng.choice([5, 7, 9]))
    # (a slow network: the sends are what the paths add)
    topo = two_node_cluster(rng, networks=(5e9, 1e8, 1e7), all_reduce=(3e9, 1e8))
    return rng, profile, topo


def _layouts(rng: random.Random, profile, D: int, count: int):
    for _ in range(count):
        S = rng.randint(2, min(4, D))
        cuts = sorted(rng.sample(range(1, profile.num_layers), S - 1))
        replicas = [1] * S
        for _ in range(D - S):
            replicas[rng.randrange(S)] += 1
        yield (*cuts, profile.num_layers), replicas


def test_each_stage_s_path_term_stays_below_the_simulated_time():
    """A stage's term (micro-batch 0's way through the stages before it with both sends over each
    cut, its busiest copy's work less the W's its index lets it hold back, the last gradient's way
    back) is at or below the simulated iteration of the layout, for 1f1b_rr and zb_h1_rr at warm-up
    depths 1 to 4, and above what the stage's own term in copies_bound says on many draws."""
    checked = tight = more = 0
    limits = Limits()
    for seed in range(12):
        rng, profile, topo = _draw(seed)
        D = topo.num_devices
        for stops, replicas in _layouts(rng, profile, D, 8):
            G, b = rng.choice([16, 32]), rng.choice([1, 2, 4])
            copies = tuple(canonical_copies(r, b) for r in replicas)
            if round_robin_constraint(copies, G // b):
                continue
            speed = speed_ratio(profile, topo)
            capacity = topo.device_memory_bytes * (1 - limits.memory_headroom)
            own = CopiesBound(profile, topo, G, b, speed, limits.optimizer_factor, capacity)
            paths = own.stage_paths()
            assert paths is not None  # (up to 16 devices)
            terms = paths.terms(list(stops), replicas)
            starts = (0, *stops[:-1])
            for family, depth in itertools.product(("1f1b_rr", "zb_h1_rr"), (1, 2, 4)):
                layout = contiguous((0, *stops), tuple(replicas))
                c = evaluate_rr(profile, topo, layout, copies, b, G // b, limits, family, depth)
                for s, term in enumerate(terms, start=1):
                    assert term <= c.iteration_s * (1 + 1e-9), (seed, family, depth, stops, replicas, b, s)
                    tight += term > c.iteration_s * 0.8
                    more += term > own.stage_s(starts[s], stops[s], replicas[s]) * 1.001
                checked += 1
    # (570 layouts and families: 133 terms within a fifth of the simulation, 654 above the own term)
    assert checked > 100 and tight > checked / 8 and more > checked / 2, (checked, tight, more)


@pytest.mark.slow  # (about 2 s: CI's first tier runs it)
def test_the_copies_bound_with_the_paths_stays_below_every_layout_and_says_more():
    """CopiesBound.bound under a cap (the search asks up to its least bound so far) adds the paths'
    programme up to 16 devices: never above a layout's simulated time, never below the bound without
    it (no cap), and above it on many draws of deep models on 8 to 16 devices over a slow network
    (one or two devices a node: every cut's sends cross it)."""
    checked = raised = 0
    limits = Limits()
    for seed in range(10):
        rng = random.Random(200 + seed)
        profile = random_profile(rng, rng.choice([10, 14]))
        topo = Topology("t", rng.choice([8, 16]) // (k := rng.choice([1, 2])), k, 32e9, 10, 20e9, 1e8)
        D = topo.num_devices
        for G, b in ((16, 1), (32, 2)):
            speed = speed_ratio(profile, topo)
            capacity = topo.device_memory_bytes * (1 - limits.memory_headroom)
            without = CopiesBound(profile, topo, G, b, speed, limits.optimizer_factor, capacity).bound()
            times = []
            for stops, replicas in _layouts(rng, profile, D, 6):
                copies = tuple(canonical_copies(r, b) for r in replicas)
                if round_robin_constraint(copies, G // b):
                    continue
                layout = contiguous((0, *stops), tuple(replicas))
                for family, depth in itertools.product(("1f1b_rr", "zb_h1_rr"), (1, 4)):
                    times.append(
                        evaluate_rr(profile, topo, layout, copies, b, G // b, limits, family, depth).iteration_s
                    )
            if not times or not math.isfinite(without):
                continue
            cap = max(times) * 4  # (a finite cap: the paths' programme runs under one)
            value = CopiesBound(profile, topo, G, b, speed, limits.optimizer_factor, capacity).bound(cap=cap)
            # (both are a T that bisection found not to fit, over other intervals: within its precision)
            assert without * (1 - 1e-4) <= value <= min(times) * (1 + 1e-9), (seed, G, b, without, value, min(times))
            raised += value > without * 1.01
            checked += 1
    assert checked > 10 and raised > checked / 4, (checked, raised)
