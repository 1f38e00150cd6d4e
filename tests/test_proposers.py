"""Pure tier: one driver over the proposers. Each proposer hands back its families' candidates and a
bound per micro-batch size on what it did not hand back; the driver keeps one incumbent and one
proven gap over all of them, so a proposer added to PROPOSERS takes part with no other change."""

from __future__ import annotations

import math
import random

import pytest

from dapple_launch.cluster import Topology
from dapple_launch.plan_config import DEFAULT_SCHEDULES
from dapple_launch.planner import search as driver
from dapple_launch.planner.cost import Limits, evaluate
from dapple_launch.planner.proposal import Proposal, SearchState, proven_gap

from .test_planner import random_profile


def _instance(seed: int):
    rng = random.Random(900 + seed)
    profile = random_profile(rng, rng.choice([5, 6, 8]))
    topo = Topology("t", rng.choice([1, 2]), rng.choice([2, 4]), rng.choice([2e9, 8e9]), 10.0, 100e9, 10e9)
    return profile, topo, rng.choice([16, 32])


@pytest.mark.parametrize("seed", range(6))
def test_the_driver_asks_every_wanted_proposer_and_its_gap_is_the_incumbent_against_the_least_bound(seed):
    profile, topo, G = _instance(seed)
    limits = Limits(schedules=DEFAULT_SCHEDULES)
    state, _ = driver.initial_state(profile, topo, G, limits, keep=4, with_baselines=True)
    ran = driver.drive(state)
    names = [type(p).__name__ for p, _ in ran]
    assert names == ["StageFamilies", "ZeroBubble", "Copies", "DeviceGroups", "StageWarmups"], (
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
