"""Pure tier: one driver over the proposers. Each proposer hands back its families' candidates and a
bound per micro-batch size on what it did not hand back; the driver keeps one incumbent and one
proven gap over all of them, so a proposer added to PROPOSERS takes part with no other change."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.plan_config import DEFAULT_SCHEDULES
from dapple_launch.planner import search as driver
from dapple_launch.planner.cost import evaluate
from dapple_launch.planner.limits import Limits
from dapple_launch.planner.proposal import Proposal, SearchState, proven_gap

from .test_planner import random_profile


def _instance(seed: int):
    rng = random.Random(900 + seed)
    profile = random_profile(rng, rng.choice([5, 6, 8]))
    topo = Topology("t", rng.choice([1, 2]), rng.choice([2, 4]), rng.choice([2e9, 8e9]), 10.0, 100e9, 10e9)
    return profile, topo, rng.choice([16, 32])


@pytest.mark.slow  # (over a second: out of the fast tier)
@pytest.mark.parametrize("seed", range(6))
def test_the_driver_asks_every_wanted_proposer_and_its_gap_is_the_incumbent_against_the_least_bound(seed):
    profile, topo, G = _instance(seed)
    limits = Limits(schedules=DEFAULT_SCHEDULES)
    state, _ = driver.initial_state(profile, topo, G, limits, keep=4, with_baselines=True)
    ran = driver.drive(state)
    names = [type(p).__name__ for p, _ in ran]
    assert names == ["StageFamilies", "ZeroBubble", "Copies", "DeviceGroups", "StageWarmups", "TableStarts"], (
        names
    )  # all 8 families allowed
    for _, proposal in ran:
        assert all(c.schedule in proposal.families for c in proposal.found)
        assert set(proposal.bounds) <= set(state.sizes)
        # a bound is on what the proposer did not return: with its own best at that size, a bound on
        # every plan of its families, so no candidate of those families anyone found is below both
        for c in state.found:
            b = c.micro_batch_size
            if c.schedule in proposal.families and b in proposal.bounds:
                own = min((x.iteration_s for x in proposal.found if x.micro_batch_size == b), default=math.inf)
                assert min(proposal.bounds[b], own) <= c.iteration_s * (1 + 1e-9), (c.summary(), proposal.bounds[b])
    best = state.best()
    assert best is not None and best.iteration_s == min(c.iteration_s for c in state.found)
    least = min(min(p.bounds.values(), default=math.inf) for _, p in ran)
    assert state.gap() == proven_gap(best.iteration_s, {0: least})
    chosen, _, _, stats = driver.search(profile, topo, G, limits)
    assert chosen is not None and chosen.iteration_s == best.iteration_s and stats.proven_gap == state.gap()


class _Known:
    """A proposer of one plan it costs itself, and a bound it claims on the rest of its family."""

    def __init__(self, layout, bound_share: float):
        self.layout, self.bound_share = layout, bound_share

    def wanted(self, state: SearchState) -> bool:
        return True

    def propose(self, state: SearchState) -> Proposal:
        b = state.sizes[-1]
        c = evaluate(state.profile, state.topology, self.layout, b, state.global_batch // b, state.limits)
        state.stats.nodes += 1
        best = state.best()
        assert best is not None
        return Proposal(("1f1b",), [c], {b: best.iteration_s * self.bound_share})


def test_a_proposer_added_to_the_driver_takes_part_in_the_incumbent_and_the_gap(monkeypatch):
    from dapple_launch.planner.cost import StageSpec

    profile, topo, G = _instance(0)
    limits = Limits(schedules=("1f1b",))
    alone, _, _, stats = driver.search(profile, topo, G, limits)
    assert alone is not None and stats.proven_gap == 0.0  # small: the per-stage proposer proves its optimum
    one_stage = (StageSpec(0, profile.num_layers, tuple(range(topo.num_devices))),)
    # a proposer that leaves its family open below the incumbent: the driver's gap says so
    monkeypatch.setattr(driver, "PROPOSERS", (*driver.PROPOSERS, _Known(one_stage, 0.5)))
    best, _, _, stats = driver.search(profile, topo, G, limits)
    assert best is not None and best.iteration_s == alone.iteration_s  # its plan is no faster: the incumbent stays
    assert stats.proven_gap == pytest.approx(0.5)
    # one that proves its family's rest no faster than the incumbent leaves the optimum proven
    monkeypatch.setattr(driver, "PROPOSERS", (*driver.PROPOSERS[:-1], _Known(one_stage, 1.0)))
    best, _, _, stats = driver.search(profile, topo, G, limits)
    assert best is not None and best.iteration_s == alone.iteration_s and stats.proven_gap == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_the_proof_table_s_own_layout_covers_the_model_and_simulates_no_faster_than_the_table(seed):
    """bounds.least_link_stages, TableStarts' start: contiguous stages over every layer on distinct
    devices, and the 1F1B proof table's value at the root (the least over every layout) at most its
    simulated time at every warm-up depth."""
    from dapple_launch.planner.bounds import least_link_stages
    from dapple_launch.planner.branch import BranchAndBound
    from dapple_launch.planner.cost import StageSpec
    from dapple_launch.planner.warmup import deeper_depths

    profile, topo, G = _instance(seed)
    limits = Limits(max_warmup_depth=3)
    for b in (1, 2, 4):
        x = BranchAndBound(profile, topo, G, limits, b, math.inf)
        stages = least_link_stages(x.bounds, 0)
        assert stages is not None and x.bounds.links is not None
        assert stages[0][0] == 0 and stages[-1][1] == profile.num_layers
        assert all(a[1] == c[0] for a, c in zip(stages, stages[1:]))
        devices = [d for _, _, s, r in stages for d in range(s, s + r)]
        assert len(devices) == len(set(devices)) and max(devices) < topo.num_devices
        layout = tuple(StageSpec(a, z, tuple(range(s, s + r))) for a, z, s, r in stages)
        M = G // b
        if len(layout) > M:
            continue
        for depth in [1, *(d for d, _ in deeper_depths(len(layout), M, limits))]:
            c = evaluate(profile, topo, layout, b, M, limits, warmup_depth=depth)
            assert float(x.bounds.links[0][0, 0]) <= c.iteration_s * (1 + 1e-12)
            # the any-schedule table (TableStarts orders and stops its sizes by it) under both families
            assert float(x.bounds.links[1][0, 0]) <= c.iteration_s * (1 + 1e-12)
        if len(layout) >= 2:
            zb = evaluate(profile, topo, layout, b, M, replace(limits, schedule="zb_h1"))
            assert float(x.bounds.links[1][0, 0]) <= zb.iteration_s * (1 + 1e-12)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_the_proof_table_s_own_layout_finishes_what_the_searches_before_left(monkeypatch):
    """GNMT-32 on 16 × 1 V100 at 10 Gbps, G 64: the layout of the 1F1B proof table at one sample per
    micro-batch, 8 single-device stages, under ZB-H1 at a deeper warm-up beats every plan the
    proposers before it reach (86.3 ms against 93.5 ms, 16 stages: the least-bottleneck start and its
    descents spread the model over every device, and each cut pays a 10 Gbps link)."""
    from pathlib import Path

    from dapple_launch.plan_config import shipped_topology
    from dapple_launch.planner.table_starts import TableStarts
    from dapple_launch.profile import read_profile_file

    root = Path(__file__).resolve().parent.parent
    profile = read_profile_file(
        root / "dapple_launch" / "profiles" / "gnmt-32-pbs-64-simplified.txt", 64, device_tflops=125.0
    )
    topo, G, limits = shipped_topology("v100-16x1-10g"), 64, Limits(schedules=DEFAULT_SCHEDULES)
    assert isinstance(driver.PROPOSERS[-1], TableStarts)
    with_it = driver.search(profile, topo, G, limits)[0]
    monkeypatch.setattr(driver, "PROPOSERS", driver.PROPOSERS[:-1])
    without = driver.search(profile, topo, G, limits)[0]
    assert with_it.iteration_s < without.iteration_s * (1 - 0.05), (with_it.summary(), without.summary())


@pytest.mark.slow  # (3 s: out of the fast tier)
def test_table_starts_leaves_uncosted_only_sizes_whose_bound_passes_what_it_keeps(monkeypatch):
    """A batch of many divisors (G 720 on 12 devices: 30 sizes): TableStarts costs each size's table
    layouts in increasing bound and stops once the bound passes its second start and the search's
    fifth plan. The plan, its runners-up, the proof and every start it descends from are those of
    costing every size; fewer candidates are costed."""
    from dapple_launch.planner import table_starts

    rng = random.Random(4)
    profile = random_profile(rng, 14)
    topo = Topology("t", 3, 4, 16e9, 10.0, 100e9, 10e9)
    G, limits = 720, Limits(schedules=DEFAULT_SCHEDULES)
    evaluated = []
    real = table_starts.evaluate

    def counted(*args, **kw):
        evaluated.append(args[3])  # (the micro-batch size)
        return real(*args, **kw)

    monkeypatch.setattr(table_starts, "evaluate", counted)
    starts = []
    real_descend = table_starts.descend
    monkeypatch.setattr(
        table_starts, "descend", lambda c, *a, **kw: (starts.append(c.summary()), real_descend(c, *a, **kw))[1]
    )
    stopped = driver.search(profile, topo, G, limits)
    stopped_work, stopped_starts = len(evaluated), list(starts)
    evaluated.clear(), starts.clear()
    monkeypatch.setattr(table_starts, "_needed", lambda *a: math.inf)
    every = driver.search(profile, topo, G, limits)
    assert stopped_starts == starts and starts
    best, runners, _, stats = stopped
    assert best.summary() == every[0].summary() and best.iteration_s == every[0].iteration_s
    assert [c.summary() for c in runners] == [c.summary() for c in every[1]]
    assert stats.proven_gap == every[3].proven_gap
    assert stopped_work < len(evaluated) / 2, (stopped_work, len(evaluated))
