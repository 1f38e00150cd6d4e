"""Pure tier: the critical path of a simulation of rank orders (schedule/critical_path.py) and the
bound over a shape's cuts that prices it at every other cut (path_bound.py's `orders`)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from dapple_launch.planner.chunked import rank_orders
from dapple_launch.schedule import StageCosts, build_schedule
from dapple_launch.schedule.critical_path import SEND, critical_path
from dapple_launch.schedule.rank_simulate import simulate_ranks, step_costs
from dapple_launch.schedule.ranks import from_stages

from .test_rank_schedules import _best_cut_s, _small_chunked_shapes

FAMILIES = ("interleaved_1f1b", "interleaved_zb", "zbv", "chimera")


def _random_orders(rng: random.Random):
    """Rank orders of every family with several stages per rank, and the stage-per-rank ones."""
    family = rng.choice([*FAMILIES, "1f1b", "gpipe", "zb_h1"])
    if family in FAMILIES:
        P = rng.choice([2, 4] if family == "chimera" else [2, 3, 4])
        v = rng.choice([2, 3]) if family.startswith("interleaved") else 2
        return rank_orders(family, P, P * rng.randint(1, 3), v)
    return from_stages(build_schedule(family, rng.randint(1, 5), rng.randint(1, 8)))


def _random_costs(rng: random.Random, S: int) -> list[StageCosts]:
    """Compute and transfers only (no all-reduce: the path is the walk's, not the buckets' after it);
    a gradient crosses a boundary at its activation's price, as the planner's stage costs have it."""
    sends = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in range(S - 1)] + [0.0]
    return [
        StageCosts(
            rng.uniform(0.1, 2),
            rng.uniform(0.1, 4),
            sends[s],
            sends[s - 1] if s else 0.0,
            weight_grad_s=rng.choice([None, rng.uniform(0, 1)]),
            action_s=rng.choice([0.0, 0.05]),
        )
        for s in range(S)
    ]


def _priced(counts: dict, costs: list[StageCosts]) -> float:
    per = step_costs(costs)
    return sum(n * (costs[s].send_activation_s if k == SEND else per[k][s]) for (s, k), n in counts.items())


def test_the_critical_path_is_the_simulated_length_and_no_longer_than_any_other_costs_simulation():
    """critical_path walks the orders as simulate_ranks does: its length is the simulated iteration,
    its steps and transfers priced at the same costs sum to it, and priced at any other costs they
    stay at or below that simulation (the precedences are the orders', not the costs': the bound
    over cuts relies on it)."""
    rng = random.Random(5)
    longer = 0
    for _ in range(150):
        orders = _random_orders(rng)
        S = orders.num_stages
        costs = _random_costs(rng, S)
        length, counts = critical_path(orders, step_costs(costs), [c.send_activation_s for c in costs])
        assert length == pytest.approx(simulate_ranks(orders, costs, record=False).iteration_s, rel=1e-12)
        assert _priced(counts, costs) == pytest.approx(length, rel=1e-12)
        for _ in range(3):
            other = _random_costs(rng, S)
            simulated = simulate_ranks(orders, other, record=False).iteration_s
            assert _priced(counts, other) <= simulated * (1 + 1e-12)
            # (a path that crosses ranks: more than any one rank's own steps)
            longer += _priced(counts, costs) > max(
                sum(step_costs(costs)[k][s] * n for k, s, n in work) for work in orders.work
            ) * (1 + 1e-9)
    assert longer > 100, longer


def test_a_link_sends_one_transfer_at_a_time_on_the_critical_path():
    """Two stages on two ranks, transfers dearer than compute: the iteration is the link's M
    activations one after another, and the path counts each of them."""
    orders = from_stages(build_schedule("gpipe", 2, 4))
    costs = [StageCosts(0.1, 0.1, 1.0, 0.0), StageCosts(0.1, 0.1, 0.0, 1.0)]
    length, counts = critical_path(orders, step_costs(costs), [1.0, 0.0])
    assert length == pytest.approx(simulate_ranks(orders, costs, record=False).iteration_s)
    assert counts[(0, SEND)] >= 4, counts


def _priced_terms(terms, costs: list[StageCosts]) -> list[float]:
    """path_bound's terms (stage × F, B, I, W, send counts) priced at the simulator's step costs."""
    per = step_costs(costs)
    return [
        sum(t[s, k] * per[k][s] for s in range(len(costs)) for k in range(4))
        + sum(t[s, 4] * costs[s].send_activation_s for s in range(len(costs)))
        for t in terms
    ]


def test_every_cycle_path_priced_at_any_costs_stays_at_or_below_their_simulation():
    """path_bound.cycle_paths: per stage and rank, its forwards' round trips through every later
    stage and back, chained by the rank's order. Each is a path of the orders' precedences, so priced
    at any stage costs it is at most their simulation, for every family (several stages per rank,
    Chimera's two pipelines, and one stage per rank); and where transfers are dear it is longer than
    any rank's own steps (what the group runs alone see)."""
    from dapple_launch.planner.path_bound import cycle_paths

    rng = random.Random(23)
    longer = 0
    for _ in range(200):
        orders = _random_orders(rng)
        terms = cycle_paths(orders)
        assert len(terms) >= 2 * (orders.num_stages - 1)  # (two per stage but the last and rank)
        if not len(terms):
            continue  # (one stage: no round trip)
        for _ in range(3):
            costs = _random_costs(rng, orders.num_stages)
            simulated = simulate_ranks(orders, costs, record=False).iteration_s
            priced = _priced_terms(terms, costs)
            assert max(priced) <= simulated * (1 + 1e-12), (orders.name, max(priced), simulated)
            busiest = max(sum(step_costs(costs)[k][s] * n for k, s, n in work) for work in orders.work)
            longer += max(priced) > busiest * (1 + 1e-9)
    assert longer > 150, longer


@pytest.mark.slow  # (several seconds: out of the fast tier)
def test_the_bound_with_critical_paths_stays_below_a_shapes_best_cut_and_raises_it():
    """GroupBound.critical (the paths' programme and game, each cut it answers with simulated and its
    critical path priced at every other cut) against the best of every cut of the shape, simulated
    exhaustively on random clusters: at or below it, and above the bound without critical paths on
    a good share of the shapes."""
    from dapple_launch.planner.group_bound import GroupBound

    rng = random.Random(17)
    checked = raised = 0
    for profile, topo, G, limits, family, v, groups, b, times, cuts in _small_chunked_shapes(rng, rounds=5):
        if rng.random() < 0.5:  # every layer's output large (transfers that chain the groups' steps)
            profile = replace(profile, layers=tuple(replace(x, activation_bytes=4e8) for x in profile.layers))
        make = lambda: GroupBound(profile, topo, G, family, v, groups, b, times)
        critical, paths = make().critical(float("inf"), float("inf")), make().bound()
        raised += critical > paths * 1.001
        best = _best_cut_s(profile, topo, G, limits, family, v, groups, b, cuts)
        assert critical <= best * (1 + 1e-9), (family, v, groups, b, critical, best)
        checked += 1
    assert checked > 150 and raised > checked / 10, (checked, raised)


def _proof(name: str, cluster: str, G: int) -> tuple[float, float]:
    """(the proven gap, the proven lower bound) of the search's plan."""
    from benchmarks.planner import load_profile, topology
    from dapple_launch.plan_config import DEFAULT_SCHEDULES
    from dapple_launch.planner.limits import Limits
    from dapple_launch.planner.search import search

    files = {"gnmt-32": ("gnmt-32-pbs-64-simplified.txt", 64, 1.0), "amoeba-36": ("amoeba-36-pbs-1.txt", 1, 1.0)}
    best, _, _, stats = search(load_profile(*files[name]), topology(cluster), G, Limits(schedules=DEFAULT_SCHEDULES))
    return stats.proven_gap, best.iteration_s * (1 - stats.proven_gap)


def _gap(name: str, cluster: str, G: int) -> float:
    return _proof(name, cluster, G)[0]


@pytest.mark.slow  # (planning four times: several seconds)
def test_on_a_slow_network_the_critical_paths_and_the_other_families_floor_lower_the_proven_gap(monkeypatch):
    """GNMT-32 on 16 × 1 V100 at G 256: every group boundary crosses the network, and the shapes of
    device groups stay open below the plan until the critical paths of their cuts (transfers
    chaining the groups' steps) are priced at every cut. AmoebaNet-36 there at G 128: the chunked pass
    raises each shape only to the least bound the per-stage families proved, and the cells it saves
    bound more shapes: the proven lower bound rises (1.4225 s against 1.4120 s, gaps 19.7 % against
    20.3 %; compared as bounds, since a faster plan of another pass lowers both gaps; at G 64, where
    it made 25.1 % of 31.8 %, the rank orders' round trips now bound those shapes either way)."""
    from dapple_launch.planner import chunked_bounds, chunked_search

    with_paths = _gap("gnmt-32", "v100-16x1", 256)
    monkeypatch.setattr(chunked_bounds, "CRITICAL_CELLS", 0.0)
    assert with_paths < 0.8 * _gap("gnmt-32", "v100-16x1", 256), with_paths
    monkeypatch.undo()

    with_floor = _proof("amoeba-36", "v100-16x1", 128)
    search_chunked = chunked_search.search_chunked
    monkeypatch.setattr(
        chunked_search, "search_chunked", lambda *args: search_chunked(*args[:6])
    )  # (no floor: each shape raised up to the best plan)
    without = _proof("amoeba-36", "v100-16x1", 128)
    assert with_floor[0] < without[0] and with_floor[1] > 1.005 * without[1], (with_floor, without)


def test_round_trips_lift_a_shape_whose_transfers_are_slow_against_its_steps(monkeypatch):
    """GNMT-32 on 16 × 1 V100 at 10 Gbps, interleaved zero bubble on 8 groups of 2 at b 16: every
    boundary crosses the network, and no group's run nor link's load comes near what its cuts
    simulate (2.5 s and more); the rank orders' round trips lift the paths' bound over its cuts
    by half again, and it stays under the simulation of its balanced cut."""
    from benchmarks.planner import load_profile, topology
    from dapple_launch.planner import group_bound
    from dapple_launch.planner.baselines import balanced_boundaries
    from dapple_launch.planner.chunked import chunked_layout, evaluate_chunked
    from dapple_launch.planner.chunked_bounds import group_bound_of
    from dapple_launch.planner.limits import Limits

    profile, cluster = load_profile("gnmt-32-pbs-64-simplified.txt", 64, 1.0), topology("v100-16x1-10g")
    shape = ("interleaved_zb", 2, (2,) * 8, 16)
    bound = lambda: group_bound_of(profile, cluster, 1024, *shape, {}).bound()
    with_trips = bound()
    monkeypatch.setattr(group_bound, "cycle_terms", lambda *args: np.zeros((0, 16, 5)))
    without = bound()
    stops = [*balanced_boundaries(profile, 16, [2] * 16), profile.num_layers]
    layout = chunked_layout("interleaved_zb", [2] * 8, stops, None)
    simulated = evaluate_chunked(profile, cluster, layout, 16, 64, Limits(), "interleaved_zb", 2).iteration_s
    assert 1.5 * without < with_trips <= simulated, (without, with_trips, simulated)
